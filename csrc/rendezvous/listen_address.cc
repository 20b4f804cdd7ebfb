#include "rendezvous/listen_address.h"

#include "core/params.h"
#include "transport/route.h"

namespace lowcomm::rendezvous {

Result<transport::SocketAddress> listen_address_for(const std::string& given,
                                                    const std::string& remote) {
  using transport::SocketAddress;
  if (!given.empty()) {
    auto a = SocketAddress::parse(given);
    if (!a) a = SocketAddress::parse(given + ":0");
    if (!a) return invalid_argument("listen_address '" + given + "': " + a.status().message());
    return a;
  }
  if (params::text("LOWCOMM_SOCKET_IFNAME")) return transport::select_listen_address();
  auto r = SocketAddress::parse(remote);
  if (!r) return r.status();
  return transport::route_to(*r);
}

}  // namespace lowcomm::rendezvous
