// Latency in one-way delays: over the emulated WAN with a 200 ms one-way delay and no bandwidth
// limit, a tiny collective's time is a whole number of delays (plus milliseconds of work), so
// the schedule is checked with 100 ms of margin instead of fragile timing. The descriptor
// exchange overlaps the payload: all-reduce takes two one-way delays (contributions, results),
// broadcast, all-gather and send/recv one (the receive; the send completes when its bytes have
// left the sender, as a kernel socket's does).
//
// Every rank must start the measured operation at the same instant, or the last one to start
// would be charged for the others' head start: rank 0 picks a start time, broadcasts it, and
// every rank sleeps until then (fork()ed ranks share steady_clock).

#include <cstdio>
#include <thread>

#include "collectives_test_util.h"

namespace lowcomm::testing {
namespace {

constexpr double kOneWayS = 0.2;

CommOptions wan_options() {
  CommOptions o = test_options();
  o.wan = "rtt=400ms";
  return o;
}

// Sleeps until the start time rank 0 chose; an error when it has already passed.
Status align_start(Communicator& c, int rank) {
  int64_t start = now_ns() + 1'500'000'000;  // several one-way delays of margin
  float wire[2];
  std::memcpy(wire, &start, sizeof(start));
  LOWCOMM_CHECK(c.broadcast(wire, wire, 2, DType::kFloat32, 0).wait());
  std::memcpy(&start, wire, sizeof(start));
  if (now_ns() >= start)
    return Status(StatusCode::kTimeout,
                  "rank " + std::to_string(rank) + " missed the common start time");
  std::this_thread::sleep_for(std::chrono::nanoseconds(start - now_ns()));
  return Status::ok();
}

double delays_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count() / kOneWayS;
}

// Every rank must take at least `low` and under `high` one-way delays.
std::string expect_delays(double took, double low, double high) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%.2f one-way delays (%.0f ms)", took, took * kOneWayS * 1e3);
  RANK_CHECK(took >= low, std::string("faster than the emulated link allows: ") + buf);
  RANK_CHECK(took < high, buf);
  return std::string("ok ") + buf;
}

void report(const char* what, const std::vector<RankResult>& res) {
  for (size_t r = 0; r < res.size(); ++r)
    std::printf("%s rank %zu: %s\n", what, r, res[r].text.c_str());
}

TEST(CollectivesLatency, AllReduceTakesTwoOneWayDelays) {
  constexpr int P = 3;
  auto res = run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, P, wan_options());
    RANK_OK(c.status());
    RANK_OK(align_start(**c, rank));
    std::vector<float> x(64, static_cast<float>(rank + 1));
    auto t0 = Clock::now();
    RANK_OK((*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait());
    double took = delays_since(t0);
    for (float v : x) RANK_CHECK(v == 6.0f, std::to_string(v));
    return expect_delays(took, 1.5, 2.5);  // was 3: descriptors, contributions, results
  });
  report("all_reduce", res);
  expect_all_ok(res);
}

TEST(CollectivesLatency, OneHopAllReduceTakesOneOneWayDelay) {
  constexpr int P = 3;
  auto res = run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = wan_options();
    o.direct_bytes = 1024;
    auto c = Communicator::init(id, rank, P, o);
    RANK_OK(c.status());
    RANK_OK(align_start(**c, rank));
    std::vector<float> x(64, static_cast<float>(rank + 1));
    auto t0 = Clock::now();
    RANK_OK((*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait());
    double took = delays_since(t0);
    for (float v : x) RANK_CHECK(v == 6.0f, std::to_string(v));
    return expect_delays(took, 0.8, 1.5);
  });
  report("one-hop all_reduce", res);
  expect_all_ok(res);
}

TEST(CollectivesLatency, BroadcastAndAllGatherTakeOneOneWayDelay) {
  constexpr int P = 3;
  auto res = run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, P, wan_options());
    RANK_OK(c.status());
    RANK_OK(align_start(**c, rank));
    std::vector<float> b(64, rank == 1 ? 7.0f : 0.0f);
    auto t0 = Clock::now();
    RANK_OK((*c)->broadcast(b.data(), b.data(), b.size(), DType::kFloat32, 1).wait());
    double bcast = delays_since(t0);
    for (float v : b) RANK_CHECK(v == 7.0f, std::to_string(v));

    RANK_OK(align_start(**c, rank));
    std::vector<float> g(64 * P, 0.0f);
    for (int i = 0; i < 64; ++i) g[64 * rank + i] = static_cast<float>(rank);
    t0 = Clock::now();
    RANK_OK((*c)->all_gather(g.data() + 64 * rank, g.data(), 64, DType::kFloat32).wait());
    double gather = delays_since(t0);
    for (int i = 0; i < 64 * P; ++i)
      RANK_CHECK(g[i] == static_cast<float>(i / 64), std::to_string(i));
    // Both were 2: descriptors, data.
    std::string r = expect_delays(bcast, 0.75, 1.5), s = expect_delays(gather, 0.75, 1.5);
    if (r.rfind("ok", 0) != 0 || s.rfind("ok", 0) != 0)
      return "broadcast: " + r + "; all_gather: " + s;
    return "ok broadcast " + r.substr(3) + ", all_gather " + s.substr(3);
  });
  report("broadcast/all_gather", res);
  expect_all_ok(res);
}

