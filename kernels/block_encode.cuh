#pragma once
// Block-grouped encodes (plain, error feedback, delta) of the quantized codecs: one fused kernel
// that reads every input element from DRAM once. Included by block_encode.cu (groups of one
// sweep, blocks <= 256) and block_encode_sweeps.cu (several sweeps): each instantiation then
// carries only its own path's registers.
//
// Schedule. A group of G = spec.block elements (a power of two, 32..4096) belongs to L =
// min(32, G/8) lanes of one warp, so a warp holds 32/L groups. In each sweep over its group,
// lane l owns the 8 consecutive elements 8l..8l+7 of that sweep's 8L: one 16-byte load (16-bit
// types) or two (fp32) per input, and exactly `bits` bytes of codes out. A group takes
// S = max(1, G/256) sweeps.
//   phase 1: the lanes read their elements (x, plus residual or cache) and reduce the group's
//     statistics across the L lanes with shuffles: max|y| (absmax), min and max (minmax), the
//     mean |y| (q1) and finiteness. Lane 0 of the group writes the scale record.
//   phase 2: each lane quantizes its elements against that record (re-derived from the stored
//     floats, as the CPU re-reads them), packs its 8 codes, stores them next to its neighbours'
//     (a warp's stores coalesce) and writes back the residual or cache. With S = 1 the values
//     are still in registers; with S > 1 they are re-read, from L1/L2, since the group was read
//     a few microseconds earlier.
// DRAM traffic: one read of the inputs, one write of codes, scales and state.
//
// Bit-identity notes (reference: csrc/codec/cpu_scalar.cc).
//   - min/max reduce in any order, except that std::min/std::max in index order keep the first
//     of equal values, and the only equal floats with different bits are +0 and -0: a zero
//     extreme takes the sign of the group's first zero, tracked as a (index, sign) minimum.
//   - q1's sum follows group_math.h's tree: t[i] += t[i + s] for s = G/2 .. 1 over the group
//     padded with zeros. With element p = 256 it + 8 l + j: strides >= 256 combine sweeps it and
//     it + s/256 of the same (l, j); visiting sweeps in bit-reversed order turns that
//     stride-halving tree into a pairwise sum of adjacent leaves, kept as a binary-counter stack
//     of partial sums in registers. Strides 128..8 pair lane l with lane l + s/8
//     (__shfl_down_sync); strides 4, 2, 1 pair values inside a lane. When the sum overflows for
//     a finite group, the same tree runs again over |y| * 2^-12 (quant_math.h, mean_abs).

#include <cuda_runtime.h>

#include <cstdint>

#include "codec_launch.h"
#include "encode_step.cuh"

