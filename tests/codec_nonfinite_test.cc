// The NaN/Inf rule: a group holding NaN or +-Inf gets a NaN scale record and decodes to NaN
// for every element; other groups are untouched; feedback residuals and delta caches of such
// groups reset to 0. Passthrough keeps NaN as NaN and Inf as Inf. NaNs are written canonical.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
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

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kNegNaN = -std::numeric_limits<float>::quiet_NaN();

uint32_t canonical_nan_bits(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return 0x7FC0u;
    case DType::kFloat16:
      return 0x7E00u;
    default:
      return 0x7FC00000u;
  }
}

// A tensor whose groups in `bad` hold one non-finite value each (at different places).
struct Poisoned {
  Tensor clean, x;
  std::set<uint64_t> bad;
};

Poisoned poison(const CodecSpec& s, DType dtype, uint64_t n, float special, uint64_t seed) {
  Poisoned p;
  p.clean = test::gradient_tensor(dtype, n, seed);
  p.x = p.clean;
  const uint64_t groups = group_count(s, n);
  for (uint64_t g : {uint64_t{1}, groups / 2, groups - 1}) p.bad.insert(g);
  uint64_t k = 0;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t g = test::group_of(s, i);
    if (p.bad.count(g) && (k++ % 7) == 3) p.x.set(i, special);
  }
  // Every listed group got at least one special value.
  std::set<uint64_t> hit;
  for (uint64_t i = 0; i < n; ++i) {
    if (!std::isfinite(p.x.get(i))) hit.insert(test::group_of(s, i));
  }
  EXPECT_EQ(hit, p.bad);
  return p;
}

// clang-format off
const char* kQuantSpecs[] = {"q1", "q2", "q3", "q4", "q8", "minmax2", "minmax8", "q4:col=16",
                             "minmax4:col=16", "q2:sr", "minmax4:sr", "q8:block=32"};
// clang-format on
const float kSpecials[] = {kNaN, kNegNaN, kInf, -kInf};

TEST(CodecNonFinite, PoisonsOnlyItsGroup) {
  for (const char* text : kQuantSpecs) {
    CodecSpec s = spec_of(text);
    const uint64_t n = test::fit_count(s, 128 * 6 + 50);
    for (DType dtype : test::kAllDTypes) {
      for (float special : kSpecials) {
        SCOPED_TRACE(std::string(text) + " " + dtype_name(dtype) + " special " +
                     std::to_string(special));
        Poisoned p = poison(s, dtype, n, special, 3);
        const RoundingKey key{8, 0};
        auto codes = encode_bytes(s, p.x, key);
        auto clean_codes = encode_bytes(s, p.clean, key);
        test::Payload pl = test::unpack(s, codes, n);
        for (uint64_t g = 0; g < group_count(s, n); ++g) {
          for (int k = 0; k < test::scale_floats(s); ++k) {
            float sc = pl.scales[g * test::scale_floats(s) + k];
            if (p.bad.count(g)) {
              EXPECT_EQ(test::f32_bits(sc), 0x7FC00000u) << "group " << g << " scale record";
            } else {
              EXPECT_TRUE(std::isfinite(sc)) << "group " << g;
            }
          }
        }
        auto clean = decode_f32(s, clean_codes, n);
        for (DType out : test::kAllDTypes) {
          Tensor d = test::decode_tensor(s, codes, n, out);
          Tensor dc = test::decode_tensor(s, clean_codes, n, out);
          for (uint64_t i = 0; i < n; ++i) {
            if (p.bad.count(test::group_of(s, i))) {
              ASSERT_EQ(d.raw(i), canonical_nan_bits(out)) << "element " << i;
            } else {
              ASSERT_EQ(d.raw(i), dc.raw(i)) << "element " << i << " of a clean group changed";
              ASSERT_TRUE(std::isfinite(clean[i]));
            }
          }
        }
        // decode_accumulate: the poisoned groups become NaN, the others add as usual.
        Tensor acc = test::gradient_tensor(dtype, n, 4), acc_clean = acc;
        ASSERT_TRUE(decode_accumulate(s, codes.data(), codes.size(), n, dtype, acc.data()).is_ok());
        ASSERT_TRUE(
            decode_accumulate(s, clean_codes.data(), clean_codes.size(), n, dtype, acc_clean.data())
                .is_ok());
        for (uint64_t i = 0; i < n; ++i) {
          if (p.bad.count(test::group_of(s, i))) {
            ASSERT_EQ(acc.raw(i), canonical_nan_bits(dtype)) << "element " << i;
          } else {
            ASSERT_EQ(acc.raw(i), acc_clean.raw(i)) << "element " << i;
          }
        }
      }
    }
  }
}

