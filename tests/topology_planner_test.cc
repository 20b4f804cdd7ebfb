// The planner's call-time schedules (topology/planner.h): what each kind of call runs, given the
// site map and the options, decided in one place. (The run-time picker, the reports and the
// owner shares have their own tests: collectives_two_level_test.cc, collectives_shares_test.cc;
// the whole path runs in every collectives test.)
#include <gtest/gtest.h>

#include "topology/planner.h"

namespace lowcomm::testing {
namespace {

using topology::Algorithm;
using Schedule = AllReduceOptions::Schedule;
using Sparse = AllReduceOptions::SparseSchedule;

topology::Planner planner(const std::string& sites, int nranks, uint64_t direct_bytes = 0,
                          Sparse sparse_default = Sparse::kAuto) {
  topology::PlannerSettings s;
  s.rank = 0;
  s.nranks = nranks;
  if (!sites.empty()) s.sites = *topology::parse_sites(sites, nranks);
  s.sites_given = !sites.empty();
  s.direct_bytes = direct_bytes;
  s.sparse_default = sparse_default;
  topology::Planner p;
  p.configure(s);
  return p;
}

topology::AllReduceCall call(uint64_t count, std::optional<CodecSpec> codec = std::nullopt,
                             Schedule schedule = Schedule::kAuto) {
  topology::AllReduceCall c;
  c.count = count;
  c.codec = std::move(codec);
  c.schedule = schedule;
  c.positions_shareable = c.codec && c.codec->kind == CodecKind::kRandk;
  return c;
}

TEST(Planner, FlatWithoutSitesTwoLevelsLeftToThePickerWithThem) {
  const uint64_t large = 4 << 20;  // elements: 16 MiB of fp32
  auto flat = planner("", 8).all_reduce(call(large));
  ASSERT_TRUE(flat.is_ok());
  EXPECT_EQ(flat->algorithm, Algorithm::kDefault);
  EXPECT_FALSE(flat->auto_schedule);
  topology::Planner two = planner("0,0,0,0,1,1,1,1", 8);
  auto a = two.all_reduce(call(large));
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->algorithm, Algorithm::kTwoLevel);
  EXPECT_TRUE(a->auto_schedule);  // the picker tries both when it runs
  // Below kTwoLevelMinBytes: flat, and not the picker's.
  auto small = two.all_reduce(call(1024));
  ASSERT_TRUE(small.is_ok());
  EXPECT_EQ(small->algorithm, Algorithm::kDefault);
  EXPECT_FALSE(small->auto_schedule);
  // Named: two levels whatever the size, or a clear refusal without sites.
  auto named = two.all_reduce(call(1024, std::nullopt, Schedule::kTwoLevel));
  ASSERT_TRUE(named.is_ok());
  EXPECT_EQ(named->algorithm, Algorithm::kTwoLevel);
  EXPECT_FALSE(named->auto_schedule);
  auto refused = planner("", 8).all_reduce(call(large, std::nullopt, Schedule::kTwoLevel));
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("needs sites of equal size"), std::string::npos)
      << refused.status().to_string();
  // The other kinds: two levels from the same threshold.
  EXPECT_EQ(two.gather(large * 4), Algorithm::kTwoLevel);
  EXPECT_EQ(two.gather(1024), Algorithm::kDefault);
  EXPECT_EQ(two.reduce_scatter(large, DType::kFloat32, ReduceOp::kSum, std::nullopt),
            Algorithm::kTwoLevel);
  EXPECT_EQ(planner("", 8).gather(large * 4), Algorithm::kDefault);
}

TEST(Planner, OneHopAtOrBelowDirectBytes) {
  topology::Planner p = planner("", 4, /*direct_bytes=*/4096);
  EXPECT_EQ(p.all_reduce(call(1024))->algorithm, Algorithm::kOneHop);  // 4096 bytes
  EXPECT_EQ(p.all_reduce(call(1025))->algorithm, Algorithm::kDefault);
  // One rank: nothing to hop to.
  EXPECT_EQ(planner("", 1, 4096).all_reduce(call(16))->algorithm, Algorithm::kDefault);
}

TEST(Planner, SparseCodecsGatherOrShareTheirPositions) {
  const CodecSpec topk = *parse_codec_spec("topk:32/4096+q4");
  const CodecSpec randk = *parse_codec_spec("randk:32/4096+q4");
  topology::Planner p = planner("", 4);
  auto t = p.all_reduce(call(4096, topk));
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(t->algorithm, Algorithm::kOneHop);  // topk: gather-all, always
  EXPECT_FALSE(t->auto_schedule);
  auto r = p.all_reduce(call(4096, randk));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->algorithm, Algorithm::kDefault);  // randk from three ranks: the picker's
  EXPECT_TRUE(r->auto_schedule);
  topology::AllReduceCall owner = call(4096, topk);
  owner.sparse_schedule = Sparse::kOwner;
  auto refused = p.all_reduce(owner);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("topk's positions differ by rank"), std::string::npos);
  auto two = p.all_reduce(call(4096, topk, Schedule::kTwoLevel));
  ASSERT_FALSE(two.is_ok());
  EXPECT_NE(two.status().message().find("takes dense codecs"), std::string::npos);
  // The communicator's default (LOWCOMM_SPARSE_SCHEDULE) applies where the call says auto.
  auto by_default = planner("", 4, 0, Sparse::kGatherAll).all_reduce(call(4096, randk));
  EXPECT_EQ(by_default->algorithm, Algorithm::kOneHop);
  EXPECT_FALSE(by_default->auto_schedule);
  // Two ranks: gather-all (same bytes, one delay fewer).
  EXPECT_EQ(planner("", 2).all_reduce(call(4096, randk))->algorithm, Algorithm::kOneHop);
}

TEST(Planner, AgreementCarriesTheSiteMapAndNoRateWhenSharesAreEqual) {
  topology::Planner p = planner("0,0,1,1", 4);
  topology::OpShape shape;
  shape.bytes = 64 << 20;
  const topology::Agreement a = p.agreement(shape, Algorithm::kDefault, /*reports=*/true);
  EXPECT_EQ(a.sites_hash, p.sites().hash);
  EXPECT_NE(a.sites_hash, 0u);
  EXPECT_EQ(a.shares_hash, 0u);  // equal shares
  EXPECT_EQ(a.report.rate, 0u);
  EXPECT_EQ(a.report.time, 0u);  // no reporting call yet
  EXPECT_FALSE(a.rated);
  // After one reporting call, its time travels in the next report.
  p.learn(shape, Algorithm::kDefault, a, std::vector<uint32_t>(4, 0), 0.25, [] { return 0.0; });
  const topology::Agreement next = p.agreement(shape, Algorithm::kDefault, true);
  EXPECT_NEAR(topology::decode_time(next.report.time), 0.25, 0.25 * 1e-3);
}

}  // namespace
}  // namespace lowcomm::testing
