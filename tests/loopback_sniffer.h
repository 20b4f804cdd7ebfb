#pragma once
// LoopbackSniffer: every byte of every frame that crosses the loopback interface while it runs,
// read from a raw packet socket (AF_PACKET, root or CAP_NET_RAW only), so that a test can look
// for plaintext in what a real connection sent: whatever path the library's bytes take over
// loopback, the sniffer sees them. Frames of other processes are read too; each frame is
// searched for `needle` (a pattern only the test sends) as it arrives and then dropped.

#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace lowcomm::testing {

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
