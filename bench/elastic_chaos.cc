// lowcomm-elastic-chaos: a DiLoCo-style loop under random kills (SIGKILL), freezes
// (SIGSTOP, SIGCONT later) and joins, checking that no round is lost or applied twice and that
// the replicas stay identical (docs/membership.md).
//
//   lowcomm-elastic-chaos --events 12 --rounds 1000 --seconds 60      # scripts/test.sh's run
//   lowcomm-elastic-chaos --events 500 --rounds 10000000 --seconds 3600  # the soak (or, with
//     partitions: scripts/elastic_netns.sh build chaos --events 500 ...)
// The run winds down once the events are done (with --events 0: never) or --seconds have
// passed: every member stops 100 rounds later.
//
// Members hold registered state (a parameter vector and the round counter). Each round every
// member contributes a vector that depends on (member, round), the group averages it (q4), and
// every member adds the average to its parameters and counts the round; the library checks at
// every commit that all members hold the same state. A frozen member that was evicted fails its
// call ("evicted"/"no quorum") and exits; the driver then starts a joiner in its place. Faults
// are injected one at a time: the next waits until the group's view has settled, so a majority
// is never lost at once. At the end every surviving member must hold the same state and the
// full round count; a round that makes no progress for --hang-seconds fails the run.
//
// With --netns PREFIX (namespaces from scripts/wan_netns.sh up N --prefix PREFIX --subnet S,
// or scripts/elastic_netns.sh BUILD chaos ...), member k starts in namespace k % N and a joiner
// in the namespace with the fewest live members, and a fourth kind of event is a partition: the
// network between one namespace holding a strict minority of the live members and all the
// others is cut (nftables drops) for 0.5 s to twice the failure timeout, then healed. Members
// cut off longer than the failure timeout (TCP's retransmission backoff can stretch a cut by
// seconds) fence themselves and are replaced once the network heals; no new fault comes until
// that has played out.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
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

constexpr int kSlots = 1024;  // processes over a run (a soak replaces hundreds)

struct Slot {
  std::atomic<int> state{0};  // 0 unused, 1 running, 2 done ok, 3 fenced, 4 failed
  std::atomic<uint64_t> round{0};
  std::atomic<uint64_t> hash{0};
  std::atomic<int> view_size{0};
  std::atomic<uint64_t> view_changes{0};
  int ns = 0;  // --netns: the namespace it runs in
  char address[64];
  char error[256];
};
struct Shared {
  std::atomic<uint64_t> stop_round{~0ull};  // set once the events are done (or time is up)
  Slot slot[kSlots];
};

struct Args {
  int events = 12;
  uint64_t rounds = 400;
  double seconds = 120;
  double hang_seconds = 15;
  int members = 4;
  int round_ms = 20;  // the inner steps between collectives
  unsigned seed = 1;
  int failure_ms = 3000;  // the suite shares two cores with other tests; 0: the library default
  bench::Netns net{"", "10.78.0"};
  int namespaces = 4;
};

ElasticOptions options(const Args& a) {
  ElasticOptions o;
  o.comm.streams = 1;
  o.comm.socket_buffer_bytes = 1 << 20;
  o.comm.timeout = 30s;
  o.comm.codec_threads = 1;
  o.retries = 3;
  o.failure_timeout = std::chrono::milliseconds(a.failure_ms);
  o.view_change_timeout = 20s;
  return o;
}

