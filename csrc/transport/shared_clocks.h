#pragma once
// The clocks of an emulated site that several ranks (processes) share (site= rules, wan_link.h):
// one uplink and one downlink in a POSIX shared-memory segment, so that every rank of the site
// reserves its chunks' time on the same two links (pacer.h: LinkClock is atomic and
// compare-and-swapped). The segment's name must be the same on every rank of the site and
// unique to the communicator (comm_impl.cc derives it from the UniqueId and the site's index).
//
// Lifetime: every rank opens (creating it if it is the first) before the mesh is bootstrapped;
// once the mesh is up every rank has it mapped, and each unlinks the name (the mappings stay).

#include <memory>
#include <string>

#include "lowcomm/status.h"
#include "transport/pacer.h"

namespace lowcomm::transport {

// A LinkClocks whose up and down clocks live in the segment `name` ("/..."); down_bits_per_second
// is this rank's (every rank of a site has the same rates).
Result<std::shared_ptr<LinkClocks>> open_shared_clocks(const std::string& name,
                                                       double down_bits_per_second);
// Removes the name (ENOENT is fine: another rank of the site removed it first).
void unlink_shared_clocks(const std::string& name);

}  // namespace lowcomm::transport
