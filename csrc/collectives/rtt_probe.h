#pragma once
// The round-trip times between every pair of ranks, agreed at init so that every rank holds the
// same matrix and draws the same sites from it (sites.h: plan_from_rtt). Each rank's row is what
// it already knows: the lowest round trip the kernel measured on each peer's streams while they
// were set up (Peer::setup_rtt_seconds: the SYN exchange and the handshake), plus the emulated
// link's round trip where one is set. Each rank sends its row to every peer; the matrix keeps,
// for each pair, the lower of the two ranks' figures. Costs one exchange with every peer (half
// a round trip of the slowest pair, in parallel), once per communicator, and only where the sites
// are not known otherwise (comm_impl.cc). Until 2026-11 each rank pinged every peer three
// times first: three more round trips on the critical path of every group's set-up.

#include <memory>
#include <vector>

#include "core/deadline.h"
#include "lowcomm/status.h"
#include "transport/peer.h"

namespace lowcomm::collectives {

// rtt[i][j] in seconds (0 on the diagonal). `extra[j]`: seconds to add to the kernel's figure
// for peer j (an emulated link's round trip), or empty. Fails with the peer's error, or
// kTimeout.
Result<std::vector<std::vector<double>>> measure_rtt_matrix(
    const std::vector<std::unique_ptr<transport::Peer>>& peers, int rank,
    const std::vector<double>& extra, Deadline deadline);

}  // namespace lowcomm::collectives
