#pragma once
// Pieces of the GPU-free plugin driver: forked ranks with a control channel, NCCL-style
// connection set-up loops, and verifiable payloads.

#include <dirent.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "plugin_loader.h"

namespace lowcomm::nccl_net::testing {

// In forked ranks gtest's assertions cannot report: a failed check prints and returns 1.
#define DRIVER_CHECK(cond, ...)                                                                   \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::fprintf(stderr, "[driver %d] check failed at %s:%d: %s: ", (int)getpid(), __FILE__,    \
                   __LINE__, #cond);                                                              \
      std::fprintf(stderr, "%s", ::lowcomm::nccl_net::testing::detail_text(__VA_ARGS__).c_str()); \
      std::fprintf(stderr, "\n");                                                                 \
      return 1;                                                                                   \
    }                                                                                             \
  } while (0)

// The optional printf-style detail of a DRIVER_CHECK.
inline std::string detail_text() {
  return {};
}
template <typename... Args>
std::string detail_text(const char* fmt, Args... args) {
  char buf[1024];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

using Clock = std::chrono::steady_clock;

// A byte pipe between two forked ranks (one end each).
struct Channel {
  int fd = -1;
  bool send(const void* p, size_t n) const {
    auto* b = static_cast<const char*>(p);
    while (n) {
      ssize_t k = ::write(fd, b, n);
      if (k <= 0) return false;
      b += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }
  bool recv(void* p, size_t n) const {
    auto* b = static_cast<char*>(p);
    while (n) {
      ssize_t k = ::read(fd, b, n);
      if (k <= 0) return false;
      b += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }
};

// Runs `a` and `b` in two forked processes joined by a Channel; returns their exit codes
// (128 + signal when killed). Each rank is killed by SIGALRM after `limit_s`: a hang fails.
// `env_a`/`env_b` run first in the child (setenv before the plugin is loaded), after
// LOWCOMM_FAILURE_TIMEOUT_MS=5000 unless the environment sets it.
inline std::pair<int, int> run_two(const std::function<int(Channel)>& a,
                                   const std::function<int(Channel)>& b, int limit_s = 240,
                                   const std::function<void()>& env_a = {},
                                   const std::function<void()>& env_b = {}) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return {-1, -1};
  std::fflush(nullptr);
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = ::fork();
    if (pids[r] == 0) {
      ::close(sv[1 - r]);
      ::alarm(static_cast<unsigned>(limit_s));
      // Generous, as the collectives tests' options: a sanitizer build's peer on two shared
      // cores was once silent for 1.7 s while alive (TSan, ten thousand transfers). A test of
      // the timeout itself sets its own in env_a/env_b.
      ::setenv("LOWCOMM_FAILURE_TIMEOUT_MS", "5000", 0);
      if (r == 0 && env_a) env_a();
      if (r == 1 && env_b) env_b();
      int rc = (r == 0 ? a : b)(Channel{sv[r]});
      std::fflush(nullptr);
      ::_exit(rc);
    }
  }
  ::close(sv[0]);
  ::close(sv[1]);
  int codes[2];
  for (int r = 0; r < 2; ++r) {
    int st = 0;
    ::waitpid(pids[r], &st, 0);
    codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  return {codes[0], codes[1]};
}

// Deterministic payload: byte i of message `seed` (xorshift64 per 8 bytes).
inline uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}
inline void fill(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t s = mix(seed + 1);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    std::memcpy(p + i, &s, 8);
  }
  s ^= s << 13;
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(s >> (8 * (i % 8)));
}
// Index of the first wrong byte, or n.
inline size_t first_mismatch(const uint8_t* p, size_t n, uint64_t seed) {
  std::vector<uint8_t> want(n);
  fill(want.data(), n, seed);
  for (size_t i = 0; i < n; ++i)
    if (p[i] != want[i]) return i;
  return n;
}

// NCCL's set-up: connect() and accept() called until both return a comm, from this thread.
// Returns false after `limit` or on an error (rc of the failing call in *rc).
template <typename Net>
bool connect_loop(const Net* net, void* send_ctx, void* handle, void* listen_comm, void** send_comm,
                  void** recv_comm, int* rc,
                  std::chrono::seconds limit = std::chrono::seconds(20)) {
  abi::DeviceHandle* dev_send = nullptr;
  abi::DeviceHandle* dev_recv = nullptr;
  *send_comm = *recv_comm = nullptr;
  *rc = abi::kSuccess;
  const bool want_send = send_ctx != nullptr, want_recv = listen_comm != nullptr;
  auto end = Clock::now() + limit;
  while ((want_send && !*send_comm) || (want_recv && !*recv_comm)) {
    if (Clock::now() > end) return false;
    if (want_send && !*send_comm) {
      *rc = net->connect(send_ctx, 0, handle, send_comm, &dev_send);
      if (*rc != abi::kSuccess) return false;
    }
    if (want_recv && !*recv_comm) {
      *rc = net->accept(listen_comm, recv_comm, &dev_recv);
      if (*rc != abi::kSuccess) return false;
    }
    std::this_thread::yield();
  }
  return true;
}

