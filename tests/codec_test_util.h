#pragma once
// Shared helpers of the codec tests: seeded tensor generators (fp32, bf16, fp16), an
// independent oracle for rounding to the 16-bit types, and a reader of the encoded payload
// (scales, then packed codes) so tests can check the grid without going through decode().
//
// Nothing here includes lowcomm's internal headers: the oracles must not share code with what
// they check.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "lowcomm/codec.h"

namespace lowcomm::test {

// ---- deterministic random numbers (splitmix64; no std:: distributions, whose output is
// implementation-defined) ----

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}

  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  uint64_t below(uint64_t k) { return next() % k; }
  // Standard normal (Box-Muller).
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // Student's t with 3 degrees of freedom: heavy tails like real gradients.
  double student_t3() {
    double a = normal(), b = normal(), c = normal();
    double chi2 = a * a + b * b + c * c;
    return normal() / std::sqrt(chi2 / 3.0 + 1e-12);
  }

 private:
  uint64_t s_;
};

// ---- 16-bit float oracle ----

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t to_bf16_bits(float f) {
  if (std::isnan(f)) return 0x7FC0u;
  uint32_t u = f32_bits(f);
  uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7FFFu + lsb) >> 16);
}
inline float from_bf16_bits(uint16_t h) {
  return bits_f32(static_cast<uint32_t>(h) << 16);
}

// fp16 through the compiler's _Float16 (libgcc's soft conversion): independent of lowcomm's.
inline uint16_t to_f16_bits(float f) {
  if (std::isnan(f)) return 0x7E00u;
  _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
inline float from_f16_bits(uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, 2);
  return static_cast<float>(h);
}

// The value v becomes when stored as `dtype` (round to nearest even).
inline float round_to(DType dtype, float v) {
  switch (dtype) {
    case DType::kBFloat16:
      return from_bf16_bits(to_bf16_bits(v));
    case DType::kFloat16:
      return from_f16_bits(to_f16_bits(v));
    default:
      return v;
  }
}

// Same float, or both NaN.
inline bool same_value(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || f32_bits(a) == f32_bits(b);
}

// ---- tensors in memory ----

struct Tensor {
  DType dtype = DType::kFloat32;
  uint64_t n = 0;
  std::vector<uint8_t> bytes;

  Tensor() = default;
  Tensor(DType d, uint64_t count) : dtype(d), n(count), bytes(count * dtype_size(d) + 1) {}

  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }

  float get(uint64_t i) const {
    if (dtype == DType::kFloat32) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return dtype == DType::kBFloat16 ? from_bf16_bits(h) : from_f16_bits(h);
  }
  // Stores v rounded to nearest even (NaN stays NaN).
  void set(uint64_t i, float v) {
    if (dtype == DType::kFloat32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
      return;
    }
    uint16_t h = dtype == DType::kBFloat16 ? to_bf16_bits(v) : to_f16_bits(v);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
  // Raw element bits (16-bit types zero-extended).
  uint32_t raw(uint64_t i) const {
    if (dtype == DType::kFloat32) return f32_bits(get(i));
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return h;
  }
  std::vector<float> floats() const {
    std::vector<float> v(n);
    for (uint64_t i = 0; i < n; ++i) v[i] = get(i);
    return v;
  }
  bool operator==(const Tensor& o) const {
    return dtype == o.dtype && n == o.n &&
           std::memcmp(bytes.data(), o.bytes.data(), n * dtype_size(dtype)) == 0;
  }
};

inline Tensor make_tensor(DType dtype, const std::vector<float>& values) {
  Tensor t(dtype, values.size());
  for (uint64_t i = 0; i < values.size(); ++i) t.set(i, values[i]);
  return t;
}

inline const DType kAllDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

// ---- value generators ----

// Gradient-like values: every `block` elements share a scale drawn log-uniformly over
// [10^lo_exp, 10^hi_exp]; within a block, Student-t(3) values, with occasional outliers,
// exact zeros, and now and then a block that is all zeros or one sparse spike.
inline std::vector<float> pseudo_gradient(uint64_t n, uint64_t seed, uint64_t block = 128,
                                          double lo_exp = -6.0, double hi_exp = 0.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (uint64_t start = 0; start < n; start += block) {
    uint64_t end = std::min(n, start + block);
    double scale = std::pow(10.0, rng.uniform(lo_exp, hi_exp));
    uint64_t kind = rng.below(40);
    for (uint64_t i = start; i < end; ++i) {
      double x = scale * rng.student_t3();
      if (rng.below(100) == 0) x *= 30.0;                                      // outlier
      if (rng.below(50) == 0) x = 0.0;                                         // exact zero
      if (kind == 0) x = 0.0;                                                  // dead block
      if (kind == 1) x = (i == start + rng.below(end - start)) ? scale : 0.0;  // sparse
      v[i] = static_cast<float>(x);
    }
  }
  return v;
}

inline std::vector<float> uniform_values(uint64_t n, uint64_t seed, double lo, double hi) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.uniform(lo, hi));
  return v;
}

