// Collectives with UCX inside the site (CommOptions::intra_site, collectives/intra_site.h):
// the same bits as over TCP for every collective and both all-reduce schedules, payload really
// on UCX (OpStats::ucx_bytes_sent), with digests across hosts (ranks on their own loopback
// addresses) and without on one host; ranks that disagree fall back pairwise, as does UCX that
// fails to start; a killed rank fails the others; a bad setting is refused. A test that asks
// for UCX checks that its payload went over UCX (a silent fall-back to TCP fails it).

#include <cstdlib>
#include <thread>

#include "collectives_test_util.h"
#include "transport/ucx_transport.h"

namespace lowcomm::testing {
namespace {

constexpr uint64_t kN = 300007;  // ~1.2 MB fp32: several segments, a tail everywhere

#define SKIP_WITHOUT_UCX() \
  if (!transport::UcxTransport::built_with_ucx()) GTEST_SKIP() << "built without UCX"

// "ok <ucx bytes sent> <hash>..." for one set of collectives (the reduce-scatter's, this rank's
// slice, last); `own_hosts`: rank r listens on
// 127.0.0.(r+1), a host of its own.
std::string collectives(int rank, const UniqueId& id, int P, const std::string& intra,
                        const std::string& sites, bool own_hosts) {
  CommOptions o = test_options();
  o.intra_site = intra;
  o.sites = sites;
  if (own_hosts) o.listen_address = "127.0.0." + std::to_string(rank + 1);
  auto c = Communicator::init(id, rank, P, o);
  RANK_OK(c.status());
  std::string hashes;
  uint64_t ucx = 0;
  auto note = [&](const std::vector<uint8_t>& y, const Work& w) {
    char buf[24];
    std::snprintf(buf, sizeof buf, " %016llx", static_cast<unsigned long long>(fnv64(y)));
    hashes += buf;
    auto st = w.stats();
    if (st) ucx += st->ucx_bytes_sent;
  };
  uint64_t seed = 70;
  for (const char* codec : {"", "q4"}) {
    for (auto schedule :
         {AllReduceOptions::Schedule::kFlat, AllReduceOptions::Schedule::kTwoLevel}) {
      if (schedule == AllReduceOptions::Schedule::kTwoLevel && sites == "flat") continue;
      Tensor x = make_input(DType::kFloat32, kN, seed++, rank);
      std::vector<uint8_t> y(x.bytes.size());
      AllReduceOptions ar;
      if (*codec) ar.codec = *parse_codec_spec(codec);
      ar.schedule = schedule;
      Work w = (*c)->all_reduce(x.data(), y.data(), kN, DType::kFloat32, ReduceOp::kSum, ar);
      RANK_OK(w.wait());
      note(y, w);
    }
  }
  {
    Tensor x = make_input(DType::kFloat32, kN, seed++, rank);
    std::vector<uint8_t> y(kN * 4 * static_cast<uint64_t>(P));
    Work w = (*c)->all_gather(x.data(), y.data(), kN, DType::kFloat32);
    RANK_OK(w.wait());
    note(y, w);
  }
  {
    Tensor x = make_input(DType::kFloat32, kN, seed++, rank);
    std::vector<uint8_t> y(kN * 4);
    Work w = (*c)->broadcast(x.data(), y.data(), kN, DType::kFloat32, 1);
    RANK_OK(w.wait());
    note(y, w);
  }
  {
    Tensor x = make_input(DType::kFloat32, kN * static_cast<uint64_t>(P), seed, rank);
    std::vector<uint8_t> y(kN * 4);
    Work w = (*c)->reduce_scatter(x.data(), y.data(), kN, DType::kFloat32, ReduceOp::kSum);
    RANK_OK(w.wait());
    note(y, w);
  }
  return "ok " + std::to_string(ucx) + hashes;
}

uint64_t ucx_bytes(const std::string& text) {
  return std::strtoull(text.c_str() + 3, nullptr, 10);
}
std::string hashes_of(const std::string& text) {
  return text.substr(text.find(' ', 3));
}
// The results every rank shares: all but the reduce-scatter's.
std::string replicated(const std::string& text) {
  const std::string h = hashes_of(text);
  return h.substr(0, h.rfind(' '));
}

void expect_same_bits_as_tcp(int P, const std::string& sites, bool own_hosts) {
  auto tcp = run_ranks(P, [&](int rank, const UniqueId& id) {
    return collectives(rank, id, P, "tcp", sites, own_hosts);
  });
  auto ucx = run_ranks(P, [&](int rank, const UniqueId& id) {
    return collectives(rank, id, P, "ucx", sites, own_hosts);
  });
  expect_all_ok(tcp);
  expect_all_ok(ucx);
  for (int r = 0; r < P; ++r) {
    if (!tcp[r].ok() || !ucx[r].ok()) return;
    EXPECT_EQ(ucx_bytes(tcp[r].text), 0u) << "rank " << r;
    EXPECT_GT(ucx_bytes(ucx[r].text), 0u) << "rank " << r << ": nothing went over UCX";
    EXPECT_EQ(hashes_of(ucx[r].text), hashes_of(tcp[r].text)) << "rank " << r;
    EXPECT_EQ(replicated(ucx[r].text), replicated(ucx[0].text)) << "rank " << r << " vs rank 0";
  }
}

TEST(CollectivesUcx, OneHostSameBitsAsTcpEveryCollective) {
  SKIP_WITHOUT_UCX();
  expect_same_bits_as_tcp(4, "flat", false);  // one host: the whole group is the site
}

TEST(CollectivesUcx, TwoSitesOfHostsSameBitsAsTcpWithDigests) {
  SKIP_WITHOUT_UCX();
  // Every rank on a loopback address of its own (a host each), two sites of two: UCX between
  // the ranks of each site, with a digest on every message; TCP between the sites.
  expect_same_bits_as_tcp(4, "0,0,1,1", true);
}

TEST(CollectivesUcx, RanksThatDisagreeFallBackPairwise) {
  SKIP_WITHOUT_UCX();
  // Rank 1 keeps TCP, the others ask for UCX: 0, 2 and 3 use it among themselves, everyone
  // uses TCP with rank 1, and the result is the TCP run's.
  auto mixed = run_ranks(4, [](int rank, const UniqueId& id) {
    return collectives(rank, id, 4, rank == 1 ? "tcp" : "ucx", "flat", false);
  });
  auto tcp = run_ranks(4, [](int rank, const UniqueId& id) {
    return collectives(rank, id, 4, "tcp", "flat", false);
  });
  expect_all_ok(mixed);
  expect_all_ok(tcp);
  for (int r = 0; r < 4; ++r) {
    if (!mixed[r].ok() || !tcp[r].ok()) return;
    EXPECT_EQ(hashes_of(mixed[r].text), hashes_of(tcp[r].text)) << "rank " << r;
    if (r == 1) {
      EXPECT_EQ(ucx_bytes(mixed[r].text), 0u);
    } else {
      EXPECT_GT(ucx_bytes(mixed[r].text), 0u) << "rank " << r;
    }
  }
}

TEST(CollectivesUcx, SealedStreamsKeepTcp) {
  SKIP_WITHOUT_UCX();
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.intra_site = "ucx";
    o.encrypt = 1;
    auto c = Communicator::init(id, rank, 2, o);
    RANK_OK(c.status());
    std::vector<float> x(1 << 18, 1.0f);
    Work w = (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum);
    RANK_OK(w.wait());
    auto st = w.stats();
    if (!st || st->ucx_bytes_sent != 0) return "sealed payload went over UCX (or no stats)";
    return x[7] == 2.0f ? "ok" : "wrong sum";
  });
  expect_all_ok(res);
}

