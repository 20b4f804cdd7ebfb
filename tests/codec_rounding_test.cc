// Stochastic rounding (":sr"): the documented generator (8 bits of Philox4x32-10 per element),
// reproducible for one seed, unbiased over seeds and to within the documented 2^-9 of a step,
// and a pure function of (seed, key.offset + element index), so chunks encoded apart match the
// whole.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "codec_test_util.h"
#include "lowcomm/codec.h"

namespace lowcomm {
namespace {

using test::decode_f32;
using test::encode_bytes;
using test::spec_of;
using test::Tensor;

TEST(CodecRounding, SameSeedSameBytesOtherSeedOtherBytes) {
  for (const char* text :
       {"q2:sr", "q3:sr", "q4:sr:block=32", "q8:sr", "q4:col=16:sr", "minmax2:sr", "minmax8:sr"}) {
    SCOPED_TRACE(text);
    CodecSpec s = spec_of(text);
    Tensor x = test::gradient_tensor(DType::kFloat32, 4096, 3);
    auto a = encode_bytes(s, x, RoundingKey{42, 0});
    EXPECT_EQ(a, encode_bytes(s, x, RoundingKey{42, 0}));
    EXPECT_NE(a, encode_bytes(s, x, RoundingKey{43, 0}));
    EXPECT_NE(a, encode_bytes(s, x, RoundingKey{uint64_t{42} << 32, 0}));  // high key word used
    EXPECT_NE(a, encode_bytes(s, x, RoundingKey{42, 8}));
    EXPECT_NE(a, encode_bytes(s, x, RoundingKey{42, uint64_t{1} << 40}));  // high counter word
  }
  // Round to nearest ignores the key.
  CodecSpec rn = spec_of("q4");
  Tensor x = test::gradient_tensor(DType::kFloat32, 1000, 4);
  EXPECT_EQ(encode_bytes(rn, x, RoundingKey{1, 0}), encode_bytes(rn, x, RoundingKey{2, 77}));
}

// ---- the documented generator, written apart from lowcomm's ----

// Philox4x32-10 as Random123 defines it (Salmon et al., SC'11).
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += 0x9E3779B9u;
      key[1] += 0xBB67AE85u;
    }
    const uint64_t p0 = uint64_t{0xD2511F53u} * ctr[0];
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
  }
  return ctr;
}