// A pseudo-gradient tensor in `dtype`, values clamped to what fp16 can hold when needed.
inline Tensor gradient_tensor(DType dtype, uint64_t n, uint64_t seed, uint64_t block = 128) {
  return make_tensor(dtype, pseudo_gradient(n, seed, block));
}

// Shortest text that reads back as the same float ("1.17549435e-38", "1.40129846e-45").
inline std::string show(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// ---- specs and the payload layout ----

inline CodecSpec spec_of(std::string_view text) {
  auto r = parse_codec_spec(text);
  if (!r.is_ok()) {
    ADD_FAILURE() << "spec '" << text << "' does not parse: " << r.status().to_string();
    return CodecSpec{};
  }
  return *r;
}

// "q4" from ("q", 4). (Spelled out: GCC 12 gives a false -Wrestrict on "q" + std::string.)
inline std::string named(const char* prefix, int bits) {
  std::string s = prefix;
  s += std::to_string(bits);
  return s;
}

inline int scale_floats(const CodecSpec& s) {
  return s.kind == CodecKind::kMinmax ? 2 : 1;
}

// The payload read back: scale records (one float per group, two for minmax: lo, hi) and one
// unsigned code per element. Packing: every 8 elements form a unit of `bits` bytes read as a
// little-endian integer; element j of the unit holds bits [j*b, (j+1)*b).
struct Payload {
  std::vector<float> scales;
  std::vector<uint32_t> codes;
};

inline Payload unpack(const CodecSpec& s, const std::vector<uint8_t>& bytes, uint64_t n) {
  Payload p;
  uint64_t groups = group_count(s, n);
  p.scales.resize(groups * scale_floats(s));
  if (!p.scales.empty()) std::memcpy(p.scales.data(), bytes.data(), p.scales.size() * 4);
  const uint8_t* packed = bytes.data() + p.scales.size() * 4;
  const int b = s.bits;
  p.codes.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t unit = i / 8, j = i % 8;
    uint64_t w = 0;
    for (int k = 0; k < b; ++k) w |= static_cast<uint64_t>(packed[unit * b + k]) << (8 * k);
    p.codes[i] = static_cast<uint32_t>((w >> (j * b)) & ((1u << b) - 1u));
  }
  return p;
}

inline uint64_t group_of(const CodecSpec& s, uint64_t i) {
  return s.grouping == Grouping::kBlock ? i / s.block : i % s.cols;
}

// The documented decode of one code with its group's scale record, in the documented order:
// absmax (k * 2^-(b-1)) * absmax; q1 +-mean|x|; minmax lo + k (hi-lo)/(2^b-1) in double.
inline float reference_value(const CodecSpec& s, const Payload& p, uint64_t i) {
  uint64_t g = group_of(s, i);
  uint32_t code = p.codes[i];
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (s.kind == CodecKind::kMinmax) {
    float lo = p.scales[2 * g], hi = p.scales[2 * g + 1];
    if (!std::isfinite(lo) || !std::isfinite(hi)) return nan;
    double step = (static_cast<double>(hi) - lo) / static_cast<double>((1 << s.bits) - 1);
    return static_cast<float>(lo + static_cast<double>(code) * step);
  }
  float scale = p.scales[g];
  if (!std::isfinite(scale)) return nan;
  if (s.bits == 1) return code ? -scale : scale;
  int k = static_cast<int>(code) - (1 << (s.bits - 1));
  float unit = static_cast<float>(k) * std::ldexp(1.0f, 1 - s.bits);
  return unit * scale;
}

// ---- running the codec (failures reported, empty results returned) ----

inline std::vector<uint8_t> encode_bytes(const CodecSpec& s, const Tensor& x, RoundingKey key = {},
                                         CpuOptions opts = {}) {
  std::vector<uint8_t> codes(encoded_size(s, x.n) + 1);
  Status st = encode(s, x.dtype, x.data(), x.n, codes.data(), codes.size(), key, opts);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  codes.pop_back();
  return codes;
}

inline Tensor decode_tensor(const CodecSpec& s, const std::vector<uint8_t>& codes, uint64_t n,
                            DType dtype, CpuOptions opts = {}) {
  Tensor out(dtype, n);
  Status st = decode(s, codes.data(), codes.size(), n, dtype, out.data(), opts);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return out;
}

inline std::vector<float> decode_f32(const CodecSpec& s, const std::vector<uint8_t>& codes,
                                     uint64_t n, CpuOptions opts = {}) {
  return decode_tensor(s, codes, n, DType::kFloat32, opts).floats();
}

// Number of elements quantized specs can be tested on: a multiple of cols for column groups.
inline uint64_t fit_count(const CodecSpec& s, uint64_t n) {
  if (s.grouping != Grouping::kColumn) return n;
  uint64_t rows = std::max<uint64_t>(1, n / s.cols);
  return rows * s.cols;
}

}  // namespace lowcomm::test