// A non-finite value in the input, or in the residual, resets the group's residual to +0;
// other groups get y - D exactly as without the special value.
TEST(CodecNonFinite, FeedbackResidualResets) {
  for (const char* text : kQuantSpecs) {
    CodecSpec s = spec_of(text);
    const uint64_t n = test::fit_count(s, 128 * 6 + 50);
    for (DType dtype : test::kAllDTypes) {
      SCOPED_TRACE(std::string(text) + " " + dtype_name(dtype));
      Poisoned p = poison(s, dtype, n, kInf, 5);
      std::vector<float> r0 = test::pseudo_gradient(n, 6, 128, -6, -4);
      std::vector<float> r = r0, rc = r0;
      const uint64_t bad_in_r = (*p.bad.begin() == 1 ? 2 : 1);  // a clean group of x
      for (uint64_t i = 0; i < n; ++i) {
        if (test::group_of(s, i) == bad_in_r && i % 5 == 0) r[i] = kNaN;
      }
      std::vector<uint8_t> codes(encoded_size(s, n)), cc(codes.size());
      ASSERT_TRUE(encode_error_feedback(s, dtype, p.x.data(), r.data(), n, codes.data(),
                                        codes.size(), {3, 0})
                      .is_ok());
      ASSERT_TRUE(encode_error_feedback(s, dtype, p.clean.data(), rc.data(), n, cc.data(),
                                        cc.size(), {3, 0})
                      .is_ok());
      auto d = decode_f32(s, codes, n);
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t g = test::group_of(s, i);
        if (p.bad.count(g) || g == bad_in_r) {
          ASSERT_EQ(test::f32_bits(r[i]), 0u) << "element " << i << " residual not reset";
          ASSERT_TRUE(std::isnan(d[i])) << "element " << i;
        } else {
          ASSERT_EQ(test::f32_bits(r[i]), test::f32_bits(rc[i])) << "element " << i;
        }
      }
    }
  }
}

// Sender and receiver caches of poisoned groups both reset to 0; the receiver's output is NaN
// there; a clean step afterwards keeps both caches identical.
TEST(CodecNonFinite, DeltaCachesResetTogether) {
  for (const char* text : kQuantSpecs) {
    CodecSpec s = spec_of(text);
    const uint64_t n = test::fit_count(s, 128 * 6 + 50);
    for (DType dtype : test::kAllDTypes) {
      SCOPED_TRACE(std::string(text) + " " + dtype_name(dtype));
      Poisoned p = poison(s, dtype, n, kNegNaN, 9);
      Tensor m_send = test::gradient_tensor(dtype, n, 10), m_recv = m_send, out(dtype, n);
      std::vector<uint8_t> codes(encoded_size(s, n));
      ASSERT_TRUE(
          encode_delta(s, dtype, p.x.data(), m_send.data(), n, codes.data(), codes.size(), {4, 0})
              .is_ok());
      ASSERT_TRUE(
          decode_delta(s, codes.data(), codes.size(), n, dtype, m_recv.data(), out.data()).is_ok());
      ASSERT_TRUE(m_send == m_recv);
      for (uint64_t i = 0; i < n; ++i) {
        if (p.bad.count(test::group_of(s, i))) {
          ASSERT_EQ(m_send.raw(i), 0u) << "element " << i << " cache not reset";
          ASSERT_EQ(out.raw(i), canonical_nan_bits(dtype)) << "element " << i;
        } else {
          ASSERT_EQ(out.raw(i), m_recv.raw(i)) << "element " << i;
        }
      }
      ASSERT_TRUE(encode_delta(s, dtype, p.clean.data(), m_send.data(), n, codes.data(),
                               codes.size(), {5, 0})
                      .is_ok());
      ASSERT_TRUE(
          decode_delta(s, codes.data(), codes.size(), n, dtype, m_recv.data(), out.data()).is_ok());
      ASSERT_TRUE(m_send == m_recv);
      ASSERT_TRUE(out == m_recv);
    }
  }
}

// With out == m, a poisoned group cannot both reset the cache to 0 (to stay in step with the
// sender) and hold NaN (the output rule). Disabled until the API decides which one wins; it
// documents that the receiver's cache currently becomes NaN and diverges from the sender's.
// decode_delta cannot write a NaN group's output (NaN) and its cache reset (0) to one buffer,
// so an output aliasing the cache is rejected rather than desynchronising sender and receiver.
TEST(CodecNonFinite, DeltaOutputMustNotAliasTheCache) {
  CodecSpec s = spec_of("q4");
  const uint64_t n = 512;
  Poisoned p = poison(s, DType::kFloat32, n, kNaN, 11);
  Tensor m_send(DType::kFloat32, n), m_recv(DType::kFloat32, n);
  std::vector<uint8_t> codes(encoded_size(s, n));
  ASSERT_TRUE(
      encode_delta(s, DType::kFloat32, p.x.data(), m_send.data(), n, codes.data(), codes.size())
          .is_ok());
  Status st =
      decode_delta(s, codes.data(), codes.size(), n, DType::kFloat32, m_recv.data(), m_recv.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("alias"), std::string::npos) << st.message();
  ASSERT_TRUE(
      decode_delta(s, codes.data(), codes.size(), n, DType::kFloat32, m_recv.data(), nullptr)
          .is_ok());
  EXPECT_TRUE(m_send == m_recv);
}

