// Authentication: a wrong secret is rejected on both sides, a client speaking garbage is
// dropped, and neither stops a legitimate peer from connecting.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <future>
#include <thread>

#include "core/little_endian.h"
#include "transport/chunk_header.h"
#include "transport/handshake.h"
#include "transport/socket_options.h"
#include "transport_test_util.h"

namespace lowcomm::transport {
namespace {

using testing::loopback;
using testing::random_bytes;
using testing::test_config;

// A blocking raw TCP client, for speaking to the listener as a stranger would.
UniqueFd raw_connect(const SocketAddress& addr) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_EQ(::connect(fd.get(), addr.sockaddr_ptr(), addr.length()), 0);
  return fd;
}

// Waits until the server closes `fd`: true when recv sees EOF or a reset within the timeout.
bool closed_by_server(int fd, int timeout_ms) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    uint8_t buf[256];
    long n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return true;  // EOF or ECONNRESET
  }
  return false;
}

struct Fixture {
  std::shared_ptr<ProgressEngine> engine = *ProgressEngine::create("lc-test-srv");
  std::shared_ptr<ProgressEngine> client_engine = *ProgressEngine::create("lc-test-cli");
  std::unique_ptr<Listener> listener =
      std::move(Listener::create(engine, test_config(0, "right secret"), loopback())).value();
};

TEST(TransportSecurity, WrongSecretRejectedThenRightOneAccepted) {
  Fixture f;
  auto addr = f.listener->address();
  auto accepted = std::async(std::launch::async,
                             [&] { return f.listener->accept(Deadline::after_seconds(10)); });
  auto bad = connect_peer(f.client_engine, addr, test_config(1, "wrong secret"),
                          Deadline::after_seconds(5));
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("failed authentication"), std::string::npos)
      << bad.status().to_string();
  auto good = connect_peer(f.client_engine, addr, test_config(1, "right secret"),
                           Deadline::after_seconds(5));
  ASSERT_TRUE(good.is_ok()) << good.status().to_string();
  auto peer = accepted.get();
  ASSERT_TRUE(peer.is_ok()) << peer.status().to_string();
  EXPECT_EQ((*peer)->remote_rank(), 1);
  EXPECT_GE(f.listener->rejected_connections(), 1u);
  // And the good pair carries data.
  uint32_t x = 0xC0FFEE, y = 0;
  auto r = (*peer)->irecv(0, &y, sizeof(y));
  ASSERT_TRUE((*good)->send(0, &x, sizeof(x), Deadline::after_seconds(5)).is_ok());
  ASSERT_TRUE(r.wait(Deadline::after_seconds(5)).is_ok());
  EXPECT_EQ(y, x);
}

TEST(TransportSecurity, ServerRejectsAClientThatCannotProveTheSecret) {
  // A client that speaks the protocol but sends a forged proof: the server must check the MAC
  // itself (the honest client above gives up before the server gets to check).
  Fixture f;
  UniqueFd fd = raw_connect(f.listener->address());
  uint8_t hello[kHelloBytes] = {};
  store_le32(hello, 0x3148434Cu);  // "LCH1"
  store_le16(hello + 4, 5);        // protocol version
  store_le16(hello + 6, 0);
  store_le16(hello + 8, 1);
  store_le32(hello + 12, 7);
  store_le64(hello + 16, 1234);
  ASSERT_EQ(::send(fd.get(), hello, sizeof(hello), MSG_NOSIGNAL), static_cast<long>(sizeof(hello)));
  auto peer = std::async(std::launch::async,
                         [&] { return f.listener->accept(Deadline::after_seconds(2)); });
  uint8_t challenge[kChallengeBytes];
  size_t got = 0;
  while (got < sizeof(challenge)) {
    long n = ::recv(fd.get(), challenge + got, sizeof(challenge) - got, 0);
    ASSERT_GT(n, 0);
    got += static_cast<size_t>(n);
  }
  uint8_t forged[kProofBytes] = {};
  ASSERT_EQ(::send(fd.get(), forged, sizeof(forged), MSG_NOSIGNAL),
            static_cast<long>(sizeof(forged)));
  EXPECT_TRUE(closed_by_server(fd.get(), 2000));
  auto p = peer.get();
  EXPECT_EQ(p.status().code(), StatusCode::kTimeout);  // no peer surfaced
  EXPECT_GE(f.listener->rejected_connections(), 1u);
}

TEST(TransportSecurity, GarbageClientDroppedWhileLegitimatePeerConnects) {
  Fixture f;
  auto addr = f.listener->address();
  UniqueFd garbage = raw_connect(addr);
  auto junk = random_bytes(4096, 77);
  ASSERT_EQ(::send(garbage.get(), junk.data(), junk.size(), MSG_NOSIGNAL), 4096);
  UniqueFd silent = raw_connect(addr);  // connects and says nothing
  auto accepted = std::async(std::launch::async,
                             [&] { return f.listener->accept(Deadline::after_seconds(10)); });
  auto good = connect_peer(f.client_engine, addr, test_config(1, "right secret"),
                           Deadline::after_seconds(5));
  ASSERT_TRUE(good.is_ok()) << good.status().to_string();
  auto peer = accepted.get();
  ASSERT_TRUE(peer.is_ok()) << peer.status().to_string();
  EXPECT_TRUE(closed_by_server(garbage.get(), 1000));
  EXPECT_GE(f.listener->rejected_connections(), 1u);
  // Data still flows on the legitimate pair.
  std::vector<uint8_t> out = random_bytes(1 << 20, 5), in(1 << 20);
  auto r = (*peer)->irecv(9, in.data(), in.size());
  ASSERT_TRUE((*good)->send(9, out.data(), out.size(), Deadline::after_seconds(5)).is_ok());
  ASSERT_TRUE(r.wait(Deadline::after_seconds(5)).is_ok());
  EXPECT_TRUE(in == out);
}

