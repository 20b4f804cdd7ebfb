// Stochastic rounding (":sr"): reproducible for one seed, unbiased over seeds, and a pure
// function of (seed, key.offset + element index), so chunks encoded apart match the whole.

#include <gtest/gtest.h>

#include <cmath>
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

// Encoding elements [a, b) with key.offset = base + a gives the codes of that part of the
// whole tensor encoded with key.offset = base, for a a multiple of the block size.
TEST(CodecRounding, ChunksMatchTheWhole) {
  for (const char* text : {"q2:sr", "q3:sr:block=32", "q4:sr", "q8:sr:block=64", "minmax2:sr",
                           "minmax4:sr:block=32", "q4", "q1:block=32"}) {
    CodecSpec s = spec_of(text);
    for (DType dtype : test::kAllDTypes) {
      // The second base makes the Philox counter (index / 4) cross 2^32 inside the tensor.
      for (uint64_t base : {uint64_t{1000003}, (uint64_t{1} << 34) - 128 * 20}) {
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

}  // namespace
}  // namespace lowcomm
