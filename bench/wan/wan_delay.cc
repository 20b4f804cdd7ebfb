// lowcomm-wan-delay: a one-way delay for the packets a network namespace receives, for kernels
// without netem. The kernel hands every packet that an NFQUEUE rule selects to this process
// (metadata only, no payload copy); the process gives each its ACCEPT verdict D after it
// arrived, in arrival order, so the packets go on D later and in the order they came. Run one
// per namespace (scripts/wan_netns.sh does, with `--delay`):
//
//   iptables -t mangle -A PREROUTING -i lceth0 -j NFQUEUE --queue-num 7 --queue-bypass
//   lowcomm-wan-delay --queue 7 --delay-us 25000
//
// On ingress, not egress: a packet held on its way out still counts against its socket's TCP
// small-queues budget (a couple of packets while the pacing rate is low), so a sender would
// never have more than a few packets on a delayed path (1.8 Mbit/s on a 1 Gbit/s link at 50 ms
// RTT); crossing the veth pair frees the packet from its socket first. --queue-bypass lets
// packets through undelayed while no process holds the queue, so a stopped delayer never cuts
// the link. Limits (docs/wan-emulation.md): one thread, so the rate it can delay is what one
// core verdicts (GRO/GSO super-packets, up to 64 KiB, count once: NFQA_CFG_F_GSO); no jitter, no
// loss.
// <arpa/inet.h> before the netfilter headers: <linux/in.h> would define in_addr first.
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>

namespace {

using Clock = std::chrono::steady_clock;

struct Held {
  uint32_t id;
  Clock::time_point due;
};

struct State {
  std::deque<Held> held;
  std::chrono::microseconds delay{0};
};

volatile sig_atomic_t g_stop = 0;

void on_signal(int) {
  g_stop = 1;
}

int on_packet(nfq_q_handle*, nfgenmsg*, nfq_data* nfa, void* data) {
  auto* state = static_cast<State*>(data);
  const nfqnl_msg_packet_hdr* hdr = nfq_get_msg_packet_hdr(nfa);
  if (hdr == nullptr) return 0;
  state->held.push_back({ntohl(hdr->packet_id), Clock::now() + state->delay});
  return 0;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "lowcomm-wan-delay: error: %s\n", what.c_str());
  std::exit(1);
}

long parse_long(std::string_view flag, const char* text, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
    die(std::string(flag) + " '" + text + "' is not an integer in [" + std::to_string(lo) + ", " +
        std::to_string(hi) + "]");
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  long queue = -1;
  long delay_us = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if ((a == "--queue" || a == "--delay-us") && i + 1 < argc) {
      if (a == "--queue")
        queue = parse_long(a, argv[++i], 0, 65535);
      else
        delay_us = parse_long(a, argv[++i], 0, 10'000'000);
    } else {
      std::fprintf(stderr, "usage: lowcomm-wan-delay --queue N --delay-us D\n");
      return 2;
    }
  }
  if (queue < 0 || delay_us < 0) die("--queue and --delay-us are both required");

  State state;
  state.delay = std::chrono::microseconds(delay_us);

  nfq_handle* h = nfq_open();
  if (h == nullptr) die("nfq_open failed (needs CAP_NET_ADMIN and nfnetlink_queue)");
  nfq_q_handle* qh = nfq_create_queue(h, static_cast<uint16_t>(queue), &on_packet, &state);
  if (qh == nullptr) die("cannot bind queue " + std::to_string(queue) + " (another process?)");
  if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) die("nfq_set_mode failed");
  // Whole GSO packets, not their segments: one verdict per up to 64 KiB.
  if (nfq_set_queue_flags(qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO) < 0)
    die("nfq_set_queue_flags(NFQA_CFG_F_GSO) failed");
  // Room for a bandwidth-delay product of packets: 10 Gbit/s × 200 ms of 1500-byte packets.
  nfq_set_queue_maxlen(qh, 200000);
  const int fd = nfq_fd(h);
  // A large receive buffer: packets arrive in bursts of a TCP window.
  nfnl_rcvbufsiz(nfq_nfnlh(h), 64 << 20);

  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  std::fprintf(stderr, "lowcomm-wan-delay: queue %ld, delay %ld us\n", queue, delay_us);

  alignas(8) static char buf[1 << 16];
  while (g_stop == 0) {
    // Wake when the first held packet is due, to the microsecond (ppoll): with poll's
    // milliseconds each wake-up let out a millisecond of packets at once, so a 1 Gbit/s flow
    // left in bursts at the veth's rate and a receiver measuring arrival rates read up to
    // 20 Gbit/s. A packet is never let out early.
    timespec ts{};
    timespec* timeout = nullptr;
    if (!state.held.empty()) {
      const auto wait = state.held.front().due - Clock::now();
      const auto ns =
          std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count());
      ts.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
      ts.tv_nsec = static_cast<long>(ns % 1'000'000'000);
      timeout = &ts;
    }
    pollfd p{fd, POLLIN, 0};
    const int n = ppoll(&p, 1, timeout, nullptr);
    if (n < 0 && errno != EINTR) die(std::string("poll: ") + std::strerror(errno));
    if (n > 0) {
      for (;;) {
        const ssize_t got = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (got < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
          if (errno == ENOBUFS) {
            // The kernel dropped queue messages for want of buffer: those packets are lost, as
            // on a congested link; TCP resends them.
            continue;
          }
          die(std::string("recv: ") + std::strerror(errno));
        }
        nfq_handle_packet(h, buf, static_cast<int>(got));
      }
    }
    const auto now = Clock::now();
    while (!state.held.empty() && state.held.front().due <= now) {
      nfq_set_verdict(qh, state.held.front().id, NF_ACCEPT, 0, nullptr);
      state.held.pop_front();
    }
  }
  // Let everything still held through before leaving.
  for (const Held& held : state.held) nfq_set_verdict(qh, held.id, NF_ACCEPT, 0, nullptr);
  nfq_destroy_queue(qh);
  nfq_close(h);
  return 0;
}
