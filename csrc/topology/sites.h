#pragma once
// Sites: which ranks share a fast local network (a rack, a cloud region) behind one WAN link.
// A communicator whose ranks fall into several sites of equal size runs its large all-reduces
// in two levels (two_level.cc): inside each site, then between sites slice by slice, then
// inside each site again, so each site's WAN link carries about S instead of n_site x S.
//
// Where the map comes from (init_settings.cc, then Planner::discover), first that applies:
//   CommOptions::sites, else LOWCOMM_SITES: "flat" (none), or one label per rank,
//     comma-separated ("0,0,0,0,1,1,1,1"; labels are any non-negative integers);
//   the site= rules of the emulated WAN (LOWCOMM_WAN, docs/transport.md);
//   the hosts of the ranks' addresses, where some host has several ranks;
//   round-trip times measured at init (rtt_matrix.h), where every rank has a host of its own;
//   none (flat).
// Every rank must hold the same map: its hash travels in the descriptor of every two-level
// operation, so ranks that disagree fail the operation naming the peer instead of exchanging
// bytes of different schedules.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <optional>

#include "lowcomm/codec.h"
#include "lowcomm/communicator.h"
#include "lowcomm/status.h"

namespace lowcomm::topology {

struct SitePlan {
  std::vector<int> site_of;               // by rank: the site's index (0..sites-1, by first rank)
  std::vector<std::vector<int>> members;  // by site: its ranks, ascending
  int per_site = 0;   // ranks per site when every site has the same number; else 0
  uint64_t hash = 0;  // of the map (FNV-1a over the site indices); 0 when flat

  int sites() const { return static_cast<int>(members.size()); }
  // Two levels make sense: at least two sites, of equal size, each of at least two ranks.
  bool two_level() const { return sites() >= 2 && per_site >= 2; }
  // The ranks sharing `rank`'s position in the other sites (one per site, in site order).
  std::vector<int> column(int rank) const;
  // `rank`'s position in its site.
  int local_index(int rank) const;
  // Some site holds several ranks (they share its WAN link).
  bool shares_a_link() const {
    for (const std::vector<int>& m : members)
      if (m.size() > 1) return true;
    return false;
  }
  std::string to_string() const;  // "2 sites x 4 ranks: {0-3} {4-7}"
};

// The cost model: an all-reduce runs in two levels when the plan has them, it is an fp32 sum or
// average of at least kTwoLevelMinBytes, and every rank of every column owns at least one scale
// group of the slice. Below that size the call is a few one-way delays either way and the
// local phases are pure cost (the measurement that set kTwoLevelMinBytes: docs/sites.md). Flat
// otherwise. (Not yet from measured rates: docs/sites.md.)
inline constexpr uint64_t kTwoLevelMinBytes = 1 << 20;
bool use_two_level(const SitePlan& plan, uint64_t count, DType dtype, ReduceOp op,
                   const std::optional<CodecSpec>& codec);
// What two levels need at all (use_two_level less the size threshold): what a call that asks
// for them (AllReduceOptions::Schedule::kTwoLevel) must meet.
bool can_two_level(const SitePlan& plan, uint64_t count, DType dtype, ReduceOp op,
                   const std::optional<CodecSpec>& codec);

// An all-gather (or a broadcast) runs in two levels when the plan has them and the gathered
// result (the broadcast tensor) is at least kTwoLevelMinBytes.
bool use_two_level_gather(const SitePlan& plan, uint64_t gathered_bytes);

// From one label per rank (labels grouped in order of first appearance).
SitePlan plan_from_labels(const std::vector<int>& labels);
// As plan_from_labels, but flat when no two ranks share a label: the emulator's site= rules
// (transport::WanPlan::site_labels, a rank outside every rule a site alone).
SitePlan plan_from_groups(const std::vector<int>& labels);
// Sites from round-trip times (seconds, rtt[i][j] between ranks i and j, symmetric, the
// diagonal ignored): ranks closer than `threshold_s` are linked, and a site is a connected group
// (single linkage), so a site's ranks need not all be close to each other, only chained. Flat
// when every rank is its own site or all are one.
SitePlan plan_from_rtt(const std::vector<std::vector<double>>& rtt, double threshold_s);
// The default threshold: 2 ms. A rack or a cloud region's network has round trips well under a
// millisecond; two sites joined by the internet are rarely under 5 ms apart (LOWCOMM_SITE_RTT_MS
// overrides it).
inline constexpr double kSiteRttSeconds = 2e-3;
// LOWCOMM_SITES syntax for `nranks` ranks; "" or "flat": no sites.
Result<SitePlan> parse_sites(std::string_view text, int nranks);

}  // namespace lowcomm::topology
