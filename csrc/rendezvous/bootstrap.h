#pragma once
// Bootstrap: from a UniqueId to a full mesh of authenticated peers.
//
//   1. Every rank opens its own Listener (rank 0: at the id's address).
//   2. Ranks 1..P-1 connect to rank 0 and send a hello with their rank, nranks, listen
//      address and flags; rank 0 checks them and sends every rank the table of addresses (or the
//      reason the group cannot form, so nobody waits for the deadline to learn it).
//   3. Rank i connects to every rank 0 < j < i and accepts every rank j > i (rank 0's link to
//      each rank is the bootstrap connection itself).
// Every connection runs the transport's HMAC handshake with the id's secret. Everything runs
// on the caller's thread with non-blocking connect/accept, under one deadline; a missing rank
// is named in the error. With a join timeout (CommOptions::join_timeout) each wait for other
// ranks is bounded by it as well: the root's for hellos and for ready messages, a rank's for the
// root's answer (twice it: the root names the missing within one).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "lowcomm/communicator.h"
#include "transport/peer.h"

namespace lowcomm::rendezvous {

// The transport tag of init's messages: the hellos to the root, the table, the ready and verdict
// messages (collectives/tags.h keeps it out of the collectives' tags).
inline constexpr uint64_t kBootstrapTag = 1;

// A rank's flags in its hello, and so in the table every rank holds.
inline constexpr uint32_t kRankAsksForUcx = 1;  // intra_site "ucx" (intra_site.h)

// The root's table, the same on every rank: by rank, its listen address ("host:port") and the
// flags its hello carried.
struct BootstrapTable {
  std::vector<std::string> addresses;
  std::vector<uint32_t> flags;
};

struct Mesh {
  std::shared_ptr<transport::ProgressEngine> engine;
  std::vector<std::unique_ptr<transport::Peer>> peers;  // by rank; null at this rank
  BootstrapTable table;
};

// `flags`: this rank's (kRankAsksForUcx, ...), for the table.
Result<Mesh> bootstrap_mesh(const UniqueId& id, int rank, int nranks, const CommOptions& options,
                            uint32_t flags, const transport::PeerConfig& config, Deadline deadline);

}  // namespace lowcomm::rendezvous