// Waits for a request as NCCL's progress thread does (test() in a loop); false on an error or
// after `limit`.
template <typename Net>
bool wait_request(const Net* net, void* request, int* size, int* rc,
                  std::chrono::seconds limit = std::chrono::seconds(60)) {
  auto end = Clock::now() + limit;
  int done = 0;
  while (!done) {
    *rc = net->test(request, &done, size);
    if (*rc != abi::kSuccess) return false;
    if (!done && Clock::now() > end) return false;
  }
  return true;
}

// One receive or send, as NCCL posts them (one buffer, the LL hint left in *request).
template <typename Net>
int post_recv(const Net* net, void* comm, void* buf, size_t size, void** request) {
  void* data = buf;
  int tag = 0;
  *request = reinterpret_cast<void*>(1);
  return net->irecv(comm, 1, &data, &size, &tag, nullptr, nullptr, request);
}
template <typename Net>
int post_send(const Net* net, void* comm, const void* buf, size_t size, void** request) {
  return net->isend(comm, const_cast<void*>(buf), size, 0, nullptr, nullptr, request);
}

// A forked rank's plugin: loaded, one context, a send comm to the other rank and a receive
// comm from it (connect_ranks); closed and finalized when it goes.
struct RankComms {
  PluginLib lib;
  void* ctx = nullptr;
  void* send = nullptr;
  void* recv = nullptr;
  const abi::NetV12* net() const { return lib.v12(); }
  // Closes both comms and finalizes; each call's result ORed into the return (0: all fine).
  int close() {
    int rc = 0;
    if (send) rc |= net()->close_send(std::exchange(send, nullptr));
    if (recv) rc |= net()->close_recv(std::exchange(recv, nullptr));
    if (ctx) rc |= net()->finalize(std::exchange(ctx, nullptr));
    return rc;
  }
  ~RankComms() { close(); }
};

// init, listen, swap handles over the channel, then connect and accept from this thread.
inline int connect_ranks(Channel& ch, RankComms& c,
                         std::chrono::seconds limit = std::chrono::seconds(20)) {
  const abi::NetV12* net = c.net();
  abi::CommConfig config{-1};
  DRIVER_CHECK(net->init(&c.ctx, 1, &config, driver_logger, nullptr) == abi::kSuccess && c.ctx,
               "init: %s", take_last_warn().c_str());
  char mine[abi::kHandleMaxBytes] = {}, theirs[abi::kHandleMaxBytes] = {};
  void* listen = nullptr;
  DRIVER_CHECK(net->listen(c.ctx, 0, mine, &listen) == abi::kSuccess);
  DRIVER_CHECK(ch.send(mine, sizeof(mine)) && ch.recv(theirs, sizeof(theirs)));
  int rc = 0;
  bool ok = connect_loop(net, c.ctx, theirs, listen, &c.send, &c.recv, &rc, limit);
  net->close_listen(listen);
  DRIVER_CHECK(ok, "set-up rc %d: %s", rc, take_last_warn().c_str());
  return 0;
}

// Threads of this process with the given name (the plugin's engine thread is "lc-nccl-net");
// by name, since sanitizer runtimes start threads of their own.
inline int count_threads(const std::string& name = "lc-nccl-net") {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string line;
      if (std::getline(comm, line) && line == name) ++n;
    }
    ::closedir(d);
  }
  return n;
}

// count_threads(name) once it has dropped to `want`, or after 2 s. pthread_join returns when
// the kernel clears the thread's tid, which happens during its exit, before the task is reaped
// and leaves /proc/self/task: a joined thread can still be listed for a moment (seen under load
// in CI). A thread that was not joined keeps running and is still counted after the wait.
inline int count_threads_settled(int want, const std::string& name = "lc-nccl-net") {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int n = count_threads(name);
  while (n > want && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    n = count_threads(name);
  }
  return n;
}

}  // namespace lowcomm::nccl_net::testing
