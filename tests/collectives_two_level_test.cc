// The two-level all-reduce (collectives/two_level.cc): ranks grouped into sites reduce inside
// their site, across sites slice by slice, and inside again. Every rank ends with the same bits,
// close to the exact sum (as close as the flat schedule: two quantizations per element), in
// place or not, with error feedback; unequal sites stay flat; ranks that disagree about the
// sites fail naming the mismatch instead of mixing schedules.

#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>

#include "collectives_test_util.h"
#include "topology/schedule_picker.h"
#include "topology/sites.h"

namespace lowcomm::testing {
namespace {

constexpr uint64_t kN = 100003;  // not a multiple of anything: every slice and chunk has a tail

// Every case: "ok " then, per case, the output's hash and its RMS error against the exact
// result (every rank can compute every input: make_input is a function of (seed, rank, i)).
std::string cases(int rank, const UniqueId& id, int P, const std::string& sites,
                  uint64_t segment_bytes) {
  CommOptions o = test_options();
  o.sites = sites;
  o.segment_bytes = segment_bytes;
  auto c = Communicator::init(id, rank, P, o);
  RANK_OK(c.status());
  std::string out = "ok";
  int k = 0;
  for (const char* codec : {"", "q4", "q8"}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      for (bool in_place : {false, true}) {
        const uint64_t seed = 40 + static_cast<uint64_t>(k++);
        Tensor x = make_input(DType::kFloat32, kN, seed, rank);
        std::vector<uint8_t> y(x.bytes.size());
        AllReduceOptions ar;
        if (*codec) ar.codec = *parse_codec_spec(codec);
        // Small enough that the cost model would choose flat: force the schedule under test.
        if (sites != "flat") ar.schedule = AllReduceOptions::Schedule::kTwoLevel;
        // A key per case: a residual carried from another case would add its error here.
        if (*codec && in_place) ar.error_feedback_key = "grad" + std::to_string(k);
        void* dst = in_place ? x.data() : y.data();
        RANK_OK((*c)->all_reduce(x.data(), dst, kN, DType::kFloat32, op, ar).wait());
        if (in_place) y = x.bytes;
        double err = 0, ref = 0;
        for (uint64_t i = 0; i < kN; ++i) {
          double exact = 0;
          for (int r = 0; r < P; ++r) exact += input_value(seed, r, i);
          if (op == ReduceOp::kAverage) exact /= P;
          float got;
          std::memcpy(&got, &y[4 * i], 4);
          err += (got - exact) * (got - exact);
          ref += exact * exact;
        }
        char buf[64];
        std::snprintf(buf, sizeof(buf), " %016llx:%.3g", static_cast<unsigned long long>(fnv64(y)),
                      std::sqrt(err / ref));
        out += buf;
      }
    }
  }
  return out;
}

std::vector<std::string> hashes(const std::string& text) {
  std::vector<std::string> h;
  for (size_t p = text.find(' '); p != std::string::npos; p = text.find(' ', p + 1))
    h.push_back(text.substr(p + 1, 16));
  return h;
}
std::vector<double> errors(const std::string& text) {
  std::vector<double> e;
  for (size_t p = text.find(':'); p != std::string::npos; p = text.find(':', p + 1))
    e.push_back(std::atof(text.c_str() + p + 1));
  return e;
}

TEST(CollectivesTwoLevel, IdenticalOnEveryRankAndAsCloseAsFlat) {
  constexpr int P = 4;
  // Contiguous and interleaved sites; then 64 KiB segments, which cut the 400 KB tensor into
  // three pipelined pieces (two_level.cc).
  struct Case {
    const char* sites;
    uint64_t segment_bytes;
  };
  for (Case c : {Case{"0,0,1,1", 4 << 20}, Case{"7,3,7,3", 4 << 20}, Case{"0,0,1,1", 64 << 10}}) {
    const char* sites = c.sites;
    const uint64_t seg = c.segment_bytes;
    auto two =
        run_ranks(P, [&](int rank, const UniqueId& id) { return cases(rank, id, P, sites, seg); });
    expect_all_ok(two);
    auto flat =
        run_ranks(P, [&](int rank, const UniqueId& id) { return cases(rank, id, P, "flat", seg); });
    expect_all_ok(flat);
    if (!two[0].ok() || !flat[0].ok()) continue;
    for (int r = 1; r < P; ++r) EXPECT_EQ(hashes(two[r].text), hashes(two[0].text)) << sites;
    const auto e2 = errors(two[0].text), ef = errors(flat[0].text);
    ASSERT_EQ(e2.size(), ef.size());
    for (size_t i = 0; i < e2.size(); ++i) {
      if (i < 4) {
        EXPECT_LT(e2[i], 1e-6) << "uncompressed case " << i << ": " << two[0].text;
      } else {
        // Two quantizations per element, as flat: the same error within noise.
        EXPECT_LT(e2[i], ef[i] * 1.5 + 1e-7) << sites << " case " << i << ": " << two[0].text;
        EXPECT_GT(e2[i], 0.0);
      }
    }
    // A different schedule: not the flat bits (which shows the two-level path ran).
    EXPECT_NE(hashes(two[0].text)[4], hashes(flat[0].text)[4]) << sites;
    std::printf("sites %s: %s\nflat:          %s\n", sites, two[0].text.c_str(),
                flat[0].text.c_str());
  }
}

// Six ranks as 2 sites x 3 and as 3 sites x 2, a block-grouped codec with error feedback over
// three calls, 64 KiB segments (several pieces): every rank ends with the same bits each call.
TEST(CollectivesTwoLevel, SixRanksInTwoShapesAgreeEveryCall) {
  constexpr int P = 6;
  for (const char* sites : {"0,0,0,1,1,1", "4,4,5,5,6,6"}) {
    auto res = run_ranks(P, [sites](int rank, const UniqueId& id) -> std::string {
      CommOptions o = test_options();
      o.sites = sites;
      o.segment_bytes = 64 << 10;
      auto c = Communicator::init(id, rank, P, o);
      RANK_OK(c.status());
      std::string out = "ok";
      for (int call = 0; call < 3; ++call) {
        Tensor x = make_input(DType::kFloat32, 300007, 70 + static_cast<uint64_t>(call), rank);
        AllReduceOptions ar;
        ar.codec = *parse_codec_spec("q4:block=64");
        ar.error_feedback_key = "w";
        ar.schedule = AllReduceOptions::Schedule::kTwoLevel;
        RANK_OK(
            (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kAverage, ar)
                .wait());
        out += " " + std::to_string(fnv64(x.bytes));
      }
      return out;
    });
    expect_all_ok(res);
    for (int r = 1; r < P; ++r) EXPECT_EQ(res[r].text, res[0].text) << sites << " rank " << r;
  }
}

// A rank whose map differs fails the all-reduce on every rank, naming the two-level descriptor,
// instead of running another schedule against the others (the map's hash is in the descriptor).
TEST(CollectivesTwoLevel, RanksThatDisagreeAboutSitesFailNamingIt) {
  constexpr int P = 4;
  auto res = run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.sites = rank == 3 ? "0,1,0,1" : "0,0,1,1";
    auto c = Communicator::init(id, rank, P, o);
    RANK_OK(c.status());
    std::vector<float> x(1 << 20, 1.0f);  // 4 MiB: two levels by the cost model
    Status s =
        (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait();
    RANK_CHECK(!s.is_ok(), "an all-reduce over disagreeing site maps succeeded");
    RANK_CHECK(s.message().find("two-level") != std::string::npos, s.to_string());
    return "ok";
  });
  expect_all_ok(res);
}

