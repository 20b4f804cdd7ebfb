// The owner all-reduce of Random-k on shared positions.
//
// Every rank keeps the same K of every C elements: randk's positions follow (seed, step), never
// the rank (randk_positions). So the P messages are P dense vectors over one set of n' kept
// elements, and the owner reduction (owner_reduce.cc) can run on that vector instead of every
// message going to every rank (gather-all, one_hop_reduce.cc):
//   1. The positions, once per call. With error feedback, y = x + r over the whole tensor: the
//      kept elements are copied into v (n' floats) and every other element keeps β·y as its
//      residual.
//   2. The owner all-reduce of v with the dense codec q<B> (absmax, blocks of 128 kept values,
//      round to nearest): each contribution quantized once, each owner's fp32 sum once more
//      (two quantizations, as every owner reduction), the same bits on every rank. The kept
//      elements' residual is β·(v - D(Q(v))), from codes encoded here exactly as the
//      contribution's (nearest rounding: a function of v and the block alone).
//   3. The output: zero, and the reduced v at the positions.
// Per rank: 2(P-1)/P·m bytes (m: v's codes) and two one-way delays, against gather-all's
// (P-1)·m' and one, and the positions drawn once instead of once per message decoded. Which of
// the two runs is the communicator's choice (AllReduceOptions::sparse_schedule, docs/sparse.md).
//
// A chunk of C whose y holds a non-finite element sends NaN at its kept positions and resets its
// residual, as the randk codec does; the NaN then spreads over the q<B> block of 128 kept values
// that holds it (a block may span chunks).

#include <cmath>
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/arg_checks.h"
#include "collectives/owner_reduce.h"
#include "collectives/reduce_common.h"
#include "core/thread_pool.h"

