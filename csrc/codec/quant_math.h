#pragma once
// Element math shared by the CPU paths and the CUDA kernels. Every function here is a pure
// function of its arguments built from IEEE-754 single/double operations in a fixed order, so
// host and device produce the same bits. Rules that keep it so:
//   - no fused multiply-add: host code is compiled with -ffp-contract=off, device code uses
//     the explicit _rn intrinsics below;
//   - no flush-to-zero (no fast-math anywhere);
//   - NaN results are written as one canonical NaN (x86 and CUDA disagree on NaN payloads).

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LC_HD __host__ __device__ __forceinline__
#else
#define LC_HD inline
#endif

namespace lowcomm::qm {

constexpr uint32_t kCanonicalNanF32 = 0x7FC00000u;
constexpr uint16_t kCanonicalNanBF16 = 0x7FC0u;
constexpr uint16_t kCanonicalNanF16 = 0x7E00u;
constexpr float kFltMax = 3.402823466e+38f;
constexpr float kFltMinNormal = 1.175494351e-38f;

LC_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

LC_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

LC_HD bool is_nan(float f) {
  return (f32_bits(f) & 0x7FFFFFFFu) > 0x7F800000u;
}
LC_HD bool is_finite(float f) {
  return (f32_bits(f) & 0x7FFFFFFFu) < 0x7F800000u;
}
LC_HD float canonical(float f) {
  return is_nan(f) ? bits_f32(kCanonicalNanF32) : f;
}
LC_HD float abs_f(float f) {
  return bits_f32(f32_bits(f) & 0x7FFFFFFFu);
}

// Arithmetic that never contracts into an FMA.
#if defined(__CUDA_ARCH__)
LC_HD float mul(float a, float b) {
  return __fmul_rn(a, b);
}
LC_HD float add(float a, float b) {
  return __fadd_rn(a, b);
}
LC_HD float sub(float a, float b) {
  return __fsub_rn(a, b);
}
LC_HD float div(float a, float b) {
  return __fdiv_rn(a, b);
}
LC_HD double dmul(double a, double b) {
  return __dmul_rn(a, b);
}
LC_HD double dadd(double a, double b) {
  return __dadd_rn(a, b);
}
LC_HD double dsub(double a, double b) {
  return __dsub_rn(a, b);
}
LC_HD double ddiv(double a, double b) {
  return __ddiv_rn(a, b);
}
LC_HD float rint_f(float a) {
  return rintf(a);
}
LC_HD float floor_f(float a) {
  return floorf(a);
}
LC_HD double rint_d(double a) {
  return rint(a);
}
LC_HD double floor_d(double a) {
  return floor(a);
}
#else
LC_HD float mul(float a, float b) {
  return a * b;
}
LC_HD float add(float a, float b) {
  return a + b;
}
LC_HD float sub(float a, float b) {
  return a - b;
}
LC_HD float div(float a, float b) {
  return a / b;
}
LC_HD double dmul(double a, double b) {
  return a * b;
}
LC_HD double dadd(double a, double b) {
  return a + b;
}
LC_HD double dsub(double a, double b) {
  return a - b;
}
LC_HD double ddiv(double a, double b) {
  return a / b;
}
LC_HD float rint_f(float a) {
  return __builtin_nearbyintf(a);
}
LC_HD float floor_f(float a) {
  return __builtin_floorf(a);
}
LC_HD double rint_d(double a) {
  return __builtin_nearbyint(a);
}
LC_HD double floor_d(double a) {
  return __builtin_floor(a);
}
#endif

// ---- 16-bit float conversions (round to nearest even, canonical NaN) ----

LC_HD float bf16_to_f32(uint16_t h) {
  return bits_f32(static_cast<uint32_t>(h) << 16);
}

LC_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return kCanonicalNanBF16;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

LC_HD float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0x1Fu) return man ? bits_f32(kCanonicalNanF32) : bits_f32(sign | 0x7F800000u);
  if (exp == 0) {
    if (man == 0) return bits_f32(sign);
    // Subnormal: man * 2^-24, exact in fp32.
    float v = mul(static_cast<float>(man), 5.9604644775390625e-08f);
    return bits_f32(sign | f32_bits(v));
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

LC_HD uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7FFFFFFFu;
  if (u > 0x7F800000u) return kCanonicalNanF16;
  if (u >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to infinity
  if (u < 0x38800000u) {                        // below 2^-14: fp16 subnormal or zero
    if (u <= 0x33000000u) return sign;          // <= 2^-25 rounds to zero (tie to even)
    uint32_t e = u >> 23;
    uint32_t m = (u & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - e;  // 14..24
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t v = u - 0x38000000u;  // rebias exponent 127 -> 15
  v += 0xFFFu + ((v >> 13) & 1u);
  return static_cast<uint16_t>(sign | (v >> 13));
}

// ---- Philox4x32-10, the counter-based generator for stochastic rounding ----

struct U32x4 {
  uint32_t v[4];
};

LC_HD void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// The 128-bit output (four words) of counter c under key `seed`.
LC_HD U32x4 philox(uint64_t c, uint64_t seed) {
  uint32_t c0 = static_cast<uint32_t>(c), c1 = static_cast<uint32_t>(c >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c0, hi0, lo0);
    mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return U32x4{{c0, c1, c2, c3}};
}

// ---- stochastic rounding: 8 random bits per element (docs/codecs.md, "Stochastic rounding") ----
// Element t of the key's index space (t = RoundingKey::offset + i, mod 2^64) draws r, byte
// t mod 16 of Philox counter t / 16, the counter's four words read as 16 little-endian bytes
// (byte l is bits 8 (l mod 4) .. 8 (l mod 4) + 7 of word l / 4). It rounds up when
// u = (r + 1/2) / 256 < frac(y), so P(up) is frac(y) rounded to a multiple of 1/256: unbiased to
// within 2^-9 of a step. r depends on (seed, t) only, never on how the tensor is split into
// ranges, threads or segments.

constexpr int kSrBits = 8;                                         // random bits per element
constexpr int kSrPerDraw = 16;                                     // elements per Philox counter
constexpr int kSrDrawShift = 4;                                    // log2(kSrPerDraw)
constexpr uint64_t kSrCounterMask = ~uint64_t{0} >> kSrDrawShift;  // counters of wrapped t
static_assert(kSrPerDraw * kSrBits == 128 && kSrPerDraw == 1 << kSrDrawShift);

// r of byte `lane` (0..15) of one counter's output.
LC_HD uint32_t sr_lane(const U32x4& w, uint32_t lane) {
  return (w.v[lane >> 2] >> (8 * (lane & 3))) & 0xFFu;
}

// r of element t under key `seed`.
LC_HD uint32_t sr_draw(uint64_t seed, uint64_t t) {
  return sr_lane(philox(t >> kSrDrawShift, seed), static_cast<uint32_t>(t) & (kSrPerDraw - 1));
}

// u = (r + 1/2) / 256: exact in fp32, in (0, 1), symmetric about 1/2.
LC_HD float sr_threshold(uint32_t r) {
  return mul(add(static_cast<float>(r), 0.5f), 0.00390625f);
}

// ---- absmax grid ----
// Codes k in [-2^(b-1), 2^(b-1)-1] stored as k + 2^(b-1); decoded as (k * 2^-(b-1)) * absmax.

struct AbsmaxParams {
  float pre;  // 2^64 when absmax < 2^-64 (keeps 2^(b-1)/absmax finite), else 1
  float inv;  // 2^(b-1) / (absmax * pre), 0 when absmax is 0
};

LC_HD float pow2i(int e) {
  return bits_f32(static_cast<uint32_t>(127 + e) << 23);
}

// 2^(b-1)/absmax overflows fp32 for absmax below about 2^(b-129), normal values included
// (q8: every absmax under 2^-121). Below 2^-64, x and absmax are both scaled by 2^64: exact,
// and it leaves y = x * pre * inv bit-identical wherever the unscaled inv is finite.
LC_HD AbsmaxParams absmax_params(float absmax, int bits) {
  AbsmaxParams p;
  p.pre = absmax < pow2i(-64) ? pow2i(64) : 1.0f;
  p.inv = absmax > 0.0f ? div(pow2i(bits - 1), mul(absmax, p.pre)) : 0.0f;
  return p;
}

// Scaled value y = x * pre * inv in code units, then the integer code (offset to unsigned).
// Stochastic rounding rounds y up with draw `rnd` (sr_draw) when sr_threshold(rnd) < frac(y).
LC_HD uint32_t absmax_code(float x, AbsmaxParams p, int bits, bool stochastic, uint32_t rnd) {
  float y = mul(mul(x, p.pre), p.inv);
  float k;
  if (stochastic) {
    float f = floor_f(y);
    k = add(f, sr_threshold(rnd) < sub(y, f) ? 1.0f : 0.0f);
  } else {
    k = rint_f(y);
  }
  float lo = -pow2i(bits - 1), hi = sub(pow2i(bits - 1), 1.0f);
  k = k < lo ? lo : (k > hi ? hi : k);
  return static_cast<uint32_t>(static_cast<int32_t>(k) + (1 << (bits - 1)));
}

LC_HD float absmax_value(uint32_t code, float absmax, int bits) {
  float k = static_cast<float>(static_cast<int32_t>(code) - (1 << (bits - 1)));
  return mul(mul(k, pow2i(1 - bits)), absmax);
}

// 1 bit: sign x mean|x|; code 1 means negative.
// The mean is the group's canonical tree sum of |y| (group_math.h) divided by the element
// count. When that sum overflows fp32 for a finite group (values near FLT_MAX), the tree is
// summed again in the same order over |y| * 2^-12 (at most 4096 leaves of at most
// FLT_MAX * 2^-12: no overflow) and the mean is scaled back by 2^12, saturating at FLT_MAX.
// A finite group so never gets an infinite record, which would decode to NaN.
constexpr float kMeanRescale = 2.44140625e-04f;  // 2^-12
LC_HD float mean_abs(float tree_sum, uint32_t count) {
  return div(tree_sum, static_cast<float>(count));
}
LC_HD float rescaled_mean_abs(float rescaled_tree_sum, uint32_t count) {
  float m = mul(div(rescaled_tree_sum, static_cast<float>(count)), 4096.0f);
  return m > kFltMax ? kFltMax : m;
}
LC_HD uint32_t sign_code(float x) {
  return x < 0.0f ? 1u : 0u;
}
LC_HD float sign_value(uint32_t code, float mean_abs) {
  return code ? -mean_abs : mean_abs;
}

// ---- min-max grid (computed in double: no overflow or subnormal loss for any fp32 range) ----

struct MinmaxParams {
  double lo;
  double inv;   // (2^b - 1) / (hi - lo), 0 when hi == lo
  double step;  // (hi - lo) / (2^b - 1)
};

LC_HD MinmaxParams minmax_params(float lo, float hi, int bits) {
  MinmaxParams p;
  double range = dsub(static_cast<double>(hi), static_cast<double>(lo));
  double levels = static_cast<double>((1 << bits) - 1);
  p.lo = lo;
  p.inv = range > 0.0 ? ddiv(levels, range) : 0.0;
  p.step = ddiv(range, levels);
  return p;
}

// y = (x - lo) * inv in double, rounded as in absmax_code (the threshold widened to double).
LC_HD uint32_t minmax_code(float x, const MinmaxParams& p, int bits, bool stochastic,
                           uint32_t rnd) {
  double y = dmul(dsub(static_cast<double>(x), p.lo), p.inv);
  double k;
  if (stochastic) {
    double f = floor_d(y);
    k = dadd(f, static_cast<double>(sr_threshold(rnd)) < dsub(y, f) ? 1.0 : 0.0);
  } else {
    k = rint_d(y);
  }
  double hi = static_cast<double>((1 << bits) - 1);
  k = k < 0.0 ? 0.0 : (k > hi ? hi : k);
  return static_cast<uint32_t>(k);
}

LC_HD float minmax_value(uint32_t code, const MinmaxParams& p) {
  return static_cast<float>(dadd(p.lo, dmul(static_cast<double>(code), p.step)));
}

// ---- packing: every 8 consecutive elements form one unit of `bits` bytes; element j of the
// unit occupies bits [j*b, (j+1)*b) of the unit read as a little-endian integer. ----

LC_HD uint64_t pack_unit(const uint32_t codes[8], int bits) {
  uint64_t w = 0;
  for (int j = 0; j < 8; ++j) w |= static_cast<uint64_t>(codes[j]) << (j * bits);
  return w;
}

LC_HD uint32_t unit_code(uint64_t w, int j, int bits) {
  return static_cast<uint32_t>((w >> (j * bits)) & ((1u << bits) - 1u));
}

}  // namespace lowcomm::qm
