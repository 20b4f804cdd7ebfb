// Owner shares that follow the links (topology/shares.h): the planner's bisection, its
// hysteresis and refusals, the arrival meter's peak rate, and four real ranks over an emulated
// WAN where one rank's link is 4x slower: they measure their rates from the traffic, agree on
// one plan through the descriptors, and the slow rank ends up owning almost nothing while every
// replica stays bitwise identical.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>

#include "collectives_test_util.h"
#include "core/fnv1a.h"
#include "topology/shares.h"
#include "transport/arrival_meter.h"

namespace lowcomm::testing {
namespace {

using topology::kShareUnits;
using topology::plan_shares;
using topology::predicted_time;
using topology::SharePlan;
using topology::SharePlanner;

double share(const SharePlan& p, size_t i) {
  return static_cast<double>(p.parts[i]) / kShareUnits;
}

TEST(SharesPlan, EqualRatesGiveEqualSharesAndFewerThanThreeRanksNone) {
  SharePlan p = plan_shares({5e7, 5e7, 5e7, 5e7});
  ASSERT_EQ(p.parts.size(), 4u);
  EXPECT_EQ(std::accumulate(p.parts.begin(), p.parts.end(), uint64_t{0}), kShareUnits);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(share(p, i), 0.25, 1e-5);
  EXPECT_TRUE(plan_shares({1e6, 4e6}).equal()) << "two ranks each move E whatever the shares";
  EXPECT_TRUE(plan_shares({1e6, 0, 1e6}).equal()) << "a zero rate plans nothing";
  EXPECT_TRUE(plan_shares({1e6, NAN, 1e6}).equal());
}

// One rank at a quarter of the rate: with equal shares it moves 1.5 E at r/4 (time 6 E/r); it
// cannot do better than E at r/4 (4 E/r), so it owns (almost) nothing and the others a third
// each, finishing at 5/3 E/r.
TEST(SharesPlan, OneSlowRankOwnsAlmostNothingAndMeetsTheBound) {
  const std::vector<double> r = {1e8, 1e8, 1e8, 2.5e7};
  SharePlan p = plan_shares(r);
  ASSERT_EQ(p.parts.size(), 4u);
  EXPECT_EQ(std::accumulate(p.parts.begin(), p.parts.end(), uint64_t{0}), kShareUnits);
  EXPECT_LT(share(p, 3), 1e-5);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(share(p, i), 1.0 / 3, 1e-5);
  const double equal = predicted_time(SharePlan{}, r), planned = predicted_time(p, r);
  EXPECT_NEAR(equal * 1e8, 6.0, 1e-9);
  EXPECT_NEAR(planned * 1e8, 4.0, 1e-4);
  // One rank ten times faster than the rest owns no more than 2/P.
  SharePlan capped = plan_shares({1e9, 1e8, 1e8, 1e8});
  EXPECT_LE(share(capped, 0), 0.5 + 1e-5);
  EXPECT_NEAR(share(capped, 0) + 3 * share(capped, 1), 1.0, 1e-5);
}

// A rank 20% slower still owns a share, smaller, so that every rank finishes together:
// 3 (T - 1)/2 + (0.8 T - 1)/2 = 1 gives T = 6 / 3.8.
TEST(SharesPlan, ASlightlySlowerRankOwnsLessAndAllFinishTogether) {
  const std::vector<double> r = {1, 1, 1, 0.8};
  SharePlan p = plan_shares(r);
  const double T = 6 / 3.8;
  EXPECT_NEAR(share(p, 3), (0.8 * T - 1) / 2, 1e-5);
  EXPECT_NEAR(share(p, 0), (T - 1) / 2, 1e-5);
  EXPECT_NEAR(predicted_time(p, r), T, 1e-4);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_NEAR((1 + 2 * share(p, i)) / r[i], T, 1e-4) << "rank " << i << " finishes at T";
}

// Plans are computed on every rank from the same rate codes and only their hash is agreed, so
// the rates must be the same doubles on every host. A rate one last bit off changes the plan:
// for these codes (found by a search, 3 in 35,000 random sets), perturbing rank 1's rate by one
// ulp moves a part, which a host whose exp2 rounds differently would do, failing the group at
// the next descriptor check. The planner's rates come from integers alone (relative_rate: a Q63
// power of 2^(-1/1024), no libm), bit for bit the values below on every host.
TEST(SharesPlan, RatesFromCodesAreTheSameBitsOnEveryHost) {
  EXPECT_EQ(topology::relative_rate(0), 1.0);
  EXPECT_EQ(topology::relative_rate(1024), 0.5);
  EXPECT_EQ(topology::relative_rate(3 * 1024), 0.125);
  EXPECT_EQ(topology::relative_rate(1), 0x1.ffa74ea381efcp-1);
  EXPECT_EQ(topology::relative_rate(37), 0x1.f35605cce1613p-1);
  EXPECT_EQ(topology::relative_rate(511), 0x1.6a48a86475795p-1);
  EXPECT_EQ(topology::relative_rate(958), 0x1.0bb23d833d93fp-1);
  EXPECT_EQ(topology::relative_rate(1023), 0x1.002c605e2e8cfp-1);
  EXPECT_EQ(topology::relative_rate(5000), 0x1.15a98c8a58e51p-5);
  for (uint32_t k = 0; k < 8192; k += 7)
    EXPECT_NEAR(topology::relative_rate(k) / std::exp2(-static_cast<double>(k) / 1024), 1.0, 1e-15)
        << k;

  const std::vector<uint16_t> codes = {21604, 21604, 20646, 21566};
  std::vector<double> r = topology::plan_rates(codes);
  const SharePlan plan = plan_shares(r);
  EXPECT_EQ(plan.parts, (std::vector<uint32_t>{355838, 355837, 1, 336900}));
  r[1] = std::nextafter(r[1], 2.0);  // what another host's libm might have given
  EXPECT_NE(plan_shares(r).parts, plan.parts) << "the hazard: one ulp moves a part";
  // Two ranks' planners given the same codes hold the same plan: the one from plan_rates.
  SharePlanner a, b;
  EXPECT_TRUE(a.observe(codes));
  EXPECT_TRUE(b.observe(codes));
  EXPECT_EQ(a.plan().parts, plan.parts);
  EXPECT_EQ(a.plan().hash(), b.plan().hash());
}

TEST(SharesPlan, ChunksCoverTheTensorOnScaleGroupsEachRankAtLeastOne) {
  SharePlan p = plan_shares({1e8, 1e8, 1e8, 1e6, 3e7});
  for (uint64_t n : {5ull * 64, 1000ull * 64 + 17, 12345678ull}) {
    auto c = p.chunks(n, 5, 64);
    ASSERT_EQ(c.size(), 5u);
    uint64_t at = 0;
    for (const auto& r : c) {
      EXPECT_EQ(r.begin, at);
      EXPECT_GE(r.count, 1u);
      if (r.begin + r.count < n) {
        EXPECT_EQ(r.count % 64, 0u);
      }
      at += r.count;
    }
    EXPECT_EQ(at, n);
  }
  // Fewer granules than ranks, or a plan of another size: equal chunks.
  auto few = p.chunks(3 * 64, 5, 64);
  EXPECT_EQ(few.size(), 5u);
  auto other = p.chunks(4096, 4, 64);
  auto equal = topology::owner_chunks(4096, 4, 64);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(other[i].count, equal[i].count);
}

TEST(SharesPlanner, ReplansOnlyForAGainAndNeverFromAnUnknownRate) {
  SharePlanner s;
  EXPECT_EQ(s.own_code(), 0) << "nothing measured yet";
  s.measured(0);
  s.measured(1e20);  // absurd: not believed
  s.measured(NAN);
  EXPECT_EQ(s.own_code(), 0);
  s.measured(1e8);
  EXPECT_EQ(s.own_code(), 0) << "one measurement (TCP may still be opening its windows)";
  s.measured(5e7);
  EXPECT_EQ(s.own_code(), topology::encode_rate(1e8)) << "the higher of the last two";
  s.measured(6e7);
  EXPECT_EQ(s.own_code(), topology::encode_rate(6e7)) << "a slower link is seen after two";

  const uint16_t fast = topology::encode_rate(1.25e8), slow = topology::encode_rate(3.1e7);
  EXPECT_FALSE(s.observe({fast, fast, 0, slow})) << "one rank unknown: keep the plan";
  EXPECT_TRUE(s.plan().equal());
  // Within 5% of each other: equal shares are as good.
  EXPECT_FALSE(
      s.observe({fast, topology::encode_rate(1.2e8), fast, topology::encode_rate(1.19e8)}));
  EXPECT_TRUE(s.plan().equal());
  EXPECT_TRUE(s.observe({fast, fast, fast, slow}));
  EXPECT_FALSE(s.plan().equal());
  EXPECT_NE(s.plan().hash(), 0u);
  const uint32_t h = s.plan().hash();
  EXPECT_FALSE(s.observe({fast, fast, fast, topology::encode_rate(3.0e7)})) << "noise: keep it";
  EXPECT_EQ(s.plan().hash(), h);
  // The slow link recovers: the skewed plan is now 1.5x too slow; back to equal shares.
  EXPECT_TRUE(s.observe({fast, fast, fast, fast}));
  EXPECT_TRUE(s.plan().equal());
}

// What four ranks on equal 1 Gbit/s links with 50 ms RTT reported after their first q4 64 MiB
// all-reduce (LOWCOMM_DEBUG=INFO): the least-time plan for them is 0.309,0.259,0.158,0.275,
// predicted 1.14x faster, measured 10% slower than equal shares and kept for good. Rates that
// close are equal within what the meter can tell.
TEST(SharesPlanner, RatesWithinTheMetersNoiseKeepEqualShares) {
  auto mbit = [](double m) { return topology::encode_rate(m * 1e6 / 8); };
  SharePlanner s;
  EXPECT_FALSE(s.observe({mbit(1042), mbit(978), mbit(847), mbit(998)}));
  EXPECT_TRUE(s.plan().equal());
  EXPECT_FALSE(s.observe({mbit(1000), mbit(1000), mbit(1000), mbit(800)}))
      << "predicted 1.19x faster: within the noise";
  EXPECT_TRUE(s.plan().equal());
  // Half the rate is a real difference (predicted 1.75x faster) ...
  EXPECT_TRUE(s.observe({mbit(1000), mbit(1000), mbit(1000), mbit(500)}));
  EXPECT_LT(static_cast<double>(s.plan().parts[3]) / kShareUnits, 0.1);
  // ... and when it is mostly gone, the plan (predicted 3% slower than equal shares now) goes.
  EXPECT_TRUE(s.observe({mbit(1000), mbit(1000), mbit(1000), mbit(900)}));
  EXPECT_TRUE(s.plan().equal());
}

// The protocol's timing, four planners standing for four ranks: operation k carries each
// rank's rate as it stood before k and every rank re-plans after k from those codes. Rank 3's
// link drops to a quarter at operation 5: operations 5, 6 and 7 run on the old plan, 8 on the
// new one (re-planned within three collectives), the same plan on every rank.
TEST(SharesPlanner, AChangedLinkIsReplannedWithinThreeCollectives) {
  std::vector<SharePlanner> ranks(4);
  std::vector<uint32_t> used_hash;  // the plan each operation ran with (rank 0's)
  for (int k = 0; k < 12; ++k) {
    std::vector<uint16_t> codes;
    for (auto& r : ranks) codes.push_back(r.own_code());
    used_hash.push_back(ranks[0].plan().hash());
    for (size_t r = 0; r < 4; ++r) ranks[r].measured(r == 3 && k >= 5 ? 2.5e7 : 1e8);
    for (auto& r : ranks) r.observe(codes);
    for (auto& r : ranks) EXPECT_EQ(r.plan().hash(), ranks[0].plan().hash()) << "op " << k;
  }
  for (int k = 0; k <= 7; ++k) EXPECT_EQ(used_hash[static_cast<size_t>(k)], 0u) << "op " << k;
  EXPECT_NE(used_hash[8], 0u) << "re-planned for the fourth collective on the slower link";
  EXPECT_LT(static_cast<double>(ranks[0].plan().parts[3]) / kShareUnits, 1e-5);
}

TEST(ArrivalMeter, PeakRateSeesTheLinkThroughTheGaps) {
  // 1 MiB every 10 ms for 200 ms, an idle 500 ms (waiting for a slow peer), then 4 more.
  std::vector<transport::MeterSample> a;
  int64_t t = 0;
  for (int i = 0; i < 20; ++i) a.push_back({t, t += 10'000'000, 1 << 20});
  t += 500'000'000;
  for (int i = 0; i < 4; ++i) a.push_back({t, t += 10'000'000, 1 << 20});
  const double link = (1 << 20) / 0.01;
  EXPECT_NEAR(transport::peak_rate_of(a, 0, 0.125), link, link * 0.01);
  // Points (a link of unknown rate: each chunk's last bit) over-read by up to one interval in the
  // stretch: three 1 MiB points 20 ms apart.
  for (auto& s : a) s.start_ns = s.end_ns;
  EXPECT_GE(transport::peak_rate_of(a, 0, 0.125), link);
  EXPECT_LE(transport::peak_rate_of(a, 0, 0.125), link * 1.55);
  EXPECT_EQ(transport::peak_rate_of({{0, 1, 1000}, {1, 2, 1000}}, 0, 0.125), 0)
      << "too few bytes to say";
  // A read after a stall: 40 MiB the kernel took in over 400 ms, read at once. As one span it is
  // the link's rate, not the memory's.
  EXPECT_NEAR(transport::peak_rate_of({{0, 400'000'000, 40ull << 20}}, 0, 0.125), (40 << 20) / 0.4,
              (40 << 20) / 0.4 * 0.01);
  transport::ArrivalMeter m;
  const auto t0 = transport::PaceClock::now();
  for (int i = 0; i < 8; ++i)
    m.record(t0 + std::chrono::milliseconds(5 * i), t0 + std::chrono::milliseconds(5 * (i + 1)),
             1 << 20);
  EXPECT_NEAR(m.peak_rate(t0), (1 << 20) / 0.005, (1 << 20) / 0.005 * 0.05);
  EXPECT_EQ(m.peak_rate(t0 + std::chrono::seconds(1)), 0) << "nothing since then";
}

// Four ranks, rank 3's link (up and down) 4x slower than the others'. The first all-reduces run
// with equal shares and measure; from the third on every rank runs the same skewed plan, named
// in its descriptor and reported in the stats, rank 3 owning almost nothing.
TEST(CollectivesShares, OneSlowRankOwnsLessEveryRankAgreesReplicasIdentical) {
  constexpr int P = 4;
  constexpr uint64_t n = 2 << 20;  // 8 MiB of fp32, q8: ~2 MiB on the wire per rank
  constexpr int ops = 6;
  std::vector<RankResult> res = run_ranks(
      P,
      [](int rank, const UniqueId& id) -> std::string {
        CommOptions o = test_options();
        o.wan = "bw=400mbit;rank=3:bw=100mbit";
        o.segment_bytes = 1 << 20;
        auto c = Communicator::init(id, rank, P, o);
        RANK_OK(c.status());
        std::vector<float> in(n), out(n);
        std::string text = "ok";
        for (int k = 0; k < ops; ++k) {
          for (uint64_t i = 0; i < n; ++i) in[i] = input_value(k + 1, rank, i);
          AllReduceOptions ar;
          ar.codec = *parse_codec_spec("q8");
          Work w = (*c)->all_reduce(in.data(), out.data(), n, DType::kFloat32, ReduceOp::kSum, ar);
          RANK_OK(w.wait());
          auto st = w.stats();
          RANK_OK(st.status());
          char buf[160];
          std::snprintf(buf, sizeof(buf), " op%d %016llx %.4f %.0f", k,
                        static_cast<unsigned long long>(
                            fnv1a64(reinterpret_cast<const uint8_t*>(out.data()), n * 4)),
                        st->shares.empty() ? -1.0 : st->shares[3], st->rate_estimate);
          text += buf;
        }
        return text;
      },
      60);
  expect_all_ok(res);
  std::vector<std::vector<std::string>> hashes(ops);
  for (int r = 0; r < P; ++r) {
    if (!res[r].ok()) continue;
    std::printf("rank %d:%s\n", r, res[r].text.c_str() + 2);
    const char* p = res[r].text.c_str() + 2;
    for (int k = 0; k < ops; ++k) {
      int got = 0, consumed = 0;
      char h[17];
      double slow_share = 0, rate = 0;
      ASSERT_EQ(std::sscanf(p, " op%d %16s %lf %lf%n", &got, h, &slow_share, &rate, &consumed), 4);
      p += consumed;
      hashes[static_cast<size_t>(k)].push_back(h);
      if (k >= 2 && r == 3) {
        // Measured on the traffic of the first two: within 15% of the emulated rate (goodput:
        // the link also carries 66 bytes of TCP/IP framing per 1448). The fast ranks' peaks
        // depend on the CPU keeping their links busy (under TSan it does not, and they read as
        // little as twice the slow rank's), so only the link-bound rank is held to its rate
        // here; docs/sites.md has the bench's numbers.
        const double configured = 100e6 / 8;
        EXPECT_NEAR(rate, configured * 1448 / 1514, configured * 0.15) << "op " << k;
      }
      if (k >= 3) {
        EXPECT_GE(slow_share, 0) << "rank " << r << " op " << k << ": still equal shares";
        // Under TSan the fast ranks' links are CPU-bound (above): they read 1.5-2x the slow
        // rank's rate instead of 4x, and the slow rank keeps up to ~0.1 of the tensor.
#if defined(__SANITIZE_THREAD__)
        constexpr double kMaxSlowShare = 0.15;
#else
        constexpr double kMaxSlowShare = 0.05;
#endif
        EXPECT_LT(slow_share, kMaxSlowShare) << "rank " << r << " op " << k;
      }
    }
  }
  for (int k = 0; k < ops; ++k)
    for (const auto& h : hashes[static_cast<size_t>(k)])
      EXPECT_EQ(h, hashes[static_cast<size_t>(k)][0]) << "op " << k;
}

TEST(CollectivesShares, EqualSharesWhenAskedAndABadSettingRefused) {
  std::vector<RankResult> res = run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.shares = "sometimes";
    auto bad = Communicator::init(id, rank, 3, o);
    if (bad.is_ok()) return "bad shares setting accepted";
    if (bad.status().message().find("shares option must be one of auto, equal") ==
        std::string::npos)
      return "unexpected error: " + bad.status().message();
    return "ok";
  });
  expect_all_ok(res);
}

}  // namespace
}  // namespace lowcomm::testing
