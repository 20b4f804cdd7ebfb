// Column-grouped encodes (plain, error feedback, delta): the tensor viewed as [rows, cols] with
// one scale record per column. Three kernels on the caller's stream:
//   1. statistics: one thread per (column, chunk of rows) walks its rows in order and folds
//      its partial result into per-column scratch words with 64-bit atomics;
//   2. finalize: one thread per column turns the scratch words into the scale record;
//   3. quantize: one thread per 8-element unit, as the elementwise kernels, each element
//      against its own column's record.
// DRAM traffic: the inputs are read twice (statistics, quantize), codes and state written once.
//
// Bit-identity (reference: scalar_column_scales + encode_units in cpu_scalar.cc). max |y| is
// order-free: the non-negative floats order like their bit patterns, and any non-finite |y|
// has bits >= 0x7F800000, so one atomicMax on the bits yields both the maximum and the
// "non-finite" flag. min and max are order-free except for the sign of a zero extreme: the host
// keeps the first of equal values in row order, and +0/-0 are the only equal values with
// different bits. So each key is (value order << 32 | chunk order << 1 | sign): zeros of both
// signs share a value order, the earliest chunk wins ties, and each chunk walks its rows in
// order; the sign bit then restores the winner's zero. A non-finite chunk forces the keys to
// 0 (min) and ~0 (max), which no finite value produces.

#include <cuda_runtime.h>

#include <cstdint>

#include "codec_launch.h"
#include "encode_step.cuh"

