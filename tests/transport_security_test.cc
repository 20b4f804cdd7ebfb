// Authentication: a wrong secret is rejected on both sides, a client speaking garbage is
// dropped, and neither stops a legitimate peer from connecting.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <future>
#include <thread>

#include "transport/little_endian.h"
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
  auto accepted = std::async(std::launch::async, [&] { return f.listener->accept(Deadline::after_seconds(10)); });
  auto bad = connect_peer(f.client_engine, addr, test_config(1, "wrong secret"), Deadline::after_seconds(5));
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("failed authentication"), std::string::npos)
      << bad.status().to_string();
  auto good = connect_peer(f.client_engine, addr, test_config(1, "right secret"), Deadline::after_seconds(5));
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
  store_le16(hello + 4, 1);
  store_le16(hello + 6, 0);
  store_le16(hello + 8, 1);
  store_le32(hello + 12, 7);
  store_le64(hello + 16, 1234);
  ASSERT_EQ(::send(fd.get(), hello, sizeof(hello), MSG_NOSIGNAL), static_cast<long>(sizeof(hello)));
  auto peer = std::async(std::launch::async, [&] { return f.listener->accept(Deadline::after_seconds(2)); });
  uint8_t challenge[kChallengeBytes];
  size_t got = 0;
  while (got < sizeof(challenge)) {
    long n = ::recv(fd.get(), challenge + got, sizeof(challenge) - got, 0);
    ASSERT_GT(n, 0);
    got += static_cast<size_t>(n);
  }
  uint8_t forged[kProofBytes] = {};
  ASSERT_EQ(::send(fd.get(), forged, sizeof(forged), MSG_NOSIGNAL), static_cast<long>(sizeof(forged)));
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
  auto accepted = std::async(std::launch::async, [&] { return f.listener->accept(Deadline::after_seconds(10)); });
  auto good = connect_peer(f.client_engine, addr, test_config(1, "right secret"), Deadline::after_seconds(5));
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

TEST(TransportSecurity, EmptySecretIsRefused) {
  auto engine = *ProgressEngine::create("lc-test");
  auto l = Listener::create(engine, test_config(0, ""), loopback());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lowcomm::transport
