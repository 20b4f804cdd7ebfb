// AVX2 path for the absmax codecs (q1..q8), the hot path of the compressed all-reduce and of
// AQ-SGD links, and for the min-max codecs (minmax2/4/8). It computes exactly what
// cpu_scalar.cc computes, op for op in the same order (compiled with -ffp-contract=off, no FMA),
// eight elements per instruction (four for the min-max grid, which is computed in double):
//   encodes: block groups, one pass over memory per group: y is staged in a block-sized buffer
//            (stays in L1), the scale record is reduced from it, then codes are packed from it;
//            stochastic rounding draws the group's random bits first (avx2_philox.h), four
//            Philox counters per instruction;
//   decodes: block groups, and column groups of the absmax codecs (col= a multiple of 8).
// Anything else, and the partial group at a tensor's end, is handed to the scalar path.

#include <cpuid.h>
#include <immintrin.h>

#include <cstring>

#include "codec/avx2_lanes.h"
#include "codec/avx2_philox.h"
#include "codec/cpu_kernels.h"
#include "codec/element_io.h"
#include "codec/group_math.h"

namespace lowcomm::cpu {
namespace {

// ---- the canonical tree sum (group_math.h) over a full block in t[0..g) ----

float tree_sum8(float* t, uint32_t g) {
  for (uint32_t s = g / 2; s >= 8; s /= 2) {
    for (uint32_t i = 0; i < s; i += 8) {
      _mm256_storeu_ps(t + i, _mm256_add_ps(_mm256_loadu_ps(t + i), _mm256_loadu_ps(t + i + s)));
    }
  }
  __m256 v = _mm256_loadu_ps(t);
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // stride 4
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));                                         // stride 2
  a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));                                     // stride 1
  return _mm_cvtss_f32(a);
}

// ---- block encode ----

