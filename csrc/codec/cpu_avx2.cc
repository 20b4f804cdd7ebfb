// AVX2 path for the absmax codecs (q1..q8), the hot path of the compressed all-reduce and of
// AQ-SGD links, and for the min-max codecs (minmax2/4/8). It computes exactly what
// cpu_scalar.cc computes, op for op in the same order (compiled with -ffp-contract=off, no FMA),
// eight elements per instruction (four for the min-max grid, which is computed in double):
//   encodes: block groups, one pass over memory per group: y is staged in a block-sized buffer
//            (stays in L1), the scale record is reduced from it, then codes are packed from it;
//            stochastic rounding draws the group's Philox words first, four counters per
//            instruction;
//   decodes: block groups, and column groups of the absmax codecs (col= a multiple of 8).
// Anything else, and the partial group at a tensor's end, is handed to the scalar path.

#include <cpuid.h>
#include <immintrin.h>

#include <cstring>

#include "codec/cpu_kernels.h"
#include "codec/element_io.h"
#include "codec/group_math.h"

namespace lowcomm::cpu {
namespace {

// ---- loads and stores of 8 elements ----

template <DType D>
__m256 load8(const void* base, uint64_t i) {
  if constexpr (D == DType::kFloat32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else {
    __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    if constexpr (D == DType::kBFloat16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  }
}

inline __m256 canonical8(__m256 v) {
  __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(qm::kCanonicalNanF32)));
  return _mm256_blendv_ps(v, nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

template <DType D>
void store8(void* base, uint64_t i, __m256 v) {
  if constexpr (D == DType::kFloat32) {
    _mm256_storeu_ps(static_cast<float*>(base) + i, canonical8(v));
  } else {
    __m256i isnan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    __m128i nan16 =
        _mm_packs_epi32(_mm256_castsi256_si128(isnan), _mm256_extracti128_si256(isnan, 1));
    __m128i h;
    if constexpr (D == DType::kBFloat16) {
      __m256i u = _mm256_castps_si256(v);
      __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
      u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
      u = _mm256_srli_epi32(u, 16);
      h = _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
      h = _mm_blendv_epi8(h, _mm_set1_epi16(static_cast<short>(qm::kCanonicalNanBF16)), nan16);
    } else {
      h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      h = _mm_blendv_epi8(h, _mm_set1_epi16(static_cast<short>(qm::kCanonicalNanF16)), nan16);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(base) + i), h);
  }
}

inline __m256 abs8(__m256 v) {
  return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
}

// All ones where v is finite (|v| <= FLT_MAX; false for NaN and infinities).
inline __m256 finite_mask8(__m256 v) {
  return _mm256_cmp_ps(abs8(v), _mm256_set1_ps(qm::kFltMax), _CMP_LE_OQ);
}

// ---- the encode source: y = x, x + r, or a - m ----

template <DType D, CodecOp Op>
__m256 source8(const void* x, const void* state, uint64_t i) {
  __m256 v = load8<D>(x, i);
  if constexpr (Op == CodecOp::kEncodeFeedback) {
    return _mm256_add_ps(v, _mm256_loadu_ps(static_cast<const float*>(state) + i));
  } else if constexpr (Op == CodecOp::kEncodeDelta) {
    return _mm256_sub_ps(v, load8<D>(state, i));
  } else {
    return v;
  }
}

// How far ahead of the current group to prefetch: keeps the memory system busy while the
// previous group is being quantized from L1.
constexpr uint64_t kPrefetchBytes = 4096;

// Sets of four Philox counters generated together (see philox4xN): 4 sets fill the vector
// pipes; 2 leave them waiting on the multiplies' latency, 6 measured no faster.
constexpr int kPhiloxSets = 4;

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

// ---- random words for a whole group, four Philox counters per instruction ----

// The key schedule of Philox4x32-10 under `seed`: keys[2r], keys[2r+1] are round r's k0, k1.
inline void philox_keys(uint64_t seed, __m256i keys[20]) {
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    keys[2 * round] = _mm256_set1_epi32(static_cast<int>(k0));
    keys[2 * round + 1] = _mm256_set1_epi32(static_cast<int>(k1));
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

// Philox4x32-10 (qm::philox, the same rounds) for counters c .. c+4N-1; words[4*l + w] is word w
// of counter c + l. Each 64-bit lane carries one counter, its word in the low half: that is
// where _mm256_mul_epu32 reads its factor and leaves the product's low word, so a round is two
// multiplies, two shifts (the high words) and four xors, with no shuffling. The high halves of
// the lanes hold junk that never reaches a low half. N independent sets of four counters are
// interleaved so that the multiplies' latency overlaps. keys[2r], keys[2r+1]: round r's key
// words (philox_keys).
template <int N>
[[gnu::always_inline]] inline void philox4xN(uint64_t c, const __m256i* keys, uint32_t* words) {
  __m256i s0[N], s1[N], s2[N], s3[N];
  const __m256i lane = _mm256_setr_epi64x(0, 1, 2, 3);
  for (int b = 0; b < N; ++b) {
    const __m256i ctr =
        _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(c + 4 * b)), lane);
    s0[b] = ctr;                         // low word of the counter
    s1[b] = _mm256_srli_epi64(ctr, 32);  // high word
    s2[b] = _mm256_setzero_si256();
    s3[b] = _mm256_setzero_si256();
  }
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
#pragma GCC unroll 10
  for (int round = 0; round < 10; ++round) {
    for (int b = 0; b < N; ++b) {
      // The key is xored in off the multiplies' dependency chain.
      const __m256i p0 = _mm256_mul_epu32(s0[b], m0);  // hi0:lo0
      const __m256i p1 = _mm256_mul_epu32(s2[b], m1);  // hi1:lo1
      s0[b] = _mm256_xor_si256(_mm256_srli_epi64(p1, 32), _mm256_xor_si256(s1[b], keys[2 * round]));
      s2[b] =
          _mm256_xor_si256(_mm256_srli_epi64(p0, 32), _mm256_xor_si256(s3[b], keys[2 * round + 1]));
      s1[b] = p1;
      s3[b] = p0;
    }
  }
  for (int b = 0; b < N; ++b) {
    // Low words to counter order: (w0 w1 w2 w3) per counter.
    const __m256i w01 = _mm256_blend_epi32(s0[b], _mm256_slli_epi64(s1[b], 32), 0xAA);
    const __m256i w23 = _mm256_blend_epi32(s2[b], _mm256_slli_epi64(s3[b], 32), 0xAA);
    const __m256i even = _mm256_unpacklo_epi64(w01, w23);  // counter 0 | counter 2
    const __m256i odd = _mm256_unpackhi_epi64(w01, w23);   // counter 1 | counter 3
    __m256i* out = reinterpret_cast<__m256i*>(words + 16 * b);
    _mm256_storeu_si256(out + 0, _mm256_permute2x128_si256(even, odd, 0x20));  // counters 0, 1
    _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(even, odd, 0x31));  // counters 2, 3
  }
}

// Random words of elements start .. start+g-1 (random_word in group_math.h): returns a pointer
// to element start's word inside `buf`, which holds at least g + 64 words.
const uint32_t* group_random_words(const RoundingKey& key, uint64_t start, uint32_t g,
                                   uint32_t* buf) {
  const uint64_t idx = key.offset + start;
  const uint64_t c = idx >> 2;
  // One counter more when the start is not a multiple of 4.
  const uint64_t counters = ((idx & 3) + g + 3) / 4;
  __m256i keys[20];
  philox_keys(key.seed, keys);
  uint64_t done = 0;
  for (; done + 4 * kPhiloxSets <= counters; done += 4 * kPhiloxSets) {
    philox4xN<kPhiloxSets>(c + done, keys, buf + 4 * done);
  }
  for (; done < counters; done += 4) philox4xN<1>(c + done, keys, buf + 4 * done);
  return buf + (idx & 3);
}

// ---- packing 32 codes (four units) held as int32 in c[0..3] ----

// Bytes of 32 codes in element order.
[[gnu::always_inline]] inline __m256i codes_to_bytes(const __m256i c[4]) {
  __m256i a = _mm256_packus_epi32(c[0], c[1]);
  __m256i b = _mm256_packus_epi32(c[2], c[3]);
  __m256i bytes = _mm256_packus_epi16(a, b);
  return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Writes 32 codes (4 * bits bytes) at dst.
[[gnu::always_inline]] inline void pack32(const __m256i c[4], int bits, uint8_t* dst) {
  __m256i bytes = codes_to_bytes(c);
  if (bits == 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), bytes);
    return;
  }
  if (bits == 4) {
    __m256i w = _mm256_maddubs_epi16(bytes, _mm256_set1_epi16(0x1001));  // c0 + 16 c1
    __m128i p = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), p);
    return;
  }
  // bits 2 or 3: four codes per 32-bit lane.
  __m256i w = _mm256_maddubs_epi16(
      bytes, _mm256_set1_epi16(static_cast<short>(bits == 2 ? 0x0401 : 0x0801)));
  w = _mm256_madd_epi16(w, _mm256_set1_epi32(bits == 2 ? 0x00100001 : 0x00400001));
  alignas(32) uint32_t quad[8];  // quad[q] = codes 4q..4q+3 packed in 4*bits bits
  _mm256_store_si256(reinterpret_cast<__m256i*>(quad), w);
  if (bits == 2) {
    for (int q = 0; q < 8; ++q) dst[q] = static_cast<uint8_t>(quad[q]);
    return;
  }
  uint64_t lo = 0, hi = 0;  // 96 bits: units of 24 bits
  for (int u = 0; u < 4; ++u) {
    uint64_t unit = quad[2 * u] | (static_cast<uint64_t>(quad[2 * u + 1]) << 12);
    int bit = 24 * u;
    if (bit < 64) lo |= unit << bit;
    if (bit >= 64) {
      hi |= unit << (bit - 64);
    } else if (bit + 24 > 64) {
      hi |= unit >> (64 - bit);
    }
  }
  std::memcpy(dst, &lo, 8);
  std::memcpy(dst + 8, &hi, 4);
}