// Unchanged, for reference: the sender sends its descriptor and data at once, the receiver
// checks the descriptor before it takes the data.
TEST(CollectivesLatency, SendRecvTakesOneOneWayDelay) {
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 2, wan_options());
    RANK_OK(c.status());
    RANK_OK(align_start(**c, rank));
    std::vector<float> x(64, rank == 0 ? 3.0f : 0.0f);
    auto t0 = Clock::now();
    RANK_OK((rank == 0 ? (*c)->send(x.data(), x.size(), DType::kFloat32, 1, 5)
                       : (*c)->recv(x.data(), x.size(), DType::kFloat32, 0, 5))
                .wait());
    double took = delays_since(t0);
    for (float v : x) RANK_CHECK(v == 3.0f, std::to_string(v));
    // The receive takes the delay; the send completes when its bytes have left, as a kernel
    // socket's does (so back-to-back sends pay the delay once, not once each).
    return rank == 0 ? expect_delays(took, 0.0, 0.5) : expect_delays(took, 0.75, 1.5);
  });
  report("send/recv", res);
  expect_all_ok(res);
}

// The site model (the default): a rank's sends to all its peers share its one uplink, and what
// it receives from all of them shares its one downlink. 3 ranks all-gather 2 MiB each, so
// every rank sends and receives 4 MiB: over bw=100mbit that is 4 MiB * 8 / 1e8 = 0.34 s, twice
// what per-pair links (model=pair) take (each pair link carries 2 MiB). With fast uplinks and a
// 100 Mbit/s downlink the downlink sets the time. The lower bounds are the model's own
// arithmetic (nothing is faster than its link); the upper bounds leave room for a busy host.
std::string site_rank(int rank, const UniqueId& id, const std::string& wan, double* took) {
  CommOptions o = test_options();
  o.wan = wan;
  auto c = Communicator::init(id, rank, 3, o);
  RANK_OK(c.status());
  const uint64_t per = (2u << 20) / 4;
  std::vector<float> x(per, static_cast<float>(rank)), y(3 * per);
  RANK_OK(align_start(**c, rank));
  auto t0 = Clock::now();
  RANK_OK((*c)->all_gather(x.data(), y.data(), per, DType::kFloat32).wait());
  *took = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int r = 0; r < 3; ++r) RANK_CHECK(y[r * per + 7] == static_cast<float>(r), "payload");
  return "ok";
}

double max_time(const std::string& wan) {
  std::vector<RankResult> res = run_ranks(3, [wan](int rank, const UniqueId& id) -> std::string {
    double took = 0;
    std::string s = site_rank(rank, id, wan, &took);
    return s == "ok" ? "ok " + std::to_string(took) : s;
  });
  expect_all_ok(res);
  double worst = 0;
  for (auto& r : res)
    if (r.ok()) worst = std::max(worst, std::stod(r.text.substr(3)));
  return worst;
}

TEST(CollectivesWanModel, SiteUplinkAndDownlinkAreSharedByEveryPeer) {
  const double bytes = 4.0 * (1 << 20) * (1 + 64.0 / (512 << 10));  // chunk headers too
  const double site = max_time("bw=100mbit");
  const double pair = max_time("model=pair,bw=100mbit");
  const double down = max_time("up=1gbit,down=100mbit");
  std::printf("all-gather 3 x 2 MiB: site %.3f s, pair %.3f s, 100 Mbit/s downlink %.3f s\n", site,
              pair, down);
  EXPECT_GE(site, bytes * 8 / 1e8 * 0.97);
  EXPECT_LE(site, bytes * 8 / 1e8 * 2.5);
  EXPECT_GE(pair, bytes / 2 * 8 / 1e8 * 0.97);
  EXPECT_LT(pair, site * 0.75) << "per-pair links must run in parallel";
  EXPECT_GE(down, bytes * 8 / 1e8 * 0.97) << "the downlink must hold what arrives";
  EXPECT_LE(down, bytes * 8 / 1e8 * 2.5);
}

