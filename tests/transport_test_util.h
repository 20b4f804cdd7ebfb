#pragma once
// Helpers for the transport tests: a connected pair of peers over loopback, port 0.

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <vector>

#include "transport/connector.h"
#include "transport/listener.h"

namespace lowcomm::transport::testing {

inline PeerConfig test_config(int rank, std::string secret = "test-secret", int streams = 4) {
  PeerConfig c;
  c.local_rank = rank;
  c.secret = std::move(secret);
  c.streams = streams;
  c.adapt_streams = false;          // exercise striping over every stream, even on loopback
  c.socket_buffer_bytes = 4 << 20;  // keep kernel memory modest across many test pairs
  c.handshake_timeout_s = 5.0;
  return c;
}

inline SocketAddress loopback() {
  return *SocketAddress::parse("127.0.0.1:0");
}

struct PeerPair {
  std::shared_ptr<ProgressEngine> engine_a, engine_b;
  std::unique_ptr<Peer> a;  // rank 0, the accepting side
  std::unique_ptr<Peer> b;  // rank 1, the connecting side
  std::unique_ptr<Listener> listener;
};

// Each side gets its own engine, as separate processes would. `route`, when given, maps the
// listener's address to the one the connecting side dials (a proxy in between).
inline PeerPair connect_pair(const PeerConfig& accept_cfg, const PeerConfig& connect_cfg,
                             const std::function<SocketAddress(SocketAddress)>& route = {}) {
  PeerPair p;
  p.engine_a = *ProgressEngine::create("lc-test-a");
  p.engine_b = *ProgressEngine::create("lc-test-b");
  auto l = Listener::create(p.engine_a, accept_cfg, loopback());
  EXPECT_TRUE(l.is_ok()) << l.status().to_string();
  if (!l) return p;
  p.listener = std::move(l).value();
  auto addr = route ? route(p.listener->address()) : p.listener->address();
  auto connected = std::async(std::launch::async, [&] {
    return connect_peer(p.engine_b, addr, connect_cfg, Deadline::after_seconds(10));
  });
  auto accepted = p.listener->accept(Deadline::after_seconds(10));
  auto c = connected.get();
  EXPECT_TRUE(accepted.is_ok()) << accepted.status().to_string();
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  if (accepted) p.a = std::move(accepted).value();
  if (c) p.b = std::move(c).value();
  return p;
}

inline PeerPair connect_pair() {
  return connect_pair(test_config(0), test_config(1));
}

inline std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (size_t i = 0; i + 4 <= n; i += 4) {
    auto x = static_cast<uint32_t>(rng());
    std::memcpy(&v[i], &x, 4);
  }
  for (size_t i = n & ~size_t{3}; i < n; ++i) v[i] = static_cast<uint8_t>(rng());
  return v;
}

}  // namespace lowcomm::transport::testing
