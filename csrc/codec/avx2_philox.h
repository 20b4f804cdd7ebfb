#pragma once
// Philox4x32-10 for stochastic rounding in the AVX2 kernels: the draws of a range's groups
// (qm::sr_draw, bit for bit) and their rounding thresholds (qm::sr_threshold). Include only from
// files compiled with -mavx2.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "codec/quant_math.h"
#include "lowcomm/codec.h"

namespace lowcomm::cpu {

// Sets of four Philox counters generated together (see philox4xN): 4 sets fill the vector
// pipes; 2 leave them waiting on the multiplies' latency, 6 measured no faster.
inline constexpr int kPhiloxSets = 4;

// ---- Philox words, four counters per instruction ----

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

// Philox4x32-10 (qm::philox, the same rounds) for counters c .. c+4N-1, each masked with
// qm::kSrCounterMask (the counter of an index that wrapped past 2^64 restarts at 0, as the
// portable path computes it); words[4*l + w] is word w of counter c + l, so the output is each
// counter's 128 bits in turn, little-endian: counter c + l's draws are bytes 16 l .. 16 l + 15.
// Each 64-bit lane carries one counter, its word in the low half: that is where
// _mm256_mul_epu32 reads its factor and leaves the product's low word, so a round is two
// multiplies, two shifts (the high words) and four xors, with no shuffling. The high halves of
// the lanes hold junk that never reaches a low half. N independent sets of four counters are
// interleaved so that the multiplies' latency overlaps. keys[2r], keys[2r+1]: round r's key
// words (philox_keys).
template <int N>
[[gnu::always_inline]] inline void philox4xN(uint64_t c, const __m256i* keys, void* words) {
  __m256i s0[N], s1[N], s2[N], s3[N];
  const __m256i lane = _mm256_setr_epi64x(0, 1, 2, 3);
  const __m256i mask = _mm256_set1_epi64x(static_cast<long long>(qm::kSrCounterMask));
  for (int b = 0; b < N; ++b) {
    const __m256i ctr = _mm256_and_si256(
        _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(c + 4 * b)), lane), mask);
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
    __m256i* out = static_cast<__m256i*>(words) + 2 * b;
    _mm256_storeu_si256(out + 0, _mm256_permute2x128_si256(even, odd, 0x20));  // counters 0, 1
    _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(even, odd, 0x31));  // counters 2, 3
  }
}

// ---- the draws of a range's groups ----

// One element's draw as stored: its byte of the counter's output.
using SrDraw = uint8_t;
static_assert(qm::kSrBits == 8, "SrDraw and sr_thresholds8 read one byte per element");

// The draws of a range's groups, for one key. They are generated a span ahead (at least
// kSpan elements, within the range), so that even a small block's counters fill kPhiloxSets
// interleaved sets; the key schedule is expanded once per range.
class RangeDraws {
 public:
  RangeDraws(const RoundingKey& key, uint64_t end) : offset_(key.offset), end_(end) {
    philox_keys(key.seed, keys_);
  }

  // Draws of elements start .. start+g-1 of the job (qm::sr_draw of key.offset + start + k):
  // returns a pointer to element start's, valid until the next call.
  const SrDraw* group(uint64_t start, uint32_t g) {
    if (start < begin_ || start + g > stop_) fill(start, g);
    return buf_ + skip_ + (start - begin_);
  }

 private:
  static constexpr uint64_t kSpan = 1024;

  void fill(uint64_t start, uint32_t g) {
    const uint64_t count = std::max<uint64_t>(g, std::min<uint64_t>(kSpan, end_ - start));
    const uint64_t t = offset_ + start;
    const uint64_t first = t >> qm::kSrDrawShift;
    skip_ = static_cast<uint32_t>(t) & (qm::kSrPerDraw - 1);
    // One counter more when t is not a counter's first lane.
    const uint64_t counters = (skip_ + count + qm::kSrPerDraw - 1) / qm::kSrPerDraw;
    uint64_t done = 0;
    for (; done + 4 * kPhiloxSets <= counters; done += 4 * kPhiloxSets) {
      philox4xN<kPhiloxSets>(first + done, keys_, buf_ + done * qm::kSrPerDraw);
    }
    if (done + 8 <= counters) {
      philox4xN<2>(first + done, keys_, buf_ + done * qm::kSrPerDraw);
      done += 8;
    }
    for (; done < counters; done += 4) {
      philox4xN<1>(first + done, keys_, buf_ + done * qm::kSrPerDraw);
    }
    begin_ = start;
    stop_ = start + count;
  }

  __m256i keys_[20];
  uint64_t offset_, end_;
  uint64_t begin_ = 0, stop_ = 0;  // the elements whose draws are in buf_, from buf_ + skip_
  uint32_t skip_ = 0;
  // At most kMaxBlock elements' counters, rounded up to a set of four, plus one for the skip.
  alignas(32) SrDraw buf_[kMaxBlock + 5 * qm::kSrPerDraw];
};

// qm::sr_threshold of the eight draws at `d`: (r + 1/2) / 256, exact.
inline __m256 sr_thresholds8(const SrDraw* d) {
  const __m256i r = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(d)));
  return _mm256_mul_ps(_mm256_add_ps(_mm256_cvtepi32_ps(r), _mm256_set1_ps(0.5f)),
                       _mm256_set1_ps(0.00390625f));
}

}  // namespace lowcomm::cpu
