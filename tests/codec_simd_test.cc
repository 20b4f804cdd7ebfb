// The AVX2 path must produce the same bytes as the portable path, for every op, codec, dtype,
// rounding and size class, including non-finite and subnormal inputs.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "codec/quant_math.h"
#include "lowcomm/codec.h"

namespace lowcomm {
namespace {

struct Case {
  std::string spec;
  DType dtype;
  uint64_t n;
};

std::vector<uint8_t> make_tensor(DType dtype, uint64_t n, uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(-8.0f, 3.0f);
  std::vector<uint8_t> out(n * dtype_size(dtype));
  for (uint64_t i = 0; i < n; ++i) {
    float v = normal(rng) * std::pow(10.0f, mag(rng));
    if (specials && (i / 128) % 5 == 3) v *= 1e-25f;  // whole blocks of tiny values
    if (specials) {
      auto pick = rng() % 997;
      if (pick == 0) v = std::numeric_limits<float>::quiet_NaN();
      if (pick == 1) v = -std::numeric_limits<float>::infinity();
      if (pick == 2) v = 1e-41f;  // fp32 subnormal
      if (pick == 3) v = -0.0f;
      if (pick == 4 || pick == 5) v = 3.0e38f;  // q1 sums overflow: the rescaled-tree fallback
      if (pick == 6) v = 1e-30f;                // tiny scales: the 2^64 pre-scale
    }
    if (dtype == DType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      uint16_t h = dtype == DType::kBFloat16 ? qm::f32_to_bf16(v) : qm::f32_to_f16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// Runs every op with simd on and off on input x and compares all bytes written.
void check_tensor(const Case& c, const std::vector<uint8_t>& x) {
  auto spec = parse_codec_spec(c.spec);
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  const uint64_t bytes = encoded_size(*spec, c.n);
  auto m0 = make_tensor(c.dtype, c.n, 2, false);
  std::vector<float> r0(c.n);
  for (uint64_t i = 0; i < c.n; ++i) r0[i] = 1e-3f * static_cast<float>(i % 17) - 0.008f;
  // Offsets off and on a multiple of 16 (a Philox counter serves 16 elements); the second key
  // has both seed words and the counter's high word nonzero.
  for (const RoundingKey key :
       {RoundingKey{1234, 77}, RoundingKey{0xDEADBEEF00000003, 1ull << 40}}) {
    CpuOptions simd{1, true}, plain{1, false};
    for (int op = 0; op < 3; ++op) {
      SCOPED_TRACE("encode op " + std::to_string(op));
      std::vector<uint8_t> ca(bytes, 0xAA), cb(bytes, 0x55);
      auto ma = m0, mb = m0;
      auto ra = r0, rb = r0;
      if (op == 0) {
        ASSERT_TRUE(encode(*spec, c.dtype, x.data(), c.n, ca.data(), bytes, key, simd).is_ok());
        ASSERT_TRUE(encode(*spec, c.dtype, x.data(), c.n, cb.data(), bytes, key, plain).is_ok());
      } else if (op == 1) {
        ASSERT_TRUE(encode_error_feedback(*spec, c.dtype, x.data(), ra.data(), c.n, ca.data(),
                                          bytes, key, simd)
                        .is_ok());
        ASSERT_TRUE(encode_error_feedback(*spec, c.dtype, x.data(), rb.data(), c.n, cb.data(),
                                          bytes, key, plain)
                        .is_ok());
      } else {
        ASSERT_TRUE(
            encode_delta(*spec, c.dtype, x.data(), ma.data(), c.n, ca.data(), bytes, key, simd)
                .is_ok());
        ASSERT_TRUE(
            encode_delta(*spec, c.dtype, x.data(), mb.data(), c.n, cb.data(), bytes, key, plain)
                .is_ok());
      }
      ASSERT_EQ(ca, cb);
      ASSERT_EQ(ra, rb);
      ASSERT_EQ(ma, mb);

      // Decodes of these codes.
      auto oa = m0, ob = m0;
      ASSERT_TRUE(decode(*spec, ca.data(), bytes, c.n, c.dtype, oa.data(), simd).is_ok());
      ASSERT_TRUE(decode(*spec, ca.data(), bytes, c.n, c.dtype, ob.data(), plain).is_ok());
      ASSERT_EQ(oa, ob);
      oa = m0, ob = m0;
      ASSERT_TRUE(
          decode_accumulate(*spec, ca.data(), bytes, c.n, c.dtype, oa.data(), simd).is_ok());
      ASSERT_TRUE(
          decode_accumulate(*spec, ca.data(), bytes, c.n, c.dtype, ob.data(), plain).is_ok());
      ASSERT_EQ(oa, ob);
      auto da = m0, db = m0;
      oa.assign(oa.size(), 0), ob.assign(ob.size(), 0);
      ASSERT_TRUE(
          decode_delta(*spec, ca.data(), bytes, c.n, c.dtype, da.data(), oa.data(), simd).is_ok());
      ASSERT_TRUE(
          decode_delta(*spec, ca.data(), bytes, c.n, c.dtype, db.data(), ob.data(), plain).is_ok());
      ASSERT_EQ(da, db);
      ASSERT_EQ(oa, ob);
    }
  }
}

void check_case(const Case& c, bool specials) {
  SCOPED_TRACE(c.spec + " " + dtype_name(c.dtype) + " n=" + std::to_string(c.n) +
               (specials ? " specials" : ""));
  check_tensor(c, make_tensor(c.dtype, c.n, 1, specials));
}

TEST(CodecSimd, MatchesPortablePathBitForBit) {
  const char* specs[] = {"q1",
                         "q2",
                         "q3",
                         "q4",
                         "q8",
                         "q4:sr",
                         "q2:block=32:sr",
                         "q3:block=64",
                         "q8:block=4096",
                         "q1:block=32",
                         "q4:block=256:sr",
                         "q4:col=64",
                         "q2:col=24",
                         "q4:col=20",
                         "minmax2",
                         "minmax4",
                         "minmax8",
                         "minmax4:sr",
                         "minmax2:block=32:sr",
                         "minmax8:block=4096:sr",
                         "minmax4:col=16",
                         "q8:sr",
                         "bf16",
                         "fp16",
                         "fp32",
                         "none"};
  const uint64_t sizes[] = {0, 1, 7, 8, 31, 32, 127, 128, 129, 1000, 4096 + 40, 65536 + 200};
  for (const char* s : specs) {
    for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (uint64_t n : sizes) {
        auto spec = parse_codec_spec(s);
        ASSERT_TRUE(spec.is_ok());
        if (!check_count(*spec, n).is_ok()) continue;
        check_case({s, d, n}, false);
        check_case({s, d, n}, true);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Min-max groups whose record is decided by ties: constant groups, and groups whose minimum or
// maximum is a zero, where the portable path keeps the first zero it met (+0 or -0), so the
// record's sign bit depends on element order.
TEST(CodecSimd, MinmaxTiesAndSignedZeroExtremes) {
  const uint32_t g = 32;
  std::vector<std::vector<float>> groups;
  auto group = [&](auto value) {
    std::vector<float> v(g);
    for (uint32_t k = 0; k < g; ++k) v[k] = value(k);
    groups.push_back(v);
  };
  group([](uint32_t) { return 1.5f; });                    // constant
  group([](uint32_t k) { return k % 3 ? 0.0f : -0.0f; });  // zeros, -0 first
  group([](uint32_t k) { return k % 3 ? -0.0f : 0.0f; });  // zeros, +0 first
  group([](uint32_t k) {
    return k < 5 ? 1.0f + static_cast<float>(k) : (k % 2 ? 0.0f : -0.0f);
  });                                                                       // min +0 first
  group([](uint32_t k) { return k < 9 ? 2.0f : (k % 2 ? -0.0f : 0.0f); });  // min 0, -0 first
  group([](uint32_t k) {
    return k % 4 ? -static_cast<float>(k) : (k % 8 ? -0.0f : 0.0f);
  });  // max 0, +0 first
  group([](uint32_t k) {
    return k == 20 ? -0.0f : -0.25f * static_cast<float>(k + 1);
  });                                                                    // max a lone -0
  group([](uint32_t k) { return k % 2 ? 3.0e38f : -3.0e38f; });          // range > FLT_MAX
  group([](uint32_t k) { return 1e-41f * static_cast<float>(k % 5); });  // subnormals
  std::vector<float> all;
  for (const auto& v : groups) all.insert(all.end(), v.begin(), v.end());
  for (const char* s : {"minmax2:block=32", "minmax4:block=32:sr", "minmax8:block=32"}) {
    for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(std::string(s) + " " + dtype_name(d));
      std::vector<uint8_t> x(all.size() * dtype_size(d));
      for (size_t i = 0; i < all.size(); ++i) {
        if (d == DType::kFloat32) {
          std::memcpy(x.data() + 4 * i, &all[i], 4);
        } else {
          uint16_t h = d == DType::kBFloat16 ? qm::f32_to_bf16(all[i]) : qm::f32_to_f16(all[i]);
          std::memcpy(x.data() + 2 * i, &h, 2);
        }
      }
      check_tensor({s, d, all.size()}, x);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CodecSimd, ThreadCountDoesNotChangeBytes) {
  auto spec = parse_codec_spec("q4:sr");
  ASSERT_TRUE(spec.is_ok());
  const uint64_t n = (uint64_t{1} << 21) + 77;
  auto x = make_tensor(DType::kFloat32, n, 9, true);
  const uint64_t bytes = encoded_size(*spec, n);
  std::vector<uint8_t> a(bytes), b(bytes);
  ASSERT_TRUE(
      encode(*spec, DType::kFloat32, x.data(), n, a.data(), bytes, {5, 0}, {1, true}).is_ok());
  ASSERT_TRUE(
      encode(*spec, DType::kFloat32, x.data(), n, b.data(), bytes, {5, 0}, {0, true}).is_ok());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace lowcomm