// AllReduceOptions::schedule: kFlat on a communicator with sites gives the flat bits, kTwoLevel
// where two levels cannot run is refused before anything is sent (the group stays usable).
TEST(CollectivesTwoLevel, ScheduleOptionForcesOrRefuses) {
  constexpr int P = 4;
  auto run = [](const std::string& sites, AllReduceOptions::Schedule schedule) {
    return run_ranks(P, [sites, schedule](int rank, const UniqueId& id) -> std::string {
      CommOptions o = test_options();
      o.sites = sites;
      auto c = Communicator::init(id, rank, P, o);
      RANK_OK(c.status());
      Tensor x = make_input(DType::kFloat32, kN, 3, rank);
      std::vector<uint8_t> y(x.bytes.size());
      AllReduceOptions ar;
      ar.codec = *parse_codec_spec("q4");
      ar.schedule = schedule;
      Status s =
          (*c)->all_reduce(x.data(), y.data(), kN, DType::kFloat32, ReduceOp::kSum, ar).wait();
      if (!s.is_ok()) {
        RANK_CHECK(s.code() == StatusCode::kInvalidArgument, s.to_string());
        ar.schedule = AllReduceOptions::Schedule::kAuto;  // still usable
        RANK_OK(
            (*c)->all_reduce(x.data(), y.data(), kN, DType::kFloat32, ReduceOp::kSum, ar).wait());
        return "ok refused";
      }
      return "ok " + std::to_string(fnv64(y));
    });
  };
  using S = AllReduceOptions::Schedule;
  auto forced_flat = run("0,0,1,1", S::kFlat);
  auto flat = run("flat", S::kAuto);
  auto two = run("0,0,1,1", S::kTwoLevel);
  auto refused = run("0,0,0,1", S::kTwoLevel);
  for (auto* r : {&forced_flat, &flat, &two, &refused}) expect_all_ok(*r);
  EXPECT_EQ(forced_flat[0].text, flat[0].text);
  EXPECT_NE(two[0].text, flat[0].text);
  EXPECT_EQ(refused[0].text, "ok refused");
}

