#include "transport/path_model.h"

#include <linux/tcp.h>  // tcp_info with tcpi_min_rtt (glibc's ends before it)
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "transport/socket_options.h"

namespace lowcomm::transport {
namespace {

// The third field of /proc/sys/net/ipv4/tcp_{w,r}mem: the autotuning maximum, bytes.
uint64_t autotune_max(const char* path, uint64_t fallback) {
  std::ifstream f(path);
  uint64_t lo = 0, def = 0, hi = 0;
  if (f >> lo >> def >> hi && hi > 0) return hi;
  return fallback;
}

}  // namespace

uint64_t stream_window_bytes(int fd, int requested_buffer_bytes) {
  uint64_t send = 0, recv = 0;
  if (requested_buffer_bytes > 0) {
    SocketBufferSizes g = granted_socket_buffers(fd);
    send = static_cast<uint64_t>(std::max(g.send, 0));
    recv = static_cast<uint64_t>(std::max(g.recv, 0));
  } else {
    // Linux defaults when /proc is unreadable: tcp_wmem max 4 MiB, tcp_rmem max 6 MiB.
    send = autotune_max("/proc/sys/net/ipv4/tcp_wmem", 4u << 20);
    recv = autotune_max("/proc/sys/net/ipv4/tcp_rmem", 6u << 20);
  }
  return std::max<uint64_t>(std::min(send, recv) / 2, 4096);
}

double kernel_rtt_seconds(int fd) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return 0.0;
  return static_cast<double>(info.tcpi_rtt) * 1e-6;
}

double kernel_min_rtt_seconds(int fd) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return 0.0;
  if (len < offsetof(tcp_info, tcpi_min_rtt) + sizeof(info.tcpi_min_rtt)) return 0.0;
  // ~0u: no sample yet.
  return info.tcpi_min_rtt == ~0u ? 0.0 : static_cast<double>(info.tcpi_min_rtt) * 1e-6;
}

int stripe_streams(double rate_bps, double rtt_s, uint64_t window_bytes, int opened) {
  if (opened <= 1) return 1;
  if (window_bytes == 0 || !(rate_bps > 0.0) || !(rtt_s > 0.0)) return opened;
  double need = std::ceil(rate_bps / 8.0 * rtt_s / static_cast<double>(window_bytes));
  if (!(need >= 1.0)) return 1;
  return need >= opened ? opened : static_cast<int>(need);
}

}  // namespace lowcomm::transport
