// The owner reduction: all-reduce, reduce-scatter and reduce (to a root), plain and compressed.
//
// Schedule, P ranks, the tensor cut into P owner chunks (aligned to the codec's scale groups)
// and each chunk into pipeline segments:
//   1. Every rank encodes each segment of the chunk rank j owns and sends it straight to j
//      (segments interleaved over owners, each rank starting with the next rank, so every owner
//      gets work at once); its own chunk is encoded too, so every contribution carries the same
//      single quantization. Uncompressed: the input bytes are sent as they are (no copy).
//   2. Owner j, segment by segment as they arrive, decode-accumulates the P contributions in
//      rank order in fp32, divides by P for an average, and re-quantizes the sum once (error
//      feedback optional) -- while later segments are still on the wire.
//   3. All-reduce: the owner sends those codes unchanged to every rank and decodes them itself;
//      every rank decodes the same bytes, so every rank ends bitwise identical, and the error is
//      two quantizations whatever P is. Reduce: the same, to the root only. Reduce-scatter
//      stops after 2 (the owner's sum is rounded to the dtype in its output).
// Bytes sent per rank: (P-1)/P * n * w in step 1 and (P-1) * n/P * w in step 3, w the encoded
// bytes per element: 2 (P-1)/P * n * w, the bandwidth-optimal all-reduce volume.
//
// Latency: two one-way delays. The descriptor exchange is posted, not waited for: every
// receive is posted and step 1 sent at once, and the descriptors (sent first, so they arrive
// with the contributions) are checked before step 2 uses any received byte. What that allows to
// arrive unchecked, and why it is safe:
//   - Step-1 contributions land in scratch and are read only after the check.
//   - Step-3 results may land in place in `out`, which may be the user's input. An owner sends
//     them only after it has checked every descriptor, and a mismatch is symmetric (ours
//     differs from owner j's exactly when j's differs from ours), so results only ever come
//     from an owner whose operation is ours.
//   - Payload of a mismatched operation travels on another tag (tags::payload hashes the
//     operation's shape), so it meets none of our receives, whatever its length, and cannot
//     fail the connection before the descriptor check names the mismatch. (If the 16-bit
//     hashes collide, a length mismatch may fail the connection first; OpRun::wait still names
//     the mismatch when the descriptor is in. The two points above do not rest on the hash.)
// Step 1 updates the error-feedback residual before the check, as any failure after step 1
// would leave it; a mismatch fails the communicator anyway.
//
// The phases, in the order owner_reduce() below runs them (owner_reduce.h; each in its file):
// every receive posted (contributions to this rank's chunk, then other owners' results), step 1
// (owner_reduce_contributions.cc), the descriptor check, step 2 with this owner's part of step 3
// per segment as it is reduced (owner_reduce_chunk.cc: the segment's results leave while the
// next segment's contributions are still arriving, and results already in are decoded while a
// contribution is awaited), then the rest of step 3 (owner_reduce_results.cc).

#include <algorithm>

#include "collectives/arg_checks.h"
#include "collectives/owner_reduce.h"
#include "collectives/reduce_common.h"
#include "collectives/tags.h"

