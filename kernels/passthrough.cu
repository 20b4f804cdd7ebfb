// Every op of the passthrough codecs (none, bf16, fp16): the payload is the tensor in the wire
// dtype. Elementwise, one thread per 8-element unit (grid-stride), 16-byte accesses where the
// buffers allow. Reference: passthrough_range in cpu_scalar.cc; an encode's decoded value is the
// wire value it just wrote, so error feedback and delta see exactly what the receiver will.

#include <cuda_runtime.h>

#include <cstdint>

#include "codec_launch.h"
#include "encode_step.cuh"

namespace lowcomm::cuda {
namespace {

struct PassthroughArgs {
  const void* x;
  void* state;
  void* out;
  void* payload;
  uint64_t n;
};

template <DType D, DType W, CodecOp Op>
__global__ void __launch_bounds__(LaunchPolicy::kThreads) passthrough_kernel(PassthroughArgs a) {
  using Wire = Element<W>;
  using E = Element<D>;
  const uint64_t units = (a.n + 7) / 8;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t u = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < units;
       u += stride) {
    const uint64_t i0 = u * 8;
    const uint32_t cnt = unit_elements(a.n, i0);
    typename Wire::Bits wb[8];
    if constexpr (Op == CodecOp::kEncode || Op == CodecOp::kEncodeFeedback ||
                  Op == CodecOp::kEncodeDelta) {
      float y[8], m[8] = {}, s[8];
      load_source_unit<D, Op>(a.x, a.state, i0, cnt, y, m);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        wb[j] = Wire::from_f32(y[j]);
        const float dec = Wire::to_f32(wb[j]);
        s[j] = Op == CodecOp::kEncode ? 0.0f : next_state<Op>(y[j], m[j], dec, qm::is_finite(dec));
      }
      store_unit_bits(a.payload, i0, cnt, wb);
      store_state_unit<D, Op>(a.state, i0, cnt, s);
    } else {
      load_unit_bits(a.payload, i0, cnt, wb);
      float dec[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) dec[j] = Wire::to_f32(wb[j]);
      if constexpr (Op == CodecOp::kDecode) {
        store_unit<D>(a.out, i0, cnt, dec);
      } else if constexpr (Op == CodecOp::kDecodeAccumulate) {
        float o[8];
        load_unit<D>(a.out, i0, cnt, o);
#pragma unroll
        for (int j = 0; j < 8; ++j) o[j] = qm::add(o[j], dec[j]);
        store_unit<D>(a.out, i0, cnt, o);
      } else {
        // m += value, or 0 for a non-finite value; out = m as stored, or the value itself.
        float m[8];
        load_unit<D>(a.state, i0, cnt, m);
        typename E::Bits mb[8], ob[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const bool finite = qm::is_finite(dec[j]);
          mb[j] = E::from_f32(finite ? qm::add(m[j], dec[j]) : 0.0f);
          ob[j] = E::from_f32(finite ? E::to_f32(mb[j]) : dec[j]);
        }
        store_unit_bits(a.state, i0, cnt, mb);
        if (a.out != nullptr) store_unit_bits(a.out, i0, cnt, ob);
      }
    }
  }
}

template <DType D, DType W>
cudaError_t launch_wire(const CodecJob& job, const GridShape& grid, const PassthroughArgs& a,
                        cudaStream_t stream) {
  const dim3 g(grid.blocks), b(grid.threads);
  switch (job.op) {
    case CodecOp::kEncode:
      passthrough_kernel<D, W, CodecOp::kEncode><<<g, b, 0, stream>>>(a);
      break;
    case CodecOp::kEncodeFeedback:
      passthrough_kernel<D, W, CodecOp::kEncodeFeedback><<<g, b, 0, stream>>>(a);
      break;
    case CodecOp::kEncodeDelta:
      passthrough_kernel<D, W, CodecOp::kEncodeDelta><<<g, b, 0, stream>>>(a);
      break;
    case CodecOp::kDecode:
      passthrough_kernel<D, W, CodecOp::kDecode><<<g, b, 0, stream>>>(a);
      break;
    case CodecOp::kDecodeAccumulate:
      passthrough_kernel<D, W, CodecOp::kDecodeAccumulate><<<g, b, 0, stream>>>(a);
      break;
    case CodecOp::kDecodeDelta:
      passthrough_kernel<D, W, CodecOp::kDecodeDelta><<<g, b, 0, stream>>>(a);
      break;
  }
  return cudaGetLastError();
}

template <DType D>
cudaError_t launch_dtype(const CodecJob& job, const GridShape& grid, const PassthroughArgs& a,
                         cudaStream_t stream) {
  switch (job.spec.wire_dtype) {
    case DType::kFloat32:
      return launch_wire<D, DType::kFloat32>(job, grid, a, stream);
    case DType::kBFloat16:
      return launch_wire<D, DType::kBFloat16>(job, grid, a, stream);
    case DType::kFloat16:
      return launch_wire<D, DType::kFloat16>(job, grid, a, stream);
    default:  // not a codec dtype: check_codec_job refused it
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_passthrough(const CodecJob& job, const GridShape& grid, cudaStream_t stream) {
  PassthroughArgs a{job.x, job.state, job.out, job.payload, job.n};
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
