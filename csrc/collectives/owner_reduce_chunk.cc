// Step 2 of the owner reduction (owner_reduce.cc has the schedule): owner j reduces its chunk,
// segment by segment, as the contributions arrive, while later segments are still on the wire.
//
// Each segment: the P contributions folded in rank order (whatever order they arrive in, so
// every owner's sum is a pure function of the inputs); floating-point SUM and AVG (the only
// reductions a codec takes) decode-accumulate in fp32 from +0, everything else is an exact
// typed reduction of the plain bytes (collectives/reduce_kernels.h). Then the sum is divided by
// P for an average and either rounded once to the dtype (reduce-scatter, and the uncompressed
// all-reduce and reduce) or re-quantized once for step 3 (owner error feedback optional), and
// handed to step 3 at once. While a contribution is not yet here, results of other owners that
// are get decoded (Results::take), so waits overlap the result decodes.

#include <algorithm>
#include <cstring>
#include <optional>

#include "collectives/owner_reduce.h"
#include "collectives/reduce_common.h"
#include "collectives/reduce_kernels.h"

namespace lowcomm::collectives {
namespace {

// The accumulator of one segment, reused for every segment of the chunk.
struct Accumulator {
  bool fp32_sum = false;  // decode-accumulate in fp32 (else an exact typed reduction)
  uint8_t* bytes = nullptr;
  float* widen = nullptr;  // bf16/fp16 exact reductions: the contribution widened to fp32
  float* fp32() const { return reinterpret_cast<float*>(bytes); }
};

Accumulator make_accumulator(const OwnerReduce& o) {
  const ReduceArgs& a = o.a;
  Accumulator acc;
  acc.fp32_sum = codec_dtype(a.dtype) && (a.op == ReduceOp::kSum || a.op == ReduceOp::kAverage);
  uint64_t max_seg = 0;
  for (const Range& s : o.my_segs()) max_seg = std::max(max_seg, s.count);
  acc.bytes = o.run.scratch(max_seg * dtype_size(acc_dtype(a.dtype)));
  if (!acc.fp32_sum && acc_dtype(a.dtype) != a.dtype)
    acc.widen = reinterpret_cast<float*>(o.run.scratch(max_seg * sizeof(float)));
  return acc;
}

// Folds the P contributions to segment k into acc in rank order, waiting for each.
Status accumulate_segment(const OwnerReduce& o, Contributions& c, Results& results,
                          const Accumulator& acc, size_t k) {
  const ReduceArgs& a = o.a;
  const Range s = o.my_segs()[k];
  if (acc.fp32_sum) std::memset(acc.bytes, 0, s.count * sizeof(float));
  for (int r = 0; r < o.P; ++r) {
    const uint8_t* codes = r == o.me ? c.own[k] : c.codes[r][k];
    if (r != o.me && !o.plain && !c.requests[r][k].test())
      LOWCOMM_CHECK(results.take(o, /*block=*/false));
    if (r != o.me) LOWCOMM_CHECK(o.run.wait(c.requests[r][k]));
    if (!acc.fp32_sum) {
      if (r == 0) {
        reduce_first(a.dtype, acc.bytes, codes, s.count);
      } else {
        reduce_next(a.dtype, a.op, acc.bytes, codes, s.count, acc.widen);
      }
      continue;
    }
    // Uncompressed, this is the reduction itself, not a decode.
    std::optional<ScopedTimer> t;
    if (!o.plain) t.emplace(o.run.counters().decode);
    LOWCOMM_CHECK(decode_accumulate(o.wire, codes, o.bytes(s.count), s.count, DType::kFloat32,
                                    acc.fp32(), o.cpu));
  }
  return Status::ok();
}

// Where segment s's rounded result goes: the output (the root's, for a reduce), or scratch on a
// non-root owner of a reduce, whose output is not there.
uint8_t* result_place(const OwnerReduce& o, Range s) {
  if (o.finish.kind == Finish::kScatter) {
    uint8_t* slice = o.dev != nullptr ? o.dev->scatter_out() : o.out;  // device: pinned, sent up
    return slice + (s.begin - o.mine.begin) * o.es;
  }
  if (o.dev != nullptr) return nullptr;  // unused: the results are codes, decoded on the device
  if (o.gets_results) return o.out + s.begin * o.es;
  return o.run.scratch(s.count * o.es);
}

// Finishes segment s's reduction into dst; *res: the bytes step 3 sends (dst itself, or the
// owner's re-quantized codes in scratch).
Status finish_segment(const OwnerReduce& o, const Accumulator& acc, Range s, uint8_t* dst,
                      const uint8_t** res) {
  const ReduceArgs& a = o.a;
  *res = dst;
  if (!acc.fp32_sum) {
    reduce_finish(a.dtype, a.op, o.P, acc.bytes, dst, s.count);  // plain: the result is dst
    return Status::ok();
  }
  float* sum = acc.fp32();
  if (a.op == ReduceOp::kAverage) {
    const auto div = static_cast<float>(o.P);
    for (uint64_t i = 0; i < s.count; ++i) sum[i] /= div;
  }
  if (o.finish.kind == Finish::kScatter || o.plain) {  // round the sum into dst
    const CodecSpec dtype_out = passthrough(codec_dtype(a.dtype) ? a.dtype : DType::kFloat32);
    return encode(dtype_out, DType::kFloat32, sum, s.count, dst, s.count * o.es, {}, o.cpu);
  }
  uint8_t* b = o.run.scratch(o.bytes(s.count));
  RoundingKey key{rounding_seed(a.seed, a.step, o.me, 2), s.begin};
  ScopedTimer t(o.run.counters().encode);
  if (o.owner_residual) {
    LOWCOMM_CHECK(encode_error_feedback(o.wire, DType::kFloat32, sum,
                                        o.owner_residual + (s.begin - o.mine.begin), s.count, b,
                                        o.bytes(s.count), key, o.cpu));
  } else {
    LOWCOMM_CHECK(encode(o.wire, DType::kFloat32, sum, s.count, b, o.bytes(s.count), key, o.cpu));
  }
  *res = b;
  return Status::ok();
}

}  // namespace

Status reduce_own_chunk(const OwnerReduce& o, Contributions& c, Results& results) {
  const Accumulator acc = make_accumulator(o);
  for (size_t k = 0; k < o.my_segs().size(); ++k) {
    const Range s = o.my_segs()[k];
    LOWCOMM_CHECK(accumulate_segment(o, c, results, acc, k));
    uint8_t* dst = result_place(o, s);
    const uint8_t* res = nullptr;
    LOWCOMM_CHECK(finish_segment(o, acc, s, dst, &res));
    if (o.finish.kind == Finish::kScatter) continue;  // the result is in place: no step 3
    LOWCOMM_CHECK(results.send_own(o, s, res, dst));
  }
  return Status::ok();
}

}  // namespace lowcomm::collectives
