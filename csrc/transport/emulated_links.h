#pragma once
// The clocks of a rank's emulated links (LOWCOMM_WAN, wan_link.h), set up before it connects:
// the one place that turns a site-model WanLink into LinkClocks (pacer.h).
//   - own_site_links: a rank alone in its site (the NCCL plugin, a membership connection's
//     endpoint, a rank outside every site= rule): one uplink and one downlink, shared by all its
//     peers, in this process;
//   - EmulatedLinks::open: a communicator's rank under a WanPlan: its site's clocks (in shared
//     memory when the site has several ranks: shared_clocks.h) and those of the paths it sends on
//     (pair= rules with bw=), named after the communicator's root address; every rank opens
//     them before the mesh is bootstrapped and the names go once it is up (release_names()) or
//     when the EmulatedLinks goes.

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lowcomm/status.h"
#include "transport/pacer.h"
#include "transport/wan_link.h"

namespace lowcomm::transport {

// Null for the pair model or an unshaped link.
std::shared_ptr<LinkClocks> own_site_links(const WanLink& link);

class EmulatedLinks {
 public:
  EmulatedLinks() = default;
  EmulatedLinks(EmulatedLinks&& other) noexcept;
  EmulatedLinks& operator=(EmulatedLinks&& other) noexcept;
  EmulatedLinks(const EmulatedLinks&) = delete;
  EmulatedLinks& operator=(const EmulatedLinks&) = delete;
  ~EmulatedLinks() { release_names(); }

  // `own`: plan.link(rank, -1).
  static Result<EmulatedLinks> open(const WanPlan& plan, const WanLink& own, int rank, int nranks,
                                    std::string_view root_address);

  const std::shared_ptr<LinkClocks>& site() const { return site_; }
  // The link to `peer` with its path's clock attached (pair= rules with bw=).
  Result<WanLink> link_to(const WanPlan& plan, int rank, int peer) const;
  // Unlinks the shared-memory names (the mappings stay): once every rank of the site has them.
  void release_names();

 private:
  std::shared_ptr<LinkClocks> site_;
  std::map<int, std::shared_ptr<LinkClocks>> paths_;  // by path id
  std::vector<std::string> names_;                    // shared-memory names still linked
};

}  // namespace lowcomm::transport
