// lowcomm-elastic-bench: how fast an elastic group recovers from a member's death or freeze,
// and what membership costs when nothing fails (docs/membership.md).
//
//   lowcomm-elastic-bench --fault kill --trials 20 --mib 64    # SIGKILL into the all-reduce
//   lowcomm-elastic-bench --fault stop --trials 20             # SIGSTOP (evicted by heartbeat)
//   lowcomm-elastic-bench --fault none --rounds 20             # elastic vs static, interleaved
//   LOWCOMM_WAN=bw=1gbit,rtt=50ms lowcomm-elastic-bench --fault join --state-mib 64 --mib 1
//       # a joiner enters a running group: the members' stall, the joiner's state fetch rate
//
// Every trial forks --members processes on loopback. In the third collective (the first two warm
// the group up), entered by every member together, one member (trial % members, so the
// coordinator, member 0, is a victim too) injects the fault into itself a random 0-20 ms into
// its compressed all-reduce; each survivor records the time from the fault to the completion of
// its (retried) call. Survivors' results are compared bitwise.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/params.h"
#include "lowcomm/elastic.h"
#include "rendezvous/root_socket.h"

using namespace lowcomm;
using Clock = std::chrono::steady_clock;

namespace {

struct Shared {
  std::atomic<int64_t> fault_ns{0};
  std::atomic<int64_t> done_ns[16];
  std::atomic<uint64_t> hash[16];
  std::atomic<int> ok[16];
  double elastic_s[16];
  double static_s[16];
  std::atomic<int> finished{0};
  std::atomic<int> filled[3] = {0, 0, 0};  // per round: members whose input is ready
  std::atomic<int> failed{0};              // a member failed: nobody waits for it
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// --fault join: per member and round, the time in all_reduce and the view size after it.
constexpr int kJoinRounds = 16;
constexpr int kJoinAt = 5;  // the joiner starts once every founder finished this many rounds
struct JoinShared {
  std::atomic<int> rounds_done[17];
  double call_ms[17][kJoinRounds];
  int view_size[17][kJoinRounds];
  double setup_ms[17][kJoinRounds];
  std::atomic<uint64_t> hash[17];
  std::atomic<int> ok[17];
  std::atomic<int> failed{0};  // a slot failed: the others stop waiting for it
  double join_ms = 0, first_call_ms = 0, fetch_ms = 0;
  uint64_t fetch_bytes = 0;
  int fetch_sources = 0;
  char address[17][64];
};

struct Args {
  std::string fault = "kill";
  int trials = 20;
  int members = 4;
  double mib = 64;
  int rounds = 10;
  std::string codec = "q4";
  double state_mib = 64;  // --fault join: registered state the joiner fetches
  int inner_ms = 20;      // --fault join: the work between collectives (inner steps)
};

ElasticOptions options() {
  ElasticOptions o;
  o.comm.streams = 2;
  o.comm.timeout = std::chrono::seconds(60);
  o.retries = 2;
  o.view_change_timeout = std::chrono::seconds(20);
  return o;
}

void member(Shared* sh, const UniqueId& id, const UniqueId& static_id, int r, const Args& a,
            int victim, int delay_ms) {
  auto ec = ElasticCommunicator::init(id, r, a.members, options());
  if (!ec) {
    std::fprintf(stderr, "member %d: %s\n", r, ec.status().to_string().c_str());
    sh->failed = 1;
    _exit(1);
  }
  uint64_t n = static_cast<uint64_t>(a.mib * (1 << 20) / 4);
  std::vector<float> buf(n);
  AllReduceOptions ar;
  ar.codec = *parse_codec_spec(a.codec);
  auto fill = [&](int round) {
    for (uint64_t i = 0; i < n; ++i)
      buf[i] = std::sin(0.001f * static_cast<float>(i) + static_cast<float>(r + round));
  };
  if (a.fault == "none") {
    auto sc = Communicator::init(static_id, r, a.members, options().comm);
    if (!sc) _exit(1);
    double e = 0, s = 0;
    // Alternating which goes first, so neither always starts behind the other's stragglers.
    auto run_elastic = [&] {
      return (*ec)->all_reduce(buf.data(), buf.data(), n, DType::kFloat32, ReduceOp::kAverage, ar);
    };
    auto run_static = [&] {
      return (*sc)
          ->all_reduce(buf.data(), buf.data(), n, DType::kFloat32, ReduceOp::kAverage, ar)
          .wait();
    };
    for (int round = 0; round < a.rounds; ++round) {
      for (int k = 0; k < 2; ++k) {
        bool elastic = (k == 0) == (round % 2 == 0);
        fill(round);
        auto t0 = Clock::now();
        if (!(elastic ? run_elastic() : run_static()).is_ok()) _exit(1);
        double d = std::chrono::duration<double>(Clock::now() - t0).count();
        if (round == 0) continue;  // warm-up
        (elastic ? e : s) += d;
      }
    }
    sh->elastic_s[r] = e;
    sh->static_s[r] = s;
    sh->ok[r] = 1;
    // Leave together: a member gone before the others saw its done would make them change
    // views in the last round, which is not what this measures.
    ++sh->finished;
    while (sh->finished < a.members) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    _exit(0);
  }
  // The fault comes in the third collective: the first two warm up what a running group has
  // warm (the result buffers of odd and even collectives, the scratch memory), so the figure is
  // the recovery of a group in its steady state, not first-use page faults.
  constexpr int kFaultRound = 2;
  for (int round = 0; round <= kFaultRound; ++round) {
    fill(round);
    // Every member enters the call together: the fault is then a fixed delay into everyone's
    // collective, and the time to the survivors' completion holds no one's input preparation
    // (four members filling 64 MiB on two cores start up to 100 ms apart otherwise).
    ++sh->filled[round];
    while (sh->filled[round] < a.members) {
      if (sh->failed) _exit(1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::thread inj;
    if (round == kFaultRound && r == victim) {
      inj = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
        sh->fault_ns = now_ns();
        ::raise(a.fault == "kill" ? SIGKILL : SIGSTOP);
      });
    }
    Status s =
        (*ec)->all_reduce(buf.data(), buf.data(), n, DType::kFloat32, ReduceOp::kAverage, ar);
    if (inj.joinable()) inj.join();
    if (!s.is_ok()) {
      std::fprintf(stderr, "member %d round %d: %s\n", r, round, s.to_string().c_str());
      sh->failed = 1;  // the others stop waiting for it
      _exit(1);
    }
  }
  sh->done_ns[r] = now_ns();
  sh->hash[r] = XXH3_64bits(buf.data(), n * 4);
  sh->ok[r] = 1;
  // Stay until every survivor is done: a member gone right after its call is a second
  // failure, and a member that died holds no result the others must agree with.
  ++sh->finished;
  while (sh->finished < a.members - 1 && !sh->failed)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  _exit(0);
}

double pct(std::vector<double> v, double p);

// --fault join: founders (slot < members) and the joiner (slot == members) run kJoinRounds
// rounds of a small all-reduce; the joiner enters after kJoinAt and catches up in its first.
[[noreturn]] void join_member(JoinShared* sh, const UniqueId& id, int slot, const Args& a) {
  using Ms = std::chrono::duration<double, std::milli>;
  bool joiner = slot == a.members;
  // The state exists before joining (a trainer builds its model first), filled after.
  uint64_t sn = static_cast<uint64_t>(a.state_mib * (1 << 20) / 4);
  std::vector<float> state(sn);
  for (uint64_t i = 0; i < sn; ++i) state[i] = joiner ? 0.0f : static_cast<float>(i % 1000);
  std::vector<uint64_t> round(1, 0);
  auto t0 = Clock::now();
  Result<std::unique_ptr<ElasticCommunicator>> ec = Status();
  if (!joiner) {
    ec = ElasticCommunicator::init(id, slot, a.members, options());
  } else {
    std::vector<std::string> seeds;
    for (int r = a.members - 1; r >= 0; --r) seeds.emplace_back(sh->address[r]);
    ec = ElasticCommunicator::join(id, seeds, options());
  }
  if (!ec) {
    std::fprintf(stderr, "slot %d: %s\n", slot, ec.status().to_string().c_str());
    sh->failed = 1;
    _exit(1);
  }
  if (joiner) sh->join_ms = Ms(Clock::now() - t0).count();
  std::snprintf(sh->address[slot], sizeof(sh->address[slot]), "%s",
                (*ec)->member_address().c_str());
  (void)(*ec)->register_state("params", state.data(), sn * 4);
  (void)(*ec)->register_state("round", round.data(), 8);
  uint64_t n = static_cast<uint64_t>(a.mib * (1 << 20) / 4);
  std::vector<float> buf(n);
  AllReduceOptions ar;
  ar.codec = *parse_codec_spec(a.codec);
  int start = joiner ? -1 : 0;
  for (int r = start; r < kJoinRounds; ++r) {
    if (r >= 0 && static_cast<uint64_t>(r) != round[0] && !joiner) {
      sh->failed = 1;
      _exit(1);
    }
    for (uint64_t i = 0; i < n; ++i) buf[i] = std::sin(0.001f * static_cast<float>(i + slot));
    auto c0 = Clock::now();
    Status st =
        (*ec)->all_reduce(buf.data(), buf.data(), n, DType::kFloat32, ReduceOp::kAverage, ar);
    double ms = Ms(Clock::now() - c0).count();
    if (!st.is_ok()) {
      std::fprintf(stderr, "slot %d round %d: %s\n", slot, r, st.to_string().c_str());
      sh->failed = 1;
      _exit(1);
    }
    ++round[0];
    if (joiner && r == -1) {  // the catch-up call: r is the group's round from here on
      auto s = (*ec)->stats();
      sh->first_call_ms = ms;
      sh->fetch_ms = std::chrono::duration<double, std::milli>(s.state_fetch_time).count();
      sh->fetch_bytes = s.state_fetched_bytes;
      sh->fetch_sources = s.state_fetch_sources;
      r = static_cast<int>(round[0]) - 1;
      continue;
    }
    sh->call_ms[slot][r] = ms;
    sh->view_size[slot][r] = (*ec)->size();
    sh->setup_ms[slot][r] =
        std::chrono::duration<double, std::milli>((*ec)->stats().last_view_setup).count();
    sh->rounds_done[slot] = r + 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(a.inner_ms));  // the inner steps
  }
  sh->hash[slot] = XXH3_64bits(state.data(), sn * 4) ^ round[0];
  sh->ok[slot] = 1;
  // Leave only when everyone is done (a leave changes the others' view).
  for (;;) {
    bool all = true;
    for (int k = 0; k <= a.members; ++k)
      if (sh->rounds_done[k] < kJoinRounds) all = false;
    if (all || sh->failed) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  _exit(0);
}

int run_join(const Args& a) {
  auto* sh = static_cast<JoinShared*>(
      mmap(nullptr, sizeof(JoinShared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (sh) JoinShared();
  auto id = create_unique_id("127.0.0.1");
  if (!id) return 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < a.members; ++r) {
    pid_t p = fork();
    if (p == 0) join_member(sh, *id, r, a);
    pids.push_back(p);
  }
  (void)rendezvous::take_root_socket(id->to_string());
  for (;;) {
    bool ready = true;
    for (int r = 0; r < a.members; ++r)
      if (sh->rounds_done[r] < kJoinAt) ready = false;
    if (ready || sh->failed) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  pid_t jp = fork();
  if (jp == 0) join_member(sh, *id, a.members, a);
  pids.push_back(jp);
  bool ok = true;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  const std::string wan = params::text("LOWCOMM_WAN").value_or("(none)");
  std::printf(
      "# lowcomm-elastic-bench --fault join: %d members + 1 joiner, %.0f MiB registered "
      "state, %.2f MiB %s all-reduce per round, %d ms between rounds, LOWCOMM_WAN=%s\n",
      a.members, a.state_mib, a.mib, a.codec.c_str(), a.inner_ms, wan.c_str());
  if (!ok) {
    std::printf("FAILED: a member or the joiner failed\n");
    return 1;
  }
  uint64_t h = sh->hash[0];
  for (int k = 1; k <= a.members; ++k)
    if (sh->hash[k] != h) ok = false;
  // The admission round: the first in which a founder's view has the joiner.
  int adm = -1;
  for (int r = 0; r < kJoinRounds && adm < 0; ++r)
    if (sh->view_size[0][r] == a.members + 1) adm = r;
  std::vector<double> before;
  for (int r = 1; r < kJoinRounds; ++r)
    if (r != adm && r != adm + 1)
      for (int k = 0; k < a.members; ++k) before.push_back(sh->call_ms[k][r]);
  double normal = pct(before, 0.5);
  // The commit of round `adm` admitted the joiner; round adm + 1 is the first in the new view
  // (its communicator is built then) and the joiner's catch-up, fetch included. A member's stall
  // is what its two rounds took beyond two ordinary ones; the group's, the largest member's.
  // (The worst admission round and the worst first round belong to different members: the
  // coordinator commits first, a one-way delay before the others, and then waits that much
  // longer in the next round; their sum counted that delay twice.)
  double worst = 0, setup = 0, stall = 0, stall_admit = 0, stall_first = 0;
  int first = adm + 1;
  double admit = 0;  // the admission round itself: its commit waits for the coordinator's
  for (int k = 0; k < a.members && adm >= 0 && first < kJoinRounds; ++k) {
    worst = std::max(worst, sh->call_ms[k][first]);
    setup = std::max(setup, sh->setup_ms[k][first]);
    admit = std::max(admit, sh->call_ms[k][adm]);
    double mine = sh->call_ms[k][adm] + sh->call_ms[k][first] - 2 * normal;
    if (mine > stall) {
      stall = mine;
      stall_admit = sh->call_ms[k][adm] - normal;
      stall_first = sh->call_ms[k][first] - normal;
    }
  }
  double rate =
      sh->fetch_ms > 0 ? 8.0 * static_cast<double>(sh->fetch_bytes) / (sh->fetch_ms * 1e-3) : 0;
  std::printf("join() returned after %.1f ms; catch-up call %.1f ms\n", sh->join_ms,
              sh->first_call_ms);
  std::printf("state fetch: %.1f MiB from %d members in %.1f ms = %.1f Mbit/s\n",
              static_cast<double>(sh->fetch_bytes) / (1 << 20), sh->fetch_sources, sh->fetch_ms,
              rate / 1e6);
  std::printf(
      "members: a round takes %.1f ms (median); the admission round (%d) took up to %.1f ms, the "
      "first round with the joiner up to %.1f ms, of which up to %.1f ms building the new view's "
      "communicator: stall %.1f ms (the most a member lost: %.1f + %.1f)\n",
      normal, adm, admit, worst, setup, stall, stall_admit, stall_first);
  std::printf("%s: the %d members hold identical state\n", ok ? "ok" : "FAILED", a.members + 1);
  return ok ? 0 : 1;
}

double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size()))) - 1;
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--fault")
      a.fault = v;
    else if (k == "--trials")
      a.trials = std::stoi(v);
    else if (k == "--members")
      a.members = std::stoi(v);
    else if (k == "--mib")
      a.mib = std::stod(v);
    else if (k == "--rounds")
      a.rounds = std::stoi(v);
    else if (k == "--codec")
      a.codec = v;
    else if (k == "--state-mib")
      a.state_mib = std::stod(v);
    else if (k == "--inner-ms")
      a.inner_ms = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  if (a.members < 3 || a.members > 16 ||
      (a.fault != "kill" && a.fault != "stop" && a.fault != "none" && a.fault != "join")) {
    std::fprintf(stderr, "--members 3..16, --fault kill|stop|none|join\n");
    return 2;
  }
  if (a.fault == "join") return run_join(a);
  auto* sh = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::mt19937 rng(12345);
  std::vector<double> rec;
  int failures = 0, mismatches = 0;
  int trials = a.fault == "none" ? 1 : a.trials;
  std::printf("# lowcomm-elastic-bench: %d members, %.0f MiB fp32, codec %s, fault %s\n", a.members,
              a.mib, a.codec.c_str(), a.fault.c_str());
  for (int t = 0; t < trials; ++t) {
    new (sh) Shared();
    auto id = create_unique_id("127.0.0.1");
    auto sid = create_unique_id("127.0.0.1");
    if (!id || !sid) return 1;
    int victim = t % a.members;
    int delay = static_cast<int>(rng() % 21);
    std::vector<pid_t> pids;
    for (int r = 0; r < a.members; ++r) {
      pid_t p = fork();
      if (p == 0) member(sh, *id, *sid, r, a, a.fault == "none" ? -1 : victim, delay);
      pids.push_back(p);
    }
    (void)rendezvous::take_root_socket(id->to_string());
    (void)rendezvous::take_root_socket(sid->to_string());
    for (int r = 0; r < a.members; ++r) {
      if (r == victim && a.fault == "stop") continue;
      int st = 0;
      waitpid(pids[r], &st, 0);
    }
    if (a.fault == "stop") {
      kill(pids[victim], SIGKILL);
      kill(pids[victim], SIGCONT);
      waitpid(pids[victim], nullptr, 0);
    }
    if (a.fault == "none") {
      double e = 0, s = 0;
      for (int r = 0; r < a.members; ++r) {
        e = std::max(e, sh->elastic_s[r]);
        s = std::max(s, sh->static_s[r]);
      }
      int rr = a.rounds - 1;
      std::printf(
          "elastic %.1f ms/call, static %.1f ms/call over %d interleaved calls: "
          "elastic/static = %.3f\n",
          1e3 * e / rr, 1e3 * s / rr, rr, e / s);
      return 0;
    }
    double worst = 0;
    uint64_t h = 0;
    bool ok = true;
    for (int r = 0; r < a.members; ++r) {
      if (r == victim) continue;
      if (!sh->ok[r]) {
        ok = false;
        continue;
      }
      worst = std::max(worst, 1e-6 * static_cast<double>(sh->done_ns[r] - sh->fault_ns));
      if (h && sh->hash[r] != h) {
        ++mismatches;
        std::printf("trial %2d: member %d's result differs from the other survivors'\n", t, r);
      }
      h = sh->hash[r];
    }
    if (!ok || sh->fault_ns == 0) {
      ++failures;
      std::printf("trial %2d victim %d delay %2d ms: FAILED (a survivor did not complete)\n", t,
                  victim, delay);
      continue;
    }
    rec.push_back(worst);
    std::printf("trial %2d victim %d delay %2d ms: fault -> last survivor done %.0f ms\n", t,
                victim, delay, worst);
  }
  if (!rec.empty())
    std::printf(
        "%s: %zu trials, p50 %.0f ms, p99 %.0f ms, max %.0f ms; %d failed, %d result "
        "mismatches\n",
        a.fault.c_str(), rec.size(), pct(rec, 0.5), pct(rec, 0.99), pct(rec, 1.0), failures,
        mismatches);
  return failures || mismatches ? 1 : 0;
}
