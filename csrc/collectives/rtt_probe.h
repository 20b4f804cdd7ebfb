#pragma once
// The round-trip times between every pair of ranks, measured at init over the mesh itself and
// shared, so that every rank holds the same matrix and draws the same sites from it
// (sites.h: plan_from_rtt). Each rank pings every peer and echoes every ping at once (three
// rounds; the lowest time counts), then sends its row to every peer; the matrix keeps, for each
// pair, the lower of the two ranks' measurements. Costs about four round trips of the slowest
// pair, once per communicator, and only where the sites are not known otherwise (comm_impl.cc).

#include <memory>
#include <vector>

#include "core/deadline.h"
#include "lowcomm/status.h"
#include "transport/peer.h"

namespace lowcomm::collectives {

// rtt[i][j] in seconds (0 on the diagonal). Fails with the peer's error, or kTimeout.
Result<std::vector<std::vector<double>>> measure_rtt_matrix(
    const std::vector<std::unique_ptr<transport::Peer>>& peers, int rank, Deadline deadline);

}  // namespace lowcomm::collectives
