// Point-to-point order: receives posted before the matching sends on both sides (sends overtake
// a waiting receive), and receives from any rank (Communicator::recv_any): which message each
// one takes, in what order, mixed with ordinary receives, and how it fails.

#include <gtest/gtest.h>

#include <unistd.h>
#include <map>
#include <string>
#include <vector>

#include "collectives_test_util.h"

namespace lowcomm::testing {
namespace {

// Every rank posts a receive from every other rank before its sends to them (torch's
// batch_isend_irecv test does exactly this): the sends queued behind a waiting receive run while
// it waits, so nobody deadlocks on its single executor. Then the same with any-source receives.
TEST(CollectivesP2P, ReceivesPostedBeforeSendsOnEveryRankComplete) {
  constexpr int P = 3;
  expect_all_ok(run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.timeout = std::chrono::milliseconds(10000);
    auto comm = Communicator::init(id, rank, P, o);
    if (!comm) return "init: " + comm.status().to_string();
    Communicator& c = **comm;
    constexpr uint64_t n = 100000;  // larger than a socket buffer's worth in flight
    std::vector<std::vector<float>> in(P, std::vector<float>(n)), out(P, std::vector<float>(n));
    for (int peer = 0; peer < P; ++peer)
      for (uint64_t i = 0; i < n; ++i) out[peer][i] = static_cast<float>(rank * 10 + peer);
    std::vector<Work> works;
    for (int peer = 0; peer < P; ++peer) {
      if (peer == rank) continue;
      works.push_back(c.recv(in[peer].data(), n, DType::kFloat32, peer, 3));
      works.push_back(c.send(out[peer].data(), n, DType::kFloat32, peer, 3));
    }
    for (auto& w : works)
      if (Status s = w.wait(); !s) return s.to_string();
    for (int peer = 0; peer < P; ++peer)
      if (peer != rank && in[peer][n - 1] != static_cast<float>(peer * 10 + rank))
        return "from rank " + std::to_string(peer) + ": " + std::to_string(in[peer][n - 1]);
    // any-source receives first, then the sends
    std::vector<float> got(2 * (P - 1), -1.0f);
    std::vector<Work> any;
    for (int k = 0; k < P - 1; ++k) any.push_back(c.recv_any(&got[k], 1, DType::kFloat32, 4));
    float mine = static_cast<float>(rank);
    std::vector<Work> sends;
    for (int peer = 0; peer < P; ++peer)
      if (peer != rank) sends.push_back(c.send(&mine, 1, DType::kFloat32, peer, 4));
    for (auto* list : {&any, &sends})
      for (auto& w : *list)
        if (Status s = w.wait(); !s) return s.to_string();
    for (int k = 0; k < P - 1; ++k)
      if (got[k] != static_cast<float>(any[k].source())) return "any-source mixed up";
    // a collective after them still runs in order
    if (Status s = c.barrier().wait(); !s) return "barrier: " + s.to_string();
    return "ok";
  }));
}

// Every rank but 0 sends `kPerRank` messages on one tag, each holding (rank, k); rank 0 takes
// them all with any-source receives. Each must report the rank its bytes came from, and the
// messages from one rank must come in the order that rank sent them.
TEST(CollectivesAnySource, TakesEveryMessageOnceInEachSendersOrder) {
  constexpr int P = 4;
  constexpr int kPerRank = 5;
  expect_all_ok(run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    auto comm = Communicator::init(id, rank, P, test_options());
    if (!comm) return "init: " + comm.status().to_string();
    Communicator& c = **comm;
    constexpr uint64_t n = 3000;  // several chunks
    if (rank != 0) {
      std::vector<std::vector<int32_t>> msgs(kPerRank, std::vector<int32_t>(n));
      std::vector<Work> sent;
      for (int k = 0; k < kPerRank; ++k) {
        for (uint64_t i = 0; i < n; ++i) msgs[k][i] = rank * 1000 + k;
        sent.push_back(c.send(msgs[k].data(), n, DType::kInt32, 0, 7));
      }
      for (auto& w : sent)
        if (Status s = w.wait(); !s) return "send: " + s.to_string();
    } else {
      std::vector<std::vector<int32_t>> got((P - 1) * kPerRank, std::vector<int32_t>(n, -1));
      std::vector<Work> works;
      for (auto& g : got) works.push_back(c.recv_any(g.data(), n, DType::kInt32, 7));
      std::map<int, int> next;  // by source: the k expected next
      for (size_t j = 0; j < works.size(); ++j) {
        if (Status s = works[j].wait(); !s) return "recv_any: " + s.to_string();
        const int src = works[j].source();
        if (src < 1 || src >= P) return "bad source " + std::to_string(src);
        const int32_t want = src * 1000 + next[src]++;
        for (uint64_t i = 0; i < n; ++i)
          if (got[j][i] != want)
            return "receive " + std::to_string(j) + " from rank " + std::to_string(src) +
                   " holds " + std::to_string(got[j][i]) + ", want " + std::to_string(want);
      }
      for (int r = 1; r < P; ++r)
        if (next[r] != kPerRank)
          return "rank " + std::to_string(r) + " matched " + std::to_string(next[r]) + " times";
    }
    if (Status s = c.barrier().wait(); !s) return "barrier: " + s.to_string();
    return "ok";
  }));
}