namespace lowcomm::cuda::block_encode {

constexpr unsigned kFullMask = 0xFFFFFFFFu;
// Sweeps of the largest group (4096 / 256) are 2^4: four levels of the q1 partial-sum stack.
constexpr int kSumLevels = 4;
static_assert((uint32_t{1} << kSumLevels) * LaunchPolicy::kWarpSweep == kMaxBlock,
              "q1 sum stack depth must cover the largest block");

struct BlockEncodeArgs {
  const void* x;
  void* state;
  uint8_t* payload;  // scale records
  uint8_t* packed;   // codes
  uint64_t n;
  uint64_t groups;
  uint64_t warp_tasks;
  uint64_t seed;
  uint64_t offset;
  uint32_t block;
  uint32_t lanes;
  uint32_t sweeps;
  uint32_t log2_sweeps;
  int bits;
};

LC_DEV uint32_t unit_count(uint32_t count, uint32_t local) {
  return local < count ? min(8u, count - local) : 0u;
}

// ---- statistics of absmax and minmax groups ----

struct GroupStats {
  uint32_t finite;
  float amax;           // absmax: max |y|
  float lo, hi;         // minmax: min and max of y; +0 and -0 compare equal here
  uint32_t first_zero;  // minmax: (index << 1 | sign bit) of the group's first zero
};

LC_DEV GroupStats empty_stats() {
  return GroupStats{1u, 0.0f, qm::bits_f32(0x7F800000u), qm::bits_f32(0xFF800000u), ~0u};
}

// Adds the `count` values of a lane's unit whose first element is group element `local`.
template <QuantKind K>
LC_DEV void add_values(GroupStats& st, const float y[8], uint32_t count, uint32_t local) {
#pragma unroll
  for (uint32_t j = 0; j < 8; ++j) {
    if (j < count) {
      const float v = y[j];
      st.finite &= qm::is_finite(v) ? 1u : 0u;
      if constexpr (K == QuantKind::kAbsmax) {
        const float a = qm::abs_f(v);
        st.amax = st.amax < a ? a : st.amax;
      } else {
        st.lo = v < st.lo ? v : st.lo;
        st.hi = st.hi < v ? v : st.hi;
        if (v == 0.0f) st.first_zero = min(st.first_zero, (local + j) << 1 | qm::f32_bits(v) >> 31);
      }
    }
  }
}

// Merges the statistics of the group's lanes; every lane ends with the group's.
template <QuantKind K>
LC_DEV void reduce_stats(GroupStats& st, uint32_t lanes) {
  for (uint32_t off = lanes >> 1; off > 0; off >>= 1) {
    st.finite &= __shfl_xor_sync(kFullMask, st.finite, off);
    if constexpr (K == QuantKind::kAbsmax) {
      const float a = __shfl_xor_sync(kFullMask, st.amax, off);
      st.amax = st.amax < a ? a : st.amax;
    } else {
      const float lo = __shfl_xor_sync(kFullMask, st.lo, off);
      const float hi = __shfl_xor_sync(kFullMask, st.hi, off);
      st.lo = lo < st.lo ? lo : st.lo;
      st.hi = st.hi < hi ? hi : st.hi;
      st.first_zero = min(st.first_zero, __shfl_xor_sync(kFullMask, st.first_zero, off));
    }
  }
}

// write_group_scale() for absmax and minmax.
template <QuantKind K>
LC_DEV void stats_record(const GroupStats& st, float& s0, float& s1) {
  const float nan = qm::bits_f32(qm::kCanonicalNanF32);
  if constexpr (K == QuantKind::kMinmax) {
    const float first_zero = qm::bits_f32((st.first_zero & 1u) << 31);
    s0 = st.finite ? (st.lo == 0.0f ? first_zero : st.lo) : nan;
    s1 = st.finite ? (st.hi == 0.0f ? first_zero : st.hi) : nan;
  } else {
    s0 = st.finite ? st.amax : nan;
    s1 = 0.0f;
  }
}

// ---- q1: the mean |y| in the canonical tree order ----

// Leaves of the sum tree: |y| (times 2^-12 for the overflow fallback) for the unit's elements,
// zero for the padding.
template <bool kRescaled>
LC_DEV void abs_leaves(const float y[8], uint32_t count, float t[8], uint32_t& finite) {
#pragma unroll
  for (uint32_t j = 0; j < 8; ++j) {
    const bool valid = j < count;
    if (valid && !qm::is_finite(y[j])) finite = 0;
    const float a = kRescaled ? qm::mul(qm::abs_f(y[j]), qm::kMeanRescale) : qm::abs_f(y[j]);
    t[j] = valid ? a : 0.0f;
  }
}

// The group's tree sum of the leaves, returned to every lane of the group; `finite` is cleared
// for a lane that saw a non-finite value. With a single sweep the values are in y0 already.
template <DType D, CodecOp Op, bool kSingle, bool kRescaled>
LC_DEV float abs_tree_sum(const BlockEncodeArgs& a, uint64_t start, uint32_t count, uint32_t lane,
                          const float y0[8], uint32_t& finite) {
  const uint32_t sublane = lane & (a.lanes - 1);
  float t[8];
  if constexpr (kSingle) {
    abs_leaves<kRescaled>(y0, unit_count(count, 8 * sublane), t, finite);
  } else {
    // Strides >= 256: sweeps in bit-reversed order, summed pairwise; stack[l] holds the sum of
    // the last 2^l leaves not yet paired. After the last sweep `cur` is the whole sum.
    float stack[kSumLevels][8] = {};
    for (uint32_t m = 0; m < a.sweeps; ++m) {
      const uint32_t it = __brev(m) >> (32 - a.log2_sweeps);
      const uint32_t local = it * LaunchPolicy::kWarpSweep + 8 * sublane;
      const uint32_t cnt = unit_count(count, local);
      float y[8], mv[8] = {}, cur[8];
      load_source_unit<D, Op>(a.x, a.state, start + local, cnt, y, mv);
      abs_leaves<kRescaled>(y, cnt, cur, finite);
      bool carry = true;
#pragma unroll
      for (int l = 0; l < kSumLevels; ++l) {
        if (carry) {
          if ((m >> l) & 1u) {
#pragma unroll
            for (int j = 0; j < 8; ++j) cur[j] = qm::add(stack[l][j], cur[j]);
          } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) stack[l][j] = cur[j];
            carry = false;
          }
        }
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) t[j] = cur[j];
    }
  }
  // Strides 8 * off: lane + off holds the upper half. Lanes that read across their group's
  // edge only feed lanes whose results are never used.
  for (uint32_t off = a.lanes >> 1; off > 0; off >>= 1) {
#pragma unroll
    for (int j = 0; j < 8; ++j) t[j] = qm::add(t[j], __shfl_down_sync(kFullMask, t[j], off));
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) t[j] = qm::add(t[j], t[j + 4]);
  t[0] = qm::add(t[0], t[2]);
  t[1] = qm::add(t[1], t[3]);
  t[0] = qm::add(t[0], t[1]);
  return __shfl_sync(kFullMask, t[0], lane & ~(a.lanes - 1));
}

