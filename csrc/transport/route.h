#pragma once
// The local address this host uses to reach a remote one (the kernel's route; a UDP connect
// sends nothing), port 0: where to listen so that the remote side can reach back.

#include "lowcomm/status.h"
#include "transport/socket_address.h"

namespace lowcomm::transport {

Result<SocketAddress> route_to(const SocketAddress& remote);

}  // namespace lowcomm::transport
