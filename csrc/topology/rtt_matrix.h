#pragma once
// The round-trip times between every pair of ranks, agreed at init so that every rank holds the
// same matrix and draws the same sites from it (sites.h: plan_from_rtt). Each rank's row is what
// it already knows: the lowest round trip the kernel measured on each peer's streams while they
// were set up (Peer::setup_rtt_seconds: the SYN exchange and the handshake), plus the emulated
// link's round trip where one is set. Each rank sends its row to every peer; the matrix keeps,
// for each pair, the lower of the two ranks' figures. Costs one exchange with every peer (half
// a round trip of the slowest pair, in parallel), once per communicator, and only where the sites
// are not known otherwise (planner.h). (The probe's history: docs/sites.md.)

#include <memory>
#include <vector>

#include "core/deadline.h"
#include "lowcomm/status.h"
#include "transport/peer.h"

namespace lowcomm::topology {

// The transport tag of the rows (collectives/tags.h lists every tag the communicator uses).
inline constexpr uint64_t kRttRowTag = 9;

// rtt[i][j] in seconds (0 on the diagonal). `extra[j]`: seconds to add to the kernel's figure
// for peer j (an emulated link's round trip), or empty. Fails with the peer's error, or
// kTimeout.
Result<std::vector<std::vector<double>>> measure_rtt_matrix(
    const std::vector<std::unique_ptr<transport::Peer>>& peers, int rank,
    const std::vector<double>& extra, Deadline deadline);

}  // namespace lowcomm::topology
