// lowcomm-slow-link-check: liveness over a kernel-shaped slow link (docs/collectives.md,
// "Failure semantics"). Two ranks in network namespaces <netns>0 and <netns>1 behind tbf links
// (scripts/wan_netns.sh); run through scripts/slow_link_netns.sh, which makes them at 20 Mbit/s
// and removes them afterwards:
//
//   scripts/slow_link_netns.sh [BUILD_DIR]
//   lowcomm-slow-link-check --netns lcs --subnet 10.75.0 --mib 32   # namespaces already up
//
// On sealed connections (no ACKs travel back) and at the default failure timeout (1.5 s):
//   1. a broadcast of --mib MiB from rank 0, then a small all-gather (the root's kernel may still
//      hold the broadcast's tail while it waits on rank 1): no false failure;
//   2. a send of --mib MiB from rank 0 to rank 1, then an all-gather: no false failure;
//   3. a broadcast during which rank 1 freezes (SIGSTOP) after 2 s: rank 0 fails it as frozen
//      within 3 s of the freeze.
// Before control frames were kept from waiting behind the kernel's send buffer, the PING of (1)
// waited behind seconds of data and rank 0 failed a live rank 1 ("frozen or cut off").
// Exit status 0 when every case is as expected, 1 otherwise, 77 when the namespaces are missing.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "lowcomm/communicator.h"
#include "netns.h"
#include "rendezvous/root_socket.h"

using namespace lowcomm;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

struct Shared {
  char id[256];
  std::atomic<int> id_ready{0};
  std::atomic<pid_t> frozen{0};
  std::atomic<int64_t> frozen_at_ns{0};
  char result[2][512];
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Rank r's run; its verdict ("ok ..." or the failure) in shared->result[r].
std::string run_rank(int r, const bench::Netns& net, uint64_t mib, Shared* shared) {
  if (!net.enter(r)) return "cannot enter namespace " + net.name(r);
  if (r == 0) {
    auto id = create_unique_id(net.ip(0));
    if (!id) return "unique id: " + id.status().to_string();
    std::snprintf(shared->id, sizeof(shared->id), "%s", id->to_string().c_str());
    shared->id_ready.store(1);
  }
  while (shared->id_ready.load() == 0) std::this_thread::sleep_for(1ms);
  auto id = UniqueId::parse(shared->id);
  if (!id) return "unique id: " + id.status().to_string();
  CommOptions o;
  o.encrypt = 1;  // sealed: the receiver sends no ACKs, only PONGs
  o.timeout = 120s;
  o.failure_timeout = 1500ms;  // the default
  auto c = Communicator::init(*id, r, 2, o);
  if (!c) return "init: " + c.status().to_string();
  Communicator& comm = **c;
  const uint64_t n = mib << 18;  // floats
  std::vector<float> x(n, static_cast<float>(r == 0 ? 1 : 0));
  std::vector<float> g(2);
  float mine = static_cast<float>(r);
  std::string report;
  auto t0 = Clock::now();
  // 1. Broadcast, then an all-gather while the root's kernel may still hold the tail.
  Status s = comm.broadcast(x.data(), x.data(), n, DType::kFloat32, 0).wait();
  if (s) s = comm.all_gather(&mine, g.data(), 1, DType::kFloat32).wait();
  if (!s) return "broadcast: " + s.to_string();
  if (x.back() != 1.0f) return "broadcast: wrong data";
  report += "broadcast " + std::to_string(since(t0)) + " s";
  // 2. A send, then an all-gather.
  t0 = Clock::now();
  std::fill(x.begin(), x.end(), static_cast<float>(r == 0 ? 2 : 0));
  s = r == 0 ? comm.send(x.data(), n, DType::kFloat32, 1, 7).wait()
             : comm.recv(x.data(), n, DType::kFloat32, 0, 7).wait();
  if (s) s = comm.all_gather(&mine, g.data(), 1, DType::kFloat32).wait();
  if (!s) return "send: " + s.to_string();
  if (x.back() != 2.0f) return "send: wrong data";
  report += ", send " + std::to_string(since(t0)) + " s";
  // 3. Rank 1 freezes 2 s into a broadcast: rank 0 fails it within 3 s of the freeze.
  if (r == 1) {
    Work w = comm.broadcast(x.data(), x.data(), n, DType::kFloat32, 0);
    std::this_thread::sleep_for(2s);
    shared->frozen.store(::getpid());
    shared->frozen_at_ns.store(now_ns());
    ::raise(SIGSTOP);  // rank 0 kills it
    return "resumed (wrong)";
  }
  s = comm.broadcast(x.data(), x.data(), n, DType::kFloat32, 0).wait();
  const double after = static_cast<double>(now_ns() - shared->frozen_at_ns.load()) / 1e9;
  if (pid_t p = shared->frozen.load(); p != 0) ::kill(p, SIGKILL);
  if (s) return "frozen: the broadcast succeeded";
  if (s.message().find("frozen or cut off") == std::string::npos)
    return "frozen: failed, but not as frozen: " + s.to_string();
  if (after > 3.0) return "frozen: failed " + std::to_string(after) + " s after the freeze";
  return "ok " + report + ", frozen rank failed " + std::to_string(after) + " s after the freeze";
}

}  // namespace

int main(int argc, char** argv) {
  bench::Netns net{"lcs", "10.75.0"};
  uint64_t mib = 32;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto need = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "lowcomm-slow-link-check: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--netns") {
      net.prefix = need();
    } else if (a == "--subnet") {
      net.subnet = need();
    } else if (a == "--mib") {
      mib = std::strtoull(need().c_str(), nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: lowcomm-slow-link-check [--netns P] [--subnet S] [--mib N]\n");
      return 2;
    }
  }
  if (!net.exists(0) || !net.exists(1)) {
    std::fprintf(stderr, "lowcomm-slow-link-check: no namespaces %s0, %s1 (scripts/wan_netns.sh)\n",
                 net.prefix.c_str(), net.prefix.c_str());
    return 77;
  }
  void* m =
      ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return 1;
  auto* shared = new (m) Shared;
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = ::fork();
    if (pids[r] == 0) {
      std::string v = run_rank(r, net, mib, shared);
      std::snprintf(shared->result[r], sizeof(shared->result[r]), "%s", v.c_str());
      ::_exit(v.rfind("ok", 0) == 0 ? 0 : 1);
    }
  }
  int st0 = 0, st1 = 0;
  ::waitpid(pids[0], &st0, 0);
  if (pid_t p = shared->frozen.load(); p != 0) ::kill(p, SIGKILL);
  ::waitpid(pids[1], &st1, 0);
  const bool ok =
      WIFEXITED(st0) && WEXITSTATUS(st0) == 0 && WIFSIGNALED(st1) && WTERMSIG(st1) == SIGKILL;
  std::printf("rank 0: %s\nrank 1: %s\n", shared->result[0],
              WIFSIGNALED(st1) ? "frozen, then killed (expected)" : shared->result[1]);
  std::printf("lowcomm-slow-link-check: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