// Four ranks set up by `configure` with no site map: the first auto all-reduce (the picker
// tries two levels first) must give the bits of a forced two-level call, not those of a forced
// flat one, on every rank alike: the ranks found the sites by themselves.
void expect_auto_found_two_sites(const std::function<void(int, CommOptions&)>& configure) {
  constexpr int P = 4;
  auto res = run_ranks(P, [&](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    configure(rank, o);
    auto c = Communicator::init(id, rank, P, o);
    RANK_OK(c.status());
    const uint64_t n = 1 << 20;  // 4 MiB: two levels by the size
    Tensor x = make_input(DType::kFloat32, n, 9, rank);
    std::string out = "ok";
    for (auto schedule : {AllReduceOptions::Schedule::kAuto, AllReduceOptions::Schedule::kTwoLevel,
                          AllReduceOptions::Schedule::kFlat}) {
      std::vector<uint8_t> y(x.bytes.size());
      AllReduceOptions ar;
      ar.codec = *parse_codec_spec("q4");
      ar.schedule = schedule;
      RANK_OK((*c)->all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kSum, ar).wait());
      out += " " + std::to_string(fnv64(y));
    }
    return out;
  });
  expect_all_ok(res);
  for (int r = 0; r < P; ++r) {
    if (!res[r].ok()) continue;
    std::string a, t, f;
    std::istringstream in(res[r].text.substr(3));
    in >> a >> t >> f;
    EXPECT_EQ(a, t) << "auto did not run two levels: " << res[r].text;
    EXPECT_NE(a, f) << res[r].text;
    EXPECT_EQ(res[r].text, res[0].text);
  }
}

// Without a map the ranks of one host are one site: ranks 0-1 listen on 127.0.0.1 and 2-3 on
// 127.0.0.2 (two loopback "hosts").
TEST(CollectivesTwoLevel, RanksOfOneHostAreOneSiteByDefault) {
  expect_auto_found_two_sites(
      [](int rank, CommOptions& o) { o.listen_address = rank < 2 ? "127.0.0.1" : "127.0.0.2"; });
}

