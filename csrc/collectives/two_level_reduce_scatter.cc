// The two-level reduce-scatter: sites of m ranks each (topology/sites.h), S sites; rank r's
// result is block r (recv_count elements) of the reduction, as the flat reduce-scatter.
//
//   0. The input's blocks are copied into scratch by (position k, site t): the block of the rank
//      at position k of site t goes to slot k S + t, so the S blocks one column receives are
//      contiguous.
//   1. Inside each site, the owner reduction among the site's ranks (kScatter, uncompressed):
//      the rank at position k gets the site's sum (or average over m) of its column's S blocks.
//   2. Across sites, the owner reduction among the column (kScatter, with the call's codec and
//      error feedback): the rank of site t gets block t summed (or averaged over S) over the
//      sites, quantized once per contribution and rounded once, as flat.
// Per site link (m ranks, S sites, block B, w bytes per element on the wire): (S-1) m B w out
// and in, against the flat reduce-scatter's m (P-m) B w.
// Streams: phase 1 on the reduce channel with the site's ranks, phase 2 on it with the column's
// (other sites' ranks only): none shared.

#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/arg_checks.h"
#include "collectives/owner_reduce.h"

namespace lowcomm::collectives {

Status two_level_reduce_scatter(OpRun& run, const ReduceArgs& a, const SitePlan& plan) {
  const int P = run.size();
  const uint64_t rc = a.n / static_cast<uint64_t>(P);
  LOWCOMM_CHECK(
      check_reduce_scatter(a.send, a.recv, rc, a.dtype, a.op, P, a.codec, a.error_feedback_key));
  if (a.dtype != DType::kFloat32 || (a.op != ReduceOp::kSum && a.op != ReduceOp::kAverage))
    return internal_error("two-level reduce-scatter takes fp32 sum or average");
  LOWCOMM_CHECK(run.post_descriptors());
  const int me = run.rank();
  const int S = plan.sites();
  const int m = plan.per_site;
  const std::vector<int>& site = plan.members[static_cast<size_t>(plan.site_of[me])];
  constexpr uint64_t es = sizeof(float);
  const uint64_t block = rc * es;

  // 0. Blocks by (position, site).
  auto* ordered = run.scratch(a.n * es);
  const auto* in = static_cast<const uint8_t*>(a.send);
  for (int t = 0; t < S; ++t)
    for (int k = 0; k < m; ++k) {
      const int r = plan.members[static_cast<size_t>(t)][static_cast<size_t>(k)];
      std::memcpy(ordered + static_cast<uint64_t>(k * S + t) * block,
                  in + static_cast<uint64_t>(r) * block, block);
    }

  // 1. Inside the site: the column's S blocks, summed over the site.
  std::vector<Range> by_position;
  for (int k = 0; k < m; ++k)
    by_position.push_back({static_cast<uint64_t>(k) * S * rc, static_cast<uint64_t>(S) * rc});
  auto* partial = run.scratch(static_cast<uint64_t>(S) * block);
  ReduceArgs local = a;
  local.send = ordered;
  local.recv = partial;
  local.codec.reset();
  local.error_feedback_key.clear();
  local.owner_ef = false;
  LOWCOMM_CHECK(owner_reduce(run, local, by_position, {Finish::kScatter, -1}, site));

  // 2. Across sites: block t of the column's partials to the column's rank in site t.
  std::vector<Range> by_site;
  for (int t = 0; t < S; ++t) by_site.push_back({static_cast<uint64_t>(t) * rc, rc});
  ReduceArgs across = a;
  across.send = partial;
  across.n = static_cast<uint64_t>(S) * rc;
  if (!a.error_feedback_key.empty()) across.error_feedback_key = a.error_feedback_key + "/2level";
  return owner_reduce(run, across, by_site, {Finish::kScatter, -1}, plan.column(me));
}

}  // namespace lowcomm::collectives
