// Failure semantics: a peer that goes away fails every outstanding and later request, naming
// the peer; deadlines give kTimeout; abort cancels everything; set-up honours its deadlines.

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "transport_test_util.h"

namespace lowcomm::transport {
namespace {

using testing::connect_pair;
using testing::loopback;
using testing::test_config;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(TransportFailure, PeerClosingMidTransferFailsOutstandingRequestsQuickly) {
  auto cfg_b = test_config(1);
  cfg_b.wan = *parse_wan("bw=100mbit");  // 64 MiB takes ~5 s: still in flight when b goes
  auto p = connect_pair(test_config(0), cfg_b);
  ASSERT_TRUE(p.a && p.b);
  const size_t n = 64 << 20;
  std::vector<uint8_t> out(n, 1), in(n), other(16);
  Request r = p.a->irecv(1, in.data(), n);
  Request r2 = p.a->irecv(2, other.data(), other.size());
  Request s = p.b->isend(1, out.data(), n);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_FALSE(r.test());
  auto t0 = Clock::now();
  p.b.reset();  // closes every stream of the connecting side
  EXPECT_EQ(s.wait(Deadline::after_seconds(1)).code(), StatusCode::kAborted);
  Status rs = r.wait(Deadline::after_seconds(1));
  EXPECT_LT(since(t0), 1.0);
  EXPECT_FALSE(rs.is_ok());
  EXPECT_NE(rs.code(), StatusCode::kTimeout) << rs.to_string();
  EXPECT_NE(rs.message().find("peer rank 1 (127.0.0.1:"), std::string::npos) << rs.message();
  EXPECT_NE(rs.message().find("irecv tag 1"), std::string::npos) << rs.message();
  Status r2s = r2.wait(Deadline::after_seconds(1));
  EXPECT_FALSE(r2s.is_ok());
  EXPECT_NE(r2s.message().find("irecv tag 2"), std::string::npos) << r2s.message();
  // Sticky: later operations fail at once with the same cause.
  uint8_t x = 0;
  Status later = p.a->isend(3, &x, 1).wait(Deadline::after_seconds(1));
  EXPECT_FALSE(later.is_ok());
  EXPECT_NE(later.message().find("isend tag 3"), std::string::npos) << later.message();
  EXPECT_NE(later.message().find("peer rank 1"), std::string::npos) << later.message();
}

TEST(TransportFailure, ExpiredDeadlineGivesTimeoutThenAbortCancels) {
  auto p = connect_pair();
  ASSERT_TRUE(p.a && p.b);
  uint64_t v = 0;
  Request r = p.a->irecv(1, &v, sizeof(v));
  auto t0 = Clock::now();
  Status s = r.wait(Deadline::after(std::chrono::milliseconds(200)));
  EXPECT_EQ(s.code(), StatusCode::kTimeout);
  EXPECT_GE(since(t0), 0.19);
  EXPECT_LT(since(t0), 1.0);
  EXPECT_FALSE(r.test());  // still in flight: the buffer is still lent out
  p.a->abort();
  ASSERT_TRUE(r.test());
  EXPECT_EQ(r.status().code(), StatusCode::kAborted);
  EXPECT_EQ(p.a->irecv(1, &v, sizeof(v)).wait(Deadline::after_seconds(1)).code(),
            StatusCode::kAborted);
  // The remote side notices: its sockets were shut down.
  EXPECT_FALSE(p.b->irecv(9, &v, sizeof(v)).wait(Deadline::after_seconds(2)).is_ok());
}

TEST(TransportFailure, BlockingRecvTimesOutAndAbortsThePeer) {
  auto p = connect_pair();
  ASSERT_TRUE(p.a && p.b);
  uint64_t v = 0;
  Status s = p.a->recv(1, &v, sizeof(v), Deadline::after(std::chrono::milliseconds(100)));
  EXPECT_EQ(s.code(), StatusCode::kTimeout);
  EXPECT_NE(s.message().find("peer rank 1"), std::string::npos) << s.message();
}

TEST(TransportFailure, AbortCancelsEveryOutstandingRequest) {
  auto p = connect_pair();
  ASSERT_TRUE(p.a && p.b);
  std::vector<uint64_t> bufs(32);
  std::vector<Request> reqs;
  for (size_t i = 0; i < bufs.size(); ++i) reqs.push_back(p.a->irecv(i % 4, &bufs[i], 8));
  p.a->abort();
  for (auto& r : reqs) {
    ASSERT_TRUE(r.test());
    EXPECT_EQ(r.status().code(), StatusCode::kAborted);
  }
}

TEST(TransportFailure, AcceptAndConnectHonourDeadlines) {
  auto engine = *ProgressEngine::create("lc-test");
  auto l = std::move(Listener::create(engine, test_config(0), loopback())).value();
  auto t0 = Clock::now();
  auto a = l->accept(Deadline::after(std::chrono::milliseconds(150)));
  EXPECT_EQ(a.status().code(), StatusCode::kTimeout);
  EXPECT_LT(since(t0), 1.0);
  SocketAddress dead = l->address();
  l.reset();  // nobody listens there any more
  t0 = Clock::now();
  auto c =
      connect_peer(engine, dead, test_config(1), Deadline::after(std::chrono::milliseconds(300)));
  EXPECT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find(dead.to_string()), std::string::npos)
      << c.status().to_string();
  EXPECT_LT(since(t0), 2.0);
}

TEST(TransportFailure, ConnectWaitsForAListenerThatIsNotAcceptingYet) {
  // The listening socket exists (as rank 0's does from the moment it made the id), but nobody
  // accepts for longer than a handshake timeout: the kernel completes the TCP connects and the
  // hellos go unanswered. The connector must keep trying until its own deadline.
  auto engine_a = *ProgressEngine::create("lc-test-a");
  auto engine_b = *ProgressEngine::create("lc-test-b");
  auto l = std::move(Listener::create(engine_a, test_config(0), loopback())).value();
  PeerConfig cfg = test_config(1);
  cfg.handshake_timeout_s = 0.3;
  auto connected = std::async(std::launch::async, [&] {
    return connect_peer(engine_b, l->address(), cfg, Deadline::after_seconds(15));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // four handshake timeouts
  auto a = l->accept(Deadline::after_seconds(10));
  auto b = connected.get();
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  uint32_t x = 0xC0FFEE, y = 0;
  auto r = (*a)->irecv(0, &y, sizeof(y));
  ASSERT_TRUE((*b)->send(0, &x, sizeof(x), Deadline::after_seconds(5)).is_ok());
  ASSERT_TRUE(r.wait(Deadline::after_seconds(5)).is_ok());
  EXPECT_EQ(y, x);
}

TEST(TransportFailure, ConnectRetriesARefusedAddressUntilAListenerComes) {
  // Nobody listens at first (refused), then a listener opens on that address.
  auto engine_a = *ProgressEngine::create("lc-test-a");
  auto engine_b = *ProgressEngine::create("lc-test-b");
  SocketAddress addr =
      std::move(Listener::create(engine_a, test_config(0), loopback())).value()->address();
  auto connected = std::async(std::launch::async, [&] {
    return connect_peer(engine_b, addr, test_config(1), Deadline::after_seconds(15));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto l = Listener::create(engine_a, test_config(0), addr);
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  auto a = (*l)->accept(Deadline::after_seconds(10));
  auto b = connected.get();
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
}

TEST(TransportFailure, NonBlockingConnectAndAcceptByTest) {
  auto engine_a = *ProgressEngine::create("lc-test-a");
  auto engine_b = *ProgressEngine::create("lc-test-b");
  auto l = std::move(Listener::create(engine_a, test_config(0), loopback())).value();
  auto op =
      std::move(ConnectOp::start(engine_b, l->address(), test_config(1, "test-secret", 2))).value();
  AcceptOp acc = l->start_accept();
  bool connected = false, accepted = false;
  auto deadline = Deadline::after_seconds(5);
  // One thread drives both sides: neither call may block.
  while (!(connected && accepted) && !deadline.expired()) {
    if (!connected) {
      auto r = op->test();
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      connected = *r;
    }
    if (!accepted) {
      auto r = acc.test();
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      accepted = *r;
    }
  }
  ASSERT_TRUE(connected && accepted);
  auto pb = op->take_peer();
  auto pa = acc.take_peer();
  EXPECT_EQ(pa->streams(), 2);
  uint16_t x = 77, y = 0;
  auto r = pa->irecv(0, &y, 2);
  ASSERT_TRUE(pb->send(0, &x, 2, Deadline::after_seconds(5)).is_ok());
  ASSERT_TRUE(r.wait(Deadline::after_seconds(5)).is_ok());
  EXPECT_EQ(y, 77);
}

}  // namespace
}  // namespace lowcomm::transport
