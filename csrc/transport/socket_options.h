#pragma once
// Socket set-up shared by the connect and accept paths.

#include "core/unique_fd.h"
#include "lowcomm/status.h"
#include "transport/socket_address.h"

namespace lowcomm::transport {

// A non-blocking, close-on-exec TCP socket of the address's family.
Result<UniqueFd> make_tcp_socket(const SocketAddress& addr);
Status set_nonblocking(int fd);
// Requests `bytes` for SO_SNDBUF and SO_RCVBUF (the privileged *FORCE variants first, so
// net.core.[rw]mem_max does not cap a long fat pipe when running as root). Must be called before
// connect()/listen() so TCP window scaling is negotiated for the large window.
void request_socket_buffers(int fd, int bytes);
// What the kernel granted (getsockopt reports twice the usable size on Linux; this returns it
// as the kernel reports it).
struct SocketBufferSizes {
  int send = 0;
  int recv = 0;
};
SocketBufferSizes granted_socket_buffers(int fd);
// TCP_NOTSENT_LOWAT: the kernel takes no more from sendmsg while `bytes` of what it holds are
// still unsent, so what lowcomm queues after (a control frame) waits behind at most that much
// rather than a whole send buffer. Best effort (a kernel without it: no limit).
void limit_unsent_bytes(int fd, int bytes);
Status set_nodelay(int fd, const std::string& what);

}  // namespace lowcomm::transport
