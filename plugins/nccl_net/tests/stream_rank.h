#pragma once
// The plugin driver's environment and its two-process random-transfer stream (stream_rank), shared
// by plugin_driver_test.cc and bitflip_driver_test.cc.

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <random>
#include <vector>

#include "driver_util.h"

namespace lowcomm::nccl_net::testing {

constexpr char kSecret[] = "driver-secret-0123456789";

inline void plugin_env(const char* secret = kSecret) {
  ::setenv("LOWCOMM_SECRET", secret, 1);
  ::unsetenv("LOWCOMM_SECRET_FILE");
  ::setenv("LOWCOMM_SOCKET_IFNAME", "=lo", 1);
  ::unsetenv("LOWCOMM_WAN");
  ::unsetenv("LOWCOMM_NCCL_COMPRESS");
  ::setenv("LOWCOMM_SOCKET_BUFFER", "4M", 1);  // modest kernel memory for many test sockets
}

// How many messages the stream tests send each way: LOWCOMM_DRIVER_TRANSFERS / 2 (default
// 10,000 / 2); the sanitizer runs of scripts/test.sh send fewer (TSan is ~10x slower).
inline int transfers_each_way() {
  const char* env = std::getenv("LOWCOMM_DRIVER_TRANSFERS");
  return (env ? std::atoi(env) : 10000) / 2;
}

// One direction of the random-transfer stream: what message k is.
struct MessagePlan {
  size_t bytes;
  size_t posted;
};
inline MessagePlan plan_message(uint64_t direction, uint64_t k) {
  std::mt19937_64 rng(mix(direction * 1000003 + k));
  const uint64_t r = rng() % 1000;
  size_t bytes;
  if (r < 20)
    bytes = 0;  // 2%: empty
  else if (r < 700)
    bytes = rng() % (64u << 10);  // small steps
  else if (r < 985)
    bytes = rng() % (4u << 20);  // NCCL-sized steps
  else
    bytes = rng() % ((64u << 20) + 1);               // up to 64 MiB
  size_t extra = rng() % 3 == 0 ? rng() % 8192 : 0;  // posted > sent
  return {bytes, bytes + extra};
}

// A rank of the two-process stream: sends `count` messages to the peer and receives as many,
// 32 requests in flight per comm, test() on the oldest only, every byte verified.
inline int stream_rank(Channel ch, int me, int count) {
  RankComms c;
  if (connect_ranks(ch, c)) return 1;
  const abi::NetV12* net = c.net();
  void* send = c.send;
  void* recv = c.recv;

  struct Slot {
    void* req;
    uint64_t k;
    std::vector<uint8_t> buf;
  };
  std::deque<Slot> sends, recvs;
  std::vector<std::vector<uint8_t>> spare;
  auto take_buffer = [&](size_t n) {
    std::vector<uint8_t> b;
    if (!spare.empty()) {
      b = std::move(spare.back());
      spare.pop_back();
    }
    b.resize(n);
    return b;
  };
  uint64_t posted_s = 0, posted_r = 0, done_s = 0, done_r = 0, bytes = 0;
  const uint64_t out_dir = static_cast<uint64_t>(me), in_dir = static_cast<uint64_t>(1 - me);
  auto t0 = Clock::now();
  while (done_s < static_cast<uint64_t>(count) || done_r < static_cast<uint64_t>(count)) {
    while (recvs.size() < abi::kMaxRequests && posted_r < static_cast<uint64_t>(count)) {
      MessagePlan m = plan_message(in_dir, posted_r);
      Slot s{nullptr, posted_r, take_buffer(m.posted)};
      DRIVER_CHECK(post_recv(net, recv, s.buf.data(), m.posted, &s.req) == 0, "%s",
                   take_last_warn().c_str());
      if (!s.req) break;  // the plugin is full: NCCL retries later
      recvs.push_back(std::move(s));
      ++posted_r;
    }
    while (sends.size() < abi::kMaxRequests && posted_s < static_cast<uint64_t>(count)) {
      MessagePlan m = plan_message(out_dir, posted_s);
      Slot s{nullptr, posted_s, take_buffer(m.bytes)};
      fill(s.buf.data(), m.bytes, out_dir << 32 | posted_s);
      DRIVER_CHECK(post_send(net, send, s.buf.data(), m.bytes, &s.req) == 0, "%s",
                   take_last_warn().c_str());
      if (!s.req) break;
      sends.push_back(std::move(s));
      ++posted_s;
    }
    int done = 0, size = -1;
    if (!sends.empty()) {
      DRIVER_CHECK(net->test(sends.front().req, &done, &size) == 0, "%s", take_last_warn().c_str());
      if (done) {
        DRIVER_CHECK(static_cast<size_t>(size) == sends.front().buf.size());
        spare.push_back(std::move(sends.front().buf));
        sends.pop_front();
        ++done_s;
      }
    }
    if (!recvs.empty()) {
      Slot& s = recvs.front();
      DRIVER_CHECK(net->test(s.req, &done, &size) == 0, "%s", take_last_warn().c_str());
      if (done) {
        MessagePlan m = plan_message(in_dir, s.k);
        DRIVER_CHECK(static_cast<size_t>(size) == m.bytes, "message %llu: %d bytes, sent %zu",
                     static_cast<unsigned long long>(s.k), size, m.bytes);
        size_t bad = first_mismatch(s.buf.data(), m.bytes, in_dir << 32 | s.k);
        DRIVER_CHECK(bad == m.bytes, "message %llu corrupt at byte %zu",
                     static_cast<unsigned long long>(s.k), bad);
        bytes += m.bytes;
        spare.push_back(std::move(s.buf));
        recvs.pop_front();
        ++done_r;
      }
    }
    if (spare.size() > 8) spare.resize(8);
  }
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::fprintf(stderr, "[driver %d] rank %d: %d messages each way, %.1f MiB received in %.2f s\n",
               static_cast<int>(getpid()), me, count, static_cast<double>(bytes) / (1 << 20), s);
  DRIVER_CHECK(c.close() == 0);
  return 0;
}

}  // namespace lowcomm::nccl_net::testing
