#pragma once
// Device loads and stores of the codec's memory objects: 8-element units of a tensor, packed
// code units and scale records. Conversions are those of csrc/codec/element_io.h (round to
// nearest even, canonical NaN on every store), so device and host write the same bits.
//
// A unit starts at an element index that is a multiple of 8, so a tensor unit is 16 bytes
// (16-bit types) or 32 bytes (fp32) and is read with 16-byte vector accesses whenever the
// tensor's base is 16-byte aligned and the unit is whole, else element by element (the host
// wrappers check element alignment). Payloads are only 4-byte aligned (wire-dtype aligned for
// passthrough), and a code unit of `bits` bytes sits at unit * bits, so code accesses take the
// widest width the address allows, down to single bytes (3-bit units).

#include <cstdint>

#include "codec/quant_math.h"
#include "lowcomm/codec.h"

#define LC_DEV __device__ __forceinline__

namespace lowcomm::cuda {

// One tensor element type: its storage bits and the fp32 conversions.
template <DType D>
struct Element;

template <>
struct Element<DType::kFloat32> {
  using Bits = uint32_t;
  static LC_DEV float to_f32(uint32_t b) { return qm::bits_f32(b); }
  static LC_DEV uint32_t from_f32(float v) { return qm::f32_bits(qm::canonical(v)); }
};

template <>
struct Element<DType::kBFloat16> {
  using Bits = uint16_t;
  static LC_DEV float to_f32(uint16_t b) { return qm::bf16_to_f32(b); }
  static LC_DEV uint16_t from_f32(float v) { return qm::f32_to_bf16(v); }
};

template <>
struct Element<DType::kFloat16> {
  using Bits = uint16_t;
  static LC_DEV float to_f32(uint16_t b) { return qm::f16_to_f32(b); }
  static LC_DEV uint16_t from_f32(float v) { return qm::f32_to_f16(v); }
};

LC_DEV bool is_aligned(const void* p, uintptr_t a) {
  return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0;
}

// Elements of the unit starting at i0 in a tensor of n: 8, or fewer for the last unit.
LC_DEV uint32_t unit_elements(uint64_t n, uint64_t i0) {
  return n - i0 < 8 ? static_cast<uint32_t>(n - i0) : 8u;
}

// ---- raw element bits of one unit ----

// Bits of elements [i0, i0 + count) of the array of B at `base`; zero for j >= count.
template <typename B>
LC_DEV void load_unit_bits(const void* base, uint64_t i0, uint32_t count, B b[8]) {
  static_assert(sizeof(B) == 2 || sizeof(B) == 4, "16- or 32-bit elements");
  constexpr int kWords = 2 * static_cast<int>(sizeof(B));  // 32-bit words in a unit
  const uint8_t* p = static_cast<const uint8_t*>(base) + i0 * sizeof(B);
  if (count == 8 && is_aligned(p, 16)) {
    uint32_t w[kWords];
#pragma unroll
    for (int k = 0; k < kWords / 4; ++k) {
      uint4 v = reinterpret_cast<const uint4*>(p)[k];
      w[4 * k] = v.x;
      w[4 * k + 1] = v.y;
      w[4 * k + 2] = v.z;
      w[4 * k + 3] = v.w;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if constexpr (sizeof(B) == 4) {
        b[j] = w[j];
      } else {
        b[j] = static_cast<B>(w[j / 2] >> (16 * (j & 1)));
      }
    }
  } else if (is_aligned(p, sizeof(B))) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      b[j] = j < static_cast<int>(count) ? reinterpret_cast<const B*>(p)[j] : B{0};
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      B v = 0;
      if (j < static_cast<int>(count)) {
        for (int k = 0; k < static_cast<int>(sizeof(B)); ++k) {
          v = static_cast<B>(v | static_cast<B>(p[j * sizeof(B) + k]) << (8 * k));
        }
      }
      b[j] = v;
    }
  }
}

// Stores b[0..count) as elements [i0, i0 + count).
template <typename B>
LC_DEV void store_unit_bits(void* base, uint64_t i0, uint32_t count, const B b[8]) {
  constexpr int kWords = 2 * static_cast<int>(sizeof(B));
  uint8_t* p = static_cast<uint8_t*>(base) + i0 * sizeof(B);
  if (count == 8 && is_aligned(p, 16)) {
    uint32_t w[kWords];
#pragma unroll
    for (int k = 0; k < kWords; ++k) {
      if constexpr (sizeof(B) == 4) {
        w[k] = b[k];
      } else {
        w[k] = static_cast<uint32_t>(b[2 * k]) | static_cast<uint32_t>(b[2 * k + 1]) << 16;
      }
    }
#pragma unroll
    for (int k = 0; k < kWords / 4; ++k) {
      reinterpret_cast<uint4*>(p)[k] =
          make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]);
    }
  } else if (is_aligned(p, sizeof(B))) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (j < static_cast<int>(count)) reinterpret_cast<B*>(p)[j] = b[j];
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (j < static_cast<int>(count)) {
        for (int k = 0; k < static_cast<int>(sizeof(B)); ++k) {
          p[j * sizeof(B) + k] = static_cast<uint8_t>(b[j] >> (8 * k));
        }
      }
    }
  }
}