namespace lowcomm::cuda {
namespace {

constexpr uint64_t kMaxChunkOrder = (uint64_t{1} << 31) - 1;

struct ColumnArgs {
  const void* x;
  void* state;
  uint8_t* payload;
  uint8_t* packed;
  uint64_t n;
  uint64_t cols;
  uint64_t rows;
  uint64_t chunks;
  uint64_t rows_per_chunk;
  uint32_t* amax_bits;           // absmax scratch: [cols]
  unsigned long long* min_keys;  // minmax scratch: [cols], then max keys: [cols]
  unsigned long long* max_keys;
  uint64_t seed;
  uint64_t offset;
  int bits;
};

// Order-preserving 32-bit key of a finite float, with -0 taking +0's key.
LC_DEV uint32_t order_key(float v) {
  uint32_t u = qm::f32_bits(v);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

LC_DEV float key_value(unsigned long long key) {
  const uint32_t k = static_cast<uint32_t>(key >> 32);
  uint32_t u = (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
  if (u == 0) u = static_cast<uint32_t>(key & 1u) << 31;  // the winning zero's own sign
  return qm::bits_f32(u);
}

template <DType D, CodecOp Op, QuantKind K>
__global__ void __launch_bounds__(LaunchPolicy::kThreads) column_stats_kernel(ColumnArgs a) {
  const uint64_t total = a.cols * a.chunks;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t t = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    // Adjacent threads take adjacent columns of the same rows: coalesced loads.
    const uint64_t c = t % a.cols, chunk = t / a.cols;
    const uint64_t r0 = chunk * a.rows_per_chunk;
    const uint64_t r1 = min(a.rows, r0 + a.rows_per_chunk);
    if constexpr (K == QuantKind::kAbsmax) {
      uint32_t amax = 0;
#pragma unroll 4
      for (uint64_t r = r0; r < r1; ++r) {
        const float y = load_source_element<D, Op>(a.x, a.state, r * a.cols + c);
        amax = max(amax, qm::f32_bits(qm::abs_f(y)));
      }
      atomicMax(&a.amax_bits[c], amax);
    } else {
      bool finite = true;
      float lo = 0.0f, hi = 0.0f;
#pragma unroll 4
      for (uint64_t r = r0; r < r1; ++r) {
        const float y = load_source_element<D, Op>(a.x, a.state, r * a.cols + c);
        finite = finite && qm::is_finite(y);
        // std::min / std::max semantics: the first of equal values stays.
        lo = r == r0 ? y : (y < lo ? y : lo);
        hi = r == r0 ? y : (hi < y ? y : hi);
      }
      unsigned long long lo_key = 0, hi_key = ~0ull;
      if (finite) {
        lo_key = static_cast<unsigned long long>(order_key(lo)) << 32 | chunk << 1 |
                 qm::f32_bits(lo) >> 31;
        hi_key = static_cast<unsigned long long>(order_key(hi)) << 32 |
                 (kMaxChunkOrder - chunk) << 1 | qm::f32_bits(hi) >> 31;
      }
      atomicMin(&a.min_keys[c], lo_key);
      atomicMax(&a.max_keys[c], hi_key);
    }
  }
}

template <QuantKind K>
__global__ void __launch_bounds__(LaunchPolicy::kThreads) column_finalize_kernel(ColumnArgs a) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const float nan = qm::bits_f32(qm::kCanonicalNanF32);
  for (uint64_t c = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < a.cols;
       c += stride) {
    if constexpr (K == QuantKind::kAbsmax) {
      const uint32_t b = a.amax_bits[c];
      store_scale(a.payload, c, b >= 0x7F800000u ? nan : qm::bits_f32(b));
    } else {
      const unsigned long long lo = a.min_keys[c], hi = a.max_keys[c];
      const bool finite = lo != 0 && hi != ~0ull;
      store_scale(a.payload, 2 * c, finite ? key_value(lo) : nan);
      store_scale(a.payload, 2 * c + 1, finite ? key_value(hi) : nan);
    }
  }
}

template <DType D, CodecOp Op, QuantKind K, bool SR>
__global__ void __launch_bounds__(LaunchPolicy::kThreads) column_quantize_kernel(ColumnArgs a) {
  const uint64_t units = (a.n + 7) / 8;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t u = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < units;
       u += stride) {
    const uint64_t i0 = u * 8;
    const uint32_t cnt = unit_elements(a.n, i0);
    float y[8], m[8] = {};
    load_source_unit<D, Op>(a.x, a.state, i0, cnt, y, m);
    uint32_t rnd[8] = {};
    if constexpr (SR) sr_draws8(a.seed, a.offset + i0, rnd);
    uint64_t c = i0 % a.cols;
    uint32_t codes[8];
    float s[8];
#pragma unroll
    for (uint32_t j = 0; j < 8; ++j) {
      codes[j] = 0;
      s[j] = 0.0f;
      if (j < cnt) {
        float s0, s1;
        load_record<K>(a.payload, c, s0, s1);
        const GroupQuant q = group_for_encode<K>(s0, s1, a.bits);
        codes[j] = encode_element<Op, K, SR>(q, y[j], m[j], a.bits, rnd[j], s[j]);
        c = c + 1 == a.cols ? 0 : c + 1;
      }
    }
    store_code_unit(a.packed, u, a.bits, qm::pack_unit(codes, a.bits));
    store_state_unit<D, Op>(a.state, i0, cnt, s);
  }
}

template <DType D, CodecOp Op, QuantKind K>
cudaError_t launch_kind(const CodecJob& job, const ColumnEncodePlan& plan, const ColumnArgs& a,
                        cudaStream_t stream) {
  const dim3 block(LaunchPolicy::kThreads);
  column_stats_kernel<D, Op, K><<<dim3(plan.stats.blocks), block, 0, stream>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  column_finalize_kernel<K><<<dim3(plan.finalize.blocks), block, 0, stream>>>(a);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (job.spec.rounding == Rounding::kStochastic) {
    column_quantize_kernel<D, Op, K, true><<<dim3(plan.quantize.blocks), block, 0, stream>>>(a);
  } else {
    column_quantize_kernel<D, Op, K, false><<<dim3(plan.quantize.blocks), block, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <DType D, CodecOp Op>
cudaError_t launch_op(const CodecJob& job, const ColumnEncodePlan& plan, const ColumnArgs& a,
                      cudaStream_t stream) {
  // validate_spec rules out q1 with column groups.
  if (job.spec.kind == CodecKind::kMinmax)
    return launch_kind<D, Op, QuantKind::kMinmax>(job, plan, a, stream);
  return launch_kind<D, Op, QuantKind::kAbsmax>(job, plan, a, stream);
}

template <DType D>
cudaError_t launch_dtype(const CodecJob& job, const ColumnEncodePlan& plan, const ColumnArgs& a,
                         cudaStream_t stream) {
  switch (job.op) {
    case CodecOp::kEncode:
      return launch_op<D, CodecOp::kEncode>(job, plan, a, stream);
    case CodecOp::kEncodeFeedback:
      return launch_op<D, CodecOp::kEncodeFeedback>(job, plan, a, stream);
    case CodecOp::kEncodeDelta:
      return launch_op<D, CodecOp::kEncodeDelta>(job, plan, a, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

uint64_t column_scratch_bytes(const CodecJob& job) {
  const uint64_t per_column =
      job.spec.kind == CodecKind::kMinmax ? 2 * sizeof(unsigned long long) : sizeof(uint32_t);
  return per_column * job.spec.cols;
}

cudaError_t launch_column_encode(const CodecJob& job, const ColumnEncodePlan& plan, void* scratch,
                                 cudaStream_t stream) {
  ColumnArgs a{};
  a.x = job.x;
  a.state = job.state;
  a.payload = job.payload;
  a.packed = job.packed();
  a.n = job.n;
  a.cols = job.spec.cols;
  a.rows = plan.rows;
  a.chunks = plan.chunks;
  a.rows_per_chunk = plan.rows_per_chunk;
  a.seed = job.key.seed;
  a.offset = job.key.offset;
  a.bits = job.spec.bits;
  // Identity elements of the atomics: max |y| bits from 0; min keys from ~0, max keys from 0.
  if (job.spec.kind == CodecKind::kMinmax) {
    a.min_keys = static_cast<unsigned long long*>(scratch);
    a.max_keys = a.min_keys + a.cols;
    cudaError_t err =
        cudaMemsetAsync(a.min_keys, 0xFF, a.cols * sizeof(unsigned long long), stream);
    if (err != cudaSuccess) return err;
    err = cudaMemsetAsync(a.max_keys, 0, a.cols * sizeof(unsigned long long), stream);
    if (err != cudaSuccess) return err;
  } else {
    a.amax_bits = static_cast<uint32_t*>(scratch);
    cudaError_t err = cudaMemsetAsync(a.amax_bits, 0, a.cols * sizeof(uint32_t), stream);
    if (err != cudaSuccess) return err;
  }
  switch (job.dtype) {
    case DType::kFloat32:
      return launch_dtype<DType::kFloat32>(job, plan, a, stream);
    case DType::kBFloat16:
      return launch_dtype<DType::kBFloat16>(job, plan, a, stream);
    case DType::kFloat16:
      return launch_dtype<DType::kFloat16>(job, plan, a, stream);
    default:  // not a codec dtype: check_codec_job refused it
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace lowcomm::cuda
