// The CPU codec against its documented grid: scale records, code ranges, round-to-nearest
// error bounds, the decode formula, output dtypes, and the edges (empty, one element, partial
// blocks, zeros, denormals, huge ranges, argument errors). Inputs are seeded pseudo-gradients.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "codec_test_util.h"
#include "lowcomm/codec.h"

namespace lowcomm {
namespace {

using test::decode_f32;
using test::decode_tensor;
using test::encode_bytes;
using test::Payload;
using test::spec_of;
using test::Tensor;

constexpr double kDenormMin = 0x1.0p-149;

std::string path_name(bool simd) {
  return simd ? " (default path)" : " (portable path)";
}

// Checks one encoded tensor against the documented grid. Returns the number of failures so
// callers can stop early; every failure is reported with its element.
int check_grid(const CodecSpec& s, const Tensor& x, const std::vector<uint8_t>& codes,
               CpuOptions opts = {}) {
  int failures = 0;
  auto fail = [&](uint64_t i, const std::string& what) {
    if (++failures <= 5) {
      ADD_FAILURE() << "element " << i << " (x=" << test::show(x.get(i)) << "): " << what;
    }
  };
  const uint64_t n = x.n;
  Payload p = test::unpack(s, codes, n);
  std::vector<float> dec = decode_f32(s, codes, n, opts);
  const bool sr = s.rounding == Rounding::kStochastic;
  const uint64_t groups = group_count(s, n);

  // Scale records from the group's values.
  std::vector<double> amax(groups, 0.0), lo(groups, INFINITY), hi(groups, -INFINITY),
      abs_sum(groups, 0.0);
  std::vector<uint64_t> count(groups, 0);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t g = test::group_of(s, i);
    double y = x.get(i);
    amax[g] = std::max(amax[g], std::fabs(y));
    lo[g] = std::min(lo[g], y);
    hi[g] = std::max(hi[g], y);
    abs_sum[g] += std::fabs(y);
    ++count[g];
  }
  for (uint64_t g = 0; g < groups; ++g) {
    if (s.kind == CodecKind::kMinmax) {
      EXPECT_EQ(p.scales[2 * g], static_cast<float>(lo[g])) << "group " << g << " lo";
      EXPECT_EQ(p.scales[2 * g + 1], static_cast<float>(hi[g])) << "group " << g << " hi";
    } else if (s.bits == 1) {
      double mean = abs_sum[g] / static_cast<double>(count[g]);
      EXPECT_NEAR(p.scales[g], mean, mean * 1e-5 + kDenormMin) << "group " << g << " mean|x|";
    } else {
      EXPECT_EQ(p.scales[g], static_cast<float>(amax[g])) << "group " << g << " absmax";
    }
  }

