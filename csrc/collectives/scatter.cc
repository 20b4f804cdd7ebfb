// Scatter: one root, one hop; gather's mirror (gather.cc).
//
// Schedule: the root sends block r of its buffer to rank r, starting with the next rank, and
// copies its own block; (P-1) * count * es bytes leave the root. The descriptor exchange is
// posted first and checked before the operation succeeds, as the other collectives do; the
// root receives nothing, so its input is never a receive target.

#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/arg_checks.h"
#include "collectives/tags.h"

namespace lowcomm::collectives {

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