// ---- tensor units as fp32 ----

template <DType D>
LC_DEV void load_unit(const void* base, uint64_t i0, uint32_t count, float v[8]) {
  using E = Element<D>;
  typename E::Bits b[8];
  load_unit_bits(base, i0, count, b);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = E::to_f32(b[j]);
}

template <DType D>
LC_DEV void store_unit(void* base, uint64_t i0, uint32_t count, const float v[8]) {
  using E = Element<D>;
  typename E::Bits b[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) b[j] = E::from_f32(v[j]);
  store_unit_bits(base, i0, count, b);
}

template <DType D>
LC_DEV float load_element(const void* base, uint64_t i) {
  using E = Element<D>;
  return E::to_f32(static_cast<const typename E::Bits*>(base)[i]);
}

// ---- packed codes: unit u is `bits` bytes at packed + u * bits, little-endian ----

LC_DEV uint64_t load_code_unit(const uint8_t* packed, uint64_t unit, int bits) {
  const uint8_t* p = packed + unit * static_cast<uint64_t>(bits);
  switch (bits) {
    case 1:
      return *p;
    case 2:
      if (is_aligned(p, 2)) return *reinterpret_cast<const uint16_t*>(p);
      break;
    case 4:
      if (is_aligned(p, 4)) return *reinterpret_cast<const uint32_t*>(p);
      break;
    case 8:
      if (is_aligned(p, 8)) return *reinterpret_cast<const uint64_t*>(p);
      if (is_aligned(p, 4)) {
        const uint32_t* q = reinterpret_cast<const uint32_t*>(p);
        return static_cast<uint64_t>(q[0]) | static_cast<uint64_t>(q[1]) << 32;
      }
      break;
    default:
      break;
  }
  uint64_t w = 0;
  for (int k = 0; k < bits; ++k) w |= static_cast<uint64_t>(p[k]) << (8 * k);
  return w;
}

LC_DEV void store_code_unit(uint8_t* packed, uint64_t unit, int bits, uint64_t w) {
  uint8_t* p = packed + unit * static_cast<uint64_t>(bits);
  switch (bits) {
    case 1:
      *p = static_cast<uint8_t>(w);
      return;
    case 2:
      if (is_aligned(p, 2)) {
        *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(w);
        return;
      }
      break;
    case 4:
      if (is_aligned(p, 4)) {
        *reinterpret_cast<uint32_t*>(p) = static_cast<uint32_t>(w);
        return;
      }
      break;
    case 8:
      if (is_aligned(p, 8)) {
        *reinterpret_cast<uint64_t*>(p) = w;
        return;
      }
      if (is_aligned(p, 4)) {
        uint32_t* q = reinterpret_cast<uint32_t*>(p);
        q[0] = static_cast<uint32_t>(w);
        q[1] = static_cast<uint32_t>(w >> 32);
        return;
      }
      break;
    default:
      break;
  }
  for (int k = 0; k < bits; ++k) p[k] = static_cast<uint8_t>(w >> (8 * k));
}

// ---- scale records: fp32 value idx at payload + 4 * idx, moved as bits (NaN kept as is) ----

LC_DEV uint32_t load_scale_bits(const uint8_t* payload, uint64_t idx) {
  const uint8_t* p = payload + 4 * idx;
  if (is_aligned(p, 4)) return *reinterpret_cast<const uint32_t*>(p);
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

LC_DEV float load_scale(const uint8_t* payload, uint64_t idx) {
  return qm::bits_f32(load_scale_bits(payload, idx));
}

LC_DEV void store_scale(uint8_t* payload, uint64_t idx, float v) {
  uint8_t* p = payload + 4 * idx;
  uint32_t b = qm::f32_bits(v);
  if (is_aligned(p, 4)) {
    *reinterpret_cast<uint32_t*>(p) = b;
    return;
  }
  for (int k = 0; k < 4; ++k) p[k] = static_cast<uint8_t>(b >> (8 * k));
}

}  // namespace lowcomm::cuda
