// The stateful codec operations: error feedback (a residual carried between steps) and the
// AQ-SGD delta link (sender and receiver caches that must stay bit-identical), plus the rule
// that no result depends on the CPU thread count.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "codec_test_util.h"
#include "lowcomm/codec.h"

namespace lowcomm {
namespace {

using test::decode_f32;
using test::encode_bytes;
using test::spec_of;
using test::Tensor;

// ---- error feedback ----

// One pass: y = x + r in fp32; the codes are exactly Q(y); r_new = y - D(codes), bit for bit.
TEST(CodecFeedback, OnePassIsExact) {
  for (const char* text : {"q1", "q2", "q3:sr", "q4", "q8:col=32", "minmax4", "minmax2:sr",
                           "q4:block=4096", "none", "bf16", "fp16"}) {
    CodecSpec s = spec_of(text);
    const uint64_t n = test::fit_count(s, 3000 + 5);
    for (DType dtype : test::kAllDTypes) {
      SCOPED_TRACE(std::string(text) + " " + dtype_name(dtype));
      std::vector<float> r = test::pseudo_gradient(n, 1, 64, -7, -2);
      for (int step = 0; step < 3; ++step) {
        Tensor x = test::gradient_tensor(dtype, n, 10 + step);
        RoundingKey key{static_cast<uint64_t>(step) + 5, 17};
        std::vector<float> y(n);
        for (uint64_t i = 0; i < n; ++i) y[i] = x.get(i) + r[i];
        std::vector<uint8_t> codes(encoded_size(s, n));
        ASSERT_TRUE(
            encode_error_feedback(s, dtype, x.data(), r.data(), n, codes.data(), codes.size(), key)
                .is_ok());
        // The codes are those of y encoded directly.
        ASSERT_EQ(codes, encode_bytes(s, test::make_tensor(DType::kFloat32, y), key));
        auto d = decode_f32(s, codes, n);
        for (uint64_t i = 0; i < n; ++i) {
          float want = y[i] - d[i];
          ASSERT_EQ(test::f32_bits(r[i]), test::f32_bits(want))
              << "step " << step << " element " << i << ": y=" << y[i] << " D=" << d[i];
        }
      }
    }
  }
}

// Over many steps, the sum of decoded outputs tracks the sum of inputs: the difference is the
// final residual, which stays bounded by the largest input magnitude of its group. Groups with
// one large value and many small ones lose the small ones without feedback, not with it.
TEST(CodecFeedback, SumOfOutputsTracksSumOfInputs) {
  const uint64_t n = 1024;
  const int steps = 120;
  for (const char* text : {"q1", "q2", "q4", "q2:sr", "minmax2", "q3:col=64", "bf16"}) {
    CodecSpec s = spec_of(text);
    SCOPED_TRACE(text);
    std::vector<float> r(n, 0.0f);
    std::vector<double> sum_x(n, 0.0), sum_d(n, 0.0), sum_plain(n, 0.0), sum_abs(n, 0.0);
    double amax = 0.0;
    for (int t = 0; t < steps; ++t) {
      std::vector<float> v = test::pseudo_gradient(n, 1000 + t, 64, -3, -1);
      for (uint64_t i = 0; i < n; i += 64) v[i] = 1.0f;  // a spike per group: hides the rest
      Tensor x = test::make_tensor(DType::kFloat32, v);
      std::vector<uint8_t> codes(encoded_size(s, n));
      RoundingKey key{static_cast<uint64_t>(t), 0};
      ASSERT_TRUE(
          encode_error_feedback(s, x.dtype, x.data(), r.data(), n, codes.data(), codes.size(), key)
              .is_ok());
      auto d = decode_f32(s, codes, n);
      auto plain = decode_f32(s, encode_bytes(s, x, key), n);
      for (uint64_t i = 0; i < n; ++i) {
        sum_x[i] += v[i];
        sum_d[i] += d[i];
        sum_plain[i] += plain[i];
        sum_abs[i] += std::fabs(v[i]);
        amax = std::max(amax, std::fabs(static_cast<double>(v[i])));
      }
    }
    // Grids with b >= 2: |r| <= one step, so |r| <= 2 max|x|. q1 is only a contraction by
    // 1 - 1/G in the squared norm, so its residual is bounded by about 2 G max|x| instead (a
    // spike that always decodes to the group mean holds (G - 1) times itself in the residual).
    const bool q1 = s.kind == CodecKind::kAbsmax && s.bits == 1;
    const double bound = (q1 ? 2.0 * s.block : 2.0) * amax;
    double worst_ef = 0, worst_plain = 0;
    for (uint64_t i = 0; i < n; ++i) {
      ASSERT_LE(std::fabs(r[i]), bound) << "residual grows at element " << i;
      // sum D = sum x + r_0 - r_T, up to fp32 rounding of each step's y and r.
      ASSERT_NEAR(sum_x[i] - sum_d[i], r[i], 1e-5 * sum_abs[i] + 1e-6) << "element " << i;
      worst_ef = std::max(worst_ef, std::fabs(sum_x[i] - sum_d[i]));
      worst_plain = std::max(worst_plain, std::fabs(sum_x[i] - sum_plain[i]));
    }
    // Without feedback the hidden values' error grows with every step; with it, it is bounded.
    // (q1 needs about G steps before its bound is reached, more than this test runs.)
    if (s.kind != CodecKind::kNone && s.rounding == Rounding::kNearest && !q1) {
      EXPECT_GT(worst_plain, 4 * worst_ef) << "inputs do not show what feedback fixes";
    }
  }
}

// ---- AQ-SGD delta ----

struct DeltaCase {
  const char* spec;
  DType dtype;
};

// A sender and two receivers (one with a separate output, one with no output) over 50 steps of
// a drifting activation: the caches stay bit-identical, the sender's cache update is
// m + D(codes) rounded once to the dtype, the codes are Q(a - m), and each receiver's output
// is its cache.
TEST(CodecDelta, CachesStayBitIdentical) {
  const char* specs[] = {"q1",        "q2",          "q3:sr",   "q4",
                         "q4:col=64", "q8:col=7:sr", "minmax4", "minmax2:sr:block=32",
                         "none",      "bf16",        "fp16"};
  for (const char* text : specs) {
    CodecSpec s = spec_of(text);
    const uint64_t n = test::fit_count(s, 1024 + 56);
    for (DType dtype : test::kAllDTypes) {
      SCOPED_TRACE(std::string(text) + " " + dtype_name(dtype));
      std::vector<float> a = test::pseudo_gradient(n, 7, 128, -2, 0);
      Tensor m_send(dtype, n), m_recv(dtype, n), m_alias(dtype, n), out(dtype, n);
      double err0 = 0, err = 0;
      for (int t = 0; t < 50; ++t) {
        std::vector<float> drift = test::pseudo_gradient(n, 100 + t, 128, -4, -2);
        for (uint64_t i = 0; i < n; ++i) a[i] += drift[i];
        Tensor at = test::make_tensor(dtype, a);
        RoundingKey key{static_cast<uint64_t>(t) * 31 + 1, 0};
        std::vector<float> y(n);
        for (uint64_t i = 0; i < n; ++i) y[i] = at.get(i) - m_send.get(i);
        Tensor before = m_send;
        std::vector<uint8_t> codes(encoded_size(s, n));
        ASSERT_TRUE(
            encode_delta(s, dtype, at.data(), m_send.data(), n, codes.data(), codes.size(), key)
                .is_ok());
        ASSERT_EQ(codes, encode_bytes(s, test::make_tensor(DType::kFloat32, y), key))
            << "step " << t << ": codes are not Q(a - m)";
        auto d = decode_f32(s, codes, n);
        for (uint64_t i = 0; i < n; ++i) {
          ASSERT_EQ(m_send.get(i), test::round_to(dtype, before.get(i) + d[i]))
              << "step " << t << " element " << i;
        }
        ASSERT_TRUE(decode_delta(s, codes.data(), codes.size(), n, dtype, m_recv.data(), out.data())
                        .is_ok());
        ASSERT_TRUE(
            decode_delta(s, codes.data(), codes.size(), n, dtype, m_alias.data(), nullptr).is_ok());
        ASSERT_TRUE(m_send == m_recv) << "step " << t << ": receiver cache diverged";
        ASSERT_TRUE(m_send == m_alias) << "step " << t << ": output-less receiver diverged";
        ASSERT_TRUE(out == m_recv) << "step " << t << ": output is not the cache";
        double e = 0, mag = 0;
        for (uint64_t i = 0; i < n; ++i) {
          e += std::fabs(at.get(i) - m_send.get(i));
          mag += std::fabs(at.get(i));
        }
        if (t == 0) err0 = e / mag;
        err = e / mag;
      }
      // The cache follows the activation: the relative gap after 50 steps is no worse than
      // after the first, and small for the finer grids.
      if (s.bits >= 3) {
        EXPECT_LT(err, 0.1) << "cache does not track the activation";
      }
      EXPECT_LE(err, err0 + 0.05);
    }
  }
}

// ---- thread count ----

// Every op's bytes: codes, decoded output, accumulated output, feedback codes and residual,
// delta codes and cache.
struct AllOps {
  std::vector<uint8_t> codes, feedback_codes, delta_codes;
  Tensor decoded, accumulated, cache;
  std::vector<float> residual;