// Every rank on a host of its own (127.0.0.1 .. 127.0.0.4) and no map: the sites come from round
// trips measured at init. The emulator puts 40 ms between ranks {0,1} and {2,3}; inside each
// pair the loopback's tens of microseconds.
TEST(CollectivesTwoLevel, RanksOnHostsOfTheirOwnAreGroupedByRoundTrips) {
  expect_auto_found_two_sites([](int rank, CommOptions& o) {
    o.listen_address = "127.0.0." + std::to_string(rank + 1);
    o.wan = "rtt=0ms;pair=0-1/2-3:rtt=40ms";
    // Under a sanitizer on two busy cores a loopback round trip can exceed the default 2 ms;
    // the sites here are 40 ms apart. (Each rank is a forked process: its own environment.)
    ::setenv("LOWCOMM_SITE_RTT_MS", "10", 1);
  });
}

// The schedule picker (schedule_picker.h): two levels first, then flat, until each has a time;
// then the faster, the other again every kReexplore calls; classes apart.
TEST(SchedulePicker, TriesBothThenKeepsTheFasterAndLooksAgain) {
  using topology::Algorithm;
  topology::SchedulePicker p;
  const int c = topology::SchedulePicker::size_class(64 << 20);
  EXPECT_EQ(c, 26);
  EXPECT_EQ(topology::SchedulePicker::size_class((64 << 20) + 1), 26);
  EXPECT_EQ(p.pick(c), Algorithm::kTwoLevel);
  EXPECT_EQ(p.pick(c), Algorithm::kTwoLevel) << "its time is not in yet";
  p.record(c, Algorithm::kTwoLevel, 1.8);
  EXPECT_EQ(p.pick(c), Algorithm::kDefault);
  p.record(c, Algorithm::kTwoLevel, 1.9);  // a later two-level time replaces the first
  p.record(c, Algorithm::kDefault, 0.7);
  int flat = 0, two = 0;
  for (uint64_t i = 0; i < 2 * topology::SchedulePicker::kReexplore; ++i)
    (p.pick(c) == Algorithm::kDefault ? flat : two)++;
  EXPECT_EQ(two, 2) << "the slower schedule is tried again once every kReexplore calls";
  EXPECT_EQ(flat, 2 * static_cast<int>(topology::SchedulePicker::kReexplore) - 2);
  EXPECT_EQ(p.pick(c + 1), Algorithm::kTwoLevel) << "another size class starts afresh";
  p.record(c, Algorithm::kDefault, 5.0);  // the WAN slowed down: two levels win again
  EXPECT_EQ(p.pick_would(c), Algorithm::kTwoLevel);
}

// Auto all-reduces on four ranks in two sites of the loopback: whatever each schedule takes on
// this machine, every rank picks the same one for every call (a rank that picked otherwise
// would fail the descriptor check), both are tried, and every replica is identical.
TEST(CollectivesTwoLevel, AutoTriesBothSchedulesAndEveryRankPicksTheSame) {
  constexpr int P = 4;
  constexpr int calls = 8;
  auto res = run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.sites = "0,0,1,1";
    auto c = Communicator::init(id, rank, P, o);
    RANK_OK(c.status());
    const uint64_t n = 1 << 20;
    Tensor x = make_input(DType::kFloat32, n, 3, rank);
    std::string out = "ok";
    for (int k = 0; k < calls; ++k) {
      std::vector<uint8_t> y(x.bytes.size());
      AllReduceOptions ar;
      ar.codec = *parse_codec_spec("q8");
      Work w = (*c)->all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kSum, ar);
      RANK_OK(w.wait());
      out += " " + w.stats()->schedule + ":" + std::to_string(fnv64(y));
    }
    return out;
  });
  expect_all_ok(res);
  for (int r = 1; r < P; ++r) {
    if (res[r].ok()) {
      EXPECT_EQ(res[r].text, res[0].text);
    }
  }
  if (!res[0].ok()) return;
  std::printf("%s\n", res[0].text.c_str());
  EXPECT_NE(res[0].text.find(" two-level:"), std::string::npos);
  EXPECT_NE(res[0].text.find(" flat:"), std::string::npos);
}

