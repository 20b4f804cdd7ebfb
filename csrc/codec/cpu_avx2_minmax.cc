// AVX2 path for the min-max codecs (minmax2/4/8): block-grouped encodes (plain, error feedback,
// AQ-SGD delta; round to nearest or stochastic) and block-grouped decodes. The grid is computed
// in double as in quant_math.h, op for op, four lanes per instruction; each group is read from
// memory once and staged in L1, as in cpu_avx2.cc. avx2_range (cpu_avx2.cc) decides what comes
// here.

#include <immintrin.h>

#include <cstring>

#include "codec/avx2_lanes.h"
#include "codec/avx2_philox.h"
#include "codec/cpu_kernels.h"
#include "codec/element_io.h"
#include "codec/group_math.h"

namespace lowcomm::cpu {
namespace {

// The first of y[] that compares equal to m, which is one of them. The portable path keeps the
// first of equal candidates (std::min / std::max), which only shows in the sign of a zero extreme.
inline float first_equal(const float* y, float m) {
  uint32_t k = 0;
  while (!(y[k] == m)) ++k;
  return y[k];
}

// The grid of one finite group, as qm::minmax_params and qm::minmax_code compute it.
struct MinmaxLanes {
  __m256d lo, inv, step, top;
};

// Codes (rounded and clamped as double) of four values under the group's grid; `thr` holds
// their stochastic-rounding thresholds (sr_thresholds8).
[[gnu::always_inline]] inline __m256d minmax_codes4(__m128 v, const MinmaxLanes& p, bool sr,
                                                    __m128 thr) {
  const __m256d y = _mm256_mul_pd(_mm256_sub_pd(_mm256_cvtps_pd(v), p.lo), p.inv);
  __m256d k;
  if (sr) {
    const __m256d f = _mm256_floor_pd(y);
    const __m256d up = _mm256_and_pd(
        _mm256_cmp_pd(_mm256_cvtps_pd(thr), _mm256_sub_pd(y, f), _CMP_LT_OQ), _mm256_set1_pd(1.0));
    k = _mm256_add_pd(f, up);
  } else {
    k = _mm256_round_pd(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // max(k, +0) with +0 second: a rounded -0 becomes +0, the value of the integer code 0.
  return _mm256_min_pd(_mm256_max_pd(k, _mm256_setzero_pd()), p.top);
}

// fp32 value of four codes held as double: lo + k * step, rounded once (qm::minmax_value).
[[gnu::always_inline]] inline __m128 minmax_values4(__m256d k, const MinmaxLanes& p) {
  return _mm256_cvtpd_ps(_mm256_add_pd(p.lo, _mm256_mul_pd(k, p.step)));
}

MinmaxLanes minmax_lanes(const qm::MinmaxParams& p, int bits) {
  return MinmaxLanes{_mm256_set1_pd(p.lo), _mm256_set1_pd(p.inv), _mm256_set1_pd(p.step),
                     _mm256_set1_pd(static_cast<double>((1 << bits) - 1))};
}

template <DType D, CodecOp Op>
void minmax_encode_group(const CodecJob& job, uint64_t start, float* y, RangeDraws& draws) {
  const uint32_t g = job.spec.block;
  const int bits = job.spec.bits;
  const uint64_t group = start / g;
  uint8_t* packed = job.packed() + start / 8 * bits;

  const __m256 inf = _mm256_set1_ps(__builtin_inff());
  __m256 min0 = inf, min1 = inf;
  __m256 max0 = _mm256_sub_ps(_mm256_setzero_ps(), inf), max1 = max0;
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
    finite0 = _mm256_and_ps(finite0, _mm256_cmp_ps(abs8(v0), flt_max, _CMP_LE_OQ));
    finite1 = _mm256_and_ps(finite1, _mm256_cmp_ps(abs8(v1), flt_max, _CMP_LE_OQ));
    min0 = _mm256_min_ps(min0, v0);
    min1 = _mm256_min_ps(min1, v1);
    max0 = _mm256_max_ps(max0, v0);
    max1 = _mm256_max_ps(max1, v1);
  }
  float* scales = job.scales();
  if (_mm256_movemask_ps(_mm256_and_ps(finite0, finite1)) != 0xFF) {
    scales[2 * group] = scales[2 * group + 1] = qm::bits_f32(qm::kCanonicalNanF32);
    std::memset(packed, 0, g / 8 * bits);
    if constexpr (Op == CodecOp::kEncodeFeedback) {
      std::memset(static_cast<float*>(state) + start, 0, g * sizeof(float));
    } else if constexpr (Op == CodecOp::kEncodeDelta) {
      std::memset(static_cast<uint8_t*>(state) + start * dtype_size(D), 0, g * dtype_size(D));
    }
    return;
  }
  // Min and max of finite values are exact in any order, up to the sign of a zero.
  const __m256 vmin = _mm256_min_ps(min0, min1), vmax = _mm256_max_ps(max0, max1);
  __m128 m4 = _mm_min_ps(_mm256_castps256_ps128(vmin), _mm256_extractf128_ps(vmin, 1));
  m4 = _mm_min_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_min_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  __m128 x4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  x4 = _mm_max_ps(x4, _mm_movehl_ps(x4, x4));
  x4 = _mm_max_ss(x4, _mm_shuffle_ps(x4, x4, 1));
  float lo = _mm_cvtss_f32(m4), hi = _mm_cvtss_f32(x4);
  if (lo == 0.0f) lo = first_equal(y, lo);
  if (hi == 0.0f) hi = first_equal(y, hi);
  scales[2 * group] = lo;
  scales[2 * group + 1] = hi;
  const MinmaxLanes p = minmax_lanes(qm::minmax_params(lo, hi, bits), bits);
  const bool sr = job.spec.rounding == Rounding::kStochastic;
  const SrDraw* rnd = sr ? draws.group(start, g) : nullptr;

  for (uint32_t k = 0; k < g; k += 32) {
    __m256i codes[4];
    for (int u = 0; u < 4; ++u) {
      const uint64_t i = start + k + 8 * u;
      const __m256 v = _mm256_load_ps(y + k + 8 * u);
      const __m256 thr = sr ? sr_thresholds8(rnd + (i - start)) : _mm256_setzero_ps();
      const __m256d k0 =
          minmax_codes4(_mm256_castps256_ps128(v), p, sr, _mm256_castps256_ps128(thr));
      const __m256d k1 =
          minmax_codes4(_mm256_extractf128_ps(v, 1), p, sr, _mm256_extractf128_ps(thr, 1));
      codes[u] = _mm256_set_m128i(_mm256_cvttpd_epi32(k1), _mm256_cvttpd_epi32(k0));
      if constexpr (Op != CodecOp::kEncode) {
        const __m256 dec = _mm256_set_m128(minmax_values4(k1, p), minmax_values4(k0, p));
        if constexpr (Op == CodecOp::kEncodeFeedback) {
          _mm256_storeu_ps(static_cast<float*>(state) + i, canonical8(_mm256_sub_ps(v, dec)));
        } else {
          store8<D>(state, i, _mm256_add_ps(load8<D>(state, i), dec));
        }
      }
    }
    pack32(codes, bits, packed + k / 8 * bits);
  }
}

template <DType D, CodecOp Op>
void minmax_encode_blocks(const CodecJob& job, uint64_t begin, uint64_t end) {
  alignas(32) float y[kMaxBlock];
  RangeDraws draws(job.key, end);
  for (uint64_t start = begin; start < end; start += job.spec.block) {
    minmax_encode_group<D, Op>(job, start, y, draws);
  }
}

// Block-grouped decodes: each group's grid is derived once from its (lo, hi) record.
template <DType D, CodecOp Op>
void minmax_decode_units(const CodecJob& job, uint64_t begin, uint64_t end) {
  const int bits = job.spec.bits;
  const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(qm::kCanonicalNanF32)));
  const uint8_t* packed = job.packed();
  const int block_shift = __builtin_ctz(job.spec.block);
  void* out = job.out;
  void* state = job.state;
  constexpr uint64_t kElemBytes = D == DType::kFloat32 ? 4 : 2;
  const char* prefetch =
      static_cast<const char*>(Op == CodecOp::kDecodeDelta ? state : out) + kPrefetchBytes;
  uint64_t cur_group = UINT64_MAX;
  MinmaxLanes p{};
  __m256 finite = _mm256_setzero_ps();
  for (uint64_t i = begin; i < end; i += 8) {
    if constexpr (Op != CodecOp::kDecode) {
      if (i * kElemBytes % 64 == 0) _mm_prefetch(prefetch + i * kElemBytes, _MM_HINT_T0);
    }
    if ((i >> block_shift) != cur_group) {
      cur_group = i >> block_shift;
      const GroupDecode gd = group_decode(job, cur_group);
      finite = gd.finite ? _mm256_castsi256_ps(_mm256_set1_epi32(-1)) : _mm256_setzero_ps();
      p = minmax_lanes(gd.mm, bits);
    }
    const __m256i code = unpack8(packed, i / 8, bits);
    const __m256d k0 = _mm256_cvtepi32_pd(_mm256_castsi256_si128(code));
    const __m256d k1 = _mm256_cvtepi32_pd(_mm256_extracti128_si256(code, 1));
    __m256 dec = _mm256_set_m128(minmax_values4(k1, p), minmax_values4(k0, p));
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

}  // namespace

void avx2_minmax_range(const CodecJob& job, uint64_t begin, uint64_t end) {
  with_dtype(job.dtype, [&]<DType D>() {
    switch (job.op) {
      case CodecOp::kEncode:
        return minmax_encode_blocks<D, CodecOp::kEncode>(job, begin, end);
      case CodecOp::kEncodeFeedback:
        return minmax_encode_blocks<D, CodecOp::kEncodeFeedback>(job, begin, end);
      case CodecOp::kEncodeDelta:
        return minmax_encode_blocks<D, CodecOp::kEncodeDelta>(job, begin, end);
      case CodecOp::kDecode:
        return minmax_decode_units<D, CodecOp::kDecode>(job, begin, end);
      case CodecOp::kDecodeAccumulate:
        return minmax_decode_units<D, CodecOp::kDecodeAccumulate>(job, begin, end);
      default:
        return minmax_decode_units<D, CodecOp::kDecodeDelta>(job, begin, end);
    }
  });
}

}  // namespace lowcomm::cpu