namespace lowcomm::collectives {
StagedOwnerReduce::StagedOwnerReduce(OpRun& run, const ReduceArgs& args, std::vector<Range> chunks,
                                     Finish finish, std::vector<int> group)
    : args_(args), chunks_(std::move(chunks)), o_(run, args_, finish) {
  o_.group = std::move(group);
}

Status StagedOwnerReduce::start() {
  LOWCOMM_CHECK(prepare_owner_reduce(o_, chunks_));
  if (args_.device != nullptr) {
    if (o_.plain || o_.finish.kind == Finish::kToRoot || !o_.group.empty())
      return internal_error(
          "owner reduction: the GPU-codec path takes a flat compressed "
          "all-reduce or reduce-scatter only");
    dev_ = std::make_unique<DeviceCodes>(o_, *args_.device);
    o_.dev = dev_.get();
    LOWCOMM_CHECK(dev_->encode_contributions());
  }
  // Receives first, so arriving data lands in place instead of being buffered.
  contributions_ = post_contribution_receives(o_);
  results_.post_receives(o_);
  LOWCOMM_CHECK(send_contributions(o_, contributions_));
  // Before any received byte is read, and before results leave (see the file comment).
  return o_.run.check_descriptors();
}

Status StagedOwnerReduce::finish() {
  LOWCOMM_CHECK(reduce_own_chunk(o_, contributions_, results_));
  // Step 3: the rest of everyone else's results.
  LOWCOMM_CHECK(results_.take(o_, /*block=*/true));
  return dev_ ? dev_->finish() : Status::ok();
}

// Steps 1 and 2, and 3 (to every rank, or to the root): see the file comment.
Status owner_reduce(OpRun& run, const ReduceArgs& a, const std::vector<Range>& chunks,
                    Finish finish, std::vector<int> group) {
  StagedOwnerReduce r(run, a, chunks, finish, std::move(group));
  LOWCOMM_CHECK(r.start());
  return r.finish();
}

size_t OwnerReduce::max_segs() const {
  size_t m = 0;
  for (const auto& s : segs) m = std::max(m, s.size());
  return m;
}

Status prepare_owner_reduce(OwnerReduce& o, const std::vector<Range>& chunks) {
  const ReduceArgs& a = o.a;
  o.P = o.group.empty() ? o.run.size() : static_cast<int>(o.group.size());
  o.me = o.run.rank();
  if (!o.group.empty()) {
    auto it = std::find(o.group.begin(), o.group.end(), o.run.rank());
    if (it == o.group.end())
      return internal_error("owner reduction: this rank is not in its group");
    o.me = static_cast<int>(it - o.group.begin());
  }
  o.es = dtype_size(a.dtype);
  o.wire = a.codec ? *a.codec : passthrough(codec_dtype(a.dtype) ? a.dtype : DType::kFloat32);
  o.plain = plain_codec(a.codec, a.dtype);
  // Agreed through the descriptor check, or derived from it alike on every rank.
  const uint64_t seg = a.segment_elems ? a.segment_elems : o.run.desc().segment_elems;
  for (const Range& c : chunks) o.segs.push_back(split_segments(c, seg));
  o.mine = chunks[static_cast<size_t>(o.me)];
  o.in = static_cast<const uint8_t*>(a.send);
  o.out = static_cast<uint8_t*>(a.recv);
  o.cpu = o.run.cpu();
  const bool all_gather = o.finish.kind == Finish::kAllGather;
  const bool to_root = o.finish.kind == Finish::kToRoot;
  o.gets_results = all_gather || (to_root && o.me == o.finish.root);
  o.sends_results = all_gather || (to_root && o.me != o.finish.root);
  if (!a.error_feedback_key.empty()) {
    // The sender residual: here, or on the device for the GPU-codec path (DeviceCodes takes
    // it); the owner's is on the host either way (the sum it corrects is).
    if (a.device == nullptr) {
      auto e = o.run.ef().sender(a.error_feedback_key, a.n);
      if (!e) return e.status();
      o.ef = *e;
    }
    if (a.owner_ef) {
      auto r = o.run.ef().owner(a.error_feedback_key, a.n, o.mine.begin, o.mine.count);
      if (!r) return r.status();
      o.owner_residual = *r;
    }
  }
  o.reduce_tag = o.run.payload_tag(tags::kReduce);
  o.gather_tag = o.run.payload_tag(tags::kGather);
  return Status::ok();
}

uint64_t reduce_segment_elems(uint64_t segment_bytes, DType dtype,
                              const std::optional<CodecSpec>& codec, uint64_t chunk_elems) {
  const uint64_t g = granule(codec);
  const uint64_t es = dtype_size(dtype);
  // kSegmentsPerChunk segments per owner chunk, so the owner's results (step 3) start one
  // segment after the first contributions arrive instead of after the whole chunk; at least
  // kMinSegmentBytes (a message per peer per segment), at most segment_bytes.
  const uint64_t hi = std::max<uint64_t>(1, segment_bytes / es);
  const uint64_t lo = std::min(hi, std::max<uint64_t>(1, kMinSegmentBytes / es));
  const uint64_t elems = std::clamp(chunk_elems / kSegmentsPerChunk, lo, hi);
  // Whole scale groups, at least one; at most what the descriptor carries (kMaxSegmentGroups:
  // only a segment_bytes of 4 GiB or more reaches it, and more segments change no result).
  return std::clamp<uint64_t>(elems / g, 1, kMaxSegmentGroups) * g;
}

Status all_reduce(OpRun& run, const ReduceArgs& a) {
  LOWCOMM_CHECK(
      check_all_reduce(a.send, a.recv, a.n, a.dtype, a.op, a.codec, a.error_feedback_key));
  LOWCOMM_CHECK(run.post_descriptors());
  StagedOwnerReduce r(run, a, run.share_chunks(a.n, granule(a.codec)), {Finish::kAllGather, -1},
                      {});
  if (a.device == nullptr) r.report_results();
  LOWCOMM_CHECK(r.start());
  return r.finish();
}

Status reduce(OpRun& run, const ReduceArgs& a, int root) {
  LOWCOMM_CHECK(check_reduce(a.send, a.recv, a.n, a.dtype, a.op, root, run.rank(), run.size(),
                             a.codec, a.error_feedback_key));
  LOWCOMM_CHECK(run.post_descriptors());
  return owner_reduce(run, a, owner_chunks(a.n, run.size(), granule(a.codec)),
                      {Finish::kToRoot, root});
}

Status reduce_scatter(OpRun& run, const ReduceArgs& a) {
  const uint64_t rc = a.n / static_cast<uint64_t>(run.size());
  LOWCOMM_CHECK(check_reduce_scatter(a.send, a.recv, rc, a.dtype, a.op, run.size(), a.codec,
                                     a.error_feedback_key));
  LOWCOMM_CHECK(run.post_descriptors());
  std::vector<Range> chunks;
  for (int j = 0; j < run.size(); ++j) chunks.push_back({rc * static_cast<uint64_t>(j), rc});
  return owner_reduce(run, a, chunks, {Finish::kScatter, -1});
}

}  // namespace lowcomm::collectives