// The grouping rule on matrices shaped like real deployments, with jitter: it must find the
// sites in every one.
TEST(SitesFromRoundTrips, FindsTheSitesOfEveryTestMatrix) {
  auto matrix = [](const std::vector<int>& site, const std::vector<std::vector<double>>& between,
                   double inside, uint64_t seed) {  // round trips in ms
    const size_t P = site.size();
    std::vector<std::vector<double>> m(P, std::vector<double>(P, 0));
    uint64_t x = seed;
    for (size_t i = 0; i < P; ++i)
      for (size_t j = i + 1; j < P; ++j) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const double jitter = 1 + 0.3 * (static_cast<double>(x >> 11) / 9007199254740992.0 - 0.5);
        const auto a = static_cast<size_t>(site[i]), b = static_cast<size_t>(site[j]);
        m[i][j] = m[j][i] = (a == b ? inside : between[a][b]) * jitter * 1e-3;  // ms to s
      }
    return m;
  };
  // Published inter-region round trips (ms): Oregon, Virginia, Frankfurt, Tokyo.
  const std::vector<std::vector<double>> regions = {
      {0, 67, 143, 97}, {67, 0, 88, 145}, {143, 88, 0, 225}, {97, 145, 225, 0}};
  std::vector<std::vector<double>> two = {{0, 50}, {50, 0}};
  std::vector<std::vector<double>> metro = {{0, 4}, {4, 0}};
  struct Case {
    std::vector<int> site;
    const std::vector<std::vector<double>>* between;
    double inside_ms;
  };
  const std::vector<Case> cases = {
      {{0, 0, 0, 0, 1, 1, 1, 1}, &two, 0.1},      // 2 x 4, contiguous
      {{0, 1, 0, 1, 0, 1, 0, 1}, &two, 0.3},      // 2 x 4, interleaved
      {{0, 0, 1, 1, 2, 2, 3, 3}, &regions, 0.2},  // 4 x 2 over the regions
      {{3, 2, 1, 0, 0, 1, 2, 3}, &regions, 1.2},  // 4 x 2, scattered, a slow LAN
      {{0, 0, 0, 1, 1, 1, 1, 1}, &two, 0.05},     // unequal sites
      {{0, 0, 1, 1}, &metro, 0.5},                // two data centres 4 ms apart
      {{0, 1, 2, 3}, &regions, 0.2},              // every rank a site: flat
  };
  int k = 0;
  for (const Case& c : cases) {
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      auto m = matrix(c.site, *c.between, c.inside_ms, seed * 7 + static_cast<uint64_t>(k));
      topology::SitePlan want = topology::plan_from_labels(c.site);
      if (want.sites() == static_cast<int>(c.site.size())) want = {};
      topology::SitePlan got = topology::plan_from_rtt(m, topology::kSiteRttSeconds);
      EXPECT_EQ(got.site_of, want.site_of) << "case " << k << " seed " << seed;
      EXPECT_EQ(got.hash, want.hash) << "case " << k << " seed " << seed;
    }
    ++k;
  }
  // Everything on one LAN: one site, flat.
  std::vector<std::vector<double>> lan(6, std::vector<double>(6, 2e-4));
  EXPECT_EQ(topology::plan_from_rtt(lan, topology::kSiteRttSeconds).sites(), 0);
}

