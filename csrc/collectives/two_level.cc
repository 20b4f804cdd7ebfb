// The two-level all-reduce: sites of m ranks each (collectives/sites.h), S sites, P = S m.
//
// Schedule, the tensor cut into m slices (owner_chunks, on the codec's scale groups):
//   1. Inside each site, a reduce-scatter over the local network, uncompressed: the site's
//      j-th rank ends with slice j summed over its site in fp32 (the owner reduction among the
//      site's ranks, kScatter, into scratch).
//   2. Across sites, an all-reduce of slice j among the j-th ranks of every site (a "column"),
//      with the call's codec and error feedback: the owner reduction among the column, so each
//      element is quantized twice (the site sums as contributions, the owner's sum once), as in
//      the flat schedule, and every member of the column ends with the same bits. An average is
//      an average of averages: phase 1's owner divides by m, phase 2's by S (in fp32; not the
//      flat schedule's bits, the same on every rank).
//   3. Inside each site, an all-gather of the slices: every rank sends its slice's result to the
//      others of its site and receives theirs, so every rank holds the bits its column computed.
// Bytes per rank on the WAN: 2 (S-1)/S x n/m x w (w the encoded bytes per element), against the
// flat schedule's 2 (P-1)/P x n x w; per site link, m times that: about 2 n w against 2 m n w.
// Inside the site: (m-1)/m x n x 4 bytes out and in, twice.
//
// The phases run one after the other. Phase 1 talks to the site's ranks on the reduce channel,
// phase 3 on the gather channel; phase 2 only to other sites' ranks (both channels): no two
// phases share a (peer, tag) stream, so their messages cannot meet the wrong receive. Phase 3's
// receives are posted before phase 1 starts: a site peer sends its slice only after its phase 2,
// which needed our phase-1 contribution to its slice delivered, so by then our sends of the input
// (in place, the same memory) are done with it, and our own slice is never a target.

#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/arg_checks.h"
#include "collectives/owner_reduce.h"
#include "collectives/tags.h"

namespace lowcomm::collectives {

Status two_level_all_reduce(OpRun& run, const ReduceArgs& a, const SitePlan& plan) {
  LOWCOMM_CHECK(
      check_all_reduce(a.send, a.recv, a.n, a.dtype, a.op, a.codec, a.error_feedback_key));
  if (a.dtype != DType::kFloat32 || (a.op != ReduceOp::kSum && a.op != ReduceOp::kAverage))
    return internal_error("two-level all-reduce takes fp32 sum or average");
  LOWCOMM_CHECK(run.post_descriptors());
  const int me = run.rank();
  const std::vector<int>& site = plan.members[static_cast<size_t>(plan.site_of[me])];
  const std::vector<int> column = plan.column(me);
  const int m = static_cast<int>(site.size());
  const int j = plan.local_index(me);
  const std::vector<Range> slices = owner_chunks(a.n, m, granule(a.codec));
  const Range mine = slices[static_cast<size_t>(j)];
  auto* out = static_cast<uint8_t*>(a.recv);
  constexpr uint64_t es = sizeof(float);

  // Phase 3's receives first (see the file comment).
  const uint64_t site_gather = run.payload_tag(tags::kGather);
  for (int k = 0; k < m; ++k)
    if (k != j) {
      const Range r = slices[static_cast<size_t>(k)];
      run.irecv(site[static_cast<size_t>(k)], site_gather, out + r.begin * es, r.count * es);
    }

  // Phase 1: the site's sum of slice j, uncompressed.
  float* partial = reinterpret_cast<float*>(run.scratch(mine.count * es));
  ReduceArgs local = a;
  local.recv = partial;
  local.codec.reset();
  local.error_feedback_key.clear();
  local.owner_ef = false;
  LOWCOMM_CHECK(owner_reduce(run, local, slices, {Finish::kScatter, -1}, site));

  // Phase 2: slice j across the sites, compressed. The owner reduction returns with every
  // result of the column decoded in place.
  ReduceArgs across = a;
  across.send = partial;
  across.recv = out + mine.begin * es;
  across.n = mine.count;
  if (!a.error_feedback_key.empty()) across.error_feedback_key = a.error_feedback_key + "/2level";
  LOWCOMM_CHECK(owner_reduce(run, across, owner_chunks(mine.count, plan.sites(), granule(a.codec)),
                             {Finish::kAllGather, -1}, column));

  // Phase 3: slice j to the rest of the site.
  for (int k = 0; k < m; ++k)
    if (k != j)
      run.isend(site[static_cast<size_t>(k)], site_gather, out + mine.begin * es, mine.count * es);
  return run.check_descriptors();  // then the executor waits for every request
}

}  // namespace lowcomm::collectives
