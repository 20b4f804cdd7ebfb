#pragma once
// The transport between ranks of one site (CommOptions::intra_site): at init, every rank sends
// every peer its UCX worker address where that peer is one of its site partners and it will use
// UCX (asked for, built with it, UCX started, streams not sealed, no emulated link to it), and
// an empty message otherwise; a pair uses UCX where both sent an address, TCP otherwise. The
// exchange runs over the authenticated TCP peers with every peer, whatever the ranks asked and
// whatever site maps they hold, so ranks that disagree still agree pairwise and nobody waits for
// a message that never comes (a map that differs fails the first two-level call, naming it).
// Its cost: one small message each way per pair, concurrently, at init.

#include <memory>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "transport/peer.h"
#include "transport/ucx_site.h"

namespace lowcomm::collectives {

struct IntraSite {
  std::unique_ptr<transport::UcxSite> ucx;  // null: every peer on TCP
  std::vector<char> over_ucx;               // by rank: collective payloads travel over UCX
};

struct IntraSiteRequest {
  std::vector<int> partners;    // ranks of this rank's site (symmetric: each lists the other)
  bool want_ucx = false;        // this rank asked for UCX
  bool sealed = false;          // LOWCOMM_ENCRYPT: UCX would bypass the seal
  std::vector<char> emulated;   // by rank: this rank's sends to it cross an emulated link
  std::vector<char> same_host;  // by rank: on this rank's host (no wire: no digests over UCX)
};

Result<IntraSite> connect_intra_site(std::vector<std::unique_ptr<transport::Peer>>& peers, int rank,
                                     const IntraSiteRequest& req, Deadline deadline);

}  // namespace lowcomm::collectives
