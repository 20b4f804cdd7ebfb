#include "transport/socket_options.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "core/sys_check.h"

namespace lowcomm::transport {

Result<UniqueFd> make_tcp_socket(const SocketAddress& addr) {
  UniqueFd fd(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP));
  if (!fd) return sys_error("socket", addr.to_string(), errno);
  return fd;
}

Status set_nonblocking(int fd) {
  int flags = static_cast<int>(LOWCOMM_SYS_RETRY(::fcntl(fd, F_GETFL)));
  if (flags < 0) return sys_error("fcntl(F_GETFL)", "fd " + std::to_string(fd), errno);
  LOWCOMM_CHECK_SYS(::fcntl(fd, F_SETFL, flags | O_NONBLOCK), "fd " + std::to_string(fd));
  return Status::ok();
}

void request_socket_buffers(int fd, int bytes) {
  if (bytes <= 0) return;
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof(bytes)) != 0)
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof(bytes)) != 0)
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

SocketBufferSizes granted_socket_buffers(int fd) {
  SocketBufferSizes s;
  socklen_t len = sizeof(int);
  ::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &s.send, &len);
  len = sizeof(int);
  ::getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &s.recv, &len);
  return s;
}

void limit_unsent_bytes(int fd, int bytes) {
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &bytes, sizeof(bytes));
}

Status set_nodelay(int fd, const std::string& what) {
  int one = 1;
  LOWCOMM_CHECK_SYS(::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)), what);
  return Status::ok();
}

}  // namespace lowcomm::transport
