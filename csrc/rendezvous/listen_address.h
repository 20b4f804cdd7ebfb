#pragma once
// Where a rank listens for its peers, the same rule for a communicator's ranks (bootstrap.cc)
// and an elastic group's members (membership/elastic_setup.cc): the address given
// (CommOptions::listen_address, ElasticOptions::listen_address: "host" or "host:port"), else
// an interface of LOWCOMM_SOCKET_IFNAME (transport::select_listen_address), else the local
// address that routes to `remote` (the root, a seed member: "host:port"), port 0.

#include <string>

#include "lowcomm/status.h"
#include "transport/socket_address.h"

namespace lowcomm::rendezvous {

Result<transport::SocketAddress> listen_address_for(const std::string& given,
                                                    const std::string& remote);

}  // namespace lowcomm::rendezvous
