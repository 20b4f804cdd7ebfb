#pragma once
// What a communicator's init decides before it contacts anyone: every option resolved (the
// option given, else its LOWCOMM_* variable, else the default; a malformed one is an error
// naming it), the transport's configuration, the emulated WAN's plan and this rank's clocks,
// and the site map the options and the plan give (init refines it from the hosts and round
// trips once the mesh is up: topology::Planner::discover).

#include <string>

#include "lowcomm/communicator.h"
#include "lowcomm/status.h"
#include "topology/planner.h"
#include "transport/emulated_links.h"
#include "transport/peer_config.h"
#include "transport/wan_link.h"

namespace lowcomm::collectives {

struct InitSettings {
  CommOptions options;         // every option the communicator keeps, set
  uint64_t pinned_limit = 0;   // LOWCOMM_PINNED_BYTES (device_op.h)
  transport::PeerConfig peer;  // streams, buffers, sealing, failure timeout, this rank's link
  transport::WanPlan wan;
  transport::WanLink own;             // this rank's link (wan.link(rank, -1))
  transport::EmulatedLinks emulated;  // its clocks, opened before bootstrapping
  // The site map given or from the plan's site= rules, the owner shares' mode, the schedules'
  // options: what the planner starts from (topology/planner.h).
  topology::PlannerSettings planner;
  bool want_ucx = false;  // intra_site "ucx"
};

Result<InitSettings> read_init_settings(const UniqueId& id, int rank, int nranks,
                                        const CommOptions& given);

}  // namespace lowcomm::collectives
