#pragma once
// The transport between ranks of one site (CommOptions::intra_site): at init, every rank that
// asked for UCX sends every other rank that asked for it (the bootstrap table says who did, the
// same on every rank) its UCX worker address where that peer is one of its site partners and it
// will use UCX (built with it, UCX started, streams not sealed, no emulated link to it), and an
// empty message otherwise; a pair uses UCX where both sent an address, TCP otherwise. Between
// those two ranks the exchange runs whatever site maps they hold, so ranks whose maps disagree
// still agree pairwise and nobody waits for a message that never comes (a map that differs fails
// the first two-level call, naming it). A pair of which one rank did not ask exchanges nothing:
// until 2026-11 every pair did, which cost every group's set-up half a round trip (and n - 1
// messages a rank) for nothing where nobody asks for UCX, the default.
// Its cost: one small message each way per pair that asked, concurrently, at init.

#include <memory>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "transport/peer.h"
#include "transport/ucx_transport.h"

namespace lowcomm::collectives {

struct IntraSite {
  std::unique_ptr<transport::UcxTransport> ucx;  // null: every peer on TCP
  std::vector<char> over_ucx;                    // by rank: collective payloads travel over UCX
};

struct IntraSiteRequest {
  std::vector<int> partners;       // ranks of this rank's site (symmetric: each lists the other)
  bool want_ucx = false;           // this rank asked for UCX
  std::vector<char> asks_for_ucx;  // by rank: it asked for UCX (the bootstrap table's flags)
  bool sealed = false;             // LOWCOMM_ENCRYPT: UCX would bypass the seal
  std::vector<char> emulated;      // by rank: this rank's sends to it cross an emulated link
  std::vector<char> same_host;     // by rank: on this rank's host (no wire: no digests over UCX)
};

Result<IntraSite> connect_intra_site(std::vector<std::unique_ptr<transport::Peer>>& peers, int rank,
                                     const IntraSiteRequest& req, Deadline deadline);

}  // namespace lowcomm::collectives
