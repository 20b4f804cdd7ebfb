// lowcomm-elastic-partition: network partitions of an elastic group whose members live in
// separate network namespaces (docs/membership.md). Run through scripts/elastic_netns.sh, which
// creates the namespaces (scripts/wan_netns.sh) and removes them afterwards:
//
//   scripts/elastic_netns.sh            # both cases: 2|2 and 3|1
//   lowcomm-elastic-partition --netns lce --subnet 10.78.0 --split 3   # namespaces already up
//
// Four members, member k in namespace <netns>k at <subnet>.(k+1), run a DiLoCo-style loop
// (registered parameters and round counter, a q4 average per round, the update applied after
// the commit). After a few rounds the driver cuts the network between the first --split
// members and the rest: nftables rules in every namespace drop packets to and from the other
// side (the kernel here has no netem; the rules are the partition). Expected:
//   --split 2 (2|2): neither side has a strict majority of the view, so neither commits: every
//     member fails its call with a "no quorum" error naming the members it could reach, and no
//     member's round advances past the one in flight when the cut came.
//   --split 3 (3|1): the three form a view without the one and go on committing; the one fails
//     with "no quorum". The driver then heals the network and starts a joiner in the lone
//     member's namespace: it enters through a seed, fetches the state and the four finish
//     together with identical state.
// Exit status 0 when the outcome is the expected one, 1 otherwise, 77 when the namespaces are
// missing (the ctest wrapper reports that as skipped).
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "elastic_rounds.h"
#include "lowcomm/elastic.h"
#include "netns.h"
#include "rendezvous/root_socket.h"

using namespace lowcomm;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

constexpr int kMembers = 4;
constexpr int kSlots = kMembers + 1;  // the joiner of the 3|1 case

struct Slot {
  std::atomic<int> state{0};  // 1 running, 2 finished, 3 fenced, 4 failed
  std::atomic<uint64_t> round{0};
  std::atomic<uint64_t> hash{0};
  std::atomic<int64_t> fenced_ns{0};
  std::atomic<int> view_size{0};
  char address[64];
  char error[512];
};
struct Shared {
  std::atomic<uint64_t> stop_round{~0ull};
  Slot slot[kSlots];
};