// write_group_scale() for q1, with its overflow fallback (quant_math.h, mean_abs). With a single
// sweep the lane's values are loaded into y0/m0 here.
template <DType D, CodecOp Op, bool kSingle>
LC_DEV float mean_abs_record(const BlockEncodeArgs& a, uint64_t start, uint32_t count,
                             uint32_t lane, float y0[8], float m0[8]) {
  if constexpr (kSingle) {
    const uint32_t local = 8 * (lane & (a.lanes - 1));
    load_source_unit<D, Op>(a.x, a.state, start + local, unit_count(count, local), y0, m0);
  }
  uint32_t finite = 1;
  const float sum = abs_tree_sum<D, Op, kSingle, false>(a, start, count, lane, y0, finite);
  for (uint32_t off = a.lanes >> 1; off > 0; off >>= 1) {
    finite &= __shfl_xor_sync(kFullMask, finite, off);
  }
  float mean = qm::mean_abs(sum, count);
  // A finite group whose sum overflowed is summed again, rescaled. The groups of a warp decide
  // alone but shuffle together, so the warp takes the second pass if any of its groups needs it.
  const bool overflow = count > 0 && finite && !qm::is_finite(mean);
  if (__any_sync(kFullMask, overflow)) {
    uint32_t ignored = 1;
    const float rescaled = abs_tree_sum<D, Op, kSingle, true>(a, start, count, lane, y0, ignored);
    if (overflow) mean = qm::rescaled_mean_abs(rescaled, count);
  }
  return finite ? mean : qm::bits_f32(qm::kCanonicalNanF32);
}

// ---- phase 2 ----

template <DType D, CodecOp Op, QuantKind K, bool SR, bool kSingle>
LC_DEV void quantize_group(const BlockEncodeArgs& a, const GroupQuant& q, uint64_t start,
                           uint32_t count, uint32_t sublane, const float y0[8], const float m0[8]) {
  const uint32_t sweep = 8 * a.lanes;
  const uint32_t sweeps = kSingle ? 1 : a.sweeps;
  for (uint32_t it = 0; it < sweeps; ++it) {
    const uint32_t local = it * sweep + 8 * sublane;
    if (local >= count) break;
    const uint32_t cnt = min(8u, count - local);
    const uint64_t i0 = start + local;
    float y[8], m[8] = {};
    if constexpr (kSingle) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        y[j] = y0[j];
        m[j] = m0[j];
      }
    } else {
      load_source_unit<D, Op>(a.x, a.state, i0, cnt, y, m);
    }
    uint32_t rnd[8] = {};
    if constexpr (SR) sr_draws8(a.seed, a.offset + i0, rnd);
    uint32_t codes[8];
    float s[8];
#pragma unroll
    for (uint32_t j = 0; j < 8; ++j) {
      codes[j] = 0;
      s[j] = 0.0f;
      if (j < cnt) codes[j] = encode_element<Op, K, SR>(q, y[j], m[j], a.bits, rnd[j], s[j]);
    }
    store_code_unit(a.packed, i0 / LaunchPolicy::kUnit, a.bits, qm::pack_unit(codes, a.bits));
    store_state_unit<D, Op>(a.state, i0, cnt, s);
  }
}

template <DType D, CodecOp Op, QuantKind K, bool SR, bool kSingle>
LC_DEV void encode_group(const BlockEncodeArgs& a, uint64_t g, uint32_t lane) {
  const uint32_t sublane = lane & (a.lanes - 1);
  const uint64_t start = g * a.block;
  const uint32_t count =
      g < a.groups ? static_cast<uint32_t>(min(static_cast<uint64_t>(a.block), a.n - start)) : 0u;
  float y0[8] = {}, m0[8] = {};
  float s0, s1 = 0.0f;
  if constexpr (K == QuantKind::kSign) {
    s0 = mean_abs_record<D, Op, kSingle>(a, start, count, lane, y0, m0);
  } else {
    GroupStats st = empty_stats();
    if constexpr (kSingle) {
      const uint32_t local = 8 * sublane, cnt = unit_count(count, local);
      load_source_unit<D, Op>(a.x, a.state, start + local, cnt, y0, m0);
      add_values<K>(st, y0, cnt, local);
    } else {
      for (uint32_t it = 0; it < a.sweeps; ++it) {
        const uint32_t local = it * LaunchPolicy::kWarpSweep + 8 * sublane;
        const uint32_t cnt = unit_count(count, local);
        float y[8], mv[8] = {};
        load_source_unit<D, Op>(a.x, a.state, start + local, cnt, y, mv);
        add_values<K>(st, y, cnt, local);
      }
    }
    reduce_stats<K>(st, a.lanes);
    stats_record<K>(st, s0, s1);
  }
  if (count > 0 && sublane == 0) {
    if constexpr (K == QuantKind::kMinmax) {
      store_scale(a.payload, 2 * g, s0);
      store_scale(a.payload, 2 * g + 1, s1);
    } else {
      store_scale(a.payload, g, s0);
    }
  }
  const GroupQuant q = group_for_encode<K>(s0, s1, a.bits);
  quantize_group<D, Op, K, SR, kSingle>(a, q, start, count, sublane, y0, m0);
}