// A crafted payload (random bytes; lowcomm never writes an infinite record): groups whose
// record is finite decode to finite values on the grid, groups whose record is NaN or +-Inf
// decode to NaN; the delta receiver resets those groups' cache entries to 0.
TEST(CodecNonFinite, CraftedRecordsDecodeSafely) {
  const float specials[] = {kInf, -kInf, kNaN, test::bits_f32(0xFFFFFFFFu)};
  for (const char* text :
       {"q1", "q2", "q3", "q4", "q8", "minmax2", "minmax8", "q4:col=8", "minmax4:col=8"}) {
    CodecSpec s = spec_of(text);
    const uint64_t n = 128 * 8;
    test::Rng rng(21);
    std::vector<uint8_t> codes(encoded_size(s, n));
    for (auto& c : codes) c = static_cast<uint8_t>(rng.next());
    const uint64_t groups = group_count(s, n);
    const int per = test::scale_floats(s);
    std::vector<float> rec(groups * per);
    for (uint64_t g = 0; g < groups; ++g) {
      for (int k = 0; k < per; ++k) {
        float v = static_cast<float>(rng.uniform(-1e30, 1e30));
        if (g % 3 == 1) v = specials[(g + k) % 4];
        if (g == 2 && k == per - 1) v = std::numeric_limits<float>::max();
        rec[g * per + k] = v;
      }
    }
    std::memcpy(codes.data(), rec.data(), rec.size() * 4);
    for (DType dtype : test::kAllDTypes) {
      SCOPED_TRACE(std::string(text) + " " + dtype_name(dtype));
      Tensor d = test::decode_tensor(s, codes, n, dtype);
      test::Payload p = test::unpack(s, codes, n);
      Tensor m = test::gradient_tensor(dtype, n, 1), out(dtype, n);
      ASSERT_TRUE(
          decode_delta(s, codes.data(), codes.size(), n, dtype, m.data(), out.data()).is_ok());
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t g = test::group_of(s, i);
        bool finite = true;
        for (int k = 0; k < per; ++k) finite = finite && std::isfinite(rec[g * per + k]);
        if (finite) {
          ASSERT_EQ(test::f32_bits(d.get(i)),
                    test::f32_bits(test::round_to(dtype, test::reference_value(s, p, i))))
              << "element " << i;
          ASSERT_FALSE(std::isnan(d.get(i))) << "element " << i;
        } else {
          ASSERT_EQ(d.raw(i), canonical_nan_bits(dtype)) << "element " << i;
          ASSERT_EQ(m.raw(i), 0u) << "element " << i;
          ASSERT_EQ(out.raw(i), canonical_nan_bits(dtype)) << "element " << i;
        }
      }
    }
  }
}

// Passthrough: NaN stays NaN (canonical), +-Inf stays +-Inf, through every wire and output
// type; feedback residuals and delta caches of those elements reset to 0.
TEST(CodecNonFinite, PassthroughKeepsNaNAndInf) {
  const uint64_t n = 64;
  std::vector<float> v = test::pseudo_gradient(n, 12);
  v[1] = kNaN;
  v[2] = kInf;
  v[3] = -kInf;
  v[4] = kNegNaN;
  v[5] = test::bits_f32(0x7FA00001u);  // a signalling NaN with a payload
  for (const char* text : {"none", "bf16", "fp16"}) {
    CodecSpec s = spec_of(text);
    for (DType dtype : test::kAllDTypes) {
      SCOPED_TRACE(std::string(text) + " " + dtype_name(dtype));
      Tensor x = test::make_tensor(dtype, v);
      if (dtype == DType::kFloat32) x.set(5, v[5]);
      auto codes = encode_bytes(s, x);
      for (DType out : test::kAllDTypes) {
        Tensor d = test::decode_tensor(s, codes, n, out);
        for (uint64_t i : {1, 4, 5}) ASSERT_EQ(d.raw(i), canonical_nan_bits(out)) << i;
        ASSERT_EQ(d.get(2), kInf);
        ASSERT_EQ(d.get(3), -kInf);
      }
      std::vector<float> r(n, 0.25f);
      ASSERT_TRUE(encode_error_feedback(s, dtype, x.data(), r.data(), n, codes.data(), codes.size())
                      .is_ok());
      for (uint64_t i = 1; i <= 5; ++i) ASSERT_EQ(test::f32_bits(r[i]), 0u) << i;
      Tensor m_send = test::make_tensor(dtype, std::vector<float>(n, 1.0f)), m_recv = m_send;
      Tensor o(dtype, n);
      ASSERT_TRUE(
          encode_delta(s, dtype, x.data(), m_send.data(), n, codes.data(), codes.size()).is_ok());
      ASSERT_TRUE(
          decode_delta(s, codes.data(), codes.size(), n, dtype, m_recv.data(), o.data()).is_ok());
      ASSERT_TRUE(m_send == m_recv);
      for (uint64_t i = 1; i <= 5; ++i) {
        ASSERT_EQ(m_send.raw(i), 0u) << i;
        ASSERT_FALSE(std::isfinite(o.get(i))) << i;
      }
      ASSERT_TRUE(std::isnan(o.get(1)));
    }
  }
}

}  // namespace
}  // namespace lowcomm