// docs/codecs.md: element t = key.offset + i (mod 2^64) takes byte t mod 16 of the output of
// counter t / 16 (low word, high word, 0, 0) under key (seed low word, seed high word), the four
// words read as 16 little-endian bytes.
uint32_t documented_draw(uint64_t seed, uint64_t t) {
  const uint64_t c = t / 16;
  const auto w = philox4x32_10({static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 0, 0},
                               {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  return (w[(t % 16) / 4] >> (8 * (t % 4))) & 0xFFu;
}

// The documented code of x under its group's record, with draw r: round up when
// (r + 1/2) / 256 < y - floor(y), y in code units (absmax in fp32, minmax in double).
uint32_t documented_code(const CodecSpec& s, const test::Payload& p, uint64_t g, float x,
                         uint32_t r) {
  const double u = (r + 0.5) / 256.0;
  if (s.kind == CodecKind::kMinmax) {
    const double lo = p.scales[2 * g], hi = p.scales[2 * g + 1];
    const double levels = (1 << s.bits) - 1;
    const double inv = hi > lo ? levels / (hi - lo) : 0.0;
    const double y = (static_cast<double>(x) - lo) * inv;
    const double k = std::floor(y) + (u < y - std::floor(y) ? 1.0 : 0.0);
    return static_cast<uint32_t>(std::min(std::max(k, 0.0), levels));
  }
  const float amax = p.scales[g];
  const float pre = amax < 0x1.0p-64f ? 0x1.0p64f : 1.0f;
  const float inv = amax > 0.0f ? std::ldexp(1.0f, s.bits - 1) / (amax * pre) : 0.0f;
  const float y = (x * pre) * inv;
  const float f = std::floor(y);
  const double half = std::ldexp(1.0, s.bits - 1);
  const double k = std::min(std::max(f + (u < y - f ? 1.0 : 0.0), -half), half - 1);
  return static_cast<uint32_t>(static_cast<int>(k) + (1 << (s.bits - 1)));
}

TEST(CodecRounding, PhiloxKnownAnswers) {
  // Random123's kat_vectors for philox4x32 with 10 rounds.
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

// Every code of an sr encoding is the documented function of (x, record, seed, offset + i), on
// both CPU paths, at offsets on and off a counter's first byte and across the 2^64 wrap.
TEST(CodecRounding, CodesFollowTheDocumentedGenerator) {
  for (const char* text : {"q2:sr", "q4:sr:block=32", "q8:sr", "q4:col=16:sr", "minmax2:sr",
                           "minmax4:sr:block=64", "minmax8:sr"}) {
    const CodecSpec s = spec_of(text);
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      const uint64_t n = 128 * 9 + 16 * 3;
      const Tensor x = test::gradient_tensor(dtype, n, 11);
      for (const RoundingKey key :
           {RoundingKey{0x0123456789ABCDEFull, 0}, RoundingKey{7, 5},
            RoundingKey{uint64_t{1} << 33, 16 * 1000 + 13}, RoundingKey{99, UINT64_MAX - 600}}) {
        for (bool simd : {true, false}) {
          SCOPED_TRACE(std::string(text) + " " + dtype_name(dtype) + " offset " +
                       std::to_string(key.offset) + (simd ? " simd" : " portable"));
          const auto codes = encode_bytes(s, x, key, CpuOptions{1, simd});
          const test::Payload p = test::unpack(s, codes, n);
          for (uint64_t i = 0; i < n; ++i) {
            const uint32_t r = documented_draw(key.seed, key.offset + i);
            ASSERT_EQ(p.codes[i], documented_code(s, p, test::group_of(s, i), x.get(i), r))
                << "element " << i << " x " << test::show(x.get(i)) << " r " << r;
          }
        }
      }
    }
  }
}

// The bytes of one small sr encoding, pinned: a change of generator or rule changes the wire
// format of every ":sr" encoding (docs/codecs.md, "Format changes").
TEST(CodecRounding, GoldenBytes) {
  std::vector<float> v(32);
  for (size_t i = 0; i < v.size(); ++i) v[i] = (static_cast<float>(i) - 10.0f) / 7.0f;
  const Tensor x = test::make_tensor(DType::kFloat32, v);
  const std::vector<uint8_t> q4 = encode_bytes(spec_of("q4:sr:block=32"), x, {0x5EED, 3});
  const std::vector<uint8_t> mm = encode_bytes(spec_of("minmax4:sr:block=32"), x, {0x5EED, 3});
  auto hex = [](const std::vector<uint8_t>& b) {
    std::string out;
    char two[3];
    for (uint8_t c : b) {
      std::snprintf(two, sizeof two, "%02x", c);
      out += two;
    }
    return out;
  };
  EXPECT_EQ(hex(q4), "0000404054556677778899a9aabbccdcddeeffff");
  EXPECT_EQ(hex(mm), "6edbb6bf0000404010213233435466778798aabacbdceefe");
}

// E[D(x)] = x over seeds. Each decoded value is one of the two grid points around x, the upper
// with probability p = frac(x / step), so the mean over N seeds has standard deviation
// step * sqrt(p (1-p) / N). The tolerance is 7 of those plus 4/N steps for the discreteness of
// a binomial with small p (a false alarm is far below 1e-6 for the whole test), plus 2^-14
// steps for the fp32 rounding of x / step. The same inputs under round-to-nearest are off by
// more than the tolerance for most elements, so the test can tell the difference.
TEST(CodecRounding, UnbiasedOverSeeds) {
  constexpr int kSeeds = 2000;
  const uint64_t n = 256;
  for (const char* text : {"q2:sr", "q3:sr", "q4:sr", "q8:sr:block=32", "q4:col=16:sr",
                           "minmax2:sr", "minmax4:sr:block=64"}) {
    SCOPED_TRACE(text);
    CodecSpec s = spec_of(text);
    CodecSpec rn = s;
    rn.rounding = Rounding::kNearest;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      Tensor x = test::make_tensor(dtype, test::uniform_values(n, 17, -1.0, 1.0));
      auto codes0 = encode_bytes(s, x, RoundingKey{0, 0});
      test::Payload p = test::unpack(s, codes0, n);
      std::vector<double> sum(n, 0.0);
      for (int seed = 0; seed < kSeeds; ++seed) {
        auto codes = encode_bytes(s, x, RoundingKey{static_cast<uint64_t>(seed) * 7919u + 1, 0},
                                  CpuOptions{1, true});
        auto d = decode_f32(s, codes, n);
        for (uint64_t i = 0; i < n; ++i) sum[i] += d[i];
      }
      auto nearest = decode_f32(rn, encode_bytes(rn, x), n);
      int checked = 0, rn_would_fail = 0;
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t g = test::group_of(s, i);
        double step, base, top;
        if (s.kind == CodecKind::kMinmax) {
          base = p.scales[2 * g];
          step = (p.scales[2 * g + 1] - base) / ((1 << s.bits) - 1);
          top = p.scales[2 * g + 1];
        } else {
          step = p.scales[g] * std::ldexp(1.0, 1 - s.bits);
          base = 0.0;
          top = ((1 << (s.bits - 1)) - 1) * step;
        }
        const double xi = x.get(i);
        if (xi > top) continue;  // clamped to the top code: biased by design
        double u = (xi - base) / step;
        double pr = u - std::floor(u);
        double tol = step * (7.0 * std::sqrt(pr * (1 - pr) / kSeeds) + 4.0 / kSeeds + 0x1.0p-14);
        double mean = sum[i] / kSeeds;
        EXPECT_NEAR(mean, xi, tol) << "element " << i << " p=" << pr;
        ++checked;
        if (std::fabs(nearest[i] - xi) > tol) ++rn_would_fail;
      }
      EXPECT_GT(checked, static_cast<int>(n) / 2);
      EXPECT_GT(rn_would_fail, checked / 2) << "inputs too close to the grid to detect bias";
    }
  }
}