  for (uint64_t i = 0; i < n && failures < 5; ++i) {
    uint64_t g = test::group_of(s, i);
    float ref = test::reference_value(s, p, i);
    if (!test::same_value(ref, dec[i])) {
      fail(i, "decode gives " + test::show(dec[i]) + ", the documented formula " + test::show(ref));
    }
    if (!std::isfinite(dec[i])) {
      fail(i, "finite input decodes to " + test::show(dec[i]));
      continue;
    }
    const double y = x.get(i), d = dec[i];
    if (s.kind == CodecKind::kMinmax) {
      double step = (hi[g] - lo[g]) / ((1 << s.bits) - 1);
      double slack = std::max(std::fabs(lo[g]), std::fabs(hi[g])) * 0x1.0p-21 + kDenormMin;
      if (std::fabs(y - d) > (sr ? step : step / 2) + slack) {
        fail(i, "minmax error " + test::show(std::fabs(y - d)) + " > step " + test::show(step) +
                    (sr ? "" : " / 2"));
      }
      // The minimum is code 0 and decodes exactly. (The maximum need not: lo + k * step
      // cancels in double when |lo| >> |hi|; the half-step bound still holds.)
      if (y == lo[g] && d != y) fail(i, "the group's minimum decodes to " + test::show(d));
      // The same in code units, where decoding's own rounding cannot hide a wrong code.
      double kx = step > 0 ? (y - lo[g]) / step : 0.0;
      if (std::fabs(p.codes[i] - kx) > (sr ? 1.0 : 0.5) + 0x1.0p-16) {
        fail(i, "minmax code " + std::to_string(p.codes[i]) + " for " + test::show(kx) + " steps");
      }
    } else if (s.bits == 1) {
      float want = y < 0 ? -p.scales[g] : p.scales[g];
      if (dec[i] != want) fail(i, "q1 decodes to " + test::show(dec[i]));
    } else {
      const double step = amax[g] * std::ldexp(1.0, 1 - s.bits);
      const double top = ((1 << (s.bits - 1)) - 1) * step;
      const double slack = amax[g] * 0x1.0p-21 + kDenormMin;
      if (!sr && y == -amax[g] && d != y) {
        fail(i, "-absmax is the bottom code and decodes exactly, got " + test::show(d));
      }
      if (y <= top + slack) {
        if (std::fabs(y - d) > (sr ? step : step / 2) + slack) {
          fail(i, "absmax error " + test::show(std::fabs(y - d)) + " > step " + test::show(step) +
                      (sr ? "" : " / 2") + ", absmax " + test::show(amax[g]));
        }
        // The same in code units (exact in double, also for subnormal scales).
        double kx = y / amax[g] * (1 << (s.bits - 1));
        double k = static_cast<double>(p.codes[i]) - (1 << (s.bits - 1));
        if (std::fabs(k - std::min(kx, (1 << (s.bits - 1)) - 1.0)) > (sr ? 1.0 : 0.5) + 0x1.0p-16) {
          fail(i, "absmax code " + test::show(k) + " for " + test::show(kx) + " steps");
        }
      } else if (p.codes[i] != (1u << s.bits) - 1u) {
        fail(i,
             "value above the top code must clamp to it, got code " + std::to_string(p.codes[i]));
      }
    }
  }
  return failures;
}

// clang-format off
const char* kGridSpecs[] = {
    "q1", "q1:block=32", "q2", "q2:block=32", "q3", "q3:block=64", "q4", "q4:block=4096", "q8",
    "q8:block=256", "minmax2", "minmax4", "minmax8:block=32", "q4:col=64", "q3:col=7", "q8:col=1",
    "q2:col=1000", "minmax4:col=5", "q2:sr", "q4:sr:block=32", "q8:col=24:sr", "minmax2:sr",
    "minmax8:col=3:sr"};
// clang-format on
const uint64_t kGridCounts[] = {1, 5, 8, 100, 128, 129, 1000, 2 * 4096 + 37};

TEST(CodecCpuGrid, PseudoGradientsOnTheDocumentedGrid) {
  uint64_t seed = 1;
  for (const char* text : kGridSpecs) {
    CodecSpec s = spec_of(text);
    for (uint64_t n0 : kGridCounts) {
      const uint64_t n = test::fit_count(s, n0);
      for (DType dtype : test::kAllDTypes) {
        for (bool simd : {true, false}) {
          SCOPED_TRACE(std::string(text) + " " + dtype_name(dtype) + " n=" + std::to_string(n) +
                       path_name(simd));
          Tensor x = test::gradient_tensor(dtype, n, ++seed, std::min<uint64_t>(n, 96));
          CpuOptions opts{0, simd};
          auto codes = encode_bytes(s, x, RoundingKey{seed, 0}, opts);
          ASSERT_EQ(check_grid(s, x, codes, opts), 0);
        }
      }
    }
  }
}

// Uniform inputs hit every code and every rounding boundary region of the grid.
TEST(CodecCpuGrid, UniformInputsUseEveryCode) {
  for (const char* text : {"q2", "q3", "q4", "q8", "minmax2", "minmax4", "minmax8"}) {
    SCOPED_TRACE(text);
    CodecSpec s = spec_of(text);
    const uint64_t n = 128 * 64;
    Tensor x = test::make_tensor(DType::kFloat32, test::uniform_values(n, 7, -3.0, 3.0));
    auto codes = encode_bytes(s, x);
    ASSERT_EQ(check_grid(s, x, codes), 0);
    Payload p = test::unpack(s, codes, n);
    std::vector<int> seen(1u << s.bits, 0);
    for (uint32_t c : p.codes) seen.at(c) = 1;
    for (size_t c = 0; c < seen.size(); ++c) EXPECT_TRUE(seen[c]) << "code " << c << " unused";
  }
}

// Values exactly halfway between two grid points round to the even code under rn.
TEST(CodecCpuGrid, TiesAndExactGridPoints) {
  for (int b : {2, 3, 4, 8}) {
    SCOPED_TRACE(b);
    CodecSpec s = spec_of(test::named("q", b));
    const int half = 1 << (b - 1);
    const float absmax = 2.0f;
    const float step = absmax / static_cast<float>(half);
    std::vector<float> v(128, 0.0f);
    v[0] = -absmax;  // sets the scale
    for (int k = -half; k < half && k + half + 1 < 64; ++k) {
      v[static_cast<size_t>(k + half + 1)] = static_cast<float>(k) * step;  // on the grid
    }
    for (int k = -half; k + 1 < half && k + half + 64 < 128; ++k) {
      v[static_cast<size_t>(k + half + 64)] = (static_cast<float>(k) + 0.5f) * step;  // a tie
    }
    Tensor x = test::make_tensor(DType::kFloat32, v);
    auto codes = encode_bytes(s, x);
    Payload p = test::unpack(s, codes, 128);
    auto dec = decode_f32(s, codes, 128);
    for (int k = -half; k < half && k + half + 1 < 64; ++k) {
      size_t i = static_cast<size_t>(k + half + 1);
      EXPECT_EQ(dec[i], v[i]) << "grid point " << k << " is not exact";
    }
    for (int k = -half; k + 1 < half && k + half + 64 < 128; ++k) {
      size_t i = static_cast<size_t>(k + half + 64);
      int even = (k % 2 == 0) ? k : k + 1;
      EXPECT_EQ(static_cast<int>(p.codes[i]) - half, even) << "tie at " << k << ".5";
    }
  }
}

// Decoding straight to bf16/fp16 equals decoding to fp32 and rounding once.
TEST(CodecCpuDType, DecodeRoundsOnceToTheOutputType) {
  for (const char* text : {"q1", "q3", "q4:col=48", "q8", "minmax8", "minmax2:sr"}) {
    CodecSpec s = spec_of(text);
    const uint64_t n = test::fit_count(s, 1000);
    for (DType in : test::kAllDTypes) {
      Tensor x = test::gradient_tensor(in, n, 11);
      auto codes = encode_bytes(s, x, RoundingKey{5, 0});
      auto d32 = decode_f32(s, codes, n);
      for (DType out : {DType::kBFloat16, DType::kFloat16}) {
        SCOPED_TRACE(std::string(text) + " in " + dtype_name(in) + " out " + dtype_name(out));
        Tensor d = decode_tensor(s, codes, n, out);
        for (uint64_t i = 0; i < n; ++i) {
          ASSERT_EQ(d.get(i), test::round_to(out, d32[i])) << "element " << i;
        }
      }
    }
  }
}

// out += D(codes): fp32 accumulation, one rounding to the output dtype.
TEST(CodecCpuDType, DecodeAccumulateRoundsOnce) {
  for (const char* text : {"q2", "q4:col=40", "q8:block=32", "minmax4", "q1", "none", "bf16"}) {
    CodecSpec s = spec_of(text);
    const uint64_t n = test::fit_count(s, 1000 + 3);
    Tensor x = test::gradient_tensor(DType::kFloat32, n, 21);
    auto codes = encode_bytes(s, x);
    auto d32 = decode_f32(s, codes, n);
    for (DType dtype : test::kAllDTypes) {
      SCOPED_TRACE(std::string(text) + " " + dtype_name(dtype));
      Tensor out = test::gradient_tensor(dtype, n, 22);
      Tensor before = out;
      ASSERT_TRUE(decode_accumulate(s, codes.data(), codes.size(), n, dtype, out.data()).is_ok());
      for (uint64_t i = 0; i < n; ++i) {
        float want = test::round_to(dtype, before.get(i) + d32[i]);
        ASSERT_TRUE(test::same_value(out.get(i), want)) << "element " << i;
      }
      // Accumulating twice is two roundings, each as specified.
      Tensor twice = before;
      for (int k = 0; k < 2; ++k) {
        ASSERT_TRUE(
            decode_accumulate(s, codes.data(), codes.size(), n, dtype, twice.data()).is_ok());
      }
      for (uint64_t i = 0; i < n; ++i) {
        float want = test::round_to(dtype, test::round_to(dtype, before.get(i) + d32[i]) + d32[i]);
        ASSERT_EQ(twice.get(i), want) << "element " << i;
      }
    }
  }
}

TEST(CodecCpuDType, PassthroughRoundsToTheWireType) {
  const uint64_t n = 777;
  std::vector<float> v = test::pseudo_gradient(n, 31);
  v[3] = 1e5f;  // above fp16's range: rounds to +inf on an fp16 wire
  v[4] = -0.0f;
  v[5] = 1e-42f;   // fp32 subnormal
  v[6] = 3.4e38f;  // above bf16's largest finite (3.39e38): rounds to +inf on a bf16 wire
  for (const char* text : {"none", "bf16", "fp16"}) {
    CodecSpec s = spec_of(text);
    for (DType in : test::kAllDTypes) {
      SCOPED_TRACE(std::string(text) + " in " + dtype_name(in));
      Tensor x = test::make_tensor(in, v);
      auto codes = encode_bytes(s, x);
      ASSERT_EQ(codes.size(), n * dtype_size(s.wire_dtype));
      if (in == DType::kFloat32 && s.wire_dtype != DType::kFloat32) {
        EXPECT_TRUE(std::isinf(
            test::round_to(s.wire_dtype, x.get(s.wire_dtype == DType::kFloat16 ? 3 : 6))));
      }
      for (DType out : test::kAllDTypes) {
        Tensor d = decode_tensor(s, codes, n, out);
        for (uint64_t i = 0; i < n; ++i) {
          float want = test::round_to(out, test::round_to(s.wire_dtype, x.get(i)));
          ASSERT_EQ(test::f32_bits(d.get(i)), test::f32_bits(want))
              << "element " << i << " out " << dtype_name(out);
        }
      }
    }
  }
}

// ---- edges ----

TEST(CodecCpuEdge, EmptyTensor) {
  for (const char* text : {"none", "q1", "q4", "q4:col=8", "minmax8:sr"}) {
    SCOPED_TRACE(text);
    CodecSpec s = spec_of(text);
    EXPECT_EQ(encoded_size(s, 0), 0u);
    float r = 0;
    EXPECT_TRUE(encode(s, DType::kFloat32, nullptr, 0, nullptr, 0).is_ok());
    EXPECT_TRUE(decode(s, nullptr, 0, 0, DType::kFloat32, nullptr).is_ok());
    EXPECT_TRUE(decode_accumulate(s, nullptr, 0, 0, DType::kBFloat16, nullptr).is_ok());
    EXPECT_TRUE(encode_error_feedback(s, DType::kFloat32, nullptr, nullptr, 0, nullptr, 0).is_ok());
    EXPECT_TRUE(encode_error_feedback(s, DType::kFloat16, &r, &r, 0, &r, 0).is_ok());
    EXPECT_TRUE(encode_delta(s, DType::kFloat32, nullptr, nullptr, 0, nullptr, 0).is_ok());
    EXPECT_TRUE(decode_delta(s, nullptr, 0, 0, DType::kFloat32, nullptr, nullptr).is_ok());
  }
}

TEST(CodecCpuEdge, OneElement) {
  for (const char* text : {"q1", "q2", "q3", "q4", "q8", "minmax2", "minmax8", "q4:col=1"}) {
    CodecSpec s = spec_of(text);
    for (float v : {0.3f, -0.3f, 0.0f, -0.0f, 1e-45f, -3.0e38f}) {
      SCOPED_TRACE(std::string(text) + " x=" + test::show(v));
      Tensor x = test::make_tensor(DType::kFloat32, {v});
      auto codes = encode_bytes(s, x);
      ASSERT_EQ(codes.size(), static_cast<size_t>(test::scale_floats(s) * 4 + s.bits));
      ASSERT_EQ(check_grid(s, x, codes), 0);
      float d = decode_f32(s, codes, 1)[0];
      if (s.kind == CodecKind::kAbsmax && s.bits > 1 && v > 0) {
        // A lone positive value is its own absmax and clamps to the top code.
        float top = static_cast<float>((1 << (s.bits - 1)) - 1) * std::ldexp(1.0f, 1 - s.bits);
        EXPECT_EQ(d, top * v);
      } else {
        EXPECT_EQ(d, v);  // negative absmax, zero, minmax, q1: exact
      }
    }
  }
}

// A decoded zero is +0, also where the input was -0.
TEST(CodecCpuEdge, NegativeZeroDecodesPositiveZero) {
  for (const char* text :
       {"q1", "q2", "q3", "q4", "q8", "minmax2", "minmax8", "q4:col=8", "q2:sr"}) {
    for (DType dtype : test::kAllDTypes) {
      SCOPED_TRACE(std::string(text) + " " + dtype_name(dtype));
      CodecSpec s = spec_of(text);
      std::vector<float> v(256, -0.0f);
      for (size_t i = 128; i < 256; i += 2) v[i] = 1.0f;  // a second group with a range
      Tensor x = test::make_tensor(dtype, v);
      auto codes = encode_bytes(s, x, RoundingKey{1, 0});
      for (DType out : test::kAllDTypes) {
        Tensor d = decode_tensor(s, codes, x.n, out);
        for (uint64_t i = 0; i < x.n; ++i) {
          if (s.bits == 1 && i >= 128) continue;  // q1: -0 decodes to +mean|x|
          if (x.get(i) == 0.0f) {
            ASSERT_EQ(d.raw(i), 0u) << "element " << i;
          }
        }
      }
    }
  }
}

// Encodes write exactly encoded_size bytes, every one of them defined; decodes write exactly
// n elements. Sizes cover partial packing units and partial last blocks.
TEST(CodecCpuEdge, WritesExactlyItsBytes) {
  const char* specs[] = {"q1",   "q2",  "q3", "q4", "q8", "minmax4", "q3:col=3", "q4:block=32:sr",
                         "none", "bf16"};
  for (const char* text : specs) {
    CodecSpec s = spec_of(text);
    for (uint64_t n0 : {1, 3, 8, 13, 127, 129, 300, 4099}) {
      const uint64_t n = test::fit_count(s, n0);
      SCOPED_TRACE(std::string(text) + " n=" + std::to_string(n));
      Tensor x = test::gradient_tensor(DType::kBFloat16, n, n);
      const uint64_t size = encoded_size(s, n);
      std::vector<uint8_t> a(size + 64, 0xA5), b(size + 64, 0x00);
      ASSERT_TRUE(encode(s, x.dtype, x.data(), n, a.data(), size, RoundingKey{3, 0}).is_ok());
      ASSERT_TRUE(encode(s, x.dtype, x.data(), n, b.data(), size, RoundingKey{3, 0}).is_ok());
      EXPECT_TRUE(std::equal(a.begin(), a.begin() + static_cast<long>(size), b.begin()))
          << "bytes inside the payload depend on the buffer's old contents";
      for (uint64_t k = size; k < size + 64; ++k) ASSERT_EQ(a[k], 0xA5) << "byte " << k;
      for (DType dtype : test::kAllDTypes) {
        std::vector<uint8_t> out((n + 16) * dtype_size(dtype), 0x5A);
        ASSERT_TRUE(decode(s, a.data(), size, n, dtype, out.data()).is_ok());
        for (uint64_t k = n * dtype_size(dtype); k < out.size(); ++k) {
          ASSERT_EQ(out[k], 0x5A) << dtype_name(dtype) << " byte " << k;
        }
      }
    }
  }
}

TEST(CodecCpuEdge, AllZeroAndAllEqualGroups) {
  const uint64_t n = 128 * 4 + 40;
  for (const char* text : {"q1", "q2", "q3", "q4", "q8", "minmax2", "minmax4", "minmax8",
                           "q4:col=8", "minmax4:col=8", "q2:sr", "minmax2:sr"}) {
    CodecSpec s = spec_of(text);
    for (DType dtype : test::kAllDTypes) {
      SCOPED_TRACE(std::string(text) + " " + dtype_name(dtype));
      for (float c : {0.0f, -0.0f, 0.1f, -0.1f, 3.0f, -1e-3f}) {
        Tensor x = test::make_tensor(dtype, std::vector<float>(n, c));
        auto codes = encode_bytes(s, x, RoundingKey{9, 0});
        ASSERT_EQ(check_grid(s, x, codes), 0);
        Tensor d = decode_tensor(s, codes, n, dtype);
        // Exact where the grid holds the value: zero always; minmax always (lo == hi);
        // absmax a negative constant (code -2^(b-1)); q1 a constant in a whole block.
        bool exact = c == 0.0f || s.kind == CodecKind::kMinmax ||
                     (s.kind == CodecKind::kAbsmax && s.bits > 1 && c < 0);
        bool q1_exact = s.bits == 1;
        for (uint64_t i = 0; i < n; ++i) {
          if (exact || (q1_exact && i < n / 128 * 128)) {
            ASSERT_EQ(d.get(i), x.get(i)) << "c=" << c << " element " << i;
          }
        }
      }
    }
  }
}

// Denormal inputs and scales: the grid and its error bound hold down to the smallest denormal,
// and up to the largest float, for every scale exponent.
TEST(CodecCpuEdge, DenormalAndExtremeScales) {
  std::vector<float> scales;
  for (int e = -149; e <= 127; ++e) scales.push_back(std::ldexp(1.0f, e));
  for (float f : {3e-45f, 1.5e-40f, 1.17549e-38f, 1.1754945e-38f, 2.5e-38f, 1e-37f, 3.0e38f,
                  std::numeric_limits<float>::max()}) {
    scales.push_back(f);
  }
  for (const char* text : {"q2", "q3", "q4", "q8", "q1", "minmax2", "minmax8", "q4:sr", "q8:sr"}) {
    CodecSpec s = spec_of(text);
    for (float amax : scales) {
      for (bool simd : {true, false}) {
        SCOPED_TRACE(std::string(text) + " absmax=" + test::show(amax) + " (2^" +
                     std::to_string(std::ilogb(amax)) + ")" + path_name(simd));
        std::vector<float> v(128);
        test::Rng rng(static_cast<uint64_t>(std::ilogb(amax) + 200));
        for (auto& e : v) e = static_cast<float>(amax * rng.uniform(-1.0, 1.0));
        v[0] = amax;
        v[1] = 0.0f;
        v[2] = -amax;
        v[3] = std::numeric_limits<float>::denorm_min();
        Tensor x = test::make_tensor(DType::kFloat32, v);
        auto codes = encode_bytes(s, x, RoundingKey{1, 0}, CpuOptions{0, simd});
        EXPECT_EQ(check_grid(s, x, codes, CpuOptions{0, simd}), 0);
      }
    }
  }
}

TEST(CodecCpuEdge, HugeDynamicRangeInOneGroup) {
  std::vector<float> v(256);
  test::Rng rng(4);
  for (size_t i = 0; i < v.size(); ++i) {
    float mag = static_cast<float>(std::pow(10.0, rng.uniform(-30.0, 30.0)));
    v[i] = (rng.below(2) ? mag : -mag);
  }
  v[7] = 1e30f;
  v[8] = 1e-30f;
  v[9] = -1e-30f;
  v[130] = -3.4e38f;
  v[131] = std::numeric_limits<float>::denorm_min();
  for (const char* text : {"q1", "q2", "q3", "q4", "q8", "minmax2", "minmax4", "minmax8",
                           "q4:col=2", "minmax8:col=2", "q8:sr", "minmax8:sr"}) {
    for (bool simd : {true, false}) {
      SCOPED_TRACE(text + path_name(simd));
      CodecSpec s = spec_of(text);
      Tensor x = test::make_tensor(DType::kFloat32, v);
      auto codes = encode_bytes(s, x, RoundingKey{2, 0}, CpuOptions{0, simd});
      EXPECT_EQ(check_grid(s, x, codes, CpuOptions{0, simd}), 0);
    }
  }
}

// Finite inputs never decode to NaN or Inf, however close to overflow a group's values are.
TEST(CodecCpuEdge, FiniteInputsDecodeFinite) {
  const float big = std::numeric_limits<float>::max();
  std::vector<std::vector<float>> blocks = {
      std::vector<float>(128, big),
      std::vector<float>(128, -big),
      std::vector<float>(4096, big / 2),
      std::vector<float>(128, 3e38f),
  };
  blocks.push_back(test::uniform_values(128, 8, -3.4e38, 3.4e38));
  blocks.push_back(test::uniform_values(100, 9, 1e38, 3.4e38));  // a partial block
  for (const char* text : {"q1", "q1:block=32", "q1:block=4096", "q2", "q3", "q4", "q8", "minmax2",
                           "minmax8", "q4:col=4", "minmax4:col=4", "q8:sr", "minmax4:sr"}) {
    CodecSpec s = spec_of(text);
    for (size_t k = 0; k < blocks.size(); ++k) {
      for (bool simd : {true, false}) {
        SCOPED_TRACE(std::string(text) + " block set " + std::to_string(k) + path_name(simd));
        const CpuOptions opts{0, simd};
        Tensor x = test::make_tensor(DType::kFloat32, blocks[k]);
        auto codes = encode_bytes(s, x, RoundingKey{3, 0}, opts);
        auto dec = decode_f32(s, codes, x.n, opts);
        int bad = 0;
        for (uint64_t i = 0; i < x.n; ++i) {
          if (!std::isfinite(dec[i]) && ++bad <= 3) {
            ADD_FAILURE() << "element " << i << " x=" << x.get(i) << " -> " << dec[i];
          }
        }
        if (bad == 0) {
          EXPECT_EQ(check_grid(s, x, codes, opts), 0);
        }
      }
    }
  }
}

// ---- argument errors: reported as values, nothing written ----

TEST(CodecCpuApi, ArgumentErrors) {
  CodecSpec q4 = spec_of("q4");
  const uint64_t n = 256;
  Tensor x = test::gradient_tensor(DType::kFloat32, n, 1);
  std::vector<float> r(n, 0.0f);
  Tensor m(DType::kFloat32, n);
  const uint64_t need = encoded_size(q4, n);
  std::vector<uint8_t> codes(need + 8, 0xEE);

  auto expect_invalid = [&](Status st, std::vector<std::string> words) {
    EXPECT_FALSE(st.is_ok());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    for (const auto& w : words) {
      EXPECT_NE(st.message().find(w), std::string::npos) << st.message() << " lacks " << w;
    }
    for (uint8_t c : codes) ASSERT_EQ(c, 0xEE) << "an error wrote into the codes buffer";
  };

  // Codes buffer too small, by one byte.
  expect_invalid(encode(q4, DType::kFloat32, x.data(), n, codes.data(), need - 1),
                 {std::to_string(need), std::to_string(need - 1)});
  expect_invalid(decode(q4, codes.data(), need - 1, n, DType::kFloat32, m.data()),
                 {std::to_string(need)});
  expect_invalid(decode_accumulate(q4, codes.data(), 0, n, DType::kFloat32, m.data()), {});
  expect_invalid(
      encode_error_feedback(q4, DType::kFloat32, x.data(), r.data(), n, codes.data(), need - 1),
      {});
  expect_invalid(encode_delta(q4, DType::kFloat32, x.data(), m.data(), n, codes.data(), 10), {});
  expect_invalid(decode_delta(q4, codes.data(), need - 1, n, DType::kFloat32, m.data(), nullptr),
                 {});
  expect_invalid(encode(spec_of("none"), DType::kFloat32, x.data(), n, codes.data(), need), {});

  // Null pointers with n > 0.
  expect_invalid(encode(q4, DType::kFloat32, nullptr, n, codes.data(), need), {"null"});
  expect_invalid(encode(q4, DType::kFloat32, x.data(), n, nullptr, need), {"null"});
  expect_invalid(decode(q4, nullptr, need, n, DType::kFloat32, m.data()), {"null"});
  expect_invalid(decode(q4, codes.data(), need, n, DType::kFloat32, nullptr), {"null"});
  expect_invalid(decode_accumulate(q4, codes.data(), need, n, DType::kFloat32, nullptr), {});
  expect_invalid(
      encode_error_feedback(q4, DType::kFloat32, x.data(), nullptr, n, codes.data(), need),
      {"residual"});
  expect_invalid(
      encode_error_feedback(q4, DType::kFloat32, nullptr, r.data(), n, codes.data(), need), {});
  expect_invalid(encode_delta(q4, DType::kFloat32, x.data(), nullptr, n, codes.data(), need), {});
  expect_invalid(encode_delta(q4, DType::kFloat32, nullptr, m.data(), n, codes.data(), need), {});
  expect_invalid(decode_delta(q4, codes.data(), need, n, DType::kFloat32, nullptr, m.data()), {});

  // n not a multiple of cols.
  CodecSpec col = spec_of("q4:col=48");
  expect_invalid(encode(col, DType::kFloat32, x.data(), 100, codes.data(), codes.size()),
                 {"100", "48"});
  expect_invalid(decode(col, codes.data(), codes.size(), 100, DType::kFloat32, m.data()),
                 {"100", "48"});

  // A spec that fails validation, an unknown dtype value.
  CodecSpec bad = q4;
  bad.block = 48;
  expect_invalid(encode(bad, DType::kFloat32, x.data(), n, codes.data(), codes.size()), {"48"});
  expect_invalid(encode(q4, static_cast<DType>(99), x.data(), n, codes.data(), codes.size()),
                 {"dtype"});

  // Misaligned buffers: scales are fp32 at the payload's start; tensors are element-aligned.
  expect_invalid(encode(q4, DType::kFloat32, x.data(), n, codes.data() + 1, need), {"align"});
  Tensor xb = test::gradient_tensor(DType::kBFloat16, n + 1, 2);
  expect_invalid(encode(q4, DType::kBFloat16, xb.bytes.data() + 1, n, codes.data(), need),
                 {"align"});
  expect_invalid(decode(q4, codes.data(), need, n, DType::kFloat32, m.bytes.data() + 2), {"align"});

  // decode_delta may leave out null.
  std::vector<uint8_t> good = encode_bytes(q4, x);
  EXPECT_TRUE(
      decode_delta(q4, good.data(), good.size(), n, DType::kFloat32, m.data(), nullptr).is_ok());
}

}  // namespace
}  // namespace lowcomm
