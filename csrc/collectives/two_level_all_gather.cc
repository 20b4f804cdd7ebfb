// The two-level all-gather: sites of m ranks each (topology/sites.h), S sites, P = S m.
//
// Schedule, B bytes per rank:
//   1. Across sites: each rank sends its block to the ranks at its position in the other sites
//      (its column) and receives theirs: (S-1) B out per rank on the WAN.
//   2. Inside each site: each rank relays its column's S blocks to the other m-1 ranks of its
//      site, each block as soon as it is here, and receives the other columns' blocks from them.
// Per site link: m (S-1) B out and in, against the flat all-gather's m (P-m) B: m times less
// (4x for 2 sites of 4). Every rank sends P-1 blocks either way; only their routes differ.
//
// Blocks land in place in `recv`, as in all_gather.cc (a mismatched peer's payload travels on
// another tag: it meets none of these receives). Before a received block is relayed the
// descriptors are checked, so nothing of another operation is forwarded. Streams: across
// sites on the gather channel, inside the site on the scatter channel, which no other phase
// uses with those peers.

#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/arg_checks.h"
#include "collectives/tags.h"

namespace lowcomm::collectives {

Status two_level_all_gather(OpRun& run, const void* send, void* recv, uint64_t count, DType dtype,
                            const SitePlan& plan) {
  LOWCOMM_CHECK(check_all_gather(send, recv, count, dtype, run.size()));
  const uint64_t bytes = count * dtype_size(dtype);
  LOWCOMM_CHECK(run.post_descriptors());
  auto* out = static_cast<uint8_t*>(recv);
  auto block = [&](int r) { return out + bytes * static_cast<uint64_t>(r); };
  const int me = run.rank();
  const std::vector<int>& site = plan.members[static_cast<size_t>(plan.site_of[me])];
  const std::vector<int> column = plan.column(me);
  const uint64_t across = run.payload_tag(tags::kGather);
  const uint64_t local = run.payload_tag(tags::kScatter);

  // Every receive first: the column's blocks, then each site peer's column.
  std::vector<transport::Request> from_column(column.size());
  for (size_t i = 0; i < column.size(); ++i)
    if (column[i] != me) from_column[i] = run.irecv(column[i], across, block(column[i]), bytes);
  for (int k : site)
    if (k != me)
      for (int c : plan.column(k)) run.irecv(k, local, block(c), bytes);

  if (block(me) != send && bytes) std::memmove(block(me), send, bytes);
  for (int c : column)
    if (c != me) run.isend(c, across, block(me), bytes);
  LOWCOMM_CHECK(run.check_descriptors());  // before anything received is relayed
  // Relay the column's blocks in column order (the order the site peers posted), each once here.
  for (size_t i = 0; i < column.size(); ++i) {
    if (column[i] != me) LOWCOMM_CHECK(run.wait(from_column[i]));
    for (int k : site)
      if (k != me) run.isend(k, local, block(column[i]), bytes);
  }
  return Status::ok();  // the executor waits for every request
}

}  // namespace lowcomm::collectives
