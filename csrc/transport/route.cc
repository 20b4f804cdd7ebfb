#include "transport/route.h"

#include <sys/socket.h>

#include "core/sys_check.h"
#include "core/unique_fd.h"

namespace lowcomm::transport {

Result<SocketAddress> route_to(const SocketAddress& remote) {
  UniqueFd fd(::socket(remote.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd) return sys_error("socket", "route lookup", errno);
  LOWCOMM_CHECK_SYS(::connect(fd.get(), remote.sockaddr_ptr(), remote.length()),
                    "route lookup to " + remote.to_string());
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  LOWCOMM_CHECK_SYS(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len),
                    "route lookup");
  auto a = SocketAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&local), len);
  if (a) a.value().set_port(0);
  return a;
}

}  // namespace lowcomm::transport
