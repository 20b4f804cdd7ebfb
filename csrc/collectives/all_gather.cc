// All-gather: no arithmetic, only placement.
//
// Schedule: every rank sends its block straight to every other rank, starting with the next
// rank, and receives theirs in place: (P-1) * count * es bytes out and in per rank, one hop,
// which over a full mesh of WAN links costs one block time per link in parallel (a ring would
// add P-2 latencies).
//
// Latency: one one-way delay. The descriptor exchange is posted, not waited for (op_run.h):
// receives are posted and data sent at once, and the descriptors are checked before the
// operation succeeds. Data may therefore land before the check, always in place in `recv`, and
// that is safe:
//   - The input is never a receive target: an all-gather never receives into its own block (the
//     in-place send buffer). So a peer that called something else can at worst write output
//     that this failed call leaves unspecified anyway.
//   - It cannot even do that: a mismatched peer's payload travels on another tag
//     (tags::payload hashes the shape: kind, count, dtype, ...), so it meets none of our
//     receives and waits unclaimed until the check fails the operation. (Up to a 1 in 65536
//     hash collision, covered by the point above.)

#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/arg_checks.h"
#include "collectives/tags.h"

namespace lowcomm::collectives {

Status all_gather(OpRun& run, const void* send, void* recv, uint64_t count, DType dtype) {
  LOWCOMM_CHECK(check_all_gather(send, recv, count, dtype, run.size()));
  const uint64_t bytes = count * dtype_size(dtype);
  LOWCOMM_CHECK(run.post_descriptors());
  auto* out = static_cast<uint8_t*>(recv);
  const int me = run.rank();
  const uint64_t tag = run.payload_tag(tags::kGather);
  for (int p : run.peers()) run.irecv(p, tag, out + bytes * static_cast<uint64_t>(p), bytes);
  uint8_t* mine = out + bytes * static_cast<uint64_t>(me);
  if (mine != send && bytes) std::memmove(mine, send, bytes);
  // Each rank starts with the next one, so at every moment each rank receives one flow: on a
  // site's shared downlink, sending in rank order made rank 0 take everyone's block at once
  // while others idled (1.5x the link time with 3 ranks, in the emulator's site model).
  for (int d = 1; d < run.size(); ++d) run.isend((me + d) % run.size(), tag, mine, bytes);
  return run.check_descriptors();  // then the executor waits for every request
}

}  // namespace lowcomm::collectives
