#pragma once
// Multi-process harness for the collectives tests: every rank is a fork()ed process of the test
// binary, on loopback. The parent creates the UniqueId (its listening socket is inherited by
// rank 0), forks before starting any thread of its own, and collects one line of text per rank
// through a pipe plus the exit status. A rank's function returns "ok..." on success, anything
// else is the failure text shown by the test.

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "lowcomm/communicator.h"
#include "rendezvous/root_socket.h"

namespace lowcomm::testing {

using Clock = std::chrono::steady_clock;

struct RankResult {
  std::string text;
  int exit_code = -1;
  bool ok() const { return exit_code == 0 && text.rfind("ok", 0) == 0; }
};

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

using RankFn = std::function<std::string(int rank, const UniqueId& id)>;

inline std::vector<RankResult> run_ranks(int nranks, const RankFn& fn, double timeout_s = 40) {
  auto id = create_unique_id("127.0.0.1");
  EXPECT_TRUE(id.is_ok()) << id.status().to_string();
  std::vector<RankResult> out(nranks);
  if (!id) return out;
  std::vector<pid_t> pids(nranks, -1);
  std::vector<int> fds(nranks, -1);
  for (int r = 0; r < nranks; ++r) {
    int p[2];
    if (::pipe(p) != 0) return out;
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      std::string s = fn(r, *id);
      size_t off = 0;
      while (off < s.size()) {
        ssize_t n = ::write(p[1], s.data() + off, s.size() - off);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
      ::_exit(s.rfind("ok", 0) == 0 ? 0 : 1);  // no atexit handlers, no gtest teardown
    }
    ::close(p[1]);
    pids[r] = pid;
    fds[r] = p[0];
  }
  (void)rendezvous::take_root_socket(id->to_string());  // the parent's copy: close it
  auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  int open = nranks;
  while (open > 0 && Clock::now() < deadline) {
    std::vector<pollfd> pf;
    for (int r = 0; r < nranks; ++r)
      if (fds[r] >= 0) pf.push_back({fds[r], POLLIN, 0});
    ::poll(pf.data(), pf.size(), 100);
    for (auto& f : pf) {
      if (!(f.revents & (POLLIN | POLLHUP))) continue;
      int r = 0;
      while (fds[r] != f.fd) ++r;
      char buf[4096];
      ssize_t n = ::read(f.fd, buf, sizeof(buf));
      if (n > 0) {
        out[r].text.append(buf, static_cast<size_t>(n));
      } else {
        ::close(f.fd);
        fds[r] = -1;
        --open;
      }
    }
  }
  for (int r = 0; r < nranks; ++r) {
    if (fds[r] >= 0) {
      ::kill(pids[r], SIGKILL);
      ::close(fds[r]);
      out[r].text +=
          " [killed by the harness: no result within " + std::to_string(timeout_s) + " s]";
    }
    int st = 0;
    ::waitpid(pids[r], &st, 0);
    out[r].exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  return out;
}

inline void expect_all_ok(const std::vector<RankResult>& res) {
  for (size_t r = 0; r < res.size(); ++r)
    EXPECT_TRUE(res[r].ok()) << "rank " << r << " (exit " << res[r].exit_code
                             << "): " << res[r].text;
}

// Options for test ranks: small socket buffers and two streams keep 8 processes light.
inline CommOptions test_options() {
  CommOptions o;
  o.streams = 2;
  o.socket_buffer_bytes = 1 << 20;
  o.timeout = std::chrono::milliseconds(20000);
  o.segment_bytes = 64 << 10;  // several pipeline segments even for small tensors
  o.codec_threads = 1;
  // Generous: eight ranks of a sanitizer build share two cores (the default is 1500 ms).
  o.failure_timeout = std::chrono::milliseconds(5000);
  return o;
}

// Seeded input of rank r, element i: a smooth part plus noise, in roughly [-4, 4].
inline float input_value(uint64_t seed, int r, uint64_t i) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ (static_cast<uint64_t>(r) << 40) ^ i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  double u = static_cast<double>(x >> 11) / 9007199254740992.0;
  return static_cast<float>(std::sin(0.001 * static_cast<double>(i) + r) + 3.0 * (u - 0.5));
}

inline uint16_t to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}
inline float from_bf16(uint16_t h) {
  uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// A tensor of `dtype` held as bytes, with fp32 views for checking.
struct Tensor {
  DType dtype = DType::kFloat32;
  std::vector<uint8_t> bytes;
  Tensor(DType d, uint64_t n) : dtype(d), bytes(n * dtype_size(d)) {}
  uint64_t size() const { return bytes.size() / dtype_size(dtype); }
  void* data() { return bytes.data(); }
  float get(uint64_t i) const {
    if (dtype == DType::kFloat32) {
      float f;
      std::memcpy(&f, &bytes[4 * i], 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, &bytes[2 * i], 2);
    return from_bf16(h);  // tests use fp32 and bf16
  }
  void set(uint64_t i, float v) {
    if (dtype == DType::kFloat32) {
      std::memcpy(&bytes[4 * i], &v, 4);
    } else {
      uint16_t h = to_bf16(v);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
  }
};

inline Tensor make_input(DType d, uint64_t n, uint64_t seed, int r) {
  Tensor t(d, n);
  for (uint64_t i = 0; i < n; ++i) t.set(i, input_value(seed, r, i));
  return t;
}

inline uint64_t fnv64(const std::vector<uint8_t>& b) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t v : b) h = (h ^ v) * 1099511628211ull;
  return h;
}

}  // namespace lowcomm::testing

#define RANK_CHECK(cond, msg)                                             \
  do {                                                                    \
    if (!(cond)) return std::string("check failed: " #cond ": ") + (msg); \
  } while (0)
#define RANK_OK(expr)                                                                 \
  do {                                                                                \
    ::lowcomm::Status rank_ok_s_ = (expr);                                            \
    if (!rank_ok_s_.is_ok()) return std::string(#expr ": ") + rank_ok_s_.to_string(); \
  } while (0)
