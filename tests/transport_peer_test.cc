// A real pair of peers over loopback TCP: messages of every size striped over the streams,
// many tagged requests in flight, length mismatches, and the WAN emulation's accuracy.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "transport/emulated_links.h"
#include "transport/pacer.h"
#include "transport_test_util.h"

namespace lowcomm::transport {
namespace {

using testing::connect_pair;
using testing::random_bytes;
using testing::test_config;

const Deadline kWait = Deadline::after_seconds(20);

TEST(TransportPeer, ConnectsWithFourAuthenticatedStreams) {
  auto p = connect_pair();
  ASSERT_TRUE(p.a && p.b);
  EXPECT_EQ(p.a->remote_rank(), 1);
  EXPECT_EQ(p.b->remote_rank(), 0);
  EXPECT_EQ(p.a->streams(), 4);
  EXPECT_EQ(p.b->streams(), 4);
  EXPECT_GT(p.b->socket_buffers().send, 0);
  EXPECT_NE(p.b->name().find("peer rank 0 (127.0.0.1:"), std::string::npos) << p.b->name();
}

TEST(TransportPeer, StripesAsWideAsThePathNeeds) {
  // Explicit stream count (test_config): every stream carries data.
  auto fixed = connect_pair();
  ASSERT_TRUE(fixed.a && fixed.b);
  EXPECT_EQ(fixed.a->stripe_streams(), 4);
  // Adaptive: on loopback (RTT well under a millisecond; sized for 1 Gbit/s so a busy machine's
  // few-millisecond RTT still fits one 4 MiB window) messages use one stream; the other three
  // stay open for paths that need them.
  auto cfg_a = test_config(0), cfg_b = test_config(1);
  cfg_a.adapt_streams = cfg_b.adapt_streams = true;
  cfg_a.path_rate_bps = cfg_b.path_rate_bps = 1e9;
  auto p = connect_pair(cfg_a, cfg_b);
  ASSERT_TRUE(p.a && p.b);
  EXPECT_EQ(p.b->streams(), 4);
  EXPECT_EQ(p.b->stripe_streams(), 1);
  const size_t n = 8 << 20;
  auto out = random_bytes(n, 5);
  std::vector<uint8_t> in(n);
  Request r = p.a->irecv(3, in.data(), n);
  Request s = p.b->isend(3, out.data(), n);
  ASSERT_TRUE(s.wait(kWait).is_ok());
  ASSERT_TRUE(r.wait(kWait).is_ok());
  EXPECT_TRUE(in == out);
  // An emulated link models the windows itself and spreads over every stream.
  cfg_b.wan = *parse_wan("rtt=2ms");
  auto shaped = connect_pair(cfg_a, cfg_b);
  ASSERT_TRUE(shaped.a && shaped.b);
  EXPECT_EQ(shaped.b->stripe_streams(), 4);
}

TEST(TransportPeer, ExchangesMessagesOfEverySize) {
  auto p = connect_pair();
  ASSERT_TRUE(p.a && p.b);
  for (size_t n : {size_t{0}, size_t{1}, size_t{1} << 20, (size_t{64} << 20) + 3}) {
    auto out = random_bytes(n, static_cast<uint32_t>(n));
    std::vector<uint8_t> in(n, 0xAB);
    Request r = p.a->irecv(7, in.data(), n);
    Request s = p.b->isend(7, out.data(), n);
    ASSERT_TRUE(s.wait(kWait).is_ok()) << n;
    Status rs = r.wait(kWait);
    ASSERT_TRUE(rs.is_ok()) << n << " " << rs.to_string();
    EXPECT_TRUE(in == out) << "content differs for " << n << " bytes";
  }
}

TEST(TransportPeer, BothDirectionsAtOnce) {
  auto p = connect_pair();
  ASSERT_TRUE(p.a && p.b);
  const size_t n = 8 << 20;
  auto x = random_bytes(n, 1), y = random_bytes(n, 2);
  std::vector<uint8_t> xin(n), yin(n);
  Request r1 = p.a->irecv(1, yin.data(), n), r2 = p.b->irecv(1, xin.data(), n);
  Request s1 = p.a->isend(1, x.data(), n), s2 = p.b->isend(1, y.data(), n);
  for (auto* r : {&r1, &r2, &s1, &s2}) ASSERT_TRUE(r->wait(kWait).is_ok());
  EXPECT_TRUE(xin == x);
  EXPECT_TRUE(yin == y);
}

TEST(TransportPeer, UnexpectedMessageIsBufferedUntilPosted) {
  auto p = connect_pair();
  ASSERT_TRUE(p.a && p.b);
  auto out = random_bytes(3 << 20, 9);
  ASSERT_TRUE(p.b->isend(5, out.data(), out.size()).wait(kWait).is_ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it arrive unclaimed
  std::vector<uint8_t> in(out.size());
  ASSERT_TRUE(p.a->irecv(5, in.data(), in.size()).wait(kWait).is_ok());
  EXPECT_TRUE(in == out);
}

// A cancelled receive lets go of its buffer at once: its message, when it comes, is dropped and
// the next receive on the tag takes the next message; one already arriving cannot be cancelled.
TEST(TransportPeer, CancelledReceiveIsDroppedAndTheNextOneMatches) {
  auto p = connect_pair();
  ASSERT_TRUE(p.a && p.b);
  auto m1 = random_bytes(3 << 20, 21), m2 = random_bytes(3 << 20, 22);
  std::vector<uint8_t> first(m1.size(), 0), second(m2.size(), 0);
  Request r1 = p.a->irecv(7, first.data(), first.size());
  ASSERT_TRUE(p.a->cancel(r1));
  Status c = r1.wait(kWait);
  EXPECT_EQ(c.code(), StatusCode::kAborted) << c.to_string();
  EXPECT_NE(c.message().find("cancelled"), std::string::npos) << c.message();
  Request r2 = p.a->irecv(7, second.data(), second.size());
  ASSERT_TRUE(p.b->isend(7, m1.data(), m1.size()).wait(kWait).is_ok());
  ASSERT_TRUE(p.b->isend(7, m2.data(), m2.size()).wait(kWait).is_ok());
  ASSERT_TRUE(r2.wait(kWait).is_ok()) << r2.status().to_string();
  EXPECT_TRUE(second == m2);
  for (uint8_t x : first) ASSERT_EQ(x, 0);  // the cancelled buffer was never written
  // A completed receive: cancel says the buffer is free.
  EXPECT_TRUE(p.a->cancel(r2));
  // The connection carries on both ways.
  std::vector<uint8_t> z(16), w(16, 7);
  Request r4 = p.b->irecv(9, z.data(), z.size());
  ASSERT_TRUE(p.a->isend(9, w.data(), w.size()).wait(kWait).is_ok());
  ASSERT_TRUE(r4.wait(kWait).is_ok());
  EXPECT_TRUE(z == w);
}

// ~Peer ends every request (kAborted) before it returns, so a receive's buffer may be freed
// right after it: a message sent later never lands there. The membership layer relies on it
// (a connection's slot destroys the connection before its receive buffer).
TEST(TransportPeer, DestroyingAPeerEndsItsReceivesBeforeItReturns) {
  auto p = connect_pair();
  ASSERT_TRUE(p.a && p.b);
  std::vector<uint8_t> in(1 << 20, 0);
  Request r = p.a->irecv(5, in.data(), in.size());
  p.a.reset();
  ASSERT_TRUE(r.test());
  EXPECT_EQ(r.status().code(), StatusCode::kAborted) << r.status().to_string();
  auto m = random_bytes(in.size(), 31);
  (void)p.b->isend(5, m.data(), m.size()).wait(kWait);  // the other side is gone: either way
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (uint8_t x : in) ASSERT_EQ(x, 0);
}

TEST(TransportPeer, AReceiveAlreadyArrivingCannotBeCancelled) {
  // 32 MiB over an emulated 100 Mbit/s link: 2.7 s; after 1 s a third of it is in the buffer.
  auto cfg_a = test_config(0), cfg_b = test_config(1);
  cfg_b.wan = *parse_wan("bw=100mbit,rtt=10ms");
  auto p = connect_pair(cfg_a, cfg_b);
  ASSERT_TRUE(p.a && p.b);
  auto big = random_bytes(32 << 20, 23);
  std::vector<uint8_t> in(big.size(), 0);
  Request r = p.a->irecv(8, in.data(), in.size());
  Request s = p.b->isend(8, big.data(), big.size());
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_FALSE(p.a->cancel(r));
  ASSERT_TRUE(r.wait(kWait).is_ok()) << r.status().to_string();
  ASSERT_TRUE(s.wait(kWait).is_ok());
  EXPECT_TRUE(in == big);
}

TEST(TransportPeer, ManyConcurrentTaggedRequestsMatchPerTagInOrder) {
  auto p = connect_pair();
  ASSERT_TRUE(p.a && p.b);
  constexpr int kTags = 8, kPerTag = 16;
  std::vector<std::vector<uint8_t>> out, in;
  std::vector<Request> reqs;
  for (int t = 0; t < kTags; ++t) {
    for (int k = 0; k < kPerTag; ++k) {
      size_t n = static_cast<size_t>((t * 7919 + k * 104729) % (700 << 10));
      out.push_back(random_bytes(n, static_cast<uint32_t>(t * 1000 + k)));
      in.emplace_back(n);
    }
  }
  // Receives for odd tags are posted before the sends, for even tags after: both paths.
  for (int t = 1; t < kTags; t += 2)
    for (int k = 0; k < kPerTag; ++k) {
      auto& b = in[t * kPerTag + k];
      reqs.push_back(p.a->irecv(static_cast<uint64_t>(t), b.data(), b.size()));
    }
  std::vector<std::thread> senders;
  for (int t = 0; t < kTags; ++t) {
    senders.emplace_back([&, t] {
      for (int k = 0; k < kPerTag; ++k) {
        auto& b = out[t * kPerTag + k];
        EXPECT_TRUE(p.b->isend(static_cast<uint64_t>(t), b.data(), b.size()).wait(kWait).is_ok());
      }
    });
  }
  for (int t = 0; t < kTags; t += 2)
    for (int k = 0; k < kPerTag; ++k) {
      auto& b = in[t * kPerTag + k];
      reqs.push_back(p.a->irecv(static_cast<uint64_t>(t), b.data(), b.size()));
    }
  for (auto& th : senders) th.join();
  for (auto& r : reqs) ASSERT_TRUE(r.wait(kWait).is_ok()) << r.status().to_string();
  for (size_t i = 0; i < in.size(); ++i) EXPECT_TRUE(in[i] == out[i]) << "message " << i;
}

TEST(TransportPeer, LengthMismatchFailsTheRequestAndKeepsTheConnection) {
  auto p = connect_pair();
  ASSERT_TRUE(p.a && p.b);
  // 3 MiB: several chunks, striped over the streams, all dropped as they are read.
  std::vector<uint8_t> out(3 << 20, 1), in(999, 0);
  Request r = p.a->irecv(3, in.data(), in.size());
  Request s = p.b->isend(3, out.data(), out.size());
  Status rs = r.wait(kWait);
  EXPECT_EQ(rs.code(), StatusCode::kCorruptData) << rs.to_string();
  EXPECT_NE(rs.message().find("length mismatch"), std::string::npos) << rs.message();
  EXPECT_NE(rs.message().find("peer rank 1"), std::string::npos) << rs.message();
  for (uint8_t c : in) ASSERT_EQ(c, 0);  // nothing written into a buffer of the wrong size
  ASSERT_TRUE(s.wait(kWait).is_ok());
  // The connection still works both ways (the layer above uses it to say what went wrong).
  auto x = random_bytes(5 << 20, 8);
  std::vector<uint8_t> y(x.size()), z(16), w(16, 7);
  Request r2 = p.a->irecv(3, y.data(), y.size());  // the next message on the same tag
  ASSERT_TRUE(p.b->isend(3, x.data(), x.size()).wait(kWait).is_ok());
  ASSERT_TRUE(r2.wait(kWait).is_ok()) << r2.status().to_string();
  EXPECT_TRUE(y == x);
  Request r3 = p.b->irecv(4, z.data(), z.size());
  ASSERT_TRUE(p.a->isend(4, w.data(), w.size()).wait(kWait).is_ok());
  ASSERT_TRUE(r3.wait(kWait).is_ok());
  EXPECT_TRUE(z == w);
}

TEST(TransportPeer, ReceiveUpToTakesAnyMessageThatFitsAndReportsItsLength) {
  auto p = connect_pair();
  ASSERT_TRUE(p.a && p.b);
  // Empty, one chunk, several chunks striped, exactly the capacity; the first three posted
  // before the messages are sent, the last two after they have arrived (unexpected).
  const std::vector<size_t> sizes = {0, 1, 4095, (3u << 20) + 5, 1u << 20};
  const std::vector<size_t> capacity = {4u << 20, 4u << 20, 4u << 20, 4u << 20, 1u << 20};
  std::vector<std::vector<uint8_t>> out, in;
  std::vector<Request> recvs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.push_back(random_bytes(sizes[i], static_cast<uint32_t>(i)));
    in.emplace_back(capacity[i] + 1, 0xEE);
  }
  for (size_t i = 0; i < 3; ++i) recvs.push_back(p.a->irecv_upto(9, in[i].data(), capacity[i]));
  for (size_t i = 0; i < sizes.size(); ++i)
    ASSERT_TRUE(p.b->isend(9, out[i].data(), sizes[i]).wait(kWait).is_ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (size_t i = 3; i < sizes.size(); ++i)
    recvs.push_back(p.a->irecv_upto(9, in[i].data(), capacity[i]));
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(recvs[i].wait(kWait).is_ok()) << recvs[i].status().to_string();
    EXPECT_EQ(recvs[i].received_bytes(), sizes[i]);
    EXPECT_TRUE(std::equal(out[i].begin(), out[i].end(), in[i].begin())) << "message " << i;
    EXPECT_EQ(in[i][sizes[i]], 0xEE) << "written past the end of message " << i;
  }
  // A message larger than the capacity fails only that receive, and writes nothing.
  std::vector<uint8_t> big(5000, 3), small(4999, 0);
  Request r5 = p.a->irecv_upto(9, small.data(), small.size());
  ASSERT_TRUE(p.b->isend(9, big.data(), big.size()).wait(kWait).is_ok());
  Status s5 = r5.wait(kWait);
  EXPECT_EQ(s5.code(), StatusCode::kCorruptData) << s5.to_string();
  EXPECT_EQ(r5.received_bytes(), 0u);
  EXPECT_TRUE(std::all_of(small.begin(), small.end(), [](uint8_t c) { return c == 0; }));
  std::vector<uint8_t> after(16, 0), sent(16, 5);
  Request r6 = p.a->irecv_upto(9, after.data(), 64);
  ASSERT_TRUE(p.b->isend(9, sent.data(), sent.size()).wait(kWait).is_ok());
  ASSERT_TRUE(r6.wait(kWait).is_ok());
  EXPECT_EQ(r6.received_bytes(), 16u);
  EXPECT_TRUE(after == sent);
}

TEST(TransportPeer, UnexpectedMessageOfOtherLengthIsAnError) {
  auto p = connect_pair();
  ASSERT_TRUE(p.a && p.b);
  std::vector<uint8_t> out(4096, 1), in(100, 0);
  ASSERT_TRUE(p.b->isend(3, out.data(), out.size()).wait(kWait).is_ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Status rs = p.a->irecv(3, in.data(), in.size()).wait(kWait);
  EXPECT_EQ(rs.code(), StatusCode::kCorruptData) << rs.to_string();
  for (uint8_t c : in) ASSERT_EQ(c, 0);
  // Dropped, and its allowance given back: the next message on the tag arrives intact.
  std::vector<uint8_t> in2(4096, 0);
  Request r2 = p.a->irecv(3, in2.data(), in2.size());
  ASSERT_TRUE(p.b->isend(3, out.data(), out.size()).wait(kWait).is_ok());
  ASSERT_TRUE(r2.wait(kWait).is_ok()) << r2.status().to_string();
  EXPECT_TRUE(in2 == out);
}

TEST(TransportPeer, EmulatedWanDeliversAtTheModelledTime) {
  // 8 MiB over bw=100mbit,rtt=40ms: 8*2^20*8/1e8 + 0.02 = 0.691 s, within 10%.
  auto cfg_a = test_config(0), cfg_b = test_config(1);
  cfg_b.wan = *parse_wan("bw=100mbit,rtt=40ms");
  auto p = connect_pair(cfg_a, cfg_b);
  ASSERT_TRUE(p.a && p.b);
  const size_t n = 8 << 20;
  auto out = random_bytes(n, 3);
  std::vector<uint8_t> in(n);
  Request r = p.a->irecv(1, in.data(), n);
  auto t0 = std::chrono::steady_clock::now();
  Request s = p.b->isend(1, out.data(), n);
  ASSERT_TRUE(r.wait(kWait).is_ok());
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(s.wait(kWait).is_ok());
  double model = 8.0 * (1 << 20) * 8 / 1e8 + 0.02;
  EXPECT_NEAR(took, model, 0.1 * model) << "took " << took << " s, model " << model << " s";
  EXPECT_TRUE(in == out);
}

TEST(TransportPeer, EmulatedDelayAppliesToSmallMessages) {
  auto cfg_b = test_config(1);
  cfg_b.wan = *parse_wan("rtt=100ms");
  auto p = connect_pair(test_config(0), cfg_b);
  ASSERT_TRUE(p.a && p.b);
  uint8_t x = 42, y = 0;
  Request r = p.a->irecv(1, &y, 1);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(p.b->isend(1, &x, 1).wait(kWait).is_ok());
  ASSERT_TRUE(r.wait(kWait).is_ok());
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(took, 0.049);
  EXPECT_LT(took, 0.09);
  EXPECT_EQ(y, 42);
}

TEST(TransportPeer, EmulatedSendsCompleteWhenTheyLeaveAndPayTheDelayOnceTogether) {
  // As a kernel socket does, a send over the emulated link completes when its bytes have left
  // the sender's end, not when they arrive: eight small sends back to back take far less than
  // one one-way delay to complete, and all eight arrive one delay (200 ms) after they left,
  // not eight delays.
  auto cfg_b = test_config(1);
  cfg_b.wan = *parse_wan("bw=100mbit,rtt=400ms");  // with a rate: each chunk leaves a little
  auto p = connect_pair(test_config(0), cfg_b);    // later than it is submitted
  ASSERT_TRUE(p.a && p.b);
  constexpr int kMessages = 8;
  std::vector<uint8_t> out(kMessages), in(kMessages, 0);
  std::vector<Request> recvs;
  for (int i = 0; i < kMessages; ++i) {
    out[i] = static_cast<uint8_t>(i + 1);
    recvs.push_back(p.a->irecv(1, &in[i], 1));
  }
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kMessages; ++i) ASSERT_TRUE(p.b->isend(1, &out[i], 1).wait(kWait).is_ok());
  double sent = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(sent, 0.1) << "the sends waited for the emulated delay";
  out.assign(kMessages, 0);  // the buffers are free once the sends completed
  for (auto& r : recvs) ASSERT_TRUE(r.wait(kWait).is_ok());
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(took, 0.199);
  EXPECT_LT(took, 0.3) << "each send paid the delay on its own";
  for (int i = 0; i < kMessages; ++i) EXPECT_EQ(in[i], i + 1);
}

TEST(TransportPeer, FlushWaitsUntilEverySendHasLeftSoClosingLosesNothing) {
  // Over an emulated link a send completes when its bytes leave the sender's end but they are
  // written to the socket one delay later: destroying the peer then would drop them. flush()
  // completes only once they are written, and the receiver then gets every byte although the
  // sender is gone.
  auto cfg_b = test_config(1);
  cfg_b.wan = *parse_wan("bw=200mbit,rtt=200ms");
  auto p = connect_pair(test_config(0), cfg_b);
  ASSERT_TRUE(p.a && p.b);
  p.a->expect_close();
  auto out = random_bytes(3 << 20, 11);
  std::vector<uint8_t> in(out.size(), 0);
  Request r = p.a->irecv(2, in.data(), in.size());
  // The last chunk is delivered (written) one one-way delay (100 ms) after it left, which is
  // after 3 MiB of serialisation at 200 Mbit/s (126 ms): not before 226 ms from the start.
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(p.b->isend(2, out.data(), out.size()).wait(kWait).is_ok());
  Request f = p.b->flush();
  ASSERT_TRUE(f.wait(kWait).is_ok()) << f.status().to_string();
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.22) << "flush returned before the last chunk's delivery time";
  p.b.reset();  // closes the sockets
  ASSERT_TRUE(r.wait(kWait).is_ok()) << r.status().to_string();
  EXPECT_TRUE(in == out);
  // Nothing pending: completes at once; after a failure: fails.
  auto q = connect_pair();
  ASSERT_TRUE(q.a && q.b);
  EXPECT_TRUE(q.b->flush().wait(kWait).is_ok());
  q.b->abort();
  EXPECT_FALSE(q.b->flush().wait(kWait).is_ok());
}

TEST(TransportPeer, AnOrderlyCloseLosesNothingStillCrossingTheEmulatedDownlink) {
  // Site model: a message that has fully arrived waits for the receiver's emulated downlink
  // before it completes. The sender flushing and closing meanwhile (every stream at EOF) must
  // not fail it; a receive that can no longer be satisfied fails once it has completed.
  auto cfg_a = test_config(0), cfg_b = test_config(1);
  for (auto* c : {&cfg_a, &cfg_b}) {
    c->wan = *parse_wan("bw=200mbit");
    c->site = own_site_links(c->wan);
  }
  auto p = connect_pair(cfg_a, cfg_b);
  ASSERT_TRUE(p.a && p.b);
  p.a->expect_close();
  auto out = random_bytes(8 << 20, 12);
  std::vector<uint8_t> in(out.size(), 0), more(16);
  Request r = p.a->irecv(2, in.data(), in.size());
  Request never = p.a->irecv(2, more.data(), more.size());
  ASSERT_TRUE(p.b->isend(2, out.data(), out.size()).wait(kWait).is_ok());
  ASSERT_TRUE(p.b->flush().wait(kWait).is_ok());
  p.b.reset();
  ASSERT_TRUE(r.wait(kWait).is_ok()) << r.status().to_string();
  EXPECT_TRUE(in == out);
  Status s = never.wait(kWait);
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.to_string();
}

TEST(TransportPeer, AMessageThatArrivedBeforeTheCloseIsReceivedAfterIt) {
  // The sender's last messages (a goodbye) arrive whole before its close, with no irecv posted
  // for them yet; the close fails the peer. An irecv posted afterwards still gets each message
  // that had arrived, in order; the next one, which never came, fails with the close.
  auto p = connect_pair();
  ASSERT_TRUE(p.a && p.b);
  p.a->expect_close();
  auto first = random_bytes(300, 1), second = random_bytes(70000, 2);
  std::vector<uint8_t> other(8);
  Request ended = p.a->irecv(9, other.data(), other.size());  // fails when the peer does
  ASSERT_TRUE(p.b->isend(5, first.data(), first.size()).wait(kWait).is_ok());
  ASSERT_TRUE(p.b->isend(5, second.data(), second.size()).wait(kWait).is_ok());
  ASSERT_TRUE(p.b->flush().wait(kWait).is_ok());
  p.b.reset();
  Status s = ended.wait(kWait);
  ASSERT_EQ(s.code(), StatusCode::kRemoteError) << s.to_string();
  std::vector<uint8_t> in(1 << 20);
  Request r1 = p.a->irecv_upto(5, in.data(), in.size());
  ASSERT_TRUE(r1.wait(kWait).is_ok()) << r1.status().to_string();
  EXPECT_TRUE(std::vector<uint8_t>(in.begin(), in.begin() + r1.received_bytes()) == first);
  std::vector<uint8_t> in2(second.size());
  Request r2 = p.a->irecv(5, in2.data(), in2.size());
  ASSERT_TRUE(r2.wait(kWait).is_ok()) << r2.status().to_string();
  EXPECT_TRUE(in2 == second);
  Request r3 = p.a->irecv(5, in2.data(), in2.size());
  s = r3.wait(kWait);
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.to_string();
}

}  // namespace
}  // namespace lowcomm::transport
