// The plugin's lossless frames: round trips for every method and shuffle width, raw storage of
// what does not shrink, and errors (never crashes) for every truncation and for corruptions.

#include "lossless.h"

#include "gradient_like.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace lowcomm::nccl_net {
namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

using testing::gradient_like;

std::vector<LosslessConfig> configs() {
  std::vector<LosslessConfig> out;
  for (auto m : {LosslessMethod::kNone, LosslessMethod::kLz4, LosslessMethod::kZstd})
    for (int s : {0, 2, 4}) out.push_back({m, m == LosslessMethod::kZstd ? 3 : 1, s});
  return out;
}

TEST(NcclNetLossless, RoundTripsEveryMethodShuffleAndSize) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{4095}, size_t{(1u << 20) + 7}}) {
    for (int kind = 0; kind < 3; ++kind) {
      auto in = kind == 0   ? random_bytes(n, 1)
                : kind == 1 ? gradient_like(n, 2)
                            : std::vector<uint8_t>(n, 0x42);
      for (const auto& c : configs()) {
        std::vector<uint8_t> frame(lossless_bound(n)), back(n + 1, 0xEE);
        auto k = lossless_encode(c, in.data(), n, frame.data(), frame.size());
        ASSERT_TRUE(k.is_ok()) << k.status().to_string();
        ASSERT_LE(*k, n + kLosslessHeaderBytes);
        auto m = lossless_decode(frame.data(), *k, back.data(), n);
        ASSERT_TRUE(m.is_ok()) << to_string(c) << " n=" << n << ": " << m.status().to_string();
        ASSERT_EQ(*m, n);
        ASSERT_TRUE(std::equal(in.begin(), in.end(), back.begin())) << to_string(c) << " " << n;
        EXPECT_EQ(back[n], 0xEE);
      }
    }
  }
}

TEST(NcclNetLossless, CompressesWhatRepeatsAndStoresWhatDoesNotRaw) {
  const size_t n = 1 << 20;
  auto noise = random_bytes(n, 3);
  auto grads = gradient_like(n, 4);
  std::vector<uint8_t> frame(lossless_bound(n));
  for (auto m : {LosslessMethod::kLz4, LosslessMethod::kZstd}) {
    auto k = lossless_encode({m, 1, 0}, noise.data(), n, frame.data(), frame.size());
    ASSERT_TRUE(k.is_ok());
    EXPECT_EQ(*k, n + kLosslessHeaderBytes);  // random bytes: stored raw
    EXPECT_EQ(frame[4], 0);
  }
  // The byte-plane shuffle lets zstd find the repeating exponents of fp32 values.
  auto plain =
      lossless_encode({LosslessMethod::kZstd, 1, 0}, grads.data(), n, frame.data(), frame.size());
  auto shuffled =
      lossless_encode({LosslessMethod::kZstd, 1, 4}, grads.data(), n, frame.data(), frame.size());
  ASSERT_TRUE(plain.is_ok() && shuffled.is_ok());
  EXPECT_LT(*shuffled, n);
  EXPECT_LT(*shuffled, *plain);
}

TEST(NcclNetLossless, BadFramesAreErrorsNeverCrashes) {
  const size_t n = 64 << 10;
  auto in = gradient_like(n, 5);
  std::vector<uint8_t> out(n);
  for (const auto& c : configs()) {
    std::vector<uint8_t> frame(lossless_bound(n));
    size_t k = *lossless_encode(c, in.data(), n, frame.data(), frame.size());
    // Every truncation of the header, and a spread of the payload's.
    for (size_t cut = 0; cut < k; cut += cut < 64 ? 1 : 997) {
      auto r = lossless_decode(frame.data(), cut, out.data(), out.size());
      EXPECT_FALSE(r.is_ok()) << to_string(c) << " cut at " << cut;
    }
    // A receive smaller than the raw length.
    EXPECT_FALSE(lossless_decode(frame.data(), k, out.data(), n - 1).is_ok());
    // Random corruptions: an error or (a corrupted payload byte zstd/lz4 cannot tell) some
    // bytes, but never anything outside the buffers (ASan checks) nor a wrong length.
    std::mt19937 rng(6);
    for (int t = 0; t < 300; ++t) {
      auto bad = frame;
      bad[rng() % k] ^= static_cast<uint8_t>(1u << (rng() % 8));
      auto r = lossless_decode(bad.data(), k, out.data(), out.size());
      if (r.is_ok()) {
        EXPECT_EQ(*r, n);
      }
    }
  }
  // Header fields.
  std::vector<uint8_t> frame(lossless_bound(16));
  size_t k = *lossless_encode({}, in.data(), 16, frame.data(), frame.size());
  auto with = [&](size_t at, uint8_t v) {
    auto f = frame;
    f[at] = v;
    return lossless_decode(f.data(), k, out.data(), out.size());
  };
  EXPECT_FALSE(with(0, 'X').is_ok());  // magic
  EXPECT_FALSE(with(4, 9).is_ok());    // method
  EXPECT_FALSE(with(5, 3).is_ok());    // shuffle width
  EXPECT_FALSE(with(6, 1).is_ok());    // reserved
  EXPECT_FALSE(with(8, 17).is_ok());   // raw length disagrees with the payload
  // Encoding refuses a short output buffer.
  EXPECT_FALSE(lossless_encode({}, in.data(), 16, frame.data(), 16).is_ok());
}

TEST(NcclNetLossless, ParsesTheOptionText) {
  EXPECT_EQ(parse_lossless("off")->method, LosslessMethod::kNone);
  EXPECT_EQ(parse_lossless("lz4")->method, LosslessMethod::kLz4);
  EXPECT_EQ(parse_lossless("zstd")->level, 1);
  EXPECT_EQ(parse_lossless("zstd:7")->level, 7);
  EXPECT_FALSE(parse_lossless("zstd:0").is_ok());
  EXPECT_FALSE(parse_lossless("gzip").is_ok());
}

}  // namespace
}  // namespace lowcomm::nccl_net
