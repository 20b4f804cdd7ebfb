// lowcomm-init-bench: how long Communicator::init takes and what a communicator costs in
// memory, for P forked ranks on this machine, quiet and under a storm of foreign connections
// to the root's port (docs/scale.md).
//
//   lowcomm-init-bench                        # P = 2, 4, 8, 16; 5 repetitions each
//   lowcomm-init-bench -n 4 --storm 1000      # 4 ranks, quiet, then with 1000 foreign connects
//
// Every rank starts init at the same instant (a CLOCK_MONOTONIC time the parent picks, shared
// by all processes of the machine); a rank's init time is from that instant until init
// returns, the group's the slowest rank's. Memory: the rank's resident set after init minus
// before (VmRSS), and its peak (VmHWM). The storm: a separate process opens N TCP connections
// to the root's address from the same instant on, as fast as it can, a third of them sending
// 64 random bytes, a third a wrong-secret-sized hello of zeros, a third nothing, and holds them
// all open until the group is done.

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "lowcomm/communicator.h"
#include "rendezvous/root_socket.h"
#include "transport/socket_address.h"

namespace {

using lowcomm::Communicator;
using lowcomm::UniqueId;

double mono_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void sleep_until(double t) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(t);
  ts.tv_nsec = static_cast<long>((t - static_cast<double>(ts.tv_sec)) * 1e9);
  while (::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

// kB of a /proc/self/status field ("VmRSS", "VmHWM").
long status_kb(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long v = -1;
  size_t len = std::strlen(field);
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, field, len) == 0 && line[len] == ':') {
      v = std::strtol(line + len + 1, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return v;
}

void raise_fd_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

struct RankResult {
  bool ok = false;
  double init_s = 0;
  long rss_delta_kb = 0;
  long hwm_kb = 0;
  std::string error;
};

// The storm process: N connections to `root` from `start` on, held until killed.
[[noreturn]] void storm(const std::string& root, int n, double start) {
  raise_fd_limit();
  auto addr = lowcomm::transport::SocketAddress::parse(root);
  if (!addr) ::_exit(2);
  std::vector<int> fds;
  sleep_until(start);
  unsigned seed = 12345;
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(addr->family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    if (::connect(fd, addr->sockaddr_ptr(), addr->length()) != 0) {
      ::close(fd);
      continue;
    }
    uint8_t junk[64];
    for (auto& b : junk) b = static_cast<uint8_t>(rand_r(&seed));
    if (i % 3 == 1) std::memset(junk, 0, sizeof junk);
    if (i % 3 != 2) (void)!::send(fd, junk, sizeof junk, MSG_NOSIGNAL | MSG_DONTWAIT);
    fds.push_back(fd);
  }
  ::pause();
  ::_exit(0);
}

// One group of P ranks; the group's init time is results' max.
std::vector<RankResult> run_group(int P, int storm_connects) {
  auto id = lowcomm::create_unique_id("127.0.0.1");
  if (!id) {
    std::fprintf(stderr, "create_unique_id: %s\n", id.status().to_string().c_str());
    std::exit(1);
  }
  const double start = mono_s() + 0.3 + 0.01 * P;
  std::vector<pid_t> pids;
  std::vector<int> fds;
  for (int r = 0; r < P; ++r) {
    int p[2];
    if (::pipe(p) != 0) std::exit(1);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      raise_fd_limit();
      lowcomm::CommOptions o;
      o.timeout = std::chrono::milliseconds(60000);
      RankResult res;
      long rss0 = status_kb("VmRSS");
      sleep_until(start);
      auto c = Communicator::init(*id, r, P, o);
      res.init_s = mono_s() - start;
      res.ok = c.is_ok();
      if (!c) res.error = c.status().to_string();
      res.rss_delta_kb = status_kb("VmRSS") - rss0;
      res.hwm_kb = status_kb("VmHWM");
      char line[512];
      int len = std::snprintf(line, sizeof line, "%d %.6f %ld %ld %s", res.ok ? 1 : 0, res.init_s,
                              res.rss_delta_kb, res.hwm_kb, res.error.c_str());
      (void)!::write(p[1], line, static_cast<size_t>(std::max(0, len)));
      ::close(p[1]);
      if (c) std::move(c).value().reset();  // destroy: says goodbye to every peer
      ::_exit(0);
    }
    ::close(p[1]);
    pids.push_back(pid);
    fds.push_back(p[0]);
  }
  pid_t storm_pid = -1;
  if (storm_connects > 0) {
    storm_pid = ::fork();
    if (storm_pid == 0) storm(id->root_address, storm_connects, start);
  }
  (void)lowcomm::rendezvous::take_root_socket(id->to_string());
  std::vector<RankResult> out(P);
  for (int r = 0; r < P; ++r) {
    std::string text;
    char buf[512];
    ssize_t n;
    while ((n = ::read(fds[r], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
    ::close(fds[r]);
    int ok = 0;
    double t = 0;
    long d = 0, h = 0;
    char err[400] = {0};
    if (std::sscanf(text.c_str(), "%d %lf %ld %ld %399[^\n]", &ok, &t, &d, &h, err) >= 4) {
      out[r] = {ok == 1, t, d, h, err};
    } else {
      out[r].error = "no result: " + text;
    }
  }
  for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
  if (storm_pid > 0) {
    ::kill(storm_pid, SIGKILL);
    ::waitpid(storm_pid, nullptr, 0);
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void usage() {
  std::fprintf(stderr,
               "usage: lowcomm-init-bench [-n P[,P...]] [-r reps] [--storm N]\n"
               "  -n       rank counts (default 2,4,8,16)\n"
               "  -r       repetitions per configuration (default 5); medians are reported\n"
               "  --storm  also run each P with N foreign connections to the root's port\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ranks = {2, 4, 8, 16};
  int reps = 5, storm_n = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-n" && i + 1 < argc) {
      ranks.clear();
      std::string list = argv[++i];
      for (size_t pos = 0; pos <= list.size();) {
        size_t comma = list.find(',', pos);
        if (comma == std::string::npos) comma = list.size();
        ranks.push_back(std::atoi(list.substr(pos, comma - pos).c_str()));
        pos = comma + 1;
      }
    } else if (a == "-r" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--storm" && i + 1 < argc) {
      storm_n = std::atoi(argv[++i]);
    } else {
      usage();
    }
  }
  if (reps < 1 || ranks.empty()) usage();
  std::printf("%6s %8s %12s %12s %14s %12s\n", "ranks", "storm", "init_ms", "max_init_ms",
              "rss_delta_MiB", "peak_MiB");
  int failures = 0;
  for (int P : ranks) {
    for (int s : storm_n > 0 ? std::vector<int>{0, storm_n} : std::vector<int>{0}) {
      std::vector<double> group_s, rss, hwm;
      for (int k = 0; k < reps; ++k) {
        auto res = run_group(P, s);
        double worst = 0;
        for (auto& r : res) {
          if (!r.ok) {
            ++failures;
            std::fprintf(stderr, "P=%d storm=%d: a rank failed: %s\n", P, s, r.error.c_str());
          }
          worst = std::max(worst, r.init_s);
          rss.push_back(static_cast<double>(r.rss_delta_kb) / 1024.0);
          hwm.push_back(static_cast<double>(r.hwm_kb) / 1024.0);
        }
        group_s.push_back(worst);
      }
      std::printf("%6d %8d %12.1f %12.1f %14.1f %12.1f\n", P, s, 1e3 * median(group_s),
                  1e3 * *std::max_element(group_s.begin(), group_s.end()), median(rss),
                  median(hwm));
      std::fflush(stdout);
    }
  }
  return failures == 0 ? 0 : 1;
}