// The two-level all-gather (two_level_all_gather.cc): every block exact on every rank, in place
// and out of place, contiguous and interleaved sites; a rank with another map fails naming the
// two-level descriptor (which shows the call took two levels: the flat schedule would not).
TEST(CollectivesTwoLevel, AllGatherIsExactEverywhere) {
  constexpr int P = 4;
  const uint64_t per = 1 << 18;  // 1 MiB per rank, 4 MiB gathered: two levels by the cost model
  for (const char* sites : {"0,0,1,1", "0,1,0,1"}) {
    auto res = run_ranks(P, [&](int rank, const UniqueId& id) -> std::string {
      CommOptions o = test_options();
      o.sites = sites;
      auto c = Communicator::init(id, rank, P, o);
      RANK_OK(c.status());
      for (bool in_place : {false, true}) {
        std::vector<float> all(per * P, -1.0f), mine(per);
        for (uint64_t i = 0; i < per; ++i) mine[i] = static_cast<float>(rank * 1000003 + i);
        float* src = mine.data();
        if (in_place) {
          std::copy(mine.begin(), mine.end(), all.begin() + static_cast<long>(per * rank));
          src = all.data() + per * rank;
        }
        RANK_OK((*c)->all_gather(src, all.data(), per, DType::kFloat32).wait());
        for (int r = 0; r < P; ++r)
          for (uint64_t i = 0; i < per; i += 997)
            RANK_CHECK(all[per * r + i] == static_cast<float>(r * 1000003 + i),
                       "block " + std::to_string(r) + (in_place ? " in place" : ""));
      }
      return "ok";
    });
    expect_all_ok(res);
  }
  auto bad = run_ranks(P, [&](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.sites = rank == 0 ? "0,1,0,1" : "0,0,1,1";
    auto c = Communicator::init(id, rank, P, o);
    RANK_OK(c.status());
    std::vector<float> all(per * P), mine(per, 1.0f);
    Status s = (*c)->all_gather(mine.data(), all.data(), per, DType::kFloat32).wait();
    RANK_CHECK(!s.is_ok() && s.message().find("two-level") != std::string::npos, s.to_string());
    return "ok";
  });
  expect_all_ok(bad);
}

// The two-level broadcast (two_level_broadcast.cc): from a root in each position of each site,
// in place and not, every rank ends with the root's bytes; sites 2 x 3.
TEST(CollectivesTwoLevel, BroadcastFromEveryRootIsExact) {
  constexpr int P = 6;
  const uint64_t n = (1 << 18) + 7;  // 1 MiB and a tail: two levels, uneven slices
  auto res = run_ranks(P, [&](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.sites = "0,1,0,1,0,1";
    auto c = Communicator::init(id, rank, P, o);
    RANK_OK(c.status());
    for (int root = 0; root < P; ++root) {
      for (bool in_place : {true, false}) {
        std::vector<float> src(n), dst(n, -1.0f);
        for (uint64_t i = 0; i < n; ++i) src[i] = static_cast<float>(root * 7919 + i);
        float* s = rank == root ? src.data() : nullptr;
        float* d = in_place && rank == root ? src.data() : dst.data();
        RANK_OK((*c)->broadcast(s, d, n, DType::kFloat32, root).wait());
        for (uint64_t i = 0; i < n; i += 331)
          RANK_CHECK(d[i] == static_cast<float>(root * 7919 + i),
                     "root " + std::to_string(root) + " element " + std::to_string(i));
        RANK_CHECK(d[n - 1] == static_cast<float>(root * 7919 + n - 1), "tail");
      }
    }
    return "ok";
  });
  expect_all_ok(res);
}

