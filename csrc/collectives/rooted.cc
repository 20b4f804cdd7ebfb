// Gather and scatter: one root, one hop.
//
// Gather: every rank sends its block straight to the root, which receives each into its place
// (rank r's at r * count); the root's downlink carries (P-1) * count * es bytes, the floor for
// any gather. Scatter is the mirror: the root sends block r to rank r, starting with the next
// rank. Both post the descriptor exchange first and check it before the root's output is
// read, as the other collectives do.

#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/arg_checks.h"
#include "collectives/tags.h"

namespace lowcomm::collectives {

Status gather(OpRun& run, const void* send, void* recv, uint64_t count, DType dtype, int root) {
  LOWCOMM_CHECK(check_rooted("gather", send, recv, count, dtype, root, run.rank(), run.size(),
                             /*root_holds_all=*/true));
  const uint64_t bytes = count * dtype_size(dtype);
  const int me = run.rank();
  LOWCOMM_CHECK(run.post_descriptors());
  const uint64_t tag = run.payload_tag(tags::kGather);
  if (me != root) {
    run.isend(root, tag, send, bytes);
    return run.check_descriptors();
  }
  auto* out = static_cast<uint8_t*>(recv);
  for (int p : run.peers()) run.irecv(p, tag, out + bytes * static_cast<uint64_t>(p), bytes);
  uint8_t* mine = out + bytes * static_cast<uint64_t>(me);
  if (mine != send && bytes) std::memmove(mine, send, bytes);
  return run.check_descriptors();
}

Status scatter(OpRun& run, const void* send, void* recv, uint64_t count, DType dtype, int root) {
  LOWCOMM_CHECK(check_rooted("scatter", send, recv, count, dtype, root, run.rank(), run.size(),
                             /*root_holds_all=*/false));
  const uint64_t bytes = count * dtype_size(dtype);
  const int me = run.rank(), P = run.size();
  LOWCOMM_CHECK(run.post_descriptors());
  const uint64_t tag = run.payload_tag(tags::kScatter);
  if (me != root) {
    run.irecv(root, tag, recv, bytes);
    return run.check_descriptors();
  }
  const auto* in = static_cast<const uint8_t*>(send);
  for (int d = 1; d < P; ++d) {
    const int r = (me + d) % P;
    run.isend(r, tag, in + bytes * static_cast<uint64_t>(r), bytes);
  }
  const uint8_t* mine = in + bytes * static_cast<uint64_t>(me);
  if (mine != recv && bytes) std::memmove(recv, mine, bytes);
  return run.check_descriptors();
}

}  // namespace lowcomm::collectives
