#pragma once
// LoopbackSniffer: every byte of every frame that crosses the loopback interface while it runs,
// read from a raw packet socket (AF_PACKET, root or CAP_NET_RAW only), so that a test can look
// for plaintext in what a real connection sent: whatever path the library's bytes take over
// loopback, the sniffer sees them. Frames of other processes are read too; each frame is
// searched for `needle` (a pattern only the test sends) as it arrives and then dropped.
// PrivateLoopback keeps them out: a test that runs its processes in a network namespace of
// their own sees only its own frames.

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace lowcomm::testing {

// Moves the calling thread into a network namespace of its own, its loopback up, for as long as
// it lives (and back to the thread's namespace after): the processes it forks and the threads
// it starts meanwhile are there too, and a LoopbackSniffer opened there reads their frames and
// no one else's. Other tests blasting loopback at the same time (ctest -j) made the sniffer drop
// frames under a 512 MiB buffer: 6 GB of a bench's traffic in one run. Without the privilege
// (CAP_SYS_ADMIN) ok() is false and the thread stays where it was.
class PrivateLoopback {
 public:
  PrivateLoopback() {
    home_ = ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (home_ < 0) {
      why_ = std::string("open /proc/thread-self/ns/net: ") + std::strerror(errno);
      return;
    }
    if (::unshare(CLONE_NEWNET) != 0) {
      why_ = std::string("unshare(CLONE_NEWNET): ") + std::strerror(errno);
      ::close(home_);
      home_ = -1;
      return;
    }
    const int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    ok_ = s >= 0 && ::ioctl(s, SIOCGIFFLAGS, &ifr) == 0 &&
          (ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP),
           ::ioctl(s, SIOCSIFFLAGS, &ifr) == 0);
    if (!ok_) why_ = std::string("bringing lo up: ") + std::strerror(errno);
    if (s >= 0) ::close(s);
  }
  PrivateLoopback(const PrivateLoopback&) = delete;
  PrivateLoopback& operator=(const PrivateLoopback&) = delete;
  ~PrivateLoopback() {
    if (home_ < 0) return;
    if (::setns(home_, CLONE_NEWNET) != 0) std::abort();  // the rest of the run would be elsewhere
    ::close(home_);
  }
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }

 private:
  int home_ = -1;
  bool ok_ = false;
  std::string why_;
};

class LoopbackSniffer {
 public:
  // Opens the socket; ok() is false (why() says why) without the privilege to.
  explicit LoopbackSniffer(std::string needle) : needle_(std::move(needle)) {
    fd_ = ::socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
    if (fd_ < 0) {
      why_ = std::string("socket(AF_PACKET): ") + std::strerror(errno);
      return;
    }
    sockaddr_ll a{};
    a.sll_family = AF_PACKET;
    a.sll_protocol = htons(ETH_P_ALL);
    a.sll_ifindex = static_cast<int>(::if_nametoindex("lo"));
    if (a.sll_ifindex == 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      why_ = std::string("bind to lo: ") + std::strerror(errno);
      ::close(fd_);
      fd_ = -1;
      return;
    }
    // Other tests' loopback traffic shares the socket: room for a burst of it (FORCE: past
    // rmem_max, which the privilege to open the socket allows).
    int big = 256 << 20;
    if (::setsockopt(fd_, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof(big)) != 0)
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    reader_ = std::thread([this] { read_loop(); });
  }
  LoopbackSniffer(const LoopbackSniffer&) = delete;
  LoopbackSniffer& operator=(const LoopbackSniffer&) = delete;
  ~LoopbackSniffer() { stop(); }

  bool ok() const { return fd_ >= 0; }
  const std::string& why() const { return why_; }

  // Stops capturing; what was captured stays readable.
  void stop() {
    stop_ = true;
    if (reader_.joinable()) reader_.join();
    if (fd_ >= 0) {
      tpacket_stats st{};
      socklen_t len = sizeof(st);
      if (::getsockopt(fd_, SOL_PACKET, PACKET_STATISTICS, &st, &len) == 0) dropped_ = st.tp_drops;
      ::close(fd_);
    }
    fd_ = -1;
  }
  // Frames the kernel dropped for want of room (known after stop()).
  uint64_t dropped() const { return dropped_; }

  uint64_t bytes() const { return captured_bytes_.load(); }
  // Frames that held the needle whole.
  uint64_t sightings() const { return sightings_.load(); }

 private:
  void read_loop() {
    std::vector<char> buf(1 << 17);
    auto take = [&](ssize_t n) {
      captured_bytes_ += static_cast<uint64_t>(n);
      if (std::search(buf.begin(), buf.begin() + n, needle_.begin(), needle_.end()) !=
          buf.begin() + n)
        ++sightings_;
    };
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
      if (n > 0) take(n);
    }
    // What is queued when the test stops the sniffer was sent while it ran: read it too. Under
    // other tests' loopback traffic on a busy host this thread lags, and frames it had not read
    // yet (a run's whole plaintext, once) were neither seen nor counted as dropped. Bounded:
    // traffic that keeps arriving after the stop is not waited for.
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until) {
      ssize_t n = ::recv(fd_, buf.data(), buf.size(), MSG_DONTWAIT);
      if (n <= 0) break;
      take(n);
    }
  }

  const std::string needle_;
  int fd_ = -1;
  std::string why_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> captured_bytes_{0};
  std::atomic<uint64_t> sightings_{0};
  uint64_t dropped_ = 0;
  std::thread reader_;
};

}  // namespace lowcomm::testing
