// The two-level broadcast: sites of m ranks each (topology/sites.h), S sites; the root in
// site s0 at position j0. The tensor is cut into m slices (slice k for position k).
//
//   1. Inside the root's site: the root sends slice k to the site's rank at position k.
//   2. Across sites: each rank of the root's site sends its slice to its column (the ranks at
//      its position in the other sites).
//   3. Inside every site: each rank sends its slice to the other ranks of its site (the root
//      only sends; it holds everything).
// The root's site link carries (S-1) n out, each other site's n in, against the flat
// scatter-and-relay's m (P-m)/(P-1) n out of the root's site (2.3 n for 2 sites of 4).
// Each rank waits only for its own slice before forwarding it, after the descriptor check (so
// nothing of another operation is forwarded). Streams: phase 1 on the scatter channel, 2 and 3
// on the gather channel (2 with other sites' ranks, 3 with the site's own): none shared.

#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/arg_checks.h"
#include "collectives/tags.h"
#include "topology/partition.h"

namespace lowcomm::collectives {

Status two_level_broadcast(OpRun& run, const void* send, void* recv, uint64_t count, DType dtype,
                           int root, const SitePlan& plan) {
  LOWCOMM_CHECK(check_broadcast(send, recv, count, dtype, root, run.rank(), run.size()));
  const uint64_t es = dtype_size(dtype);
  LOWCOMM_CHECK(run.post_descriptors());
  auto* out = static_cast<uint8_t*>(recv);
  const int me = run.rank();
  if (me == root && send != recv && count) std::memmove(out, send, count * es);
  const std::vector<int>& site = plan.members[static_cast<size_t>(plan.site_of[me])];
  const int j = plan.local_index(me);
  const bool root_site = plan.site_of[me] == plan.site_of[root];
  const std::vector<Range> slices = owner_chunks(count, static_cast<int>(site.size()), 1);
  auto slice = [&](int k) { return out + slices[static_cast<size_t>(k)].begin * es; };
  auto slice_bytes = [&](int k) { return slices[static_cast<size_t>(k)].count * es; };
  const uint64_t scatter = run.payload_tag(tags::kScatter), gather = run.payload_tag(tags::kGather);

  // Receives first: this rank's slice (from the root, or from its column's rank in the root's
  // site), then every other slice from the site's rank at its position.
  transport::Request mine;
  if (me != root) {
    const int from =
        root_site ? root
                  : plan.members[static_cast<size_t>(plan.site_of[root])][static_cast<size_t>(j)];
    mine = run.irecv(from, root_site ? scatter : gather, slice(j), slice_bytes(j));
    for (int k = 0; k < static_cast<int>(site.size()); ++k)
      if (k != j) run.irecv(site[static_cast<size_t>(k)], gather, slice(k), slice_bytes(k));
  }
  if (me == root) {
    for (int k = 0; k < static_cast<int>(site.size()); ++k)
      if (site[static_cast<size_t>(k)] != me)
        run.isend(site[static_cast<size_t>(k)], scatter, slice(k), slice_bytes(k));
  }
  LOWCOMM_CHECK(run.check_descriptors());  // before anything received is forwarded
  if (me != root) LOWCOMM_CHECK(run.wait(mine));
  if (root_site)
    for (int c : plan.column(me))
      if (c != me) run.isend(c, gather, slice(j), slice_bytes(j));
  for (int k : site)
    if (k != me && k != root) run.isend(k, gather, slice(j), slice_bytes(j));
  return Status::ok();  // the executor waits for every request
}

}  // namespace lowcomm::collectives
