// All-to-all with per-peer counts (MPI_Alltoallv, torch's all_to_all_single with splits).
//
// Rank r sends send_counts[j] elements from send_offsets[j] to rank j and receives
// recv_counts[j] elements into recv_offsets[j] from rank j, one hop, starting with the next
// rank so that at every moment each rank's downlink takes one flow. The two ranks of a pair must
// agree on the count between them: the receive is posted with this rank's recv_counts[j], and a
// message of another length fails that receive naming the peer (the connection stays up). The
// descriptor carries only the dtype, so ranks with different splits are not a mismatch.

#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/arg_checks.h"
#include "collectives/tags.h"

namespace lowcomm::collectives {

Status all_to_all(OpRun& run, const AllToAllArgs& a) {
  LOWCOMM_CHECK(check_all_to_all(a.send, a.send_counts, a.send_offsets, a.recv, a.recv_counts,
                                 a.recv_offsets, a.dtype, run.rank(), run.size()));
  const uint64_t es = dtype_size(a.dtype);
  const int me = run.rank(), P = run.size();
  LOWCOMM_CHECK(run.post_descriptors());
  const uint64_t tag = run.payload_tag(tags::kGather);
  const auto* in = static_cast<const uint8_t*>(a.send);
  auto* out = static_cast<uint8_t*>(a.recv);
  for (int p : run.peers()) run.irecv(p, tag, out + a.recv_offsets[p] * es, a.recv_counts[p] * es);
  for (int d = 1; d < P; ++d) {
    const int j = (me + d) % P;
    run.isend(j, tag, in + a.send_offsets[j] * es, a.send_counts[j] * es);
  }
  const uint64_t own = a.send_counts[me] * es;
  if (own && out + a.recv_offsets[me] * es != in + a.send_offsets[me] * es)
    std::memmove(out + a.recv_offsets[me] * es, in + a.send_offsets[me] * es, own);
  return run.check_descriptors();
}

}  // namespace lowcomm::collectives