[[noreturn]] void member_main(Shared* sh, int s, const UniqueId& id, int rank, int nranks,
                              const Args& a) {
  Slot& me = sh->slot[s];
  auto fail = [&](int code, const std::string& why) {
    std::snprintf(me.error, sizeof(me.error), "%s", why.c_str());
    me.state = code;
    _exit(0);
  };
  ElasticOptions opts = options(a);
  if (a.net.enabled()) {
    if (!a.net.enter(me.ns)) fail(4, "cannot enter namespace " + a.net.name(me.ns));
    opts.listen_address = a.net.ip(me.ns) + ":0";
  }
  Result<std::unique_ptr<ElasticCommunicator>> ec = Status();
  if (rank >= 0) {
    ec = ElasticCommunicator::init(id, rank, nranks, opts);
  } else {
    std::vector<std::string> seeds;
    for (int i = kSlots - 1; i >= 0; --i)
      if (i != s && sh->slot[i].state == 1 && sh->slot[i].address[0])
        seeds.emplace_back(sh->slot[i].address);
    ec = ElasticCommunicator::join(id, seeds, opts);
  }
  if (!ec) fail(4, "start: " + ec.status().to_string());
  std::string addr = (*ec)->member_address();
  std::snprintf(me.address, sizeof(me.address), "%s", addr.c_str());
  bench::ElasticRounds rounds(**ec);
  while (rounds.round() < std::min<uint64_t>(a.rounds, sh->stop_round)) {
    if (Status st = rounds.step(); !st.is_ok()) fail(bench::fenced(st) ? 3 : 4, st.to_string());
    me.round = rounds.round();
    me.hash = rounds.hash();
    me.view_size = (*ec)->size();
    me.view_changes = (*ec)->stats().view_changes;
    std::this_thread::sleep_for(std::chrono::milliseconds(a.round_ms));  // the inner steps
  }
  me.state = 2;
  // Stay until the others are done too (leaving early would change their views).
  for (;;) {
    bool all = true;
    for (int i = 0; i < kSlots; ++i)
      if (sh->slot[i].state == 1) all = false;
    if (all) break;
    std::this_thread::sleep_for(10ms);
  }
  _exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--events")
      a.events = std::stoi(v);
    else if (k == "--rounds")
      a.rounds = std::stoull(v);
    else if (k == "--seconds")
      a.seconds = std::stod(v);
    else if (k == "--hang-seconds")
      a.hang_seconds = std::stod(v);
    else if (k == "--members")
      a.members = std::stoi(v);
    else if (k == "--round-ms")
      a.round_ms = std::stoi(v);
    else if (k == "--failure-ms")
      a.failure_ms = std::stoi(v);
    else if (k == "--netns")
      a.net.prefix = v;
    else if (k == "--subnet")
      a.net.subnet = v;
    else if (k == "--namespaces")
      a.namespaces = std::stoi(v);
    else if (k == "--seed")
      a.seed = static_cast<unsigned>(std::stoul(v));
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  if (a.members < 3 || a.members > 8) {
    std::fprintf(stderr, "--members must be in [3, 8]\n");
    return 2;
  }
  auto* sh = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (sh) Shared();
  if (a.net.enabled()) {
    for (int k = 0; k < a.namespaces; ++k)
      if (!a.net.exists(k)) {
        std::fprintf(stderr, "namespace %s missing (scripts/wan_netns.sh up %d --prefix %s)\n",
                     a.net.name(k).c_str(), a.namespaces, a.net.prefix.c_str());
        return 77;
      }
    for (int k = 0; k < a.namespaces; ++k) a.net.heal(k);
  }
  auto id = create_unique_id(a.net.enabled() ? a.net.root_ip() : "127.0.0.1");
  if (!id) return 1;
  std::vector<pid_t> pid(kSlots, -1);
  int used = 0;
  auto live_in = [&](int k) {
    int n = 0;
    for (int s = 0; s < used; ++s)
      if (sh->slot[s].state == 1 && sh->slot[s].ns == k) ++n;
    return n;
  };
  auto spawn = [&](int rank) {
    int s = used++;
    if (rank >= 0) {
      sh->slot[s].ns = rank % a.namespaces;
    } else {  // a joiner: where the fewest live members are
      int best = 0;
      for (int k = 1; k < a.namespaces; ++k)
        if (live_in(k) < live_in(best)) best = k;
      sh->slot[s].ns = best;
    }
    sh->slot[s].state = 1;
    pid_t p = fork();
    if (p == 0) member_main(sh, s, *id, rank, a.members, a);
    pid[s] = p;
    return s;
  };
  for (int r = 0; r < a.members; ++r) spawn(r);
  (void)rendezvous::take_root_socket(id->to_string());

  std::mt19937 rng(a.seed);
  auto start = Clock::now();
  auto live = [&] {
    std::vector<int> v;
    for (int s = 0; s < used; ++s)
      if (sh->slot[s].state == 1) v.push_back(s);
    return v;
  };
  auto max_round = [&] {
    uint64_t r = 0;
    for (int s = 0; s < used; ++s) r = std::max<uint64_t>(r, sh->slot[s].round);
    return r;
  };
  int events = 0, kills = 0, freezes = 0, joins = 0;
  uint64_t last_round = 0;
  auto last_progress = Clock::now();
  int frozen = -1;
  auto thaw_at = Clock::now();
  int cut_ns = -1;  // the namespace cut off, -1: none
  auto heal_at = Clock::now();
  int partitions = 0, partition_losses = 0;
  auto quiet_until = Clock::now();
  uint64_t last_changes = 0;
  size_t last_live = 0;
  auto changed_at = Clock::now();
  bool failed = false;
  std::string why;
  while (true) {
    std::this_thread::sleep_for(20ms);
    for (int s = 0; s < used; ++s) {  // reap
      if (pid[s] > 0 && waitpid(pid[s], nullptr, WNOHANG) == pid[s]) pid[s] = -1;
    }
    uint64_t mr = max_round();
    if (mr != last_round) {
      last_round = mr;
      last_progress = Clock::now();
    }
    auto lv = live();
    bool done = mr >= std::min<uint64_t>(a.rounds, sh->stop_round) && lv.empty();
    if (done) break;
    for (int s = 0; s < used; ++s)
      if (sh->slot[s].state == 4) {
        failed = true;
        why = "member slot " + std::to_string(s) + " failed: " + sh->slot[s].error;
      }
    if (failed) break;
    if (frozen < 0 && cut_ns < 0 &&
        Clock::now() - last_progress > std::chrono::duration<double>(a.hang_seconds)) {
      failed = true;
      why = "no round completed for " + std::to_string(a.hang_seconds) + " s";
      break;
    }
    if (frozen >= 0 && Clock::now() >= thaw_at) {
      kill(pid[frozen], SIGCONT);
      frozen = -1;
    }
    if (cut_ns >= 0 && Clock::now() >= heal_at) {
      a.net.heal(cut_ns);
      partition_losses = 0;
      for (int s = 0; s < used; ++s)
        if (sh->slot[s].state == 3 && sh->slot[s].ns == cut_ns) ++partition_losses;
      std::printf("               heal namespace %d (%d of its members fenced)\n", cut_ns,
                  partition_losses);
      std::fflush(stdout);
      cut_ns = -1;
      last_progress = Clock::now();
      // TCP's retransmission backoff can keep a healed path silent for seconds more, so the
      // cut-off members may still be evicted: no new fault until that has played out (two
      // faults at once could take the majority).
      quiet_until =
          Clock::now() + std::chrono::milliseconds(2 * std::max(a.failure_ms, 1500) + 2000);
    }
    // Replace fenced members with joiners (not near the end: a joiner enters at a commit).
    bool out_of_time = Clock::now() - start > std::chrono::duration<double>(a.seconds);
    // --events 0: no faults, only rounds until --seconds (the false-eviction run).
    bool events_done = a.events > 0 && events >= a.events;
    if ((events_done || out_of_time) && sh->stop_round == ~0ull && frozen < 0 && cut_ns < 0)
      sh->stop_round = mr + 100;  // wind down: every member ends at the same round
    const uint64_t end_round = std::min<uint64_t>(a.rounds, sh->stop_round);
    bool late = mr + 50 >= end_round;
    for (int s = 0; s < used; ++s) {
      if (sh->slot[s].state == 3 && used < kSlots && !late && cut_ns < 0) {
        sh->slot[s].state = 5;  // replaced
        spawn(-1);
        ++joins;
      }
    }
    if (events >= a.events || late || out_of_time || frozen >= 0 || cut_ns >= 0 ||
        Clock::now() < quiet_until || used + 2 >= kSlots)
      continue;
    // The next fault only once the views agree with the live set (one fault at a time).
    // A member's view size is as of its last round, so a change in progress (a thawed member
    // evicted late, a member fenced but not yet gone) can look settled for a moment: the views
    // must also have stopped changing for a second.
    lv = live();
    bool settled = true;
    uint64_t changes = 0;
    for (int s : lv) {
      if (sh->slot[s].view_size != static_cast<int>(lv.size()) || sh->slot[s].round == 0)
        settled = false;
      changes += sh->slot[s].view_changes;
    }
    if (changes != last_changes || lv.size() != last_live) {
      last_changes = changes;
      last_live = lv.size();
      changed_at = Clock::now();
    }
    if (Clock::now() - changed_at < std::chrono::seconds(1)) settled = false;
    if (!settled || rng() % 25 != 0) continue;
    int kind = static_cast<int>(rng() % (a.net.enabled() ? 4 : 3));
    if (lv.size() < 4 && kind != 2) kind = 2;  // few left: add one first
    if (lv.size() >= 7 && kind == 2) kind = 0;
    int victim = lv[rng() % lv.size()];
    if (kind == 3) {  // cut off the victim's namespace, if its members are a strict minority
      int k = sh->slot[victim].ns;
      if (2 * live_in(k) >= static_cast<int>(lv.size())) kind = 0;
    }
    ++events;
    if (kind == 0) {
      kill(pid[victim], SIGKILL);
      sh->slot[victim].state = 6;  // killed
      ++kills;
      std::printf("event %3d  round %5llu  kill slot %d\n", events,
                  static_cast<unsigned long long>(mr), victim);
    } else if (kind == 1) {
      kill(pid[victim], SIGSTOP);
      frozen = victim;
      thaw_at = Clock::now() + std::chrono::milliseconds(500 + rng() % 3500);
      ++freezes;
      std::printf("event %3d  round %5llu  freeze slot %d\n", events,
                  static_cast<unsigned long long>(mr), victim);
    } else if (kind == 2) {
      spawn(-1);
      ++joins;
      std::printf("event %3d  round %5llu  join\n", events, static_cast<unsigned long long>(mr));
    } else {
      cut_ns = sh->slot[victim].ns;
      std::vector<int> others;
      for (int k = 0; k < a.namespaces; ++k)
        if (k != cut_ns) others.push_back(k);
      if (!a.net.cut(cut_ns, others)) {
        failed = true;
        why = "nft rules could not be installed";
        break;
      }
      // Shorter and longer than the failure timeout: some cuts evict, some must not.
      int ms =
          500 + static_cast<int>(rng() % static_cast<unsigned>(2 * std::max(a.failure_ms, 1500)));
      heal_at = Clock::now() + std::chrono::milliseconds(ms);
      ++partitions;
      std::printf(
          "event %3d  round %5llu  partition: namespace %d (%d members) cut off for %d ms\n",
          events, static_cast<unsigned long long>(mr), cut_ns, live_in(cut_ns), ms);
    }
    std::fflush(stdout);
  }
  if (cut_ns >= 0) a.net.heal(cut_ns);
  for (int s = 0; s < used; ++s)
    if (pid[s] > 0) {
      kill(pid[s], SIGCONT);
      kill(pid[s], SIGKILL);
      waitpid(pid[s], nullptr, 0);
    }
  uint64_t hash = 0;
  int finishers = 0;
  for (int s = 0; s < used && !failed; ++s) {
    if (sh->slot[s].state != 2) continue;
    ++finishers;
    if (sh->slot[s].round != std::min<uint64_t>(a.rounds, sh->stop_round)) {
      failed = true;
      why = "slot " + std::to_string(s) + " finished at round " +
            std::to_string(sh->slot[s].round.load());
    }
    if (hash && sh->slot[s].hash != hash) {
      failed = true;
      why = "replicas differ at the end";
    }
    hash = sh->slot[s].hash;
  }
  if (!failed && finishers < 2) {
    failed = true;
    why = "fewer than two members finished";
  }
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  uint64_t most_changes = 0;
  for (int s = 0; s < used; ++s)
    most_changes = std::max<uint64_t>(most_changes, sh->slot[s].view_changes);
  std::printf(
      "%s: %llu rounds in %.1f s, %d events (%d kills, %d freezes, %d partitions, %d joins incl. "
      "replacements), %d members finished with identical state, at most %llu view changes seen "
      "by one member%s%s\n",
      failed ? "FAILED" : "ok", static_cast<unsigned long long>(max_round()), secs, events, kills,
      freezes, partitions, joins, finishers, static_cast<unsigned long long>(most_changes),
      failed ? ": " : "", why.c_str());
  return failed ? 1 : 0;
}