// Four ranks in two sites {0,1} and {2,3} over the emulated WAN `wan`: the time of 4 MiB from
// rank 0 to rank 1 (inside the site), and of 2 MiB from each of ranks 0 and 1 at once to ranks 2
// and 3 (out of the site), the slower receiver's.
struct SiteTimes {
  double local = 0, across = 0;
};
SiteTimes time_inside_and_across(const std::string& wan) {
  std::vector<RankResult> res = run_ranks(4, [&](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.wan = wan;
    auto c = Communicator::init(id, rank, 4, o);
    RANK_OK(c.status());
    std::vector<uint8_t> big(4 << 20, static_cast<uint8_t>(rank)), half(2 << 20);
    RANK_OK(align_start(**c, rank));
    auto t0 = Clock::now();
    if (rank == 0) RANK_OK((*c)->send(big.data(), big.size(), DType::kUInt8, 1).wait());
    if (rank == 1) RANK_OK((*c)->recv(big.data(), big.size(), DType::kUInt8, 0).wait());
    double local = std::chrono::duration<double>(Clock::now() - t0).count();
    RANK_OK(align_start(**c, rank));
    t0 = Clock::now();
    if (rank < 2) RANK_OK((*c)->send(half.data(), half.size(), DType::kUInt8, rank + 2).wait());
    if (rank >= 2) RANK_OK((*c)->recv(half.data(), half.size(), DType::kUInt8, rank - 2).wait());
    double across = std::chrono::duration<double>(Clock::now() - t0).count();
    return "ok " + std::to_string(local) + " " + std::to_string(across);
  });
  expect_all_ok(res);
  SiteTimes t;
  for (int r = 0; r < 4; ++r) {
    if (!res[r].ok()) continue;
    double l = 0, a = 0;
    std::sscanf(res[r].text.c_str(), "ok %lf %lf", &l, &a);
    if (r == 1) t.local = l;
    if (r >= 2) t.across = std::max(t.across, a);
  }
  return t;
}

// Sites of several ranks (site= rules): ranks 0-1 and 2-3 are two sites, each behind ONE
// 100 Mbit/s link shared by its two processes. Inside a site the local network is unshaped:
// 4 MiB from rank 0 to rank 1 takes far less than the 0.34 s the WAN link would. Across sites,
// ranks 0 and 1 each send 2 MiB at once (to 2 and 3): both go through site 0's one uplink, so
// the last arrives after 4 MiB at 100 Mbit/s (0.34 s), not the 0.17 s of two separate links.
TEST(CollectivesWanModel, RanksOfASiteShareItsLinkAndTalkLocallyForFree) {
  const double mib = 1 << 20;
  const double wire = 1 + 64.0 / (512 << 10);  // chunk headers
  SiteTimes t = time_inside_and_across("bw=100mbit;site=0-1:bw=100mbit;site=2-3:bw=100mbit");
  std::printf("site of two ranks: 4 MiB inside %.3f s, 2 x 2 MiB out through one uplink %.3f s\n",
              t.local, t.across);
  EXPECT_LT(t.local, 4 * mib * wire * 8 / 1e8 * 0.5) << "inside a site the network is local";
  EXPECT_GE(t.across, 4 * mib * wire * 8 / 1e8 * 0.97) << "two ranks of a site share one uplink";
  EXPECT_LE(t.across, 4 * mib * wire * 8 / 1e8 * 2.5);
}

// A path (pair= with bw= in the site model): ranks 0 and 1 each send 2 MiB at once to ranks 2
// and 3 over the one 100 Mbit/s route from {0,1} to {2,3}; the last arrives after 4 MiB at that
// rate (and its TCP/IP framing), not 2 MiB. Inside the site the network stays local and fast.
TEST(CollectivesWanModel, APathIsOneLinkSharedByTheSendingSite) {
  const double mib = 1 << 20;
  const double wire = 1 + 64.0 / (512 << 10);  // chunk headers
  SiteTimes t =
      time_inside_and_across("bw=0;site=0-1:bw=0;site=2-3:bw=0;pair=0-1/2-3:bw=100mbit,rtt=20ms");
  std::printf("path: 4 MiB inside a site %.3f s, 2 x 2 MiB over one 100 Mbit/s path %.3f s\n",
              t.local, t.across);
  const double path_time = 4 * mib * wire * (1 + 66.0 / 1448) * 8 / 1e8;
  EXPECT_LT(t.local, path_time * 0.5) << "inside a site the network is local";
  EXPECT_GE(t.across, path_time * 0.97) << "the two ranks of a site share one path";
  EXPECT_LE(t.across, path_time * 2.5);
}

}  // namespace
}  // namespace lowcomm::testing