namespace lowcomm::collectives {

CodecSpec shared_positions_codec(const CodecSpec& randk) {
  CodecSpec d;
  d.kind = CodecKind::kAbsmax;
  d.bits = randk.bits;
  d.grouping = Grouping::kBlock;
  d.block = kDefaultBlock;
  d.rounding = Rounding::kNearest;
  d.ef_decay = randk.ef_decay;
  return d;
}

bool can_share_positions(const std::optional<CodecSpec>& codec, DType dtype, ReduceOp op) {
  return codec && codec->kind == CodecKind::kRandk && dtype == DType::kFloat32 &&
         (op == ReduceOp::kSum || op == ReduceOp::kAverage);
}

Status shared_positions_all_reduce(OpRun& run, const ReduceArgs& a) {
  LOWCOMM_CHECK(
      check_all_reduce(a.send, a.recv, a.n, a.dtype, a.op, a.codec, a.error_feedback_key));
  if (!can_share_positions(a.codec, a.dtype, a.op))
    return internal_error("the shared-positions all-reduce takes a randk fp32 sum or average");
  LOWCOMM_CHECK(run.post_descriptors());
  const CodecSpec& spec = *a.codec;
  const CodecSpec dense = shared_positions_codec(spec);
  const uint64_t n = a.n, C = spec.block;
  const uint64_t kept = sparse_layout(spec, n).kept;
  const CpuOptions cpu = run.cpu();
  const auto* x = static_cast<const float*>(a.send);
  auto* out = static_cast<float*>(a.recv);

  auto* pos = reinterpret_cast<uint64_t*>(run.scratch(kept * sizeof(uint64_t)));
  auto* v = reinterpret_cast<float*>(run.scratch(kept * sizeof(float)));
  auto* reduced = reinterpret_cast<float*>(run.scratch(kept * sizeof(float)));
  {
    ScopedTimer t(run.counters().encode);
    // The seed one_hop_all_reduce gives randk: the same on every rank.
    LOWCOMM_CHECK(randk_positions(spec, n, rounding_seed(a.seed, a.step, 0, 2), pos, cpu));
    float* r = nullptr;
    if (!a.error_feedback_key.empty()) {
      auto e = run.ef().sender(a.error_feedback_key, n);
      if (!e) return e.status();
      r = (*e)->sender.data();
    }
    const float decay = spec.ef_decay;
    // Chunk by chunk over the codec pool (each chunk's y stays in cache between its passes).
    const uint64_t chunks = (n + C - 1) / C;
    const uint64_t per_task = std::max<uint64_t>(1, (uint64_t{1} << 16) / C);
    ThreadPool::global().parallel_for(
        (chunks + per_task - 1) / per_task, cpu.threads, [&](uint64_t task) {
          for (uint64_t c = task * per_task; c < std::min(chunks, (task + 1) * per_task); ++c) {
            const uint64_t begin = c * C, len = std::min(C, n - begin);
            const uint64_t k0 = c * spec.keep, k1 = std::min(kept, k0 + spec.keep);
            bool finite = true;
            if (r) {
              for (uint64_t i = begin; i < begin + len; ++i) {
                const float y = x[i] + r[i];
                finite &= std::isfinite(y);
                r[i] = y;
              }
            } else {
              for (uint64_t i = begin; i < begin + len; ++i) finite &= std::isfinite(x[i]);
            }
            const float* y = r ? r : x;
            for (uint64_t k = k0; k < k1; ++k) v[k] = finite ? y[pos[k]] : std::nanf("");
            if (!r) continue;
            if (!finite) {
              std::memset(r + begin, 0, len * sizeof(float));
            } else if (decay != 1.0f) {
              for (uint64_t i = begin; i < begin + len; ++i) r[i] *= decay;
            }
          }
        });
    if (r && kept > 0) {
      // The kept elements' residual, from the codes the contribution will carry.
      auto* res = reinterpret_cast<float*>(run.scratch(kept * sizeof(float)));
      std::memset(res, 0, kept * sizeof(float));
      const uint64_t bytes = encoded_size(dense, kept);
      LOWCOMM_CHECK(encode_error_feedback(dense, DType::kFloat32, v, res, kept, run.scratch(bytes),
                                          bytes, {}, cpu));
      for (uint64_t k = 0; k < kept; ++k) r[pos[k]] = res[k];
    }
  }

  ReduceArgs b = a;
  b.send = v;
  b.recv = reduced;
  b.n = kept;
  b.codec = dense;
  b.error_feedback_key.clear();
  b.owner_ef = false;
  // The descriptor's segment (whole chunks of C) in kept elements, at least the owner
  // reduction's least segment (kMinSegmentBytes of input: fewer, larger messages), on the q<B>
  // blocks; from agreed values only, so every rank cuts alike.
  const uint64_t seg = std::max(std::max<uint64_t>(run.desc().segment_elems / C, 1) * spec.keep,
                                kMinSegmentBytes / sizeof(float));
  b.segment_elems = (seg + dense.block - 1) / dense.block * dense.block;
  OpCounters& counters = run.counters();
  const uint64_t payload0 = counters.payload_sent, plain0 = counters.uncompressed_sent;
  // Equal owner chunks: shares follow link rates measured on large flat all-reduces, which
  // this small one neither needs nor feeds.
  const int P = run.size();
  LOWCOMM_CHECK(
      owner_reduce(run, b, owner_chunks(kept, P, granule(b.codec)), {Finish::kAllGather, -1}));
  // What the same schedule sends uncompressed is the whole tensor's owner reduction.
  if (kept > 0)
    counters.uncompressed_sent =
        plain0 + static_cast<uint64_t>(static_cast<double>(counters.uncompressed_sent - plain0) *
                                       static_cast<double>(n) / static_cast<double>(kept));
  if (P > 1) {
    // Of the payload, the value codes (the rest are q<B>'s block scales).
    const double values = static_cast<double>(dense.block) * dense.bits / 8.0;
    const double frac = values / static_cast<double>(encoded_size(dense, dense.block));
    counters.value_sent +=
        static_cast<uint64_t>(static_cast<double>(counters.payload_sent - payload0) * frac);
    counters.kept_sent += kept;
    counters.elements_sent += n;
  }

  std::memset(out, 0, n * sizeof(float));
  for (uint64_t k = 0; k < kept; ++k) out[pos[k]] = reduced[k];
  return Status::ok();
}

}  // namespace lowcomm::collectives