struct Args {
  bench::Netns net{"lce", "10.78.0"};
  int split = 0;  // 0: both cases
  int failure_ms = 1500;
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

ElasticOptions options(const Args& a, int ns) {
  ElasticOptions o;
  o.comm.streams = 1;
  o.comm.timeout = 30s;
  o.comm.codec_threads = 1;
  o.listen_address = a.net.ip(ns) + ":0";
  o.retries = 3;
  o.failure_timeout = std::chrono::milliseconds(a.failure_ms);
  o.view_change_timeout = 20s;
  return o;
}

[[noreturn]] void member_main(Shared* sh, int s, int ns, const UniqueId& id, int rank,
                              const Args& a) {
  Slot& me = sh->slot[s];
  auto finish = [&](int code, const std::string& why) {
    std::snprintf(me.error, sizeof(me.error), "%s", why.c_str());
    me.fenced_ns = now_ns();
    me.state = code;
    _exit(0);
  };
  if (!a.net.enter(ns)) finish(4, "cannot enter the namespace");
  Result<std::unique_ptr<ElasticCommunicator>> ec = Status();
  if (rank >= 0) {
    ec = ElasticCommunicator::init(id, rank, kMembers, options(a, ns));
  } else {
    std::vector<std::string> seeds;
    for (int i = 0; i < kSlots; ++i)
      if (i != s && sh->slot[i].state == 1) seeds.emplace_back(sh->slot[i].address);
    ec = ElasticCommunicator::join(id, seeds, options(a, ns));
  }
  if (!ec) finish(4, "start: " + ec.status().to_string());
  std::snprintf(me.address, sizeof(me.address), "%s", (*ec)->member_address().c_str());
  bench::ElasticRounds rounds(**ec);
  while (rounds.round() < sh->stop_round) {
    if (Status st = rounds.step(); !st.is_ok()) finish(bench::fenced(st) ? 3 : 4, st.to_string());
    me.round = rounds.round();
    me.hash = rounds.hash();
    me.view_size = (*ec)->size();
    std::this_thread::sleep_for(30ms);  // the inner steps
  }
  me.state = 2;
  for (;;) {  // leave only once everyone is done (leaving changes the others' view)
    bool all = true;
    for (int i = 0; i < kSlots; ++i)
      if (sh->slot[i].state == 1) all = false;
    if (all) break;
    std::this_thread::sleep_for(10ms);
  }
  _exit(0);
}

template <typename Pred>
bool wait_for(Pred p, std::chrono::milliseconds limit) {
  auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (p()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return p();
}

// One case; true when the outcome is the expected one.
bool run_case(const Args& a, int split) {
  auto* sh = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (sh) Shared();
  for (int k = 0; k < kMembers; ++k) a.net.heal(k);
  auto id = create_unique_id(a.net.root_ip());
  if (!id) {
    std::fprintf(stderr, "unique id: %s\n", id.status().to_string().c_str());
    return false;
  }
  std::vector<pid_t> pid(kSlots, -1);
  auto spawn = [&](int s, int ns, int rank) {
    sh->slot[s].state = 1;
    pid_t p = fork();
    if (p == 0) member_main(sh, s, ns, *id, rank, a);
    pid[s] = p;
  };
  for (int k = 0; k < kMembers; ++k) spawn(k, k, k);
  (void)rendezvous::take_root_socket(id->to_string());
  std::vector<int> left, right;
  for (int k = 0; k < kMembers; ++k) (k < split ? left : right).push_back(k);
  std::string name = std::to_string(split) + "|" + std::to_string(kMembers - split);
  bool ok = true;
  auto fail = [&](const std::string& why) {
    std::printf("partition %s: FAILED: %s\n", name.c_str(), why.c_str());
    ok = false;
  };
  auto rounds = [&](const std::vector<int>& who) {
    std::vector<uint64_t> r;
    for (int k : who) r.push_back(sh->slot[k].round);
    return r;
  };
  auto all_at_least = [&](uint64_t n) {
    for (int k = 0; k < kMembers; ++k)
      if (sh->slot[k].round < n || sh->slot[k].state != 1) return false;
    return true;
  };
  if (!wait_for([&] { return all_at_least(5); }, 60s)) fail("the group did not reach round 5");
  uint64_t at_cut = 0;
  int64_t cut_ns = 0;
  if (ok) {
    cut_ns = now_ns();
    for (int k : left)
      if (!a.net.cut(k, right)) fail("nft rules could not be installed");
    for (int k : right)
      if (!a.net.cut(k, left)) fail("nft rules could not be installed");
    // The rounds as of the whole cut: its rules go in one namespace at a time (20 nft commands,
    // 0.1-0.5 s), and until they all are, rounds may still commit (a round takes milliseconds).
    for (int k = 0; k < kMembers; ++k) at_cut = std::max<uint64_t>(at_cut, sh->slot[k].round);
  }
  auto ms_since_cut = [&](int k) {
    return static_cast<double>(sh->slot[k].fenced_ns - cut_ns) / 1e6;
  };
  if (ok && split == 2) {
    // Neither side may commit: all four fence, none beyond the round in flight at the cut.
    if (!wait_for(
            [&] {
              for (int k = 0; k < kMembers; ++k)
                if (sh->slot[k].state == 1) return false;
              return true;
            },
            20s))
      fail("not every member fenced within 20 s");
    for (int k = 0; k < kMembers && ok; ++k) {
      const Slot& sl = sh->slot[k];
      if (sl.state != 3) fail("member " + std::to_string(k) + ": " + sl.error);
      if (sl.round > at_cut + 1)
        fail("member " + std::to_string(k) + " committed round " + std::to_string(sl.round) +
             " after the cut at " + std::to_string(at_cut));
    }
    if (ok) {
      std::printf("partition 2|2: no side committed (rounds at the cut %llu, after: ",
                  static_cast<unsigned long long>(at_cut));
      for (uint64_t r : rounds({0, 1, 2, 3}))
        std::printf("%llu ", static_cast<unsigned long long>(r));
      std::printf("); all four fenced %.0f/%.0f/%.0f/%.0f ms after the cut\n", ms_since_cut(0),
                  ms_since_cut(1), ms_since_cut(2), ms_since_cut(3));
      std::printf("  member 0: %s\n  member 3: %s\n", sh->slot[0].error, sh->slot[3].error);
    }
  }
  if (ok && split == 3) {
    const int lone = 3;
    if (!wait_for([&] { return sh->slot[lone].state != 1; }, 20s))
      fail("the lone member did not fence within 20 s");
    if (ok && sh->slot[lone].state != 3) fail(std::string("lone member: ") + sh->slot[lone].error);
    uint64_t lone_round = sh->slot[lone].round;
    // The three go on: five more rounds in a view of three.
    if (ok && !wait_for(
                  [&] {
                    for (int k : left)
                      if (sh->slot[k].round < at_cut + 5 || sh->slot[k].view_size != 3)
                        return false;
                    return true;
                  },
                  30s))
      fail("the three did not commit five rounds without the fourth");
    double three_ms = static_cast<double>(now_ns() - cut_ns) / 1e6;
    uint64_t r3 = sh->slot[0].round;
    if (ok) {
      std::printf(
          "partition 3|1: the three went on (round %llu at the cut, %llu %.0f ms later, view of "
          "3); the one fenced %.0f ms after the cut at round %llu\n  member 3: %s\n",
          static_cast<unsigned long long>(at_cut), static_cast<unsigned long long>(r3), three_ms,
          ms_since_cut(lone), static_cast<unsigned long long>(lone_round), sh->slot[lone].error);
    }
    // Heal; a joiner takes the lone member's place (its namespace) and the four finish together.
    for (int k = 0; k < kMembers; ++k) a.net.heal(k);
    if (ok) {
      waitpid(pid[lone], nullptr, 0);
      pid[lone] = -1;
      auto t_join = Clock::now();
      spawn(kMembers, lone, -1);
      if (!wait_for([&] { return sh->slot[kMembers].round > 0; }, 30s))
        fail(std::string("the joiner did not commit a round: ") + sh->slot[kMembers].error);
      double join_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_join).count();
      if (ok) {
        uint64_t stop = 0;
        for (int k = 0; k < kSlots; ++k) stop = std::max<uint64_t>(stop, sh->slot[k].round);
        sh->stop_round = stop + 5;
        if (!wait_for(
                [&] {
                  for (int k : {0, 1, 2, kMembers})
                    if (sh->slot[k].state == 1) return false;
                  return true;
                },
                30s))
          fail("the four did not finish");
        uint64_t h = sh->slot[0].hash;
        for (int k : {0, 1, 2, kMembers}) {
          if (sh->slot[k].state != 2)
            fail("member slot " + std::to_string(k) + ": " + sh->slot[k].error);
          else if (sh->slot[k].hash != h || sh->slot[k].round != stop + 5)
            fail("replicas differ at the end");
        }
        if (ok)
          std::printf(
              "  healed: a joiner in the lone member's namespace committed its first round %.0f "
              "ms after it started; the four finished round %llu with identical state\n",
              join_ms, static_cast<unsigned long long>(stop + 5));
      }
    }
  }
  sh->stop_round = 0;
  for (int k = 0; k < kMembers; ++k) a.net.heal(k);
  for (int s = 0; s < kSlots; ++s)
    if (pid[s] > 0) {
      kill(pid[s], SIGKILL);
      waitpid(pid[s], nullptr, 0);
    }
  munmap(sh, sizeof(Shared));
  std::fflush(stdout);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--netns")
      a.net.prefix = v;
    else if (k == "--subnet")
      a.net.subnet = v;
    else if (k == "--split")
      a.split = std::stoi(v);
    else if (k == "--failure-ms")
      a.failure_ms = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  if (a.split != 0 && a.split != 2 && a.split != 3) {
    std::fprintf(stderr, "--split must be 2 (2|2) or 3 (3|1)\n");
    return 2;
  }
  for (int k = 0; k < kMembers; ++k)
    if (!a.net.exists(k)) {
      std::printf("namespace %s missing: run scripts/elastic_netns.sh (it creates them)\n",
                  a.net.name(k).c_str());
      return 77;
    }
  bool ok = true;
  if (a.split == 0 || a.split == 2) ok = run_case(a, 2) && ok;
  if (a.split == 0 || a.split == 3) ok = run_case(a, 3) && ok;
  std::printf("%s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
