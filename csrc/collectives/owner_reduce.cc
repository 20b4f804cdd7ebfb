// The owner reduction: all-reduce (plain and compressed) and reduce-scatter.
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
//      two quantizations whatever P is. Reduce-scatter stops after 2 (the owner's sum is
//      rounded to the dtype in its output).
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

#include <algorithm>
#include <cstring>
#include <optional>

#include "collectives/algorithms.h"
#include "collectives/arg_checks.h"
#include "collectives/partition.h"
#include "collectives/reduce_common.h"
#include "collectives/reduce_kernels.h"
#include "collectives/tags.h"

namespace lowcomm::collectives {
namespace {

struct Plan {
  CodecSpec wire;      // what crosses the network (a non-codec dtype's plain bytes: unused)
  bool plain = false;  // the input dtype itself: send input bytes, no encode
  std::vector<std::vector<Range>> segs;  // by owner
  uint64_t es = 0;
  uint64_t bytes(uint64_t count) const { return plain ? count * es : encoded_size(wire, count); }
};

Plan make_plan(OpRun& run, const ReduceArgs& a, const std::vector<Range>& chunks) {
  Plan p;
  p.es = dtype_size(a.dtype);
  p.wire = a.codec ? *a.codec : passthrough(codec_dtype(a.dtype) ? a.dtype : DType::kFloat32);
  p.plain = plain_codec(a.codec, a.dtype);
  uint64_t seg = run.desc().tag;  // reduce_segment_elems, agreed through the descriptor
  for (const Range& c : chunks) p.segs.push_back(split_segments(c, seg));
  return p;
}

// Where the owners' results go after step 2.
struct Finish {
  enum Kind { kScatter, kAllGather, kToRoot } kind = kAllGather;
  int root = -1;  // kToRoot
};

// Steps 1 and 2, and 3 (to every rank, or to the root): see the file comment.
Status owner_reduce(OpRun& run, const ReduceArgs& a, const std::vector<Range>& chunks,
                    Finish finish) {
  const int P = run.size(), me = run.rank();
  const bool all_gather = finish.kind == Finish::kAllGather;
  const bool to_root = finish.kind == Finish::kToRoot;
  // Whether this rank receives other owners' results, and whether it sends its own (and to whom).
  const bool gets_results = all_gather || (to_root && me == finish.root);
  const bool sends_results = all_gather || (to_root && me != finish.root);
  Plan plan = make_plan(run, a, chunks);
  const auto* in = static_cast<const uint8_t*>(a.send);
  auto* out = static_cast<uint8_t*>(a.recv);
  const Range mine = chunks[me];
  const auto& my_segs = plan.segs[me];
  const CpuOptions cpu = run.cpu();

  ErrorFeedbackEntry* ef = nullptr;
  float* owner_residual = nullptr;
  if (!a.ef_key.empty()) {
    auto e = run.ef().sender(a.ef_key, a.n);
    if (!e) return e.status();
    ef = *e;
    if (a.owner_ef) {
      auto o = run.ef().owner(a.ef_key, a.n, mine.begin, mine.count);
      if (!o) return o.status();
      owner_residual = *o;
    }
  }

  const uint64_t reduce_tag = run.payload_tag(tags::kReduce);
  const uint64_t gather_tag = run.payload_tag(tags::kGather);

  // Receives first, so arriving data lands in place instead of being buffered.
  std::vector<std::vector<uint8_t*>> contrib(P);  // [rank][segment] codes of my chunk
  std::vector<std::vector<transport::Request>> contrib_req(P);
  for (int r = 0; r < P; ++r) {
    if (r == me) continue;
    for (const Range& s : my_segs) {
      uint8_t* b = run.scratch(plan.bytes(s.count));
      contrib[r].push_back(b);
      contrib_req[r].push_back(run.irecv(r, reduce_tag, b, plan.bytes(s.count)));
    }
  }
  std::vector<std::vector<uint8_t*>> results(P);  // [owner][segment] codes of owner's chunk
  std::vector<std::vector<transport::Request>> result_req(P);
  if (gets_results) {
    for (int j = 0; j < P; ++j) {
      if (j == me) continue;
      for (const Range& s : plan.segs[j]) {
        uint8_t* b = plan.plain ? out + s.begin * plan.es : run.scratch(plan.bytes(s.count));
        results[j].push_back(b);
        result_req[j].push_back(run.irecv(j, gather_tag, b, plan.bytes(s.count)));
      }
    }
  }

  // Step 1: contributions, segment-major so every owner's first segment leaves early.
  const uint64_t send_seed = rounding_seed(a.seed, a.step, me, 1);
  std::vector<const uint8_t*> own_codes(my_segs.size());
  size_t max_segs = 0;
  for (const auto& s : plan.segs) max_segs = std::max(max_segs, s.size());
  for (size_t k = 0; k < max_segs; ++k) {
    for (int d = 1; d <= P; ++d) {
      const int j = (me + d) % P;  // own chunk last: it is not on the wire
      if (k >= plan.segs[j].size()) continue;
      const Range s = plan.segs[j][k];
      const uint8_t* src = in + s.begin * plan.es;
      const uint8_t* codes = src;
      if (!plan.plain) {
        uint8_t* b = run.scratch(plan.bytes(s.count));
        RoundingKey key{send_seed, s.begin};
        ScopedTimer t(run.counters().encode);
        if (ef) {
          LOWCOMM_CHECK(encode_error_feedback(plan.wire, a.dtype, src, ef->sender.data() + s.begin,
                                              s.count, b, plan.bytes(s.count), key, cpu));
        } else {
          LOWCOMM_CHECK(encode(plan.wire, a.dtype, src, s.count, b, plan.bytes(s.count), key, cpu));
        }
        codes = b;
      }
      if (j == me) {
        own_codes[k] = codes;
      } else {
        run.isend(j, reduce_tag, codes, plan.bytes(s.count), s.count * plan.es);
      }
    }
  }

  // Before any received byte is read, and before results leave (see the file comment).
  LOWCOMM_CHECK(run.check_descriptors());

  // Step 3, the decodes of other owners' results, in the order they are expected; done as they
  // arrive, between the segments of step 2 and while it waits, so the end of the operation is
  // not one long decode of everything (on a busy host that tail was ~10% of a q4 all-reduce).
  std::vector<std::pair<int, size_t>> result_order;
  if (gets_results) {
    for (size_t k = 0; k < max_segs; ++k)
      for (int d = 1; d < P; ++d)
        if (k < plan.segs[(me + d) % P].size()) result_order.emplace_back((me + d) % P, k);
  }
  std::vector<bool> result_done(result_order.size(), false);
  size_t results_left = result_order.size();
  auto take_results = [&](bool block) -> Status {
    for (size_t i = 0; i < result_order.size() && results_left > 0; ++i) {
      if (result_done[i]) continue;
      const auto [j, k] = result_order[i];
      if (!block && !result_req[j][k].test()) continue;
      LOWCOMM_CHECK(run.wait(result_req[j][k]));
      result_done[i] = true;
      --results_left;
      if (plan.plain) continue;  // received in place
      const Range s = plan.segs[j][k];
      ScopedTimer t(run.counters().decode);
      LOWCOMM_CHECK(decode(plan.wire, results[j][k], plan.bytes(s.count), s.count, a.dtype,
                           out + s.begin * plan.es, cpu));
    }
    return Status::ok();
  };

  // Step 2: reduce my chunk, segment by segment, as contributions arrive. Floating-point SUM
  // and AVG (the only reductions a codec takes) decode-accumulate in fp32; everything else is
  // an exact typed reduction of the plain bytes (collectives/reduce_kernels.h).
  const bool fp32_sum =
      codec_dtype(a.dtype) && (a.op == ReduceOp::kSum || a.op == ReduceOp::kAverage);
  const CodecSpec dtype_out = passthrough(codec_dtype(a.dtype) ? a.dtype : DType::kFloat32);
  const uint64_t owner_seed = rounding_seed(a.seed, a.step, me, 2);
  uint64_t max_seg = 0;
  for (const Range& s : my_segs) max_seg = std::max(max_seg, s.count);
  // One accumulator and (bf16/fp16 exact reductions) one widening buffer, reused.
  uint8_t* acc_bytes = run.scratch(max_seg * dtype_size(acc_dtype(a.dtype)));
  auto* acc = reinterpret_cast<float*>(acc_bytes);
  float* widen = !fp32_sum && acc_dtype(a.dtype) != a.dtype
                     ? reinterpret_cast<float*>(run.scratch(max_seg * sizeof(float)))
                     : nullptr;
  for (size_t k = 0; k < my_segs.size(); ++k) {
    const Range s = my_segs[k];
    if (fp32_sum) std::memset(acc, 0, s.count * sizeof(float));
    for (int r = 0; r < P; ++r) {
      const uint8_t* codes = r == me ? own_codes[k] : contrib[r][k];
      if (r != me && !plan.plain && !contrib_req[r][k].test()) LOWCOMM_CHECK(take_results(false));
      if (r != me) LOWCOMM_CHECK(run.wait(contrib_req[r][k]));
      if (!fp32_sum) {
        if (r == 0) {
          reduce_first(a.dtype, acc_bytes, codes, s.count);
        } else {
          reduce_next(a.dtype, a.op, acc_bytes, codes, s.count, widen);
        }
        continue;
      }
      // Uncompressed, this is the reduction itself, not a decode.
      std::optional<ScopedTimer> t;
      if (!plan.plain) t.emplace(run.counters().decode);
      LOWCOMM_CHECK(decode_accumulate(plan.wire, codes, plan.bytes(s.count), s.count,
                                      DType::kFloat32, acc, cpu));
    }
    // Where the rounded result goes: the output (the root's, for a reduce), or scratch on a
    // non-root owner of a reduce, whose output is not there.
    uint8_t* dst = finish.kind == Finish::kScatter ? out + (s.begin - mine.begin) * plan.es
                   : gets_results                  ? out + s.begin * plan.es
                                                   : run.scratch(s.count * plan.es);
    const uint8_t* res = dst;
    if (!fp32_sum) {
      reduce_finish(a.dtype, a.op, P, acc_bytes, dst, s.count);  // plain: the result is dst
    } else {
      if (a.op == ReduceOp::kAverage) {
        const auto div = static_cast<float>(P);
        for (uint64_t i = 0; i < s.count; ++i) acc[i] /= div;
      }
      if (finish.kind == Finish::kScatter || plan.plain) {  // round the sum into dst
        LOWCOMM_CHECK(
            encode(dtype_out, DType::kFloat32, acc, s.count, dst, s.count * plan.es, {}, cpu));
      } else {
        uint8_t* b = run.scratch(plan.bytes(s.count));
        RoundingKey key{owner_seed, s.begin};
        ScopedTimer t(run.counters().encode);
        if (owner_residual) {
          LOWCOMM_CHECK(encode_error_feedback(plan.wire, DType::kFloat32, acc,
                                              owner_residual + (s.begin - mine.begin), s.count, b,
                                              plan.bytes(s.count), key, cpu));
        } else {
          LOWCOMM_CHECK(
              encode(plan.wire, DType::kFloat32, acc, s.count, b, plan.bytes(s.count), key, cpu));
        }
        res = b;
      }
    }
    if (finish.kind == Finish::kScatter) continue;
    if (all_gather) {
      for (int d = 1; d < P; ++d)
        run.isend((me + d) % P, gather_tag, res, plan.bytes(s.count), s.count * plan.es);
    } else if (sends_results) {
      run.isend(finish.root, gather_tag, res, plan.bytes(s.count), s.count * plan.es);
    }
    // The owner decodes the very bytes it sent, like everyone else (a reduce: the root only).
    if (!plan.plain && gets_results) {
      ScopedTimer t(run.counters().decode);
      LOWCOMM_CHECK(decode(plan.wire, res, plan.bytes(s.count), s.count, a.dtype, dst, cpu));
    }
  }

  // Step 3: the rest of everyone else's results.
  return take_results(true);
}

}  // namespace

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
  return std::max<uint64_t>(g, elems / g * g);
}