// The documented bound: with 8 random bits the probability of rounding up is frac(y) rounded
// to a multiple of 1/256, so |E[D(x)] - x| <= 2^-9 of a step. Each case is one value x, exact in
// code units (absmax 1 or min-max range [0, 15] fixes the grid; no arithmetic rounding), held
// by ~2^20 elements whose draws are independent; the mean of their decodes must be within
// 2^-9 steps of x plus 6 standard deviations of the sampling (step sqrt(p (1 - p) / N)).
// Fractions near 0 and 1 make that noise small, so a generator with a coarser threshold (fewer
// bits, or a one-sided u = r / 256) fails: at frac = 0.25/256 it rounds up with probability
// 1/256, a bias of 0.75/256.
TEST(CodecRounding, BiasWithinTheDocumentedBound) {
  const uint64_t block = 128, blocks = 8192, n = block * blocks;
  const double fracs[] = {0.25 / 256, 0.75 / 256,    1.6 / 256,    37.3 / 256,
                          0.5,        1 - 0.4 / 256, 1 - 2.2 / 256};
  for (const char* text : {"q4:sr", "q2:sr", "minmax4:sr"}) {
    const CodecSpec s = spec_of(text);
    const bool minmax = s.kind == CodecKind::kMinmax;
    // The grid: step 1/2^(b-1) with absmax 1 (element 0 of each block); step 1 on [0, 15].
    const double step = minmax ? 1.0 : std::ldexp(1.0, 1 - s.bits);
    // The lowest and the highest whole step that has a grid point above it.
    const double top = minmax ? 14.0 : std::ldexp(1.0, s.bits - 1) - 2;
    for (double base : {minmax ? 0.0 : -std::ldexp(1.0, s.bits - 1), top}) {
      for (double frac : fracs) {
        const double x = (base + std::ldexp(std::round(std::ldexp(frac, 16)), -16)) * step;
        SCOPED_TRACE(std::string(text) + " x " + test::show(x) + " in steps " +
                     test::show(x / step));
        Tensor t(DType::kFloat32, n);
        for (uint64_t i = 0; i < n; ++i) {
          const uint64_t k = i % block;
          t.set(i, k == 0 ? (minmax ? 0.0f : 1.0f) : (minmax && k == 1 ? 15.0f : float(x)));
        }
        const auto d = decode_f32(s, encode_bytes(s, t, RoundingKey{0xB1A5, 12345}), n);
        double sum = 0;
        double count = 0;
        for (uint64_t i = 0; i < n; ++i) {
          if (i % block < (minmax ? 2u : 1u)) continue;
          sum += d[i];
          ++count;
        }
        const double f = x / step - std::floor(x / step);
        const double sigma = step * std::sqrt(std::max(f * (1 - f), 1.0 / 256) / count);
        EXPECT_NEAR(sum / count, x, step * 0x1.0p-9 + 6 * sigma);
      }
    }
  }
}

