// Broadcast: no arithmetic, only placement.
//
// Schedule, scatter then relay: the root sends slice i of the buffer to relay i (the P-1 other
// ranks, n/(P-1) elements each) and every relay forwards its slice to the other relays. The
// root sends n bytes in all and each relay (P-2)/(P-1) n, instead of (P-1) n from the root
// alone. Small buffers (under 64 KiB) and two ranks go direct: one hop beats two when latency
// dominates.
//
// Latency: one one-way delay direct, two for the relay. The descriptor exchange is posted, not
// waited for (op_run.h): receives are posted and data sent at once, and the descriptors are
// checked before the operation succeeds and before a relay forwards its slice. Data may
// therefore land before the check, always in place in `recv`, and that is safe:
//   - No rank's input is a receive target: the root receives nothing, a non-root has no input.
//     So a peer that called something else can at worst write output that this failed call
//     leaves unspecified anyway.
//   - It cannot even do that: a mismatched peer's payload travels on another tag
//     (tags::payload hashes the shape: kind, count, dtype, root, ...), so it meets none of our
//     receives and waits unclaimed until the check fails the operation; and relays forward only
//     after their own check. (Up to a 1 in 65536 hash collision, covered by the point above.)

#include <cstring>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/arg_checks.h"
#include "collectives/tags.h"
#include "topology/partition.h"

namespace lowcomm::collectives {
namespace {

constexpr uint64_t kDirectBroadcastBytes = 64 << 10;

}  // namespace

Status broadcast(OpRun& run, const void* send, void* recv, uint64_t count, DType dtype, int root) {
  LOWCOMM_CHECK(check_broadcast(send, recv, count, dtype, root, run.rank(), run.size()));
  const uint64_t es = dtype_size(dtype);
  const uint64_t bytes = count * es;
  const int me = run.rank(), P = run.size();
  LOWCOMM_CHECK(run.post_descriptors());
  auto* out = static_cast<uint8_t*>(recv);
  if (me == root && send != recv && bytes) std::memmove(out, send, bytes);
  if (P == 1) return run.check_descriptors();
  const uint64_t scatter = run.payload_tag(tags::kScatter), relay = run.payload_tag(tags::kGather);
  if (P == 2 || bytes < kDirectBroadcastBytes) {
    if (me == root) {
      for (int p : run.peers()) run.isend(p, scatter, out, bytes);
    } else {
      run.irecv(root, scatter, out, bytes);
    }
    return run.check_descriptors();
  }
  std::vector<int> relays;
  for (int r = 0; r < P; ++r)
    if (r != root) relays.push_back(r);
  auto slices = owner_chunks(count, P - 1, 1);
  if (me == root) {
    for (size_t i = 0; i < relays.size(); ++i)
      run.isend(relays[i], scatter, out + slices[i].begin * es, slices[i].count * es);
    return run.check_descriptors();
  }
  size_t my = 0;
  while (relays[my] != me) ++my;
  for (size_t i = 0; i < relays.size(); ++i)
    if (i != my) run.irecv(relays[i], relay, out + slices[i].begin * es, slices[i].count * es);
  auto from_root = run.irecv(root, scatter, out + slices[my].begin * es, slices[my].count * es);
  // Before waiting for the root's slice (a mismatched root's never comes) and forwarding it.
  LOWCOMM_CHECK(run.check_descriptors());
  LOWCOMM_CHECK(run.wait(from_root));
  // Rotated like all_gather's sends, so no relay's downlink takes every slice at once.
  for (size_t d = 1; d < relays.size(); ++d) {
    const size_t i = (my + d) % relays.size();
    run.isend(relays[i], relay, out + slices[my].begin * es, slices[my].count * es);
  }
  return Status::ok();
}

}  // namespace lowcomm::collectives
