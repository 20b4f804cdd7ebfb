#pragma once
// The sparse codecs' message format and element rules (topk, randk), shared by the CPU paths and
// the CUDA kernels; docs/codecs.md ("Sparse codecs") states them for users. Pure functions of
// their arguments, so host and device agree bit for bit.
//
// A message of n elements, chunks of C (the spec's `block`), K kept per full chunk:
//   header   randk only: the position seed, u64 little-endian (8 bytes)
//   records  one per chunk, back to back; chunk c starts at header + c * record(C):
//            lo f32, hi f32 (the smallest and largest kept magnitude; both NaN when any element
//            of the chunk is non-finite), then topk's positions, then the value codes.
// A chunk of len < C elements (the last) keeps k = ceil(K * len / C) (at least 1).
// Positions (topk): the kept local offsets, increasing, each log2(C) bits, packed little-endian
// from bit 0; or, when fewer bytes, a bitmap of len bits (bit i: offset i kept). The choice
// follows from (K, C, len) alone, so sizes are exact and known up front.
// Values: one code of b bits per kept element in offset order, packed little-endian: bit b-1
// is the sign (1: negative), the low b-1 bits j the magnitude lo + j * (hi - lo) / (2^(b-1) - 1)
// on the min-max grid of quant_math.h (double arithmetic), rounded to nearest.
// Selection keys: topk: |y| as its fp32 bits (every NaN as 0x7FC00000, above infinity); randk:
// a 31-bit hash of (seed, chunk, offset). The kept set: keys above the K-th largest key T, then
// keys equal to T in offset order until K are kept (ties go to the lower offset).

#include <cstdint>

#include "codec/quant_math.h"
#include "lowcomm/codec.h"