  bool operator==(const AllOps& o) const {
    return codes == o.codes && feedback_codes == o.feedback_codes && delta_codes == o.delta_codes &&
           decoded == o.decoded && accumulated == o.accumulated && cache == o.cache &&
           std::memcmp(residual.data(), o.residual.data(), residual.size() * 4) == 0;
  }
};

AllOps run_all_ops(const CodecSpec& s, const Tensor& x, RoundingKey key, CpuOptions o) {
  const uint64_t n = x.n;
  AllOps r;
  r.codes = encode_bytes(s, x, key, o);
  r.decoded = test::decode_tensor(s, r.codes, n, x.dtype, o);
  r.accumulated = x;
  EXPECT_TRUE(
      decode_accumulate(s, r.codes.data(), r.codes.size(), n, x.dtype, r.accumulated.data(), o)
          .is_ok());
  r.residual.resize(n);
  for (uint64_t i = 0; i < n; ++i) r.residual[i] = 1e-3f * x.get(i);
  r.feedback_codes.resize(encoded_size(s, n));
  EXPECT_TRUE(encode_error_feedback(s, x.dtype, x.data(), r.residual.data(), n,
                                    r.feedback_codes.data(), r.feedback_codes.size(), key, o)
                  .is_ok());
  r.cache = r.decoded;
  r.delta_codes.resize(encoded_size(s, n));
  EXPECT_TRUE(encode_delta(s, x.dtype, x.data(), r.cache.data(), n, r.delta_codes.data(),
                           r.delta_codes.size(), key, o)
                  .is_ok());
  return r;
}

// Multi-megabyte tensors: every op gives the same bytes with one thread and with the whole
// pool; encodes also with a thread count the pool does not have.
TEST(CodecThreads, ResultsDoNotDependOnThreadCount) {
  const uint64_t n = 1050000;  // 4.2 MB of fp32; 1000 columns; a partial last block of 16
  const Tensor x = test::gradient_tensor(DType::kFloat32, n, 77);
  const Tensor xb = test::gradient_tensor(DType::kBFloat16, n, 78);
  const RoundingKey key{1234, 5678};
  struct Case {
    const char* spec;
    const Tensor* x;
  };
  const Case cases[] = {{"q4", &x}, {"q2:sr", &x}, {"q4:col=1000", &x}, {"minmax8", &x},
                        {"q1", &x}, {"bf16", &x},  {"q3:sr", &xb},      {"q8:col=8:sr", &xb}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.spec) + " " + dtype_name(c.x->dtype));
    CodecSpec s = spec_of(c.spec);
    AllOps one = run_all_ops(s, *c.x, key, CpuOptions{1, true});
    AllOps all = run_all_ops(s, *c.x, key, CpuOptions{0, true});
    EXPECT_TRUE(one == all);
    EXPECT_EQ(encode_bytes(s, *c.x, key, CpuOptions{3, true}), one.codes);
  }
}

// Callers on several threads at once share the codec pool and still get their own results.
TEST(CodecThreads, ConcurrentCallers) {
  const uint64_t n = 300000;
  const CodecSpec s = spec_of("q4:sr");
  std::vector<Tensor> inputs;
  std::vector<std::vector<uint8_t>> want;
  for (uint64_t t = 0; t < 4; ++t) {
    inputs.push_back(test::gradient_tensor(DType::kFloat32, n, 500 + t));
    want.push_back(encode_bytes(s, inputs.back(), RoundingKey{t, 0}, CpuOptions{1, true}));
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> callers;
  for (uint64_t t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      std::vector<uint8_t> codes(encoded_size(s, n));
      for (int rep = 0; rep < 5; ++rep) {
        Status st = encode(s, DType::kFloat32, inputs[t].data(), n, codes.data(), codes.size(),
                           RoundingKey{t, 0});
        if (!st.is_ok() || codes != want[t]) ++mismatches[t];
      }
    });
  }
  for (auto& c : callers) c.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "caller " << t;
}

}  // namespace
}  // namespace lowcomm