// One authenticated stream driven by hand, to send chunk headers no lowcomm sender would: the
// receiver must check them even from a peer that knows the secret (a buggy build, corruption).
struct HandDrivenPeer {
  std::unique_ptr<Peer> server;  // the listener's side, a real Peer
  UniqueFd fd;                   // our side of the one stream

  explicit HandDrivenPeer(PeerConfig server_cfg) {
    auto engine = *ProgressEngine::create("lc-test-srv");
    auto listener = std::move(Listener::create(engine, server_cfg, loopback())).value();
    auto addr = listener->address();
    auto accepted = std::async(std::launch::async,
                               [&] { return listener->accept(Deadline::after_seconds(10)); });
    auto sock = make_tcp_socket(addr);
    EXPECT_TRUE(sock.is_ok());
    (void)::connect(sock->get(), addr.sockaddr_ptr(), addr.length());
    HelloInfo hello;
    hello.rank = 1;
    hello.streams = 1;
    hello.connection_id = 42;
    auto h = StreamHandshake::client(std::move(sock).value(), addr.to_string(), server_cfg.secret,
                                     hello, Deadline::after_seconds(5));
    while (!h.done()) {
      Status st = h.advance();
      EXPECT_TRUE(st.is_ok()) << st.to_string();
      if (!st) break;
      pollfd p{h.fd(), h.poll_events(), 0};
      ::poll(&p, 1, 100);
    }
    fd = h.release_fd();
    auto a = accepted.get();
    EXPECT_TRUE(a.is_ok()) << a.status().to_string();
    if (a) server = std::move(a).value();
    engine_ = engine;
    listener_ = std::move(listener);
  }
  // False once the receiver has shut the connection (it failed the peer).
  bool send_chunk(const ChunkHeader& hdr, const std::vector<uint8_t>& payload) {
    std::vector<uint8_t> wire(kChunkHeaderBytes);
    write_chunk_header(hdr, wire.data());
    PayloadSealer integrity;  // unsealed: the XXH3-128 check a lowcomm sender would write
    EXPECT_TRUE(integrity.init(StreamKeys{}).is_ok());
    EXPECT_TRUE(integrity.protect(wire.data(), payload.data(), nullptr, payload.size()).is_ok());
    wire.insert(wire.end(), payload.begin(), payload.end());
    size_t done = 0;
    while (done < wire.size()) {
      long n = ::send(fd.get(), wire.data() + done, wire.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EAGAIN) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

 private:
  std::shared_ptr<ProgressEngine> engine_;
  std::unique_ptr<Listener> listener_;
};

TEST(TransportSecurity, OverlappingChunksFailTheMessageInsteadOfCompletingIt) {
  HandDrivenPeer p(test_config(0, "right secret"));
  ASSERT_TRUE(p.server);
  std::vector<uint8_t> in(8, 0xEE);
  auto r = p.server->irecv(5, in.data(), in.size());
  // The first half twice: its total matches the message length, but the second half never came.
  ASSERT_TRUE(p.send_chunk({4, 5, 0, 8, 0}, {1, 2, 3, 4}));
  (void)p.send_chunk({4, 5, 0, 8, 0}, {1, 2, 3, 4});
  Status s = r.wait(Deadline::after_seconds(5));
  EXPECT_EQ(s.code(), StatusCode::kCorruptData) << s.to_string();
  EXPECT_NE(s.message().find("overlaps"), std::string::npos) << s.to_string();
}

TEST(TransportSecurity, EmptyUnexpectedMessagesCountAgainstTheAllowance) {
  PeerConfig cfg = test_config(0, "right secret");
  cfg.max_unexpected_bytes = 64 << 10;
  HandDrivenPeer p(cfg);
  ASSERT_TRUE(p.server);
  // Nobody posts tag 9: each empty message is bookkeeping on the receiver, so a stream of them
  // must hit the allowance and fail the peer rather than grow without bound.
  uint64_t sent = 0;
  while (sent < 20000 && p.send_chunk({0, 9, sent, 0, 0}, {})) ++sent;
  uint8_t b = 0;
  auto r = p.server->irecv(10, &b, 1);
  Status s = r.wait(Deadline::after_seconds(5));
  EXPECT_EQ(s.code(), StatusCode::kCorruptData) << s.to_string();
  EXPECT_NE(s.message().find("allowance"), std::string::npos) << s.to_string();
}

TEST(TransportSecurity, EmptySecretIsRefused) {
  auto engine = *ProgressEngine::create("lc-test");
  auto l = Listener::create(engine, test_config(0, ""), loopback());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lowcomm::transport