// ---- block encode ----

template <DType D, CodecOp Op>
void encode_group(const CodecJob& job, uint64_t start, float* y, float* t, uint32_t* rnd_buf) {
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
  const uint32_t* rnd_words = sr ? group_random_words(job.key, start, g, rnd_buf) : nullptr;

  for (uint32_t k = 0; k < g; k += 32) {
    __m256i codes[4];
    for (int u = 0; u < 4; ++u) {
      const uint64_t i = start + k + 8 * u;
      __m256 v = _mm256_load_ps(y + k + 8 * u);
      __m256 s = _mm256_mul_ps(_mm256_mul_ps(v, pre), inv);
      __m256 q;
      if (sr) {
        __m256i r = _mm256_srli_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rnd_words + (i - start))), 8);
        __m256 uni = _mm256_mul_ps(_mm256_cvtepi32_ps(r), _mm256_set1_ps(5.9604644775390625e-08f));
        __m256 f = _mm256_floor_ps(s);
        __m256 up = _mm256_and_ps(_mm256_cmp_ps(uni, _mm256_sub_ps(s, f), _CMP_LT_OQ),
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
  alignas(32) float y[kMaxBlock];            // the group's values, staged for the second pass
  alignas(32) float t[kMaxBlock];            // q1: scratch for the tree sum
  alignas(32) uint32_t rnd[kMaxBlock + 64];  // stochastic rounding: the group's random words
  for (uint64_t start = begin; start < end; start += job.spec.block) {
    encode_group<D, Op>(job, start, y, t, rnd);
  }
}

// ---- decodes ----

inline __m256i unpack8(const uint8_t* packed, uint64_t unit, int bits) {
  const uint8_t* p = packed + unit * bits;
  if (bits == 8) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  uint32_t w;  // fixed-size loads: a runtime-sized memcpy would be a library call per unit
  switch (bits) {
    case 1:
      w = p[0];
      break;
    case 2: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      w = h;
      break;
    }
    case 3: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      w = h | static_cast<uint32_t>(p[2]) << 16;
      break;
    }
    default:
      std::memcpy(&w, p, 4);
  }
  const __m256i shifts =
      _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bits));
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), shifts),
                          _mm256_set1_epi32((1 << bits) - 1));
}

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

