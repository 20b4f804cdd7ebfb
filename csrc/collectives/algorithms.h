#pragma once
// The collective algorithms, each run on the executor thread inside an OpRun whose descriptor
// describes the call. Each file opens with its schedule; docs/collectives.md has the byte counts.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "collectives/op_run.h"
#include "lowcomm/communicator.h"
#include "topology/sites.h"

namespace lowcomm::collectives {

// No codec, or a passthrough in the tensor's own dtype: the plain (uncompressed) algorithm.
inline bool plain_codec(const std::optional<CodecSpec>& codec, DType dtype) {
  return !codec || (!codec->quantized() && codec->wire_dtype == dtype);
}

class DeviceOp;

struct ReduceArgs {
  const void* send = nullptr;
  void* recv = nullptr;
  uint64_t n = 0;  // elements of the full tensor
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  std::optional<CodecSpec> codec;  // unset: uncompressed
  std::string error_feedback_key;
  bool owner_ef = false;
  uint64_t seed = 0;
  uint64_t step = 0;
  // The owner reduction's pipeline segment (elements); 0: the descriptor's. A schedule that
  // reduces another vector than the call's (randk's kept elements) derives its own alike on
  // every rank.
  uint64_t segment_elems = 0;
  // Set: send and recv are device buffers of this CUDA call and the owner reduction takes its
  // GPU-codec path (owner_reduce_device.cc): contributions encoded and results decoded on the
  // device. Only the flat all-reduce and reduce-scatter with a dense lossy codec take it.
  DeviceOp* device = nullptr;
  // AllReduceOptions::on_result: the flat all-reduce reports the parts of recv that are final
  // (collectives::all_reduce only; the schedules that copy these arguments never call it).
  std::function<void(uint64_t offset, uint64_t bytes)> on_result = nullptr;
};

// Pipeline segment length (elements) of a reduce whose owner chunks hold about `chunk_elems`:
// an eighth of a chunk, between 64 KiB and `segment_bytes` of input, on the codec's scale-group
// boundaries (at most kMaxSegmentGroups groups). Carried in the descriptor (segment_elems) so
// ranks configured differently fail cleanly instead of disagreeing on message sizes. (A fixed
// 4 MiB left 1-4 MiB all-reduces unpipelined: each owner's results waited for its whole chunk,
// 0.65-0.76 of the link limit.)
inline constexpr uint64_t kSegmentsPerChunk = 8;
inline constexpr uint64_t kMinSegmentBytes = 64 << 10;
uint64_t reduce_segment_elems(uint64_t segment_bytes, DType dtype,
                              const std::optional<CodecSpec>& codec, uint64_t chunk_elems);

// The owner reduction (owner_reduce.cc; its phases in owner_reduce_*.cc).
Status all_reduce(OpRun& run, const ReduceArgs& a);
Status reduce(OpRun& run, const ReduceArgs& a, int root);  // the result on root only
Status reduce_scatter(OpRun& run, const ReduceArgs& a);    // a.n = recv count * size
// Every rank's contribution to every rank, reduced there (one_hop_reduce.cc).
Status one_hop_all_reduce(OpRun& run, const ReduceArgs& a);
// Random-k's owner schedule over the positions every rank shares (shared_positions_reduce.cc):
// the owner reduction of the kept elements with shared_positions_codec(randk). Takes what
// can_share_positions allows (a randk fp32 sum or average).
Status shared_positions_all_reduce(OpRun& run, const ReduceArgs& a);
CodecSpec shared_positions_codec(const CodecSpec& randk);
bool can_share_positions(const std::optional<CodecSpec>& codec, DType dtype, ReduceOp op);
// Inside each site, across the sites slice by slice, inside each site again (two_level.cc);
// fp32 sum or average, the plan two-level (SitePlan::two_level).
Status two_level_all_reduce(OpRun& run, const ReduceArgs& a, const SitePlan& plan);
// Inside each site for a column's blocks, then across the column (two_level_reduce_scatter.cc);
// fp32 sum or average; a.n = recv count * size.
Status two_level_reduce_scatter(OpRun& run, const ReduceArgs& a, const SitePlan& plan);
// The root's site scatters, its ranks send across to their columns, every site all-gathers
// (two_level_broadcast.cc).
Status two_level_broadcast(OpRun& run, const void* send, void* recv, uint64_t count, DType dtype,
                           int root, const SitePlan& plan);
// Across sites within each column, then relayed inside each site (two_level_all_gather.cc).
Status two_level_all_gather(OpRun& run, const void* send, void* recv, uint64_t count, DType dtype,
                            const SitePlan& plan);

// Placement only, each in the file of its name (all_gather.cc, broadcast.cc, gather.cc,
// scatter.cc, all_to_all.cc).
Status all_gather(OpRun& run, const void* send, void* recv, uint64_t count, DType dtype);
Status broadcast(OpRun& run, const void* send, void* recv, uint64_t count, DType dtype, int root);
Status gather(OpRun& run, const void* send, void* recv, uint64_t count, DType dtype, int root);
Status scatter(OpRun& run, const void* send, void* recv, uint64_t count, DType dtype, int root);
struct AllToAllArgs {
  const void* send = nullptr;
  std::vector<uint64_t> send_counts, send_offsets;  // elements, per rank
  void* recv = nullptr;
  std::vector<uint64_t> recv_counts, recv_offsets;
  DType dtype = DType::kFloat32;
};
Status all_to_all(OpRun& run, const AllToAllArgs& a);

// Point-to-point (point_to_point.cc).
Status send(OpRun& run, const void* buf, uint64_t count, DType dtype, int peer, uint64_t tag);
Status recv(OpRun& run, void* buf, uint64_t count, DType dtype, int peer, uint64_t tag);
// From whichever peer's message on `tag` comes first (OpRun::set_source records it).
Status recv_any(OpRun& run, void* buf, uint64_t count, DType dtype, uint64_t tag);

Status barrier(OpRun& run);  // barrier.cc

}  // namespace lowcomm::collectives
