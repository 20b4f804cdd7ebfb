// AVX2 passes of the sparse codecs (sparse_avx2.h). Keys are below 2^31, so the signed 32-bit
// compares of AVX2 order them as unsigned numbers.

#include "codec/sparse_avx2.h"

#include <immintrin.h>

#include "codec/sparse_format.h"

namespace lowcomm::cpu::sparse_avx2 {
namespace {

__m256i fmix32x8(__m256i h) {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0x85EBCA6Bu)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0xC2B2AE35u)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

__m256i randk_keys8(uint32_t salt, uint32_t i) {
  __m256i p = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(i)),
                               _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  p = _mm256_mullo_epi32(p, _mm256_set1_epi32(static_cast<int>(0x9E3779B1u)));
  p = _mm256_xor_si256(p, _mm256_set1_epi32(static_cast<int>(salt)));
  return _mm256_srli_epi32(fmix32x8(p), 1);
}

// Left-packing: lane indices of the set bits of an 8-bit mask, in order.
// Built at compile time: no static initializer runs code of this -mavx2 file on CPUs without it.
struct PackTable {
  alignas(32) uint32_t idx[256][8] = {};
  constexpr PackTable() {
    for (uint32_t m = 0; m < 256; ++m) {
      uint32_t n = 0;
      for (uint32_t l = 0; l < 8; ++l)
        if (m >> l & 1u) idx[m][n++] = l;
    }
  }
};
constexpr PackTable kPack;

uint32_t hmax(__m256i v) {
  __m128i a = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  a = _mm_max_epu32(a, _mm_shuffle_epi32(a, 0x4E));
  a = _mm_max_epu32(a, _mm_shuffle_epi32(a, 0xB1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(a));
}

}  // namespace

uint32_t load_fp32(const float* x, const float* r, uint32_t len, float* y, uint32_t* key, bool topk,
                   uint32_t salt) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(static_cast<int>(sparse::kInfKey));
  const __m256i nan = _mm256_set1_epi32(static_cast<int>(sparse::kNanKey));
  __m256i vmax = _mm256_setzero_si256();
  uint32_t i = 0;
  for (; i + 8 <= len; i += 8) {
    // The next chunk (the tensor is contiguous) while this one's other passes run from L1; a
    // prefetch past the tensor's end is harmless.
    if ((i & 15u) == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(x + i + len), _MM_HINT_T0);
      if (r) _mm_prefetch(reinterpret_cast<const char*>(r + i + len), _MM_HINT_T0);
    }
    __m256 v = _mm256_loadu_ps(x + i);
    if (r) v = _mm256_add_ps(v, _mm256_loadu_ps(r + i));
    _mm256_storeu_ps(y + i, v);
    __m256i m = _mm256_and_si256(_mm256_castps_si256(v), abs_mask);
    m = _mm256_blendv_epi8(m, nan, _mm256_cmpgt_epi32(m, inf));
    vmax = _mm256_max_epu32(vmax, m);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(key + i), topk ? m : randk_keys8(salt, i));
  }
  uint32_t mx = hmax(vmax);
  for (; i < len; ++i) {
    float v = r ? qm::add(x[i], r[i]) : x[i];
    y[i] = v;
    uint32_t m = sparse::magnitude_key(v);
    mx = m > mx ? m : mx;
    key[i] = topk ? m : sparse::randk_key(salt, i);
  }
  return mx;
}

void randk_keys(uint32_t salt, uint32_t len, uint32_t* key) {
  uint32_t i = 0;
  for (; i + 8 <= len; i += 8)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(key + i), randk_keys8(salt, i));
  for (; i < len; ++i) key[i] = sparse::randk_key(salt, i);
}

void count_ge4(const uint32_t* key, uint32_t len, const uint32_t t[4], uint32_t out[4]) {
  // key >= t  <=>  key > t - 1 (t = 0: every key, as -1 is below all of them).
  const __m256i t0 = _mm256_set1_epi32(static_cast<int>(t[0] - 1));
  const __m256i t1 = _mm256_set1_epi32(static_cast<int>(t[1] - 1));
  const __m256i t2 = _mm256_set1_epi32(static_cast<int>(t[2] - 1));
  const __m256i t3 = _mm256_set1_epi32(static_cast<int>(t[3] - 1));
  __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
  uint32_t i = 0;
  for (; i + 8 <= len; i += 8) {
    __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + i));
    c0 = _mm256_sub_epi32(c0, _mm256_cmpgt_epi32(k, t0));
    c1 = _mm256_sub_epi32(c1, _mm256_cmpgt_epi32(k, t1));
    c2 = _mm256_sub_epi32(c2, _mm256_cmpgt_epi32(k, t2));
    c3 = _mm256_sub_epi32(c3, _mm256_cmpgt_epi32(k, t3));
  }
  alignas(32) uint32_t lanes[4][8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[0]), c0);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[1]), c1);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[2]), c2);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[3]), c3);
  for (int j = 0; j < 4; ++j) {
    uint32_t c = 0;
    for (int l = 0; l < 8; ++l) c += lanes[j][l];
    for (uint32_t m = i; m < len; ++m) c += key[m] >= t[j] ? 1u : 0u;
    out[j] = c;
  }
}

uint32_t collect(const uint32_t* key, uint32_t len, uint32_t lo, uint64_t hi, uint32_t* cand) {
  const __m256i lo1 = _mm256_set1_epi32(static_cast<int>(lo - 1));
  const __m256i hi1 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(hi - 1)));
  uint32_t n = 0, i = 0;
  for (; i + 8 <= len; i += 8) {
    __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + i));
    __m256i in = _mm256_andnot_si256(_mm256_cmpgt_epi32(k, hi1), _mm256_cmpgt_epi32(k, lo1));
    auto mask = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(in)));
    const __m256i perm = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPack.idx[mask]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cand + n), _mm256_permutevar8x32_epi32(k, perm));
    n += static_cast<uint32_t>(__builtin_popcount(mask));
  }
  for (; i < len; ++i)
    if (key[i] >= lo && key[i] < hi) cand[n++] = key[i];
  return n;
}

uint32_t select(const uint32_t* key, uint32_t len, uint32_t t, uint32_t ties, uint32_t* sel) {
  const __m256i t1 = _mm256_set1_epi32(static_cast<int>(t - 1));
  uint32_t n = 0, i = 0;
  for (; i + 8 <= len; i += 8) {
    __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + i));
    auto mask =
        static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(k, t1))));
    while (mask) {
      uint32_t j = i + static_cast<uint32_t>(__builtin_ctz(mask));
      mask &= mask - 1;
      if (key[j] != t) {
        sel[n++] = j;
      } else if (ties > 0) {
        sel[n++] = j;
        --ties;
      }
    }
  }
  for (; i < len; ++i) {
    if (key[i] > t) {
      sel[n++] = i;
    } else if (key[i] == t && ties > 0) {
      sel[n++] = i;
      --ties;
    }
  }
  return n;
}

void scale(float* r, const float* y, uint32_t len, float decay) {
  const __m256 d = _mm256_set1_ps(decay);
  uint32_t i = 0;
  for (; i + 8 <= len; i += 8) _mm256_storeu_ps(r + i, _mm256_mul_ps(d, _mm256_loadu_ps(y + i)));
  for (; i < len; ++i) r[i] = qm::mul(decay, y[i]);
}

}  // namespace lowcomm::cpu::sparse_avx2