TEST(CollectivesUcx, UcxMissingOrFailingToStartFallsBackToTcp) {
  // Built without UCX, or asked for a transport UCX does not have (ucp_init fails): every rank
  // says so and keeps TCP.
  auto res = run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    ::setenv("UCX_TLS", "no_such_transport", 1);
    std::string out = collectives(rank, id, 3, "ucx", "flat", false);
    if (out.rfind("ok 0 ", 0) != 0) return "expected no UCX bytes: " + out;
    return out;
  });
  auto tcp = run_ranks(3, [](int rank, const UniqueId& id) {
    return collectives(rank, id, 3, "tcp", "flat", false);
  });
  expect_all_ok(res);
  expect_all_ok(tcp);
  for (int r = 0; r < 3; ++r) {
    if (res[r].ok() && tcp[r].ok()) {
      EXPECT_EQ(hashes_of(res[r].text), hashes_of(tcp[r].text));
    }
  }
}

TEST(CollectivesUcx, KilledRankFailsTheOthersNamingIt) {
  SKIP_WITHOUT_UCX();
  // Run once: a survivor that crashes fails it (docs/sites.md has the loop that checks the
  // rate, and what is known of the crash inside UCX's TCP transport).
  auto res = run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.intra_site = "ucx";
    auto c = Communicator::init(id, rank, 3, o);
    RANK_OK(c.status());
    std::vector<float> x(4 << 20, 1.0f);
    // One all-reduce together (UCX endpoints wired up), then rank 2 dies while the others
    // wait for its part of the next.
    Work first = (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum);
    RANK_OK(first.wait());
    auto st = first.stats();
    if (!st || st->ucx_bytes_sent == 0) return "UCX asked for, but nothing went over it";
    // Rank 2 dies only once every rank has finished the first all-reduce: a rank enters the
    // barrier after it, and rank 2 leaves the barrier once all are in. Without it rank 2 could
    // die with its last bytes of the first all-reduce still on the wire (its part done, a
    // survivor's not: 4 of 200 runs failed the first all-reduce, naming rank 2). A survivor may
    // see rank 2 go in the barrier already; the failure is then the barrier's.
    Status s = (*c)->barrier().wait();
    if (rank == 2) {
      if (!s.is_ok()) return "barrier: " + s.to_string();
      ::raise(SIGKILL);
    }
    auto t0 = Clock::now();
    if (s.is_ok())
      s = (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait();
    if (s.is_ok()) return "the all-reduce succeeded without rank 2";
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    if (waited > 10) return "noticed after " + std::to_string(waited) + " s";
    if (s.message().find("rank 2") == std::string::npos)
      return "failure does not name rank 2: " + s.to_string();
    return "ok";
  });
  ASSERT_EQ(res.size(), 3u);
  EXPECT_EQ(res[2].exit_code, 128 + SIGKILL) << res[2].text;
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(res[r].ok()) << "rank " << r << ": " << res[r].text;
}

TEST(CollectivesUcx, UnknownSettingIsRefused) {
  auto res = run_ranks(1, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.intra_site = "rdma";
    auto c = Communicator::init(id, rank, 1, o);
    if (c.is_ok()) return "accepted intra_site=rdma";
    if (c.status().message().find("intra_site option must be one of tcp, ucx, got 'rdma'") ==
        std::string::npos)
      return "unclear error: " + c.status().to_string();
    return "ok";
  });
  expect_all_ok(res);
}

}  // namespace
}  // namespace lowcomm::testing
