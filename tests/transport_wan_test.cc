// The WAN link syntax, the pacer's arithmetic (on an injected clock, no sleeping), and the
// core pieces the transport stands on (deadlines, system-call errors).

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <vector>

#include "core/deadline.h"
#include "core/sys_check.h"
#include "transport/link_emulator.h"
#include "transport/pacer.h"
#include "transport/path_model.h"
#include "transport/peer_config.h"
#include "transport/shared_clocks.h"
#include "transport/wan_link.h"

namespace lowcomm::transport {
namespace {

using Clock = Pacer::Clock;
using std::chrono::duration;

double secs(Clock::duration d) {
  return duration<double>(d).count();
}

TEST(TransportParseWan, FullSpec) {
  auto w = parse_wan("bw=1gbit,rtt=80ms,jitter=2ms");
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_DOUBLE_EQ(w->bits_per_second, 1e9);
  EXPECT_DOUBLE_EQ(w->one_way_delay_s, 0.040);
  EXPECT_DOUBLE_EQ(w->jitter_s, 0.002);
}

TEST(TransportParseWan, UnitsAndOrder) {
  auto w = parse_wan(" rtt=1s , bw=100mbit ");
  ASSERT_TRUE(w.is_ok());
  EXPECT_DOUBLE_EQ(w->bits_per_second, 1e8);
  EXPECT_DOUBLE_EQ(w->one_way_delay_s, 0.5);
  EXPECT_DOUBLE_EQ(parse_wan("bw=2.5gbps")->bits_per_second, 2.5e9);
  EXPECT_DOUBLE_EQ(parse_wan("bw=300kbit")->bits_per_second, 3e5);
  EXPECT_DOUBLE_EQ(parse_wan("bw=10Mbps")->bits_per_second, 1e7);
  EXPECT_DOUBLE_EQ(parse_wan("bw=64bit")->bits_per_second, 64);
  EXPECT_DOUBLE_EQ(parse_wan("delay=250us")->one_way_delay_s, 250e-6);
  EXPECT_DOUBLE_EQ(parse_wan("bw=0")->bits_per_second, 0.0);
  auto empty = parse_wan("");
  ASSERT_TRUE(empty.is_ok());
  EXPECT_FALSE(empty->shaped());
}

TEST(TransportParseWan, Errors) {
  for (const char* bad :
       {"bw=1gbyte", "bw=fast", "rtt=80", "rtt=80min", "bw=1gbit,,rtt=1ms", "speed=1gbit",
        "bw=1gbit,bw=2gbit", "rtt=1ms,delay=1ms", "bw", "bw=-1gbit", "jitter=nanms"}) {
    auto w = parse_wan(bad);
    EXPECT_FALSE(w.is_ok()) << bad;
    EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(w.status().message().find("LOWCOMM_WAN"), std::string::npos) << bad;
  }
  EXPECT_NE(parse_wan("bw=1gbyte").status().message().find("gbyte"), std::string::npos);
}

TEST(TransportParseWan, LossIsAPercentageOfSegments) {
  auto w = parse_wan("bw=1gbit,rtt=200ms,loss=1%");
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_DOUBLE_EQ(w->loss, 0.01);
  EXPECT_TRUE(parse_wan("loss=0.5%")->shaped());
  EXPECT_NE(w->to_string().find("loss=1%"), std::string::npos);
  EXPECT_DOUBLE_EQ(parse_wan(w->to_string())->loss, 0.01);  // round trip
  for (const char* bad :
       {"loss=1", "loss=100%", "loss=-1%", "loss=x%", "loss=1%%", "loss=1%,loss=2%"}) {
    auto b = parse_wan(bad);
    EXPECT_FALSE(b.is_ok()) << bad;
    EXPECT_NE(b.status().message().find("loss"), std::string::npos) << bad;
  }
  auto plan = parse_wan_plan("rtt=20ms;pair=0/1:loss=2%");
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_DOUBLE_EQ(plan->link(0, 1)->loss, 0.02);
  EXPECT_DOUBLE_EQ(plan->link(0, 2)->loss, 0.0);
}

// A lost single-segment chunk (a heartbeat) waits for the retransmission timeout; one with
// segments behind it for one RTT (fast retransmit); nothing is delivered out of order.
// PINGs and PONGs cross the emulated link's delay, jitter and loss (so the failure detector
// measures the emulated round trip), in order among themselves, and not behind held chunks.
TEST(TransportLinkEmulator, ControlFramesCrossTheDelayJitterAndLossInOrder) {
  WanLink link = *parse_wan("bw=10mbit,rtt=200ms,jitter=20ms,loss=1%");
  LinkEmulator em(link, nullptr, 5, 1, 1 << 20);
  auto t0 = Clock::now();
  OutChunk big{};
  big.len = 4 << 20;  // 3.4 s of the link: a control frame does not wait for it
  em.submit(std::move(big), t0);
  // A second apart (no head of line): the one-way delay and jitter, or a loss's recovery.
  int lost = 0;
  double lo = 1e9, hi = 0;
  const int n = 5000;
  for (int i = 0; i < n; ++i) {
    double d = secs(em.control_arrival(t0 + std::chrono::seconds(i)) - t0) - i;
    if (i == 0) {
      EXPECT_LT(d, 3.0);  // not behind the 4 MiB chunk
    }
    if (d > 0.12 + 1e-6) {
      ++lost;
      EXPECT_GE(d, 0.08 + 0.2 - 1e-6);  // retransmitted a round trip later at the least
    } else {
      lo = std::min(lo, d);
      hi = std::max(hi, d);
    }
  }
  EXPECT_GE(lo, 0.08 - 1e-6);  // one-way 100 ms, jitter +-20 ms
  EXPECT_LT(lo, 0.082);
  EXPECT_GT(hi, 0.118);
  EXPECT_GT(lost, 20);  // 1% of 5000: 50, sd 7
  EXPECT_LT(lost, 90);
  // 5 ms apart: in order, a recovering frame holding back those behind it, as TCP does.
  auto t1 = t0 + std::chrono::seconds(n + 10);
  double last = 0;
  for (int i = 0; i < 2000; ++i) {
    double at = secs(em.control_arrival(t1 + std::chrono::milliseconds(5 * i)) - t1);
    EXPECT_GE(at, last);
    last = at;
  }
}

TEST(TransportLinkEmulator, LossDelaysByTcpRecoveryAndKeepsOrder) {
  WanLink link = *parse_wan("rtt=200ms,loss=1%");
  LinkEmulator em(link, nullptr, 7, 1, 1 << 20);
  auto t0 = Clock::now();
  const int n = 20000;
  std::vector<double> extra;
  for (int i = 0; i < n; ++i) {
    OutChunk c{};
    c.len = 32;  // one segment with its header
    auto at = t0 + std::chrono::milliseconds(i);
    em.submit(std::move(c), at);
  }
  int delayed = 0;
  double last = 0;
  bool ordered = true;
  int i = 0;
  em.drain([&](OutChunk& c) {
    double d = secs(c.release - (t0 + std::chrono::milliseconds(i)));
    if (secs(c.release - t0) < last) ordered = false;
    last = secs(c.release - t0);
    // Own loss: exactly RTT + 200 ms late; held behind an earlier one: less.
    if (std::abs(d - (0.1 + 0.4)) < 1e-6) ++delayed;
    ++i;
  });
  EXPECT_TRUE(ordered);
  EXPECT_NEAR(delayed, n * 0.01, n * 0.01 * 0.3);  // binomial: sd ~ 14 of 200

  // A 64-segment chunk: a loss is almost always followed by three segments -> 1 RTT.
  LinkEmulator big(link, nullptr, 9, 1, 64 << 20);
  int rtt_late = 0, rto_late = 0, on_time = 0, backed_off = 0;
  const int m = 3000;
  for (int k = 0; k < m; ++k) {
    OutChunk c{};
    c.len = 64 * 1448 - 64;
    big.submit(std::move(c), t0 + std::chrono::seconds(k));  // far apart: no head of line
  }
  int k = 0;
  big.drain([&](OutChunk& c) {
    double d = secs(c.release - c.depart);
    if (std::abs(d - 0.1) < 1e-3)
      ++on_time;
    else if (std::abs(d - 0.3) < 1e-3)
      ++rtt_late;
    else if (std::abs(d - 0.5) < 1e-3)
      ++rto_late;
    else if (d > 0.5)
      ++backed_off;  // the retransmission was lost too
    ++k;
  });
  EXPECT_EQ(on_time + rtt_late + rto_late + backed_off, m);
  EXPECT_LT(backed_off, m / 50);
  // P(some loss in 64 segments) = 1 - 0.99^64 = 47%; tail losses ~ 3/64 of segments.
  EXPECT_NEAR(rtt_late + rto_late + backed_off, m * 0.474, m * 0.05);
  EXPECT_GT(rtt_late, 5 * rto_late);
  EXPECT_GT(rto_late, 0);
}

TEST(TransportParseWan, FromEnv) {
  setenv("LOWCOMM_WAN", "bw=1gbit,rtt=10ms", 1);
  auto w = wan_from_env();
  ASSERT_TRUE(w.is_ok());
  EXPECT_DOUBLE_EQ(w->one_way_delay_s, 0.005);
  setenv("LOWCOMM_WAN", "bw=oops", 1);
  EXPECT_FALSE(wan_from_env().is_ok());
  unsetenv("LOWCOMM_WAN");
  EXPECT_FALSE(wan_from_env()->shaped());
}

TEST(TransportParseWan, SiteModelIsTheDefaultWithUpAndDown) {
  auto w = *parse_wan("bw=1gbit,rtt=50ms");
  EXPECT_EQ(w.model, WanModel::kSite);
  EXPECT_DOUBLE_EQ(w.bits_per_second, 1e9);
  EXPECT_DOUBLE_EQ(w.down_bits_per_second, 1e9);
  auto a = *parse_wan("up=100mbit,down=1gbit");
  EXPECT_DOUBLE_EQ(a.bits_per_second, 1e8);
  EXPECT_DOUBLE_EQ(a.down_bits_per_second, 1e9);
  EXPECT_TRUE(a.shaped());
  auto p = *parse_wan("model=pair,bw=1gbit");
  EXPECT_EQ(p.model, WanModel::kPair);
  EXPECT_DOUBLE_EQ(p.down_bits_per_second, 0.0);  // the receiver adds nothing
  for (const char* bad : {"bw=1gbit,up=1gbit", "model=pair,up=1gbit", "model=mesh", "down=x"})
    EXPECT_FALSE(parse_wan(bad).is_ok()) << bad;
}

TEST(TransportParseWan, PlanSectionsOverrideRanksAndPairs) {
  auto plan = parse_wan_plan("bw=1gbit,rtt=20ms;rank=4-5:bw=200mbit;pair=0-3/4-5:rtt=150ms");
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_TRUE(plan->has_pair_rules());
  auto l01 = *plan->link(0, 1);
  EXPECT_DOUBLE_EQ(l01.bits_per_second, 1e9);
  EXPECT_DOUBLE_EQ(l01.one_way_delay_s, 0.010);
  auto l04 = *plan->link(0, 4);  // rank 0's site, the far pair's delay
  EXPECT_DOUBLE_EQ(l04.bits_per_second, 1e9);
  EXPECT_DOUBLE_EQ(l04.one_way_delay_s, 0.075);
  auto l40 = *plan->link(4, 0);  // both directions of a pair; rank 4's own slow site
  EXPECT_DOUBLE_EQ(l40.bits_per_second, 2e8);
  EXPECT_DOUBLE_EQ(l40.down_bits_per_second, 2e8);
  EXPECT_DOUBLE_EQ(l40.one_way_delay_s, 0.075);
  auto l45 = *plan->link(4, 5);
  EXPECT_DOUBLE_EQ(l45.one_way_delay_s, 0.010);
  auto own = *plan->link(5, -1);
  EXPECT_DOUBLE_EQ(own.bits_per_second, 2e8);
  for (const char* bad :
       {"bw=1gbit;rank=x:bw=1gbit", "bw=1gbit;pair=1:rtt=1ms", "bw=1gbit;rank=1:rtt=5ms",
        "bw=1gbit;pair=0-1/1-2:bw=5mbit", "model=pair,bw=1gbit;rank=0:bw=1mbit",
        "bw=1gbit;zone=1:bw=1gbit", "bw=1gbit;rank=3-1:bw=1gbit", "bw=1gbit;rank=1"}) {
    auto b = parse_wan_plan(bad);
    EXPECT_FALSE(b.is_ok()) << bad;
    EXPECT_NE(b.status().message().find("LOWCOMM_WAN"), std::string::npos) << bad;
  }
  EXPECT_TRUE(parse_wan_plan("model=pair,bw=1gbit;pair=0/1:bw=5mbit").is_ok());
  EXPECT_TRUE(parse_wan_plan("bw=1gbit;pair=0/1:bw=5mbit").is_ok()) << "a path (site model)";
}

// The link carries TCP/IP framing too: 66 bytes per 1448-byte segment by default (what tbf
// counts), so 1448 payload bytes take 1514 bytes of link time; frame=0 paces payload alone.
// site= sections: ranks grouped into sites share the site's rates; a pair inside one site is
// local (unshaped, off the site's links); overlapping sites and pair-model sites are refused.
TEST(TransportParseWan, SitesGroupRanksBehindOneLink) {
  auto plan = parse_wan_plan("rtt=50ms;site=0-3:bw=1gbit;site=4-7:bw=100mbit;rank=9:bw=5mbit");
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_EQ(plan->site_of(2), 0);
  EXPECT_EQ(plan->site_of(4), 1);
  EXPECT_EQ(plan->site_of(8), -1);
  EXPECT_EQ(plan->site_size(5, 8), 4);
  EXPECT_EQ(plan->site_size(5, 6), 2);
  EXPECT_EQ(plan->site_size(8, 9), 1);
  EXPECT_TRUE(plan->has_pair_rules());
  auto inside = plan->link(1, 3);
  ASSERT_TRUE(inside.is_ok());
  EXPECT_TRUE(inside->local);
  EXPECT_FALSE(inside->shaped());
  auto across = plan->link(1, 5);
  ASSERT_TRUE(across.is_ok());
  EXPECT_FALSE(across->local);
  EXPECT_DOUBLE_EQ(across->bits_per_second, 1e9);
  EXPECT_DOUBLE_EQ(across->one_way_delay_s, 0.025);
  EXPECT_DOUBLE_EQ(plan->link(6, 0)->bits_per_second, 1e8);
  EXPECT_DOUBLE_EQ(plan->link(6, -1)->down_bits_per_second, 1e8);  // its own site's link
  EXPECT_DOUBLE_EQ(plan->link(9, 0)->bits_per_second, 5e6);
  for (const char* bad :
       {"bw=1gbit;site=0-3:bw=1gbit;site=3-4:bw=1gbit", "model=pair,bw=1gbit;site=0-1:bw=1gbit",
        "bw=1gbit;site=0-1:rtt=5ms", "bw=1gbit;site=2-1:bw=1gbit", "bw=1gbit;sites=0-1:bw=1gbit"}) {
    auto b = parse_wan_plan(bad);
    EXPECT_FALSE(b.is_ok()) << bad;
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

// Paths: a pair= rule with bw= in the site model is a link of its own per direction, numbered
// by rule and direction, in place of the sites' access links; a spec can come from a file.
TEST(TransportParseWan, PathsJoinSitesAndASpecComesFromAFile) {
  auto plan = parse_wan_plan(
      "rtt=10ms;site=0-1:bw=0;site=2-3:bw=0;pair=0-1/2-3:bw=500mbit,rtt=80ms;pair=0-3/4:rtt=5ms");
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  auto there = plan->link(1, 2), back = plan->link(3, 0), other = plan->link(1, 4);
  ASSERT_TRUE(there.is_ok() && back.is_ok() && other.is_ok());
  EXPECT_DOUBLE_EQ(there->bits_per_second, 5e8);
  EXPECT_DOUBLE_EQ(there->one_way_delay_s, 0.04);
  EXPECT_EQ(there->path, 4);  // rule 2, forward
  EXPECT_EQ(back->path, 5);   // rule 2, the other way
  EXPECT_EQ(other->path, -1);
  EXPECT_TRUE(plan->link(0, 1)->local);
  EXPECT_EQ(plan->paths_from(1), std::vector<int>{4});
  EXPECT_EQ(plan->paths_from(2), std::vector<int>{5});
  EXPECT_TRUE(plan->paths_from(4).empty());
  auto overlap = parse_wan_plan("bw=0;pair=0-2/2-3:bw=1gbit");
  EXPECT_EQ(overlap.status().code(), StatusCode::kInvalidArgument);

  const std::string path = ::testing::TempDir() + "lowcomm-wan-" + std::to_string(::getpid());
  {
    std::ofstream f(path);
    f << "# a comment line\nrtt=10ms   # defaults\n\nsite=0-1:bw=0\nsite=2-3:bw=0\n"
         "pair=0-1/2-3:bw=500mbit,rtt=80ms\n";
  }
  auto from_file = parse_wan_plan("@" + path);
  std::remove(path.c_str());
  ASSERT_TRUE(from_file.is_ok()) << from_file.status().to_string();
  EXPECT_EQ(from_file->link(1, 2)->path, 4);
  EXPECT_DOUBLE_EQ(from_file->link(1, 2)->bits_per_second, 5e8);
  auto missing = parse_wan_plan("@/nonexistent/lowcomm.wan");
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("cannot read"), std::string::npos);
  // The shipped matrix parses: four sites of two, six paths.
  auto aws = parse_wan_plan("@" LOWCOMM_SOURCE_DIR "/bench/wan/aws-4x2.wan");
  ASSERT_TRUE(aws.is_ok()) << aws.status().to_string();
  EXPECT_EQ(aws->site_of(7), 3);
  EXPECT_EQ(aws->paths_from(0).size(), 3u);
  EXPECT_DOUBLE_EQ(aws->link(7, 0)->bits_per_second, 523e6);
  EXPECT_DOUBLE_EQ(aws->link(7, 0)->one_way_delay_s, 0.048);
}

// The clocks of a site of several processes live in shared memory: two mappings of one segment
// (as two ranks of the site hold) serialise their pacers' chunks on one uplink and one downlink.
TEST(TransportPacer, SharedSiteClocksSerialiseAcrossMappings) {
  const std::string name = "/lowcomm-test-site-" + std::to_string(::getpid());
  auto a = open_shared_clocks(name, 8e6);
  auto b = open_shared_clocks(name, 8e6);
  unlink_shared_clocks(name);
  ASSERT_TRUE(a.is_ok() && b.is_ok()) << a.status().to_string();
  ASSERT_NE(a.value().get(), b.value().get());
  const auto link = *parse_wan("bw=8mbit,frame=0");  // 1 byte per microsecond
  Pacer p(link, 1, 1, 0, std::shared_ptr<LinkClock>(*a, &(*a)->up));
  Pacer q(link, 2, 1, 0, std::shared_ptr<LinkClock>(*b, &(*b)->up));
  Clock::time_point t0{};
  Clock::time_point last{};
  for (int i = 0; i < 10; ++i) {
    last = std::max(last, p.submit(1000, t0).deliver);
    last = std::max(last, q.submit(1000, t0).deliver);
  }
  EXPECT_NEAR(secs(last - t0), 0.020, 1e-9);  // 20 000 bytes through one shared uplink
  // Their downlinks are one too: two chunks arriving together leave 1 ms apart.
  auto ms = [](double x) {
    return std::chrono::duration_cast<Clock::duration>(duration<double, std::milli>(x));
  };
  EXPECT_NEAR(secs((*a)->down.pass(1000, t0 + ms(100)) - t0), 0.100, 1e-9);
  EXPECT_NEAR(secs((*b)->down.pass(1000, t0 + ms(100)) - t0), 0.101, 1e-9);
}

TEST(TransportPacer, LinkTimeIncludesTcpFraming) {
  auto link = *parse_wan("bw=8mbit");  // 1 byte per microsecond
  EXPECT_DOUBLE_EQ(link.wire_bytes(1448), 1514.0);
  EXPECT_DOUBLE_EQ(link.wire_bytes(1449), 1449.0 + 2 * 66);
  EXPECT_DOUBLE_EQ(link.wire_bytes(0), 0.0);
  Pacer p(link);
  Clock::time_point t0{};
  EXPECT_NEAR(secs(p.submit(1448 * 100, t0).deliver - t0), 1514e-6 * 100, 1e-9);
  EXPECT_DOUBLE_EQ(parse_wan("bw=8mbit,frame=0")->wire_bytes(1448), 1448.0);
  EXPECT_FALSE(parse_wan("frame=lots").is_ok());
}

// Site model: two peers' pacers share one uplink clock, so a rank sending to both at once is
// limited by its one uplink; with their own clocks (pair model) each link runs in parallel.
TEST(TransportPacer, SharedUplinkSerialisesEveryPeersChunks) {
  const auto link = *parse_wan("bw=8mbit,frame=0");  // 1 byte per microsecond
  auto up = std::make_shared<LinkClock>();
  Pacer a(link, 1, 1, 0, up), b(link, 2, 1, 0, up);
  Clock::time_point t0{};
  Clock::time_point last{};
  for (int i = 0; i < 10; ++i) {
    last = std::max(last, a.submit(1000, t0).deliver);
    last = std::max(last, b.submit(1000, t0).deliver);
  }
  EXPECT_NEAR(secs(last - t0), 0.020, 1e-9);  // 20 000 bytes through one link
  Pacer c(link, 1), d(link, 2);
  last = {};
  for (int i = 0; i < 10; ++i) {
    last = std::max(last, c.submit(1000, t0).deliver);
    last = std::max(last, d.submit(1000, t0).deliver);
  }
  EXPECT_NEAR(secs(last - t0), 0.010, 1e-9);  // two links of 10 000 bytes each
}

// The downlink is cut-through: a chunk arriving at an idle downlink passes at once; chunks
// arriving faster than it drains queue behind each other.
TEST(TransportPacer, DownlinkQueuesOnlyWhenBusy) {
  Downlink down;
  down.bits_per_second = 8e6;  // 1 byte per microsecond
  Clock::time_point t0{};
  auto ms = [](double x) {
    return std::chrono::duration_cast<Clock::duration>(duration<double, std::milli>(x));
  };
  EXPECT_NEAR(secs(down.pass(1000, t0 + ms(5)) - t0), 0.005, 1e-9);  // idle: no delay
  EXPECT_NEAR(secs(down.pass(1000, t0 + ms(6)) - t0), 0.006, 1e-9);  // paced at its rate
  // Three chunks arriving together (incast) leave one millisecond apart.
  EXPECT_NEAR(secs(down.pass(1000, t0 + ms(10)) - t0), 0.010, 1e-9);
  EXPECT_NEAR(secs(down.pass(1000, t0 + ms(10)) - t0), 0.011, 1e-9);
  EXPECT_NEAR(secs(down.pass(1000, t0 + ms(10)) - t0), 0.012, 1e-9);
  Downlink unlimited;
  EXPECT_EQ(unlimited.pass(1 << 30, t0 + ms(1)), t0 + ms(1));
}

TEST(TransportPacer, SixtyFourMiBOverSlowLongLink) {
  Pacer p(*parse_wan("bw=100mbit,rtt=100ms,frame=0"));
  Clock::time_point t0{};
  const uint64_t chunk = 512 << 10;
  Clock::time_point last{};
  for (uint64_t off = 0; off < (64ull << 20); off += chunk) last = p.submit(chunk, t0).deliver;
  double expect = 64.0 * (1 << 20) * 8 / 1e8 + 0.05;  // ~5.42 s, not 0.5 s
  EXPECT_NEAR(secs(last - t0), expect, 1e-6);
}

TEST(TransportPacer, DepartsWhenLinkFreesAndIdlesBetween) {
  Pacer p(*parse_wan("bw=8mbit,delay=10ms,frame=0"));  // 1 byte per microsecond
  Clock::time_point t0{};
  auto us = [](double x) {
    return std::chrono::duration_cast<Clock::duration>(duration<double, std::micro>(x));
  };
  // 1000 B at t0: on the link until 1 ms, delivered at 11 ms.
  EXPECT_NEAR(secs(p.submit(1000, t0).deliver - t0), 0.011, 1e-9);
  // Submitted at 0.5 ms while the link is busy: departs at 1 ms, free at 2 ms, delivered 12 ms.
  EXPECT_NEAR(secs(p.submit(1000, t0 + us(500)).deliver - t0), 0.012, 1e-9);
  // Submitted long after: the link was idle, so it departs at once.
  EXPECT_NEAR(secs(p.submit(1000, t0 + us(100000)).deliver - t0), 0.111, 1e-9);
}

TEST(TransportPacer, UnlimitedBandwidthIsPureDelay) {
  Pacer p(*parse_wan("rtt=40ms"));
  Clock::time_point t0{};
  EXPECT_NEAR(secs(p.submit(1 << 30, t0).deliver - t0), 0.020, 1e-9);
  EXPECT_NEAR(secs(p.submit(1 << 30, t0).deliver - t0), 0.020, 1e-9);
}

TEST(TransportPacer, JitterNeverReorders) {
  Pacer p(*parse_wan("bw=1gbit,rtt=20ms,jitter=5ms"), 42);
  Clock::time_point t0{};
  Clock::time_point prev{};
  double min_d = 1, max_d = 0;
  for (int i = 0; i < 1000; ++i) {
    auto d = p.submit(1000, t0).deliver;
    EXPECT_GE(d, prev);
    EXPECT_GE(d, p.link_free());
    double extra = secs(d - p.link_free());
    min_d = std::min(min_d, extra);
    max_d = std::max(max_d, extra);
    prev = d;
  }
  EXPECT_LE(max_d, 0.015 + 1e-9);
  EXPECT_GT(max_d - min_d, 0.001);  // it does jitter
}

// Submits `total` bytes in 512 KiB chunks as fast as the pacer allows (each chunk at the time
// the previous one may be written, like the transport's pace timer) and returns the seconds
// until the last one is delivered.
double paced_seconds(Pacer& p, uint64_t total) {
  Clock::time_point t0{}, now{}, last{};
  const uint64_t chunk = 512 << 10;
  for (uint64_t off = 0; off < total; off += chunk) last = p.submit(chunk, now).deliver;
  return secs(last - t0);
}

TEST(TransportPacer, OneWindowLimitedStreamMovesWindowPerRtt) {
  // 1 Gbit/s, 100 ms RTT, one stream with a 2 MiB window: 2 MiB per round trip (the window's
  // four chunks take 16.8 ms on the link, then the first acknowledgement is 100 ms away), i.e.
  // ~0.14 Gbit/s, nowhere near the link rate: 64 MiB take ~3.7 s instead of 0.59 s.
  const auto link = *parse_wan("bw=1gbit,rtt=100ms,frame=0");  // payload arithmetic
  Pacer one(link, 1, 1, 2u << 20);
  const uint64_t total = 64ull << 20;
  const double round = 0.1 + 8.0 * (512 << 10) / 1e9;  // a chunk's departure to its ack
  const double rounds = static_cast<double>(total) / (2u << 20);
  EXPECT_NEAR(paced_seconds(one, total), (rounds - 1) * round + 8.0 * (2u << 20) / 1e9 + 0.05,
              1e-3);
  // Four streams with 32 MiB windows hold 128 MiB in flight, more than the 12.5 MB the path
  // holds: link-limited, like an unwindowed link.
  Pacer four(link, 1, 4, 32u << 20);
  Pacer free_link(link);
  EXPECT_NEAR(paced_seconds(four, total), paced_seconds(free_link, total), 1e-6);
}

TEST(TransportPacer, StripesOverStreamsAndKeepsAckOrder) {
  Pacer p(*parse_wan("bw=1gbit,rtt=100ms"), 1, 4, 1u << 20);
  Clock::time_point now{};
  std::vector<int> used(4, 0);
  Clock::time_point prev{};
  for (int i = 0; i < 64; ++i) {
    auto slot = p.submit(512 << 10, now);
    ASSERT_GE(slot.stream, 0);
    ASSERT_LT(slot.stream, 4);
    ++used[static_cast<size_t>(slot.stream)];
    EXPECT_GE(slot.deliver, prev);  // the link never reorders
    prev = slot.deliver;
  }
  for (int n : used) EXPECT_EQ(n, 16);  // windows full in turn: even spread
}

TEST(TransportPacer, ChunkLargerThanWindowWaitsForAnEmptyStream) {
  Pacer p(*parse_wan("rtt=100ms"), 1, 1, 1000);
  Clock::time_point t0{};
  EXPECT_NEAR(secs(p.submit(5000, t0).deliver - t0), 0.05, 1e-9);
  // Departs once the first is acknowledged (100 ms), delivered 50 ms later.
  EXPECT_NEAR(secs(p.submit(5000, t0).deliver - t0), 0.15, 1e-9);
}

TEST(TransportPathModel, StripeWidthFromRttAndWindow) {
  // LAN / tbf namespaces: one stream carries 10 Gbit/s.
  EXPECT_EQ(stripe_streams(10e9, 100e-6, 32u << 20, 4), 1);
  // 100 ms with 32 MiB windows: 125 MB in flight needs 4.
  EXPECT_EQ(stripe_streams(10e9, 0.1, 32u << 20, 4), 4);
  EXPECT_EQ(stripe_streams(10e9, 0.05, 32u << 20, 4), 2);
  EXPECT_EQ(stripe_streams(1e9, 0.1, 32u << 20, 4), 1);
  // Never more than opened, never fewer than one; unknown RTT: all of them.
  EXPECT_EQ(stripe_streams(10e9, 0.2, 2u << 20, 4), 4);
  EXPECT_EQ(stripe_streams(10e9, 0.0, 32u << 20, 4), 4);
  EXPECT_EQ(stripe_streams(10e9, 1.0, 32u << 20, 1), 1);
}

TEST(TransportPathModel, ParseBufferBytes) {
  EXPECT_EQ(*parse_buffer_bytes("0"), 0);
  EXPECT_EQ(*parse_buffer_bytes("33554432"), 32 << 20);
  EXPECT_EQ(*parse_buffer_bytes("32M"), 32 << 20);
  EXPECT_EQ(*parse_buffer_bytes("512K"), 512 << 10);
  EXPECT_EQ(*parse_buffer_bytes("1G"), 1 << 30);
  EXPECT_FALSE(parse_buffer_bytes("").is_ok());
  EXPECT_FALSE(parse_buffer_bytes("-1").is_ok());
  EXPECT_FALSE(parse_buffer_bytes("4X").is_ok());
  EXPECT_FALSE(parse_buffer_bytes("2G").is_ok());
  setenv("LOWCOMM_SOCKET_BUFFER", "8M", 1);
  auto c = PeerConfig::from_env(0, "s");
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->socket_buffer_bytes, 8 << 20);
  EXPECT_TRUE(c->adapt_streams);
  setenv("LOWCOMM_SOCKET_BUFFER", "lots", 1);
  auto bad = PeerConfig::from_env(0, "s");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("LOWCOMM_SOCKET_BUFFER"), std::string::npos);
  unsetenv("LOWCOMM_SOCKET_BUFFER");
  setenv("LOWCOMM_UNEXPECTED_LIMIT", "4G", 1);
  EXPECT_EQ(PeerConfig::from_env(0, "s")->max_unexpected_bytes, uint64_t{4} << 30);
  setenv("LOWCOMM_UNEXPECTED_LIMIT", "4T", 1);
  EXPECT_FALSE(PeerConfig::from_env(0, "s").is_ok());
  unsetenv("LOWCOMM_UNEXPECTED_LIMIT");
  setenv("LOWCOMM_STREAMS", "3", 1);
  EXPECT_FALSE(PeerConfig::from_env(0, "s")->adapt_streams);
  unsetenv("LOWCOMM_STREAMS");
}

TEST(TransportDeadline, NoneDefaultAndAt) {
  Clock::time_point t0 = Clock::now();
  Deadline none = Deadline::none();
  EXPECT_TRUE(none.is_none());
  EXPECT_FALSE(none.expired(t0 + std::chrono::hours(1000)));
  EXPECT_EQ(none.poll_timeout_ms(), -1);
  Deadline def;
  EXPECT_TRUE(def.is_default());
  Deadline resolved = def.resolve(std::chrono::seconds(3), t0);
  EXPECT_FALSE(resolved.is_default());
  EXPECT_FALSE(resolved.expired(t0 + std::chrono::seconds(2)));
  EXPECT_TRUE(resolved.expired(t0 + std::chrono::seconds(3)));
  Deadline at = Deadline::after(std::chrono::milliseconds(1500), t0);
  EXPECT_EQ(at.poll_timeout_ms(-1, t0), 1500);
  EXPECT_EQ(at.poll_timeout_ms(100, t0), 100);
  EXPECT_EQ(at.poll_timeout_ms(-1, t0 + std::chrono::seconds(5)), 0);
  EXPECT_EQ(none.resolve(std::chrono::seconds(1), t0).is_none(), true);
}

Status failing_call(int fd) {
  LOWCOMM_CHECK_SYS(::close(fd), "peer rank 3 (10.0.0.1:99)");
  return Status::ok();
}

TEST(TransportSysCheck, NamesSyscallPeerAndErrno) {
  Status s = failing_call(-1);
  EXPECT_EQ(s.code(), StatusCode::kSystem);
  EXPECT_NE(s.message().find("close failed for peer rank 3 (10.0.0.1:99)"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("Bad file descriptor"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace lowcomm::transport
