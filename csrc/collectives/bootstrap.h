#pragma once
// Bootstrap: from a UniqueId to a full mesh of authenticated peers.
//
//   1. Every rank opens its own Listener (rank 0: at the id's address).
//   2. Ranks 1..P-1 connect to rank 0 and send a hello with their rank, nranks and listen
//      address; rank 0 checks them and sends every rank the table of addresses (or the reason
//      the group cannot form, so nobody waits for the deadline to learn it).
//   3. Rank i connects to every rank 0 < j < i and accepts every rank j > i (rank 0's link to
//      each rank is the bootstrap connection itself).
// Every connection runs the transport's HMAC handshake with the id's secret. Everything runs
// on the caller's thread with non-blocking connect/accept, under one deadline; a missing rank
// is named in the error. With a join timeout (CommOptions::join_timeout) each wait for other
// ranks is bounded by it as well: the root's for hellos and for ready messages, a rank's for the
// root's answer (twice it: the root names the missing within one).

#include <memory>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "lowcomm/communicator.h"
#include "transport/peer.h"

namespace lowcomm::collectives {

struct Mesh {
  std::shared_ptr<transport::ProgressEngine> engine;
  std::vector<std::unique_ptr<transport::Peer>> peers;  // by rank; null at this rank
  // By rank: its listen address ("host:port"), the root's table, the same on every rank.
  std::vector<std::string> addresses;
};

Result<Mesh> bootstrap_mesh(const UniqueId& id, int rank, int nranks, const CommOptions& options,
                            const transport::PeerConfig& config, Deadline deadline);

}  // namespace lowcomm::collectives