// An any-source receive counts as the sender's next receive on the tag, in the order receives
// run, whether an ordinary receive comes before or after it; a message already waiting counts.
TEST(CollectivesAnySource, MixesWithOrdinaryReceivesInRunOrder) {
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto comm = Communicator::init(id, rank, 2, test_options());
    if (!comm) return "init: " + comm.status().to_string();
    Communicator& c = **comm;
    if (rank == 1) {
      for (int32_t v : {10, 11, 12, 13}) {
        int32_t x = v;
        if (Status s = c.send(&x, 1, DType::kInt32, 0, 2).wait(); !s) return s.to_string();
      }
      if (Status s = c.barrier().wait(); !s) return "barrier: " + s.to_string();
      return "ok";
    }
    if (Status s = c.barrier().wait(); !s) return "barrier: " + s.to_string();  // all 4 here
    int32_t a = 0, b = 0, d = 0, e = 0;
    Work wa = c.recv(&a, 1, DType::kInt32, 1, 2);
    Work wb = c.recv_any(&b, 1, DType::kInt32, 2);
    Work wd = c.recv_any(&d, 1, DType::kInt32, 2);
    Work we = c.recv(&e, 1, DType::kInt32, 1, 2);
    for (Work* w : {&wa, &wb, &wd, &we})
      if (Status s = w->wait(); !s) return s.to_string();
    if (a != 10 || b != 11 || d != 12 || e != 13)
      return "order " + std::to_string(a) + " " + std::to_string(b) + " " + std::to_string(d) +
             " " + std::to_string(e);
    if (wb.source() != 1 || wd.source() != 1 || wa.source() != 1)
      return "source " + std::to_string(wb.source());
    return "ok";
  }));
}

// Nobody sends: the deadline, saying so; a length that differs from the sender's fails naming
// both calls; neither hangs.
TEST(CollectivesAnySource, FailsAtTheDeadlineAndOnMismatch) {
  auto res = run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.timeout = std::chrono::milliseconds(1500);
    auto comm = Communicator::init(id, rank, 3, o);
    if (!comm) return "init: " + comm.status().to_string();
    Communicator& c = **comm;
    if (rank == 0) {
      int32_t x = 0;
      Status s = c.recv_any(&x, 1, DType::kInt32, 9).wait();
      if (s.code() != StatusCode::kTimeout) return "expected a timeout, got " + s.to_string();
      if (s.message().find("no rank sent") == std::string::npos) return "unclear: " + s.message();
      return "ok";
    }
    return "ok";  // the others leave at once (their goodbye does not fail rank 0's wait)
  });
  expect_all_ok(res);
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto comm = Communicator::init(id, rank, 2, test_options());
    if (!comm) return "init: " + comm.status().to_string();
    Communicator& c = **comm;
    std::vector<float> x(20, 1.0f);
    if (rank == 1) {
      (void)c.send(x.data(), 10, DType::kFloat32, 0, 4).wait();  // may fail: rank 0 refuses it
      return "ok";
    }
    Status s = c.recv_any(x.data(), 20, DType::kFloat32, 4).wait();
    if (s.is_ok()) return "a 10-element send matched a 20-element receive";
    if (s.message().find("mismatched") == std::string::npos) return "unclear: " + s.to_string();
    return "ok";
  }));
}

// A peer that dies while rank 0 waits for any rank fails the receive at once, naming it.
TEST(CollectivesAnySource, DeadPeerFailsTheWaitNamingIt) {
  auto res = run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    auto comm = Communicator::init(id, rank, 3, test_options());  // 20 s deadline
    if (!comm) return "init: " + comm.status().to_string();
    Communicator& c = **comm;
    if (Status s = c.barrier().wait(); !s) return "barrier: " + s.to_string();
    if (rank == 1) {
      usleep(200 * 1000);
      _exit(3);
    }
    if (rank == 2) {
      int32_t x = 0;
      (void)c.recv(&x, 1, DType::kInt32, 0, 1).wait();  // never sent: fails once rank 0 fails
      return "ok";
    }
    const int64_t t0 = now_ns();
    int32_t x = 0;
    Status s = c.recv_any(&x, 1, DType::kInt32, 5).wait();
    const double secs = static_cast<double>(now_ns() - t0) * 1e-9;
    if (s.is_ok()) return "recv_any succeeded with no sender";
    if (secs > 10) return "took " + std::to_string(secs) + " s";
    if (s.message().find("rank 1") == std::string::npos)
      return "does not name rank 1: " + s.to_string();
    return "ok";
  });
  ASSERT_EQ(res.size(), 3u);
  EXPECT_TRUE(res[0].ok()) << res[0].text;
  EXPECT_TRUE(res[2].ok()) << res[2].text;
}

}  // namespace
}  // namespace lowcomm::testing