namespace lowcomm::sparse {

constexpr uint64_t kScaleBytes = 8;   // lo, hi
constexpr uint64_t kRandkHeader = 8;  // the position seed
constexpr uint32_t kNanKey = 0x7FC00000u;
constexpr uint32_t kInfKey = 0x7F800000u;

LC_HD uint64_t header_bytes(CodecKind kind) {
  return kind == CodecKind::kRandk ? kRandkHeader : 0;
}

// Elements kept of a chunk of len (1..C) elements.
LC_HD uint32_t chunk_keep(uint32_t keep, uint32_t chunk, uint32_t len) {
  if (len >= chunk) return keep;
  uint64_t k = (static_cast<uint64_t>(keep) * len + chunk - 1) / chunk;
  return k == 0 ? 1u : static_cast<uint32_t>(k);
}

LC_HD uint32_t offset_bits(uint32_t chunk) {
  uint32_t b = 0;
  while ((1u << b) < chunk) ++b;
  return b;
}

LC_HD uint64_t offsets_bytes(uint32_t k, uint32_t chunk) {
  return (static_cast<uint64_t>(k) * offset_bits(chunk) + 7) / 8;
}

LC_HD uint64_t bitmap_bytes(uint32_t len) {
  return (static_cast<uint64_t>(len) + 7) / 8;
}

// topk: a bitmap when it is strictly smaller than the offsets.
LC_HD bool uses_bitmap(uint32_t k, uint32_t chunk, uint32_t len) {
  return bitmap_bytes(len) < offsets_bytes(k, chunk);
}

LC_HD uint64_t index_bytes(CodecKind kind, uint32_t k, uint32_t chunk, uint32_t len) {
  if (kind != CodecKind::kTopk) return 0;
  return uses_bitmap(k, chunk, len) ? bitmap_bytes(len) : offsets_bytes(k, chunk);
}

LC_HD uint64_t value_bytes(uint32_t k, int bits) {
  return (static_cast<uint64_t>(k) * static_cast<uint64_t>(bits) + 7) / 8;
}

struct ChunkLayout {
  uint32_t len = 0;     // elements in the chunk
  uint32_t k = 0;       // kept
  bool bitmap = false;  // topk positions as a bitmap
  uint64_t offset = 0;  // record's first byte in the message
  uint64_t index = 0;   // positions' first byte
  uint64_t values = 0;  // value codes' first byte
  uint64_t end = 0;     // one past the record
};

LC_HD ChunkLayout chunk_layout(CodecKind kind, uint32_t keep, uint32_t chunk, int bits, uint64_t n,
                               uint64_t c) {
  ChunkLayout l;
  const uint64_t full_record =
      kScaleBytes + index_bytes(kind, keep, chunk, chunk) + value_bytes(keep, bits);
  const uint64_t begin = c * chunk;
  l.len = static_cast<uint32_t>(n - begin < chunk ? n - begin : chunk);
  l.k = chunk_keep(keep, chunk, l.len);
  l.bitmap = kind == CodecKind::kTopk && uses_bitmap(l.k, chunk, l.len);
  l.offset = header_bytes(kind) + c * full_record;
  l.index = l.offset + kScaleBytes;
  l.values = l.index + index_bytes(kind, l.k, chunk, l.len);
  l.end = l.values + value_bytes(l.k, bits);
  return l;
}

// ---- selection keys ----

LC_HD uint32_t magnitude_key(float y) {
  uint32_t k = qm::f32_bits(y) & 0x7FFFFFFFu;
  return k > kInfKey ? kNanKey : k;
}

LC_HD uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

// randk: the salt of chunk c under `seed`, then the key of offset p within it.
LC_HD uint32_t randk_salt(uint64_t seed, uint64_t c) {
  uint32_t a = fmix32(static_cast<uint32_t>(seed) ^ 0x9E3779B9u);
  uint32_t b = fmix32(static_cast<uint32_t>(seed >> 32) ^ a);
  uint32_t d = fmix32(static_cast<uint32_t>(c) ^ b);
  return fmix32(static_cast<uint32_t>(c >> 32) ^ d ^ 0x632BE5ABu);
}
LC_HD uint32_t randk_key(uint32_t salt, uint32_t p) {
  return fmix32(p * 0x9E3779B1u ^ salt) >> 1;
}

// ---- values ----

struct ValueGrid {
  bool finite = true;
  qm::MinmaxParams mm{};
  int bits = 2;
};

LC_HD ValueGrid value_grid(float lo, float hi, int bits) {
  ValueGrid g;
  g.bits = bits;
  g.finite = qm::is_finite(lo) && qm::is_finite(hi);
  if (g.finite) g.mm = qm::minmax_params(lo, hi, bits - 1);
  return g;
}

LC_HD uint32_t value_code(float y, const ValueGrid& g) {
  if (!g.finite) return 0;
  uint32_t sign = y < 0.0f ? 1u : 0u;
  uint32_t j = qm::minmax_code(qm::abs_f(y), g.mm, g.bits - 1, false, 0);
  return sign << (g.bits - 1) | j;
}

LC_HD float value_of(uint32_t code, const ValueGrid& g) {
  if (!g.finite) return qm::bits_f32(qm::kCanonicalNanF32);
  float m = qm::minmax_value(code & ((1u << (g.bits - 1)) - 1u), g.mm);
  return (code >> (g.bits - 1)) ? -m : m;
}

// The residual error feedback keeps for an element that was y and decodes to dec (0 when not
// kept): β·(y - dec), canonical; 0 for a non-finite chunk.
LC_HD float residual(float y, float dec, float decay, bool finite) {
  return finite ? qm::canonical(qm::mul(decay, qm::sub(y, dec))) : 0.0f;
}

// ---- little-endian bit fields (at most 16 bits each, so at most 3 bytes) ----

LC_HD void put_bits(uint8_t* p, uint64_t bit, uint32_t v, int nbits) {
  uint8_t* b = p + (bit >> 3);
  uint32_t w = v << (bit & 7);
  int span = static_cast<int>((bit & 7) + static_cast<uint64_t>(nbits) + 7) / 8;
  for (int i = 0; i < span; ++i) b[i] |= static_cast<uint8_t>(w >> (8 * i));
}

LC_HD uint32_t get_bits(const uint8_t* p, uint64_t bit, int nbits) {
  const uint8_t* b = p + (bit >> 3);
  int span = static_cast<int>((bit & 7) + static_cast<uint64_t>(nbits) + 7) / 8;
  uint32_t w = 0;
  for (int i = 0; i < span; ++i) w |= static_cast<uint32_t>(b[i]) << (8 * i);
  return (w >> (bit & 7)) & ((1u << nbits) - 1u);
}

}  // namespace lowcomm::sparse