// ---- min-max codecs (minmax2/4/8): the grid in double precision, four lanes per instruction ----

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

// Codes (rounded and clamped as double) of four values under the group's grid; `uni` holds their
// uniform draws for stochastic rounding.
[[gnu::always_inline]] inline __m256d minmax_codes4(__m128 v, const MinmaxLanes& p, bool sr,
                                                    __m128 uni) {
  const __m256d y = _mm256_mul_pd(_mm256_sub_pd(_mm256_cvtps_pd(v), p.lo), p.inv);
  __m256d k;
  if (sr) {
    const __m256d f = _mm256_floor_pd(y);
    const __m256d up = _mm256_and_pd(
        _mm256_cmp_pd(_mm256_cvtps_pd(uni), _mm256_sub_pd(y, f), _CMP_LT_OQ), _mm256_set1_pd(1.0));
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
void minmax_encode_group(const CodecJob& job, uint64_t start, float* y, uint32_t* rnd_buf) {
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
  const uint32_t* rnd_words = sr ? group_random_words(job.key, start, g, rnd_buf) : nullptr;

  for (uint32_t k = 0; k < g; k += 32) {
    __m256i codes[4];
    for (int u = 0; u < 4; ++u) {
      const uint64_t i = start + k + 8 * u;
      const __m256 v = _mm256_load_ps(y + k + 8 * u);
      __m256 uni = _mm256_setzero_ps();
      if (sr) {
        __m256i r = _mm256_srli_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rnd_words + (i - start))), 8);
        uni = _mm256_mul_ps(_mm256_cvtepi32_ps(r), _mm256_set1_ps(5.9604644775390625e-08f));
      }
      const __m256d k0 =
          minmax_codes4(_mm256_castps256_ps128(v), p, sr, _mm256_castps256_ps128(uni));
      const __m256d k1 =
          minmax_codes4(_mm256_extractf128_ps(v, 1), p, sr, _mm256_extractf128_ps(uni, 1));
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
  alignas(32) uint32_t rnd[kMaxBlock + 64];
  for (uint64_t start = begin; start < end; start += job.spec.block) {
    minmax_encode_group<D, Op>(job, start, y, rnd);
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

template <DType D>
void minmax_dispatch(const CodecJob& job, uint64_t begin, uint64_t end) {
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
  with_dtype(job.dtype, [&]<DType D>() {
    if (minmax) {
      minmax_dispatch<D>(job, begin, vec_end);
    } else if (job.op == CodecOp::kEncode) {
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
