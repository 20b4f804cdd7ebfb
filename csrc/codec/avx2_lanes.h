#pragma once
// Eight fp32 lanes of tensor elements for the AVX2 kernels: typed loads and stores (the rules of
// element_io.h: round to nearest even, canonical NaN), the encode source, and the packing and
// unpacking of codes. Include only from files compiled with -mavx2 -mf16c.

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "codec/codec_job.h"
#include "codec/quant_math.h"

namespace lowcomm::cpu {

// ---- loads and stores of 8 elements ----

template <DType D>
inline __m256 load8(const void* base, uint64_t i) {
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
inline void store8(void* base, uint64_t i, __m256 v) {
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
inline __m256 source8(const void* x, const void* state, uint64_t i) {
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
inline constexpr uint64_t kPrefetchBytes = 4096;

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

}  // namespace lowcomm::cpu