Status all_reduce(OpRun& run, const ReduceArgs& a) {
  LOWCOMM_CHECK(check_all_reduce(a.send, a.recv, a.n, a.dtype, a.op, a.codec, a.ef_key));
  LOWCOMM_CHECK(run.post_descriptors());
  return owner_reduce(run, a, owner_chunks(a.n, run.size(), granule(a.codec)),
                      {Finish::kAllGather, -1});
}

Status reduce(OpRun& run, const ReduceArgs& a, int root) {
  LOWCOMM_CHECK(check_reduce(a.send, a.recv, a.n, a.dtype, a.op, root, run.rank(), run.size(),
                             a.codec, a.ef_key));
  LOWCOMM_CHECK(run.post_descriptors());
  return owner_reduce(run, a, owner_chunks(a.n, run.size(), granule(a.codec)),
                      {Finish::kToRoot, root});
}

Status reduce_scatter(OpRun& run, const ReduceArgs& a) {
  const uint64_t rc = a.n / static_cast<uint64_t>(run.size());
  LOWCOMM_CHECK(
      check_reduce_scatter(a.send, a.recv, rc, a.dtype, a.op, run.size(), a.codec, a.ef_key));
  LOWCOMM_CHECK(run.post_descriptors());
  std::vector<Range> chunks;
  for (int j = 0; j < run.size(); ++j) chunks.push_back({rc * static_cast<uint64_t>(j), rc});
  return owner_reduce(run, a, chunks, {Finish::kScatter, -1});
}

}  // namespace lowcomm::collectives