// Encoding elements [a, b) with key.offset = base + a gives the codes of that part of the
// whole tensor encoded with key.offset = base, for a a multiple of the block size.
TEST(CodecRounding, ChunksMatchTheWhole) {
  for (const char* text : {"q2:sr", "q3:sr:block=32", "q4:sr", "q8:sr:block=64", "minmax2:sr",
                           "minmax4:sr:block=32", "q4", "q1:block=32"}) {
    CodecSpec s = spec_of(text);
    for (DType dtype : test::kAllDTypes) {
      // The second base makes the Philox counter (index / 16) cross 2^32 inside the tensor; the
      // third makes the index wrap past 2^64 (the counter then restarts at 0).
      for (uint64_t base :
           {uint64_t{1000003}, (uint64_t{1} << 36) - 128 * 20, UINT64_MAX - 128 * 20 + 6}) {
        SCOPED_TRACE(std::string(text) + " " + dtype_name(dtype) + " base " + std::to_string(base));
        const uint64_t n = 128 * 50 + 13;
        Tensor x = test::gradient_tensor(dtype, n, 5);
        auto whole = encode_bytes(s, x, RoundingKey{99, base});
        test::Payload pw = test::unpack(s, whole, n);
        auto dw = decode_f32(s, whole, n);
        const uint64_t cuts[] = {0, 128, 128 * 7, 128 * 8, 128 * 31, 128 * 50, n};
        for (size_t c = 0; c + 1 < std::size(cuts); ++c) {
          const uint64_t a = cuts[c], b = cuts[c + 1];
          Tensor part(dtype, b - a);
          std::memcpy(part.data(), x.bytes.data() + a * dtype_size(dtype),
                      (b - a) * dtype_size(dtype));
          auto codes = encode_bytes(s, part, RoundingKey{99, base + a}, CpuOptions{1, c % 2 == 0});
          test::Payload pp = test::unpack(s, codes, b - a);
          const uint64_t g0 = a / s.block;
          for (size_t k = 0; k < pp.scales.size(); ++k) {
            ASSERT_TRUE(test::same_value(pp.scales[k], pw.scales[g0 * test::scale_floats(s) + k]))
                << "chunk [" << a << ", " << b << ") scale " << k;
          }
          for (uint64_t i = 0; i < b - a; ++i) {
            ASSERT_EQ(pp.codes[i], pw.codes[a + i])
                << "chunk [" << a << ", " << b << ") elem " << i;
          }
          auto dp = decode_f32(s, codes, b - a);
          for (uint64_t i = 0; i < b - a; ++i) ASSERT_EQ(dp[i], dw[a + i]);
        }
      }
    }
  }
}

// The same for the error-feedback and AQ-SGD delta encodes, as the collectives and the AQ-SGD
// link call them on segments: codes and the state left behind match the whole tensor's.
TEST(CodecRounding, StatefulChunksMatchTheWhole) {
  const uint64_t n = 128 * 40, base = UINT64_MAX - 128 * 17 + 9;  // wraps past 2^64 inside
  const uint64_t cuts[] = {0, 128 * 3, 128 * 16, 128 * 17, n};
  const Tensor x = test::gradient_tensor(DType::kFloat32, n, 8);
  const Tensor m0 = test::gradient_tensor(DType::kFloat32, n, 9);
  for (const char* text : {"q4:sr", "q2:sr:block=32", "minmax4:sr"}) {
    const CodecSpec s = spec_of(text);
    for (bool delta : {false, true}) {
      SCOPED_TRACE(std::string(text) + (delta ? " delta" : " feedback"));
      // state: the fp32 residual, or the cache m (fp32 here).
      std::vector<float> whole_state(n);
      for (uint64_t i = 0; i < n; ++i) whole_state[i] = 0.01f * m0.get(i);
      std::vector<float> part_state = whole_state;
      auto run = [&](uint64_t a, uint64_t b, std::vector<float>& state, RoundingKey key,
                     CpuOptions opts) {
        std::vector<uint8_t> codes(encoded_size(s, b - a));
        const void* xa = x.bytes.data() + a * 4;
        Status st = delta ? encode_delta(s, DType::kFloat32, xa, state.data() + a, b - a,
                                         codes.data(), codes.size(), key, opts)
                          : encode_error_feedback(s, DType::kFloat32, xa, state.data() + a, b - a,
                                                  codes.data(), codes.size(), key, opts);
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        return codes;
      };
      const auto whole = run(0, n, whole_state, RoundingKey{77, base}, CpuOptions{1, true});
      const test::Payload pw = test::unpack(s, whole, n);
      for (size_t c = 0; c + 1 < std::size(cuts); ++c) {
        const uint64_t a = cuts[c], b = cuts[c + 1];
        const auto codes =
            run(a, b, part_state, RoundingKey{77, base + a}, CpuOptions{1, c % 2 == 1});
        const test::Payload pp = test::unpack(s, codes, b - a);
        for (uint64_t i = 0; i < b - a; ++i) {
          ASSERT_EQ(pp.codes[i], pw.codes[a + i]) << "chunk [" << a << ", " << b << ") elem " << i;
        }
      }
      for (uint64_t i = 0; i < n; ++i) ASSERT_TRUE(test::same_value(part_state[i], whole_state[i]));
    }
  }
}

}  // namespace
}  // namespace lowcomm
