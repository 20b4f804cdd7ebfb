// A fault injector for tests: interposes recv(2) and flips one random bit in a fraction of the
// reads that return at least a minimum number of bytes (lowcomm's payload reads: chunk headers
// and handshake messages are read in pieces of at most 88 bytes), after the kernel delivered
// them, as a corrupting NIC, middlebox or memory would. Linked into a test program, or loaded
// with LD_PRELOAD into any process (a torch rank); then configured by
//   LOWCOMM_TEST_FLIP_RATE  probability per qualifying read (default 0: off)
//   LOWCOMM_TEST_FLIP_MIN   bytes a read must return to qualify (default 1024)
//   LOWCOMM_TEST_FLIP_SEED  generator seed (default 1)
//   LOWCOMM_TEST_FLIP_LOG   a file each flip appends one line to ("flip <bytes read>")
// Not part of the library; never installed.

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

using RecvFn = ssize_t (*)(int, void*, size_t, int);

std::atomic<RecvFn> real_recv{nullptr};
std::atomic<uint64_t> threshold{0};  // flip when a draw < threshold (of 2^32)
std::atomic<size_t> min_bytes{1024};
std::atomic<uint64_t> state{1};
std::atomic<uint64_t> flips{0};
const char* log_path = nullptr;

uint64_t next_random() {
  // splitmix64 over an atomic counter: thread-safe, deterministic for one thread.
  uint64_t z = state.fetch_add(0x9E3779B97F4A7C15ull, std::memory_order_relaxed);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void set_rate(double rate) {
  if (rate < 0) rate = 0;
  if (rate > 1) rate = 1;
  threshold = static_cast<uint64_t>(rate * 4294967296.0);
}

__attribute__((constructor)) void configure_from_env() {
  if (const char* r = std::getenv("LOWCOMM_TEST_FLIP_RATE")) set_rate(std::atof(r));
  if (const char* m = std::getenv("LOWCOMM_TEST_FLIP_MIN"))
    min_bytes = std::strtoull(m, nullptr, 10);
  if (const char* s = std::getenv("LOWCOMM_TEST_FLIP_SEED")) state = std::strtoull(s, nullptr, 10);
  log_path = std::getenv("LOWCOMM_TEST_FLIP_LOG");
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void lowcomm_test_flip_configure(double rate,
                                                                        uint64_t seed) {
  state = seed;
  set_rate(rate);
}

__attribute__((visibility("default"))) uint64_t lowcomm_test_flip_count() {
  return flips.load();
}

__attribute__((visibility("default"))) ssize_t recv(int fd, void* buf, size_t len, int flags) {
  RecvFn fn = real_recv.load(std::memory_order_acquire);
  if (!fn) {
    fn = reinterpret_cast<RecvFn>(dlsym(RTLD_NEXT, "recv"));
    real_recv.store(fn, std::memory_order_release);
  }
  ssize_t n = fn(fd, buf, len, flags);
  const uint64_t t = threshold.load(std::memory_order_relaxed);
  if (t == 0 || n <= 0 || static_cast<size_t>(n) < min_bytes.load() || (flags & MSG_PEEK)) return n;
  const uint64_t draw = next_random();
  if ((draw & 0xFFFFFFFFull) >= t) return n;
  const uint64_t bit = (draw >> 32) % (static_cast<uint64_t>(n) * 8);
  static_cast<unsigned char*>(buf)[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  flips.fetch_add(1);
  if (log_path) {
    char line[64];
    int k = std::snprintf(line, sizeof(line), "flip %zd\n", n);
    int f = ::open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (f >= 0) {
      (void)!::write(f, line, static_cast<size_t>(k));
      ::close(f);
    }
  }
  return n;
}

}  // extern "C"
