#pragma once
// SocketAddress: an IPv4 or IPv6 address and port, and the choice of which local interface to
// listen on (in the manner of NCCL_SOCKET_IFNAME).

#include <sys/socket.h>

#include <string>
#include <string_view>

#include "lowcomm/status.h"

namespace lowcomm::transport {

class SocketAddress {
 public:
  SocketAddress() = default;
  // "1.2.3.4:5678", "[::1]:5678"; numeric only (no DNS: set-up must never block on a resolver).
  static Result<SocketAddress> parse(std::string_view text);
  static Result<SocketAddress> from_sockaddr(const sockaddr* sa, socklen_t len);

  const sockaddr* sockaddr_ptr() const { return reinterpret_cast<const sockaddr*>(&storage_); }
  socklen_t length() const { return len_; }
  int family() const { return storage_.ss_family; }
  int port() const;
  void set_port(int port);
  std::string to_string() const;  // the form parse() accepts; "?" when empty
  bool empty() const { return len_ == 0; }

 private:
  sockaddr_storage storage_{};
  socklen_t len_ = 0;
};

// The local address to listen on (port 0):
//  LOWCOMM_SOCKET_IFNAME unset: the first interface that is up and not loopback, else loopback.
//  "eth,ib"   interfaces whose names start with eth or ib (prefix match, first found wins);
//  "^docker,lo" any interface except those prefixes;  "=eth0" exact names only.
// IPv4 is preferred over IPv6 on the same interface. The error names the variable's value and
// the interfaces that were seen.
Result<SocketAddress> select_listen_address();
// As above with an explicit filter string (what LOWCOMM_SOCKET_IFNAME would hold); for tests.
Result<SocketAddress> select_listen_address(std::string_view ifname_filter);

}  // namespace lowcomm::transport
