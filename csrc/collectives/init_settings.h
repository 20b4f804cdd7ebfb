#pragma once
// What a communicator's init decides before it contacts anyone: every option resolved (the
// option given, else its LOWCOMM_* variable, else the default; a malformed one is an error
// naming it), the transport's configuration, the emulated WAN's plan and this rank's clocks,
// and the site map the options and the plan give (init refines it from the hosts and round
// trips once the mesh is up: CommImpl::discover_topology).

#include <string>

#include "collectives/sites.h"
#include "lowcomm/communicator.h"
#include "lowcomm/status.h"
#include "transport/emulated_links.h"
#include "transport/peer_config.h"
#include "transport/wan_link.h"

namespace lowcomm::collectives {

struct InitSettings {
  CommOptions options;         // every option the communicator keeps, set
  uint64_t pinned_limit = 0;   // LOWCOMM_PINNED_BYTES (device_op.h)
  transport::PeerConfig peer;  // streams, buffers, sealing, failure timeout, this rank's link
  std::string wan_text;        // the emulated WAN's spec ("" : none)
  transport::WanPlan wan;
  transport::WanLink own;             // this rank's link (wan.link(rank, -1))
  transport::EmulatedLinks emulated;  // its clocks, opened before bootstrapping
  SitePlan sites;                     // from the option, LOWCOMM_SITES or the plan's site= rules
  bool sites_given = false;           // by the option or LOWCOMM_SITES
  std::string shares;                 // "auto", "equal" or "" (decided once the hosts are known)
  bool want_ucx = false;              // intra_site "ucx"
};

Result<InitSettings> read_init_settings(const UniqueId& id, int rank, int nranks,
                                        const CommOptions& given);

}  // namespace lowcomm::collectives