template <DType D, CodecOp Op>
void encode_group(const CodecJob& job, uint64_t start, float* y, float* t, RangeDraws& draws) {
  const uint32_t g = job.spec.block;
  const int bits = job.spec.bits;
  const uint64_t group = start / g;
  uint8_t* packed = job.packed() + start / 8 * bits;

  // Two accumulators of each kind halve the loop-carried dependency chains.
  __m256 amax0 = _mm256_setzero_ps(), amax1 = _mm256_setzero_ps();
  const __m256 all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  __m256 finite0 = all, finite1 = all;
  const __m256 flt_max = _mm256_set1_ps(qm::kFltMax);
  const void* x = job.x;
  void* state = job.state;
  constexpr uint64_t kElemBytes = D == DType::kFloat32 ? 4 : 2;
  const char* prefetch = static_cast<const char*>(x) + start * kElemBytes + kPrefetchBytes;
  for (uint32_t k = 0; k < g; k += 16) {
    _mm_prefetch(prefetch + k * kElemBytes, _MM_HINT_T0);
    if constexpr (kElemBytes == 4) _mm_prefetch(prefetch + k * kElemBytes + 32, _MM_HINT_T0);
    __m256 v0 = source8<D, Op>(x, state, start + k);
    __m256 v1 = source8<D, Op>(x, state, start + k + 8);
    _mm256_store_ps(y + k, v0);
    _mm256_store_ps(y + k + 8, v1);
    __m256 a0 = abs8(v0), a1 = abs8(v1);
    finite0 = _mm256_and_ps(finite0, _mm256_cmp_ps(a0, flt_max, _CMP_LE_OQ));
    finite1 = _mm256_and_ps(finite1, _mm256_cmp_ps(a1, flt_max, _CMP_LE_OQ));
    amax0 = _mm256_max_ps(amax0, a0);
    amax1 = _mm256_max_ps(amax1, a1);
  }
  const __m256 amax = _mm256_max_ps(amax0, amax1);
  if (_mm256_movemask_ps(_mm256_and_ps(finite0, finite1)) !=
      0xFF) {  // non-finite group: NaN scale, zero codes, reset state
    job.scales()[group] = qm::bits_f32(qm::kCanonicalNanF32);
    std::memset(packed, 0, g / 8 * bits);
    if constexpr (Op == CodecOp::kEncodeFeedback) {
      std::memset(static_cast<float*>(state) + start, 0, g * sizeof(float));
    } else if constexpr (Op == CodecOp::kEncodeDelta) {
      std::memset(static_cast<uint8_t*>(state) + start * dtype_size(D), 0, g * dtype_size(D));
    }
    return;
  }

  if (bits == 1) {
    for (uint32_t k = 0; k < g; k += 8) _mm256_store_ps(t + k, abs8(_mm256_load_ps(y + k)));
    float mean = qm::mean_abs(tree_sum8(t, g), g);
    if (!qm::is_finite(mean)) {  // the sum overflowed: rescaled tree, as in quant_math.h
      const __m256 rescale = _mm256_set1_ps(qm::kMeanRescale);
      for (uint32_t k = 0; k < g; k += 8) {
        _mm256_store_ps(t + k, _mm256_mul_ps(abs8(_mm256_load_ps(y + k)), rescale));
      }
      mean = qm::rescaled_mean_abs(tree_sum8(t, g), g);
    }
    job.scales()[group] = mean;
    __m256 pos = _mm256_set1_ps(mean), neg = _mm256_set1_ps(-mean);
    for (uint32_t k = 0; k < g; k += 8) {
      __m256 v = _mm256_load_ps(y + k);
      __m256 is_neg = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ);
      packed[k / 8] = static_cast<uint8_t>(_mm256_movemask_ps(is_neg));
      __m256 dec = _mm256_blendv_ps(pos, neg, is_neg);
      if constexpr (Op == CodecOp::kEncodeFeedback) {
        _mm256_storeu_ps(static_cast<float*>(state) + start + k, _mm256_sub_ps(v, dec));
      } else if constexpr (Op == CodecOp::kEncodeDelta) {
        store8<D>(state, start + k, _mm256_add_ps(load8<D>(state, start + k), dec));
      }
    }
    return;
  }

  // Reduce the absmax across lanes (max is exact, so order does not matter).
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float absmax = _mm_cvtss_f32(m4);
  job.scales()[group] = absmax;
  const qm::AbsmaxParams p = qm::absmax_params(absmax, bits);
  const __m256 pre = _mm256_set1_ps(p.pre), inv = _mm256_set1_ps(p.inv);
  const __m256 lo = _mm256_set1_ps(-qm::pow2i(bits - 1));
  const __m256 hi = _mm256_set1_ps(qm::pow2i(bits - 1) - 1.0f);
  const __m256i offset = _mm256_set1_epi32(1 << (bits - 1));
  const __m256 unit_step = _mm256_set1_ps(qm::pow2i(1 - bits));
  const __m256 scale = _mm256_set1_ps(absmax);
  const bool sr = job.spec.rounding == Rounding::kStochastic;
  const SrDraw* rnd = sr ? draws.group(start, g) : nullptr;

  for (uint32_t k = 0; k < g; k += 32) {
    __m256i codes[4];
    for (int u = 0; u < 4; ++u) {
      const uint64_t i = start + k + 8 * u;
      __m256 v = _mm256_load_ps(y + k + 8 * u);
      __m256 s = _mm256_mul_ps(_mm256_mul_ps(v, pre), inv);
      __m256 q;
      if (sr) {
        const __m256 thr = sr_thresholds8(rnd + (i - start));
        __m256 f = _mm256_floor_ps(s);
        __m256 up = _mm256_and_ps(_mm256_cmp_ps(thr, _mm256_sub_ps(s, f), _CMP_LT_OQ),
                                  _mm256_set1_ps(1.0f));
        q = _mm256_add_ps(f, up);
      } else {
        q = _mm256_round_ps(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      }
      q = _mm256_min_ps(_mm256_max_ps(q, lo), hi);
      codes[u] = _mm256_add_epi32(_mm256_cvttps_epi32(q), offset);
      if constexpr (Op != CodecOp::kEncode) {
        // q + 0 turns a rounded -0 into +0, as decoding the integer code does.
        __m256 kf = _mm256_add_ps(q, _mm256_setzero_ps());
        __m256 dec = _mm256_mul_ps(_mm256_mul_ps(kf, unit_step), scale);
        if constexpr (Op == CodecOp::kEncodeFeedback) {
          _mm256_storeu_ps(static_cast<float*>(state) + i, _mm256_sub_ps(v, dec));
        } else {
          store8<D>(state, i, _mm256_add_ps(load8<D>(state, i), dec));
        }
      }
    }
    pack32(codes, bits, packed + k / 8 * bits);
  }
}

template <DType D, CodecOp Op>
void encode_blocks(const CodecJob& job, uint64_t begin, uint64_t end) {
  alignas(32) float y[kMaxBlock];  // the group's values, staged for the second pass
  alignas(32) float t[kMaxBlock];  // q1: scratch for the tree sum
  RangeDraws draws(job.key, end);  // stochastic rounding: the group's random bits
  for (uint64_t start = begin; start < end; start += job.spec.block) {
    encode_group<D, Op>(job, start, y, t, draws);
  }
}

// ---- decodes ----

