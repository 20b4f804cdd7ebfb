#pragma once
// Philox4x32-10 for stochastic rounding in the AVX2 kernels: the random words of a whole group
// (random_word in group_math.h, bit for bit), and their uniform draws. Include only from files
// compiled with -mavx2.

#include <immintrin.h>

#include <cstdint>

#include "lowcomm/codec.h"

namespace lowcomm::cpu {

// Sets of four Philox counters generated together (see philox4xN): 4 sets fill the vector
// pipes; 2 leave them waiting on the multiplies' latency, 6 measured no faster.
inline constexpr int kPhiloxSets = 4;

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
inline const uint32_t* group_random_words(const RoundingKey& key, uint64_t start, uint32_t g,
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

// qm::uniform01 of the eight words at `words`: uniform in [0, 1) with 24 bits.
inline __m256 uniform8(const uint32_t* words) {
  const __m256i r =
      _mm256_srli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(words)), 8);
  return _mm256_mul_ps(_mm256_cvtepi32_ps(r), _mm256_set1_ps(5.9604644775390625e-08f));
}

}  // namespace lowcomm::cpu
