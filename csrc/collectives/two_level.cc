// The two-level all-reduce: sites of m ranks each (topology/sites.h), S sites, P = S m.
//
// Schedule, for each piece of the tensor (below), cut into m slices (owner_chunks, on the
// codec's scale groups):
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
// Pipeline. The tensor is cut into pieces (two pipeline segments, CommOptions::segment_bytes,
// and up; at most kMaxPieces), and while
// piece p's cross-site phase is on the WAN, piece p+1's local reduce-scatter runs and its
// contributions join the WAN queue before piece p's results are awaited:
//   phase 1 of piece 0; phase 2 of piece 0 started (contributions sent)
//   for each piece p: phase 1 of p+1, phase 2 of p+1 started; phase 2 of p finished (own chunk
//   reduced, results sent and taken); phase 3 of p sent
// so the slow link never waits for the local phases except on the first piece. Every rank runs
// the same sequence, and the owner reductions of the pieces share the (peer, tag) streams in
// that order, so messages meet their receives.
//
// Streams: phase 1 talks to the site's ranks on the reduce channel, phase 3 on the gather
// channel; phase 2 only to other sites' ranks (both channels): no two phases share a stream.
// Phase 3's receives are posted before anything else: a site peer sends its slice of a piece
// only after its phase 2 of that piece, which needed our phase-1 contribution to its slice
// delivered, so by then our sends of that input (in place, the same memory) are done with it,
// and our own slice is never a target.

#include <cstring>
#include <memory>

#include "collectives/algorithms.h"
#include "collectives/arg_checks.h"
#include "collectives/owner_reduce.h"
#include "collectives/tags.h"

namespace lowcomm::collectives {
namespace {

constexpr uint64_t kMaxPieces = 8;

}  // namespace

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
  const uint64_t g = granule(a.codec);
  constexpr uint64_t es = sizeof(float);
  const auto* in = static_cast<const uint8_t*>(a.send);
  auto* out = static_cast<uint8_t*>(a.recv);

  // Pieces (a function of n and the plan only, so every rank cuts alike), and each piece's
  // slices (offsets within the tensor).
  const uint64_t units = (a.n + g - 1) / g;
  const uint64_t piece_bytes = std::max<uint64_t>(2 * run.segment_bytes(), 1);
  const uint64_t want = std::clamp<uint64_t>(a.n * es / piece_bytes, 1, kMaxPieces);
  const int pieces =
      static_cast<int>(std::min<uint64_t>(want, units / static_cast<uint64_t>(run.size())));
  const std::vector<Range> piece = owner_chunks(a.n, std::max(pieces, 1), g);
  std::vector<std::vector<Range>> slices;  // [piece][local index], offsets in the tensor
  for (const Range& p : piece) {
    std::vector<Range> sl = owner_chunks(p.count, m, g);
    for (Range& r : sl) r.begin += p.begin;
    slices.push_back(std::move(sl));
  }

  // Phase 3's receives first (see the file comment), in piece order.
  const uint64_t site_gather = run.payload_tag(tags::kGather);
  for (size_t p = 0; p < piece.size(); ++p)
    for (int k = 0; k < m; ++k)
      if (k != j) {
        const Range r = slices[p][static_cast<size_t>(k)];
        run.irecv(site[static_cast<size_t>(k)], site_gather, out + r.begin * es, r.count * es);
      }

  // Phase 1 (all of it: local) and the start of phase 2 (contributions on the WAN) of piece p.
  std::vector<std::unique_ptr<StagedOwnerReduce>> across(piece.size());
  auto begin_piece = [&](size_t p) -> Status {
    const Range mine = slices[p][static_cast<size_t>(j)];
    float* partial = reinterpret_cast<float*>(run.scratch(mine.count * es));
    ReduceArgs local = a;
    local.send = in + piece[p].begin * es;
    local.recv = partial;
    local.n = piece[p].count;
    local.codec.reset();
    local.error_feedback_key.clear();
    local.owner_ef = false;
    std::vector<Range> chunks = slices[p];
    for (Range& r : chunks) r.begin -= piece[p].begin;
    LOWCOMM_CHECK(owner_reduce(run, local, chunks, {Finish::kScatter, -1}, site));
    ReduceArgs wan = a;
    wan.send = partial;
    wan.recv = out + mine.begin * es;
    wan.n = mine.count;
    wan.seed = a.seed ^ (0x9e3779b97f4a7c15ull * (p + 1));  // pieces round independently
    if (!a.error_feedback_key.empty())
      wan.error_feedback_key = a.error_feedback_key + "/2level/" + std::to_string(p);
    across[p] =
        std::make_unique<StagedOwnerReduce>(run, wan, owner_chunks(mine.count, plan.sites(), g),
                                            Finish{Finish::kAllGather, -1}, column);
    return across[p]->start();
  };

  LOWCOMM_CHECK(begin_piece(0));
  for (size_t p = 0; p < piece.size(); ++p) {
    if (p + 1 < piece.size()) LOWCOMM_CHECK(begin_piece(p + 1));
    // The owner reduction returns with every result of the column decoded in place.
    LOWCOMM_CHECK(across[p]->finish());
    const Range mine = slices[p][static_cast<size_t>(j)];
    for (int k = 0; k < m; ++k)
      if (k != j)
        run.isend(site[static_cast<size_t>(k)], site_gather, out + mine.begin * es,
                  mine.count * es);
  }
  return run.check_descriptors();  // then the executor waits for every request
}

}  // namespace lowcomm::collectives