// The two-level reduce-scatter (two_level_reduce_scatter.cc): each rank's block, uncompressed
// within fp32 rounding of the exact sum, compressed as close as the flat reduce-scatter (one
// quantization per contribution), for contiguous and interleaved sites.
TEST(CollectivesTwoLevel, ReduceScatterMatchesTheExactBlocks) {
  constexpr int P = 4;
  const uint64_t rc = (1 << 16) + 64;  // 4 x 256 KiB: 1 MiB in, two levels by the cost model
  auto run = [&](const std::string& sites) {
    return run_ranks(P, [&, sites](int rank, const UniqueId& id) -> std::string {
      CommOptions o = test_options();
      o.sites = sites;
      auto c = Communicator::init(id, rank, P, o);
      RANK_OK(c.status());
      std::string out = "ok";
      for (const char* codec : {"", "q8"}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
          Tensor x = make_input(DType::kFloat32, rc * P, 5, rank);
          std::vector<float> y(rc);
          ReduceScatterOptions rs;
          if (*codec) rs.codec = *parse_codec_spec(codec);
          RANK_OK((*c)->reduce_scatter(x.data(), y.data(), rc, DType::kFloat32, op, rs).wait());
          double err = 0, ref = 0;
          for (uint64_t i = 0; i < rc; ++i) {
            double exact = 0;
            for (int r = 0; r < P; ++r) exact += input_value(5, r, rc * rank + i);
            if (op == ReduceOp::kAverage) exact /= P;
            err += (y[i] - exact) * (y[i] - exact);
            ref += exact * exact;
          }
          char b[32];
          std::snprintf(b, sizeof(b), " %.3g", std::sqrt(err / ref));
          out += b;
        }
      }
      return out;
    });
  };
  auto flat = run("flat");
  expect_all_ok(flat);
  for (const char* sites : {"0,0,1,1", "0,1,0,1"}) {
    auto two = run(sites);
    expect_all_ok(two);
    for (int r = 0; r < P; ++r) {
      if (!two[r].ok() || !flat[r].ok()) continue;
      std::istringstream t(two[r].text.substr(2)), f(flat[r].text.substr(2));
      for (int i = 0; i < 4; ++i) {
        double et = 0, efl = 0;
        t >> et;
        f >> efl;
        if (i < 2) {
          EXPECT_LT(et, 1e-6) << sites << " rank " << r << ": " << two[r].text;
        } else {
          EXPECT_LT(et, efl * 1.5 + 1e-7) << sites << " rank " << r << ": " << two[r].text;
        }
      }
    }
  }
}

TEST(CollectivesTwoLevel, SiteMapsParseAndBadOnesAreRefused) {
  using topology::parse_sites;
  auto p = parse_sites("5,5,2,2,5,2", 6);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_TRUE(p->two_level());
  EXPECT_EQ(p->per_site, 3);
  EXPECT_EQ(p->members[0], (std::vector<int>{0, 1, 4}));
  EXPECT_EQ(p->column(4), (std::vector<int>{4, 5}));
  EXPECT_EQ(p->local_index(5), 2);
  EXPECT_NE(p->hash, 0u);
  EXPECT_NE(p->hash, parse_sites("5,5,2,2,2,5", 6)->hash);
  EXPECT_FALSE(parse_sites("0,0,0,1", 4)->two_level());  // unequal: flat
  EXPECT_FALSE(parse_sites("0,1,2,3", 4)->two_level());  // a rank per site: flat
  EXPECT_FALSE(parse_sites("flat", 4)->two_level());
  EXPECT_EQ(parse_sites("flat", 4)->hash, 0u);
  for (const char* bad : {"0,0,1", "0,0,1,x", "0,,1,1", "-1,0,1,1", "0;0;1;1"}) {
    auto b = parse_sites(bad, 4);
    EXPECT_FALSE(b.is_ok()) << bad;
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.sites = "0,0,1";
    auto c = Communicator::init(id, rank, 2, o);
    RANK_CHECK(!c.is_ok() && c.status().message().find("sites option") != std::string::npos,
               c.status().to_string());
    return "ok";
  });
  expect_all_ok(res);
}

}  // namespace
}  // namespace lowcomm::testing
