// Gather: one root, one hop.
//
// Schedule: every rank sends its block straight to the root, which receives each into its
// place (rank r's at r * count); the root's downlink carries (P-1) * count * es bytes, the
// floor for any gather. The descriptor exchange is posted first and checked before the root's
// output is read, as the other collectives do; the root's own block is never a receive target.

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

}  // namespace lowcomm::collectives
