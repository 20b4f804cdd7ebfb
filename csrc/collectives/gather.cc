// All-gather and broadcast: no arithmetic, only placement.
//
// All-gather: every rank sends its block straight to every other rank and receives theirs in
// place: (P-1) * count * es bytes out and in per rank, one hop, which over a full mesh of WAN
// links costs one block time per link in parallel (a ring would add P-2 latencies).
//
// Broadcast, scatter then relay: the root sends slice i of the buffer to relay i (the P-1
// other ranks, n/(P-1) elements each) and every relay forwards its slice to the other relays.
// The root sends n bytes in all and each relay (P-2)/(P-1) n, instead of (P-1) n from the root
// alone. Small buffers (under 64 KiB) and two ranks go direct: one hop beats two when latency
// dominates.

#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/partition.h"
#include "collectives/tags.h"

namespace lowcomm::collectives {
namespace {

constexpr uint64_t kDirectBroadcastBytes = 64 << 10;

Status check_buffers(const void* a, const void* b, uint64_t bytes) {
  if (bytes > 0 && (!a || !b)) return invalid_argument("null buffer with a non-zero count");
  return Status::ok();
}

}  // namespace

Status all_gather(OpRun& run, const void* send, void* recv, uint64_t count, DType dtype) {
  const uint64_t bytes = count * dtype_size(dtype);
  if (count > (uint64_t{1} << 56) / static_cast<uint64_t>(run.size()))
    return invalid_argument("element count too large");
  LOWCOMM_CHECK(check_buffers(send, recv, bytes));
  LOWCOMM_CHECK(run.exchange_descriptors());
  auto* out = static_cast<uint8_t*>(recv);
  const int me = run.rank();
  for (int p : run.peers()) run.irecv(p, tags::kGather, out + bytes * static_cast<uint64_t>(p), bytes);
  uint8_t* mine = out + bytes * static_cast<uint64_t>(me);
  if (mine != send && bytes) std::memmove(mine, send, bytes);
  for (int p : run.peers()) run.isend(p, tags::kGather, mine, bytes);
  return Status::ok();  // the executor waits for every request
}

Status broadcast(OpRun& run, const void* send, void* recv, uint64_t count, DType dtype, int root) {
  if (root < 0 || root >= run.size())
    return invalid_argument("broadcast root " + std::to_string(root) + " is outside [0, " +
                            std::to_string(run.size()) + ")");
  if (count > (uint64_t{1} << 56)) return invalid_argument("element count too large");
  const uint64_t es = dtype_size(dtype);
  const uint64_t bytes = count * es;
  const int me = run.rank(), P = run.size();
  LOWCOMM_CHECK(check_buffers(me == root ? send : recv, recv, bytes));
  LOWCOMM_CHECK(run.exchange_descriptors());
  auto* out = static_cast<uint8_t*>(recv);
  if (me == root && send != recv && bytes) std::memmove(out, send, bytes);
  if (P == 1) return Status::ok();
  if (P == 2 || bytes < kDirectBroadcastBytes) {
    if (me == root) {
      for (int p : run.peers()) run.isend(p, tags::kScatter, out, bytes);
    } else {
      run.irecv(root, tags::kScatter, out, bytes);
    }
    return Status::ok();
  }
  std::vector<int> relays;
  for (int r = 0; r < P; ++r)
    if (r != root) relays.push_back(r);
  auto slices = owner_chunks(count, P - 1, 1);
  if (me == root) {
    for (size_t i = 0; i < relays.size(); ++i)
      run.isend(relays[i], tags::kScatter, out + slices[i].begin * es, slices[i].count * es);
    return Status::ok();
  }
  size_t my = 0;
  while (relays[my] != me) ++my;
  for (size_t i = 0; i < relays.size(); ++i)
    if (i != my) run.irecv(relays[i], tags::kGather, out + slices[i].begin * es, slices[i].count * es);
  LOWCOMM_CHECK(run.wait(run.irecv(root, tags::kScatter, out + slices[my].begin * es, slices[my].count * es)));
  for (size_t i = 0; i < relays.size(); ++i)
    if (i != my) run.isend(relays[i], tags::kGather, out + slices[my].begin * es, slices[my].count * es);
  return Status::ok();
}

}  // namespace lowcomm::collectives