template <DType D, CodecOp Op, QuantKind K, bool SR, bool kSingle>
__global__ void __launch_bounds__(LaunchPolicy::kThreads) block_encode_kernel(BlockEncodeArgs a) {
  const uint32_t lane = threadIdx.x % LaunchPolicy::kWarp;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x / LaunchPolicy::kWarp;
  const uint32_t groups_per_warp = LaunchPolicy::kWarp / a.lanes;
  const uint32_t sub = lane / a.lanes;
  // The loop condition is uniform across a warp, so every lane reaches every shuffle.
  for (uint64_t w =
           (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / LaunchPolicy::kWarp;
       w < a.warp_tasks; w += stride) {
    encode_group<D, Op, K, SR, kSingle>(a, w * groups_per_warp + sub, lane);
  }
}

template <DType D, CodecOp Op, bool kSingle>
cudaError_t launch_op(const CodecJob& job, const BlockEncodePlan& plan, const BlockEncodeArgs& a,
                      cudaStream_t stream) {
  const dim3 grid(plan.grid.blocks), block(plan.grid.threads);
  const bool sr = job.spec.rounding == Rounding::kStochastic;
  if (job.spec.kind == CodecKind::kMinmax) {
    if (sr) {
      block_encode_kernel<D, Op, QuantKind::kMinmax, true, kSingle><<<grid, block, 0, stream>>>(a);
    } else {
      block_encode_kernel<D, Op, QuantKind::kMinmax, false, kSingle><<<grid, block, 0, stream>>>(a);
    }
  } else if (job.spec.bits == 1) {  // validate_spec rules out q1 with stochastic rounding
    block_encode_kernel<D, Op, QuantKind::kSign, false, kSingle><<<grid, block, 0, stream>>>(a);
  } else if (sr) {
    block_encode_kernel<D, Op, QuantKind::kAbsmax, true, kSingle><<<grid, block, 0, stream>>>(a);
  } else {
    block_encode_kernel<D, Op, QuantKind::kAbsmax, false, kSingle><<<grid, block, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <DType D, bool kSingle>
cudaError_t launch_dtype(const CodecJob& job, const BlockEncodePlan& plan, const BlockEncodeArgs& a,
                         cudaStream_t stream) {
  switch (job.op) {
    case CodecOp::kEncode:
      return launch_op<D, CodecOp::kEncode, kSingle>(job, plan, a, stream);
    case CodecOp::kEncodeFeedback:
      return launch_op<D, CodecOp::kEncodeFeedback, kSingle>(job, plan, a, stream);
    case CodecOp::kEncodeDelta:
      return launch_op<D, CodecOp::kEncodeDelta, kSingle>(job, plan, a, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template <bool kSingle>
cudaError_t launch_block_encode_sweeps(const CodecJob& job, const BlockEncodePlan& plan,
                                       cudaStream_t stream) {
  BlockEncodeArgs a{};
  a.x = job.x;
  a.state = job.state;
  a.payload = job.payload;
  a.packed = job.packed();
  a.n = job.n;
  a.groups = job.groups();
  a.warp_tasks = plan.warp_tasks;
  a.seed = job.key.seed;
  a.offset = job.key.offset;
  a.block = job.spec.block;
  a.lanes = plan.lanes;
  a.sweeps = plan.sweeps;
  a.log2_sweeps = plan.log2_sweeps;
  a.bits = job.spec.bits;
  switch (job.dtype) {
    case DType::kFloat32:
      return launch_dtype<DType::kFloat32, kSingle>(job, plan, a, stream);
    case DType::kBFloat16:
      return launch_dtype<DType::kBFloat16, kSingle>(job, plan, a, stream);
    case DType::kFloat16:
      return launch_dtype<DType::kFloat16, kSingle>(job, plan, a, stream);
    default:  // not a codec dtype: check_codec_job refused it
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace lowcomm::cuda::block_encode
