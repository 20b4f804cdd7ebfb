// Decodes of the quantized codecs: out = D(codes), out += D(codes), and the AQ-SGD receiver
// m += D(codes); out = m. Elementwise: one thread per 8-element unit (grid-stride), which reads
// the unit's `bits` bytes of codes, looks up its group's scale record (a few KiB per MiB of
// codes, so it stays in L1/L2) and writes 8 elements with 16-byte stores.
// DRAM traffic: codes and scales read once; out written once (and read once to accumulate);
// for decode_delta m read and written once and out written once.
//
// Bit-identity (reference: decode_range in cpu_scalar.cc): the same group_decode /
// decode_value steps (group_quant.cuh), fp32 accumulation with one rounding to the dtype on
// store, and for decode_delta the output taken from the cache as stored, i.e. after rounding.
// Block groups hold whole units (blocks are multiples of 8), so a unit has one record; column
// groups change with every element.

#include <cuda_runtime.h>

#include <cstdint>

#include "codec_launch.h"
#include "device_io.cuh"
#include "group_quant.cuh"

namespace lowcomm::cuda {
namespace {

struct DecodeArgs {
  const uint8_t* payload;
  const uint8_t* packed;
  void* out;    // decode, accumulate: the output; decode_delta: the optional copy of m
  void* state;  // decode_delta: the cache m
  uint64_t n;
  uint64_t cols;        // column groups; 0 for block groups
  uint32_t log2_block;  // block groups
  int bits;
};

template <DType D, CodecOp Op, QuantKind K>
__global__ void __launch_bounds__(LaunchPolicy::kThreads) quant_decode_kernel(DecodeArgs a) {
  const uint64_t units = (a.n + 7) / 8;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t u = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < units;
       u += stride) {
    const uint64_t i0 = u * 8;
    const uint32_t cnt = unit_elements(a.n, i0);
    const uint64_t w = load_code_unit(a.packed, u, a.bits);
    float dec[8];
    bool finite[8];
    float s0, s1;
    if (a.cols == 0) {
      load_record<K>(a.payload, i0 >> a.log2_block, s0, s1);
      const GroupQuant q = group_for_decode<K>(s0, s1, a.bits);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        dec[j] = quant_value<K>(q, qm::unit_code(w, j, a.bits), a.bits);
        finite[j] = q.finite;
      }
    } else {
      uint64_t c = i0 % a.cols;
#pragma unroll
      for (uint32_t j = 0; j < 8; ++j) {
        dec[j] = 0.0f;
        finite[j] = true;
        if (j < cnt) {
          load_record<K>(a.payload, c, s0, s1);
          const GroupQuant q = group_for_decode<K>(s0, s1, a.bits);
          dec[j] = quant_value<K>(q, qm::unit_code(w, static_cast<int>(j), a.bits), a.bits);
          finite[j] = q.finite;
          c = c + 1 == a.cols ? 0 : c + 1;
        }
      }
    }
    if constexpr (Op == CodecOp::kDecode) {
      store_unit<D>(a.out, i0, cnt, dec);
    } else if constexpr (Op == CodecOp::kDecodeAccumulate) {
      float o[8];
      load_unit<D>(a.out, i0, cnt, o);
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] = qm::add(o[j], dec[j]);
      store_unit<D>(a.out, i0, cnt, o);
    } else {
      // m += D(codes), or 0 for a non-finite group; out = m as stored, or the NaN itself.
      using E = Element<D>;
      float m[8];
      load_unit<D>(a.state, i0, cnt, m);
      typename E::Bits mb[8], ob[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        mb[j] = E::from_f32(finite[j] ? qm::add(m[j], dec[j]) : 0.0f);
        ob[j] = E::from_f32(finite[j] ? E::to_f32(mb[j]) : dec[j]);
      }
      store_unit_bits(a.state, i0, cnt, mb);
      if (a.out != nullptr) store_unit_bits(a.out, i0, cnt, ob);
    }
  }
}

template <DType D, CodecOp Op>
cudaError_t launch_op(const CodecJob& job, const GridShape& grid, const DecodeArgs& a,
                      cudaStream_t stream) {
  const dim3 g(grid.blocks), b(grid.threads);
  if (job.spec.kind == CodecKind::kMinmax) {
    quant_decode_kernel<D, Op, QuantKind::kMinmax><<<g, b, 0, stream>>>(a);
  } else if (job.spec.bits == 1) {
    quant_decode_kernel<D, Op, QuantKind::kSign><<<g, b, 0, stream>>>(a);
  } else {
    quant_decode_kernel<D, Op, QuantKind::kAbsmax><<<g, b, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <DType D>
cudaError_t launch_dtype(const CodecJob& job, const GridShape& grid, const DecodeArgs& a,
                         cudaStream_t stream) {
  switch (job.op) {
    case CodecOp::kDecode:
      return launch_op<D, CodecOp::kDecode>(job, grid, a, stream);
    case CodecOp::kDecodeAccumulate:
      return launch_op<D, CodecOp::kDecodeAccumulate>(job, grid, a, stream);
    case CodecOp::kDecodeDelta:
      return launch_op<D, CodecOp::kDecodeDelta>(job, grid, a, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_quant_decode(const CodecJob& job, const GridShape& grid, cudaStream_t stream) {
  DecodeArgs a{};
  a.payload = job.payload;
  a.packed = job.packed();
  a.out = job.out;
  a.state = job.state;
  a.n = job.n;
  a.cols = job.spec.grouping == Grouping::kColumn ? job.spec.cols : 0;
  a.log2_block = job.spec.grouping == Grouping::kBlock ? log2_exact(job.spec.block) : 0;
  a.bits = job.spec.bits;
  switch (job.dtype) {
    case DType::kFloat32:
      return launch_dtype<DType::kFloat32>(job, grid, a, stream);
    case DType::kBFloat16:
      return launch_dtype<DType::kBFloat16>(job, grid, a, stream);
    case DType::kFloat16:
      return launch_dtype<DType::kFloat16>(job, grid, a, stream);
    default:  // not a codec dtype: check_codec_job refused it
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace lowcomm::cuda