template <DType D, CodecOp Op>
void decode_units(const CodecJob& job, uint64_t begin, uint64_t end) {
  const int bits = job.spec.bits;
  const bool column = job.spec.grouping == Grouping::kColumn;
  const __m256i offset = _mm256_set1_epi32(1 << (bits - 1));
  const __m256 unit_step = _mm256_set1_ps(qm::pow2i(1 - bits));
  const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(qm::kCanonicalNanF32)));
  const float* scales = job.scales();
  const uint8_t* packed = job.packed();
  const uint64_t cols = job.spec.cols;
  const int block_shift = __builtin_ctz(job.spec.block);  // blocks are powers of two
  void* out = job.out;
  void* state = job.state;
  constexpr uint64_t kElemBytes = D == DType::kFloat32 ? 4 : 2;
  const char* prefetch =
      static_cast<const char*>(Op == CodecOp::kDecodeDelta ? state : out) + kPrefetchBytes;
  uint64_t col = column ? begin % cols : 0;  // advanced by 8 per unit: no division in the loop
  for (uint64_t i = begin; i < end; i += 8) {
    if constexpr (Op != CodecOp::kDecode) {
      if (i * kElemBytes % 64 == 0) _mm_prefetch(prefetch + i * kElemBytes, _MM_HINT_T0);
    }
    __m256 scale;
    if (column) {
      scale = _mm256_loadu_ps(scales + col);
      col += 8;
      if (col == cols) col = 0;
    } else {
      scale = _mm256_set1_ps(scales[i >> block_shift]);
    }
    __m256 finite = finite_mask8(scale);
    __m256i code = unpack8(packed, i / 8, bits);
    __m256 dec;
    if (bits == 1) {
      __m256 neg = _mm256_castsi256_ps(_mm256_cmpeq_epi32(code, _mm256_set1_epi32(1)));
      dec = _mm256_blendv_ps(scale, _mm256_sub_ps(_mm256_setzero_ps(), scale), neg);
    } else {
      __m256 k = _mm256_cvtepi32_ps(_mm256_sub_epi32(code, offset));
      dec = _mm256_mul_ps(_mm256_mul_ps(k, unit_step), scale);
    }
    dec = _mm256_blendv_ps(nan, dec, finite);
    if constexpr (Op == CodecOp::kDecode) {
      store8<D>(out, i, dec);
    } else if constexpr (Op == CodecOp::kDecodeAccumulate) {
      store8<D>(out, i, _mm256_add_ps(load8<D>(out, i), dec));
    } else {  // kDecodeDelta: non-finite groups reset m to 0 and output NaN
      store8<D>(state, i, _mm256_and_ps(finite, _mm256_add_ps(load8<D>(state, i), dec)));
      if (out) store8<D>(out, i, _mm256_blendv_ps(nan, load8<D>(state, i), finite));
    }
  }
}

// ---- passthrough (a float wire dtype): conversions and sums, 8 elements at a time ----
// The same element rule as the portable path (cpu_scalar.cc passthrough_range): stores round to
// nearest even and write the canonical NaN; state resets to 0 where the wire value is not
// finite.

template <DType D, DType W, CodecOp Op>
void passthrough_units(const CodecJob& job, uint64_t begin, uint64_t end) {
  void* wire = job.payload;
  constexpr uint64_t kElemBytes = D == DType::kFloat32 ? 4 : 2;
  // The buffer read and written in place (decode-accumulate: out; delta ops: state); the other
  // ops have none, and their null `out` must not even be offset.
  [[maybe_unused]] const char* inplace =
      static_cast<const char*>(Op == CodecOp::kDecodeAccumulate ? job.out : job.state);
  for (uint64_t i = begin; i < end; i += 8) {
    if constexpr (Op == CodecOp::kDecodeAccumulate || Op == CodecOp::kDecodeDelta ||
                  Op == CodecOp::kEncodeDelta) {
      if (i * kElemBytes % 64 == 0)
        _mm_prefetch(inplace + kPrefetchBytes + i * kElemBytes, _MM_HINT_T0);
    }
    if constexpr (Op == CodecOp::kEncode) {
      store8<W>(wire, i, load8<D>(job.x, i));
    } else if constexpr (Op == CodecOp::kEncodeFeedback) {
      float* r = static_cast<float*>(job.state);
      __m256 y = _mm256_add_ps(load8<D>(job.x, i), _mm256_loadu_ps(r + i));
      store8<W>(wire, i, y);
      __m256 dec = load8<W>(wire, i);
      _mm256_storeu_ps(r + i, _mm256_and_ps(finite_mask8(dec), canonical8(_mm256_sub_ps(y, dec))));
    } else if constexpr (Op == CodecOp::kEncodeDelta) {
      __m256 m = load8<D>(job.state, i);
      store8<W>(wire, i, _mm256_sub_ps(load8<D>(job.x, i), m));
      __m256 dec = load8<W>(wire, i);
      store8<D>(job.state, i, _mm256_and_ps(finite_mask8(dec), _mm256_add_ps(m, dec)));
    } else if constexpr (Op == CodecOp::kDecode) {
      store8<D>(job.out, i, load8<W>(wire, i));
    } else if constexpr (Op == CodecOp::kDecodeAccumulate) {
      store8<D>(job.out, i, _mm256_add_ps(load8<D>(job.out, i), load8<W>(wire, i)));
    } else {  // kDecodeDelta
      __m256 dec = load8<W>(wire, i);
      __m256 finite = finite_mask8(dec);
      store8<D>(job.state, i, _mm256_and_ps(finite, _mm256_add_ps(load8<D>(job.state, i), dec)));
      if (job.out) store8<D>(job.out, i, _mm256_blendv_ps(dec, load8<D>(job.state, i), finite));
    }
  }
}

template <DType D, DType W>
void passthrough_dispatch(const CodecJob& job, uint64_t begin, uint64_t end) {
  switch (job.op) {
    case CodecOp::kEncode:
      return passthrough_units<D, W, CodecOp::kEncode>(job, begin, end);
    case CodecOp::kEncodeFeedback:
      return passthrough_units<D, W, CodecOp::kEncodeFeedback>(job, begin, end);
    case CodecOp::kEncodeDelta:
      return passthrough_units<D, W, CodecOp::kEncodeDelta>(job, begin, end);
    case CodecOp::kDecode:
      return passthrough_units<D, W, CodecOp::kDecode>(job, begin, end);
    case CodecOp::kDecodeAccumulate:
      return passthrough_units<D, W, CodecOp::kDecodeAccumulate>(job, begin, end);
    default:
      return passthrough_units<D, W, CodecOp::kDecodeDelta>(job, begin, end);
  }
}

bool passthrough_range(const CodecJob& job, uint64_t begin, uint64_t end) {
  const uint64_t vec_end = begin + (end - begin) / 8 * 8;
  with_dtype(job.dtype, [&]<DType D>() {
    with_dtype(job.spec.wire_dtype,
               [&]<DType W>() { passthrough_dispatch<D, W>(job, begin, vec_end); });
  });
  if (vec_end < end) scalar_range(job, vec_end, end);
  return true;
}

}  // namespace

bool avx2_supported() {
  // clang 14 knows no "f16c" for __builtin_cpu_supports; read CPUID leaf 1 for it.
  static const bool ok = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
    return f16c && __builtin_cpu_supports("avx2");
  }();
  return ok;
}

bool avx2_range(const CodecJob& job, uint64_t begin, uint64_t end) {
  // Error feedback with decay: the scalar path (one more multiply per element).
  if (job.op == CodecOp::kEncodeFeedback && job.spec.ef_decay != 1.0f) return false;
  if (job.spec.kind == CodecKind::kNone) return passthrough_range(job, begin, end);
  const bool minmax = job.spec.kind == CodecKind::kMinmax;
  const bool encode = is_encode(job.op);
  if (encode && job.spec.grouping != Grouping::kBlock) return false;
  if (!encode && job.spec.grouping == Grouping::kColumn && (minmax || job.spec.cols % 8 != 0))
    return false;
  // Whole blocks (encode) or whole units (decode) here; the tensor's ragged end goes scalar.
  const uint64_t align = encode ? job.spec.block : 8;
  const uint64_t vec_end = end == job.n ? end / align * align : end;
  if (vec_end < begin) return false;
  if (minmax) {
    avx2_minmax_range(job, begin, vec_end);
    if (vec_end < end) scalar_range(job, vec_end, end);
    return true;
  }
  with_dtype(job.dtype, [&]<DType D>() {
    if (job.op == CodecOp::kEncode) {
      encode_blocks<D, CodecOp::kEncode>(job, begin, vec_end);
    } else if (job.op == CodecOp::kEncodeFeedback) {
      encode_blocks<D, CodecOp::kEncodeFeedback>(job, begin, vec_end);
    } else if (job.op == CodecOp::kEncodeDelta) {
      encode_blocks<D, CodecOp::kEncodeDelta>(job, begin, vec_end);
    } else if (job.op == CodecOp::kDecode) {
      decode_units<D, CodecOp::kDecode>(job, begin, vec_end);
    } else if (job.op == CodecOp::kDecodeAccumulate) {
      decode_units<D, CodecOp::kDecodeAccumulate>(job, begin, vec_end);
    } else {
      decode_units<D, CodecOp::kDecodeDelta>(job, begin, vec_end);
    }
  });
  if (vec_end < end) scalar_range(job, vec_end, end);
  return true;
}

}  // namespace lowcomm::cpu
