// The one-hop all-reduce, for small tensors on long links (CommOptions::direct_bytes).
//
// Schedule: every rank encodes its whole tensor once (error feedback optional: the sender
// residual, as in the owner reduction) and sends the codes to every other rank; every rank
// decode-accumulates the P contributions in rank order in fp32, divides by P for an average and
// rounds once to the dtype. Every rank reduces the same bytes in the same order, so every rank
// ends bitwise identical; the error is one quantization per contribution (the owner reduction
// has a second, the owners' re-quantization). Uncompressed, the arithmetic is the owner
// reduction's (rank order, fp32, one rounding): the same bits.
//
// Cost: one one-way delay (the owner reduction takes two), (P-1)·n·w bytes sent per rank
// (instead of 2(P-1)/P·n·w). A trainer that all-reduces each parameter synchronously pays the
// delay once per tensor, so for tensors below the bandwidth-delay product this halves its time.
//
// The sparse codecs (topk, randk) always take this schedule, whatever the size: the union of P
// sparse messages is not sparse, so an owner could only re-sparsify it (a second lossy step);
// here each rank's message reaches every rank and every element is quantized once (SparseLoCo's
// aggregation). Random-k draws its positions from a seed every rank derives alike from
// (seed, step), so the P messages keep the same positions.
//
// CUDA buffers (ReduceArgs::device): the tensor is encoded on the device and only its codes
// cross to the host; the sum is formed here and the caller copies the output up (so a compressed
// one-hop all-reduce moves encoded bytes down and the dtype's bytes up).
//
// As in the owner reduction, the descriptors are posted with the payload and checked before any
// received byte is read; contributions land in scratch; the input is copied before it is sent
// when it is also the output (a send may still be reading it when the result is written).

#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/arg_checks.h"
#include "collectives/device_op.h"
#include "collectives/reduce_common.h"
#include "collectives/reduce_kernels.h"
#include "collectives/tags.h"

namespace lowcomm::collectives {

Status one_hop_all_reduce(OpRun& run, const ReduceArgs& a) {
  LOWCOMM_CHECK(
      check_all_reduce(a.send, a.recv, a.n, a.dtype, a.op, a.codec, a.error_feedback_key));
  LOWCOMM_CHECK(run.post_descriptors());
  const int P = run.size(), me = run.rank();
  const uint64_t es = dtype_size(a.dtype);
  const bool plain = plain_codec(a.codec, a.dtype);
  const CodecSpec wire =
      a.codec ? *a.codec : passthrough(codec_dtype(a.dtype) ? a.dtype : DType::kFloat32);
  const uint64_t bytes = plain ? a.n * es : encoded_size(wire, a.n);
  const uint64_t tag = run.payload_tag(tags::kReduce);
  const CpuOptions cpu = run.cpu();

  std::vector<uint8_t*> codes(static_cast<size_t>(P), nullptr);
  std::vector<transport::Request> req(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    if (r == me) continue;
    codes[r] = run.scratch(bytes);
    req[r] = run.irecv(r, tag, codes[r], bytes);
  }

  uint8_t* own = run.scratch(bytes);
  if (plain) {
    std::memcpy(own, a.send, bytes);
  } else {
    // Random-k's positions: the same on every rank (the rank is left out of the seed).
    const bool shared = wire.kind == CodecKind::kRandk;
    RoundingKey key{rounding_seed(a.seed, a.step, shared ? 0 : me, shared ? 2 : 1), 0};
    ScopedTimer t(run.counters().encode);
    if (a.device != nullptr) {
      // CUDA buffers (device_op.h): encoded on the device, only the codes copied here; the
      // output (a.recv) is pinned host memory the caller copies up.
      LOWCOMM_CHECK(encode_on_device(*a.device, run.ef(), a.error_feedback_key, wire, a.dtype,
                                     a.send, a.n, own, bytes, key));
    } else if (!a.error_feedback_key.empty()) {
      auto e = run.ef().sender(a.error_feedback_key, a.n);
      if (!e) return e.status();
      LOWCOMM_CHECK(encode_error_feedback(wire, a.dtype, a.send, (*e)->sender.data(), a.n, own,
                                          bytes, key, cpu));
    } else {
      LOWCOMM_CHECK(encode(wire, a.dtype, a.send, a.n, own, bytes, key, cpu));
    }
  }
  codes[me] = own;
  for (int d = 1; d < P; ++d) run.isend((me + d) % P, tag, own, bytes, a.n * es);
  if (wire.sparse() && P > 1) {
    const SparseLayout l = sparse_layout(wire, a.n);
    const auto peers = static_cast<uint64_t>(P - 1);
    run.counters().index_sent += peers * l.index_bytes;
    run.counters().value_sent += peers * l.value_bytes;
    run.counters().kept_sent += peers * l.kept;
    run.counters().elements_sent += peers * a.n;
  }

  LOWCOMM_CHECK(run.check_descriptors());

  const bool fp32_sum =
      codec_dtype(a.dtype) && (a.op == ReduceOp::kSum || a.op == ReduceOp::kAverage);
  // A sparse message's sum in fp32 accumulates in the output itself: the input was read (encoded)
  // before anything is written, and every send reads the encoded copy. Saves a pass over the
  // tensor (the copy out of scratch), where the dense messages' decode is the larger cost.
  const bool in_output = fp32_sum && a.dtype == DType::kFloat32 && wire.sparse();
  uint8_t* acc_bytes =
      in_output ? static_cast<uint8_t*>(a.recv) : run.scratch(a.n * dtype_size(acc_dtype(a.dtype)));
  auto* acc = reinterpret_cast<float*>(acc_bytes);
  float* widen = !fp32_sum && acc_dtype(a.dtype) != a.dtype
                     ? reinterpret_cast<float*>(run.scratch(a.n * sizeof(float)))
                     : nullptr;
  if (fp32_sum) std::memset(acc, 0, a.n * sizeof(float));
  for (int r = 0; r < P; ++r) {
    if (r != me) LOWCOMM_CHECK(run.wait(req[r]));
    if (!fp32_sum) {
      if (r == 0) {
        reduce_first(a.dtype, acc_bytes, codes[r], a.n);
      } else {
        reduce_next(a.dtype, a.op, acc_bytes, codes[r], a.n, widen);
      }
      continue;
    }
    std::optional<ScopedTimer> t;
    if (!plain) t.emplace(run.counters().decode);
    LOWCOMM_CHECK(decode_accumulate(wire, codes[r], bytes, a.n, DType::kFloat32, acc, cpu));
  }
  auto* out = static_cast<uint8_t*>(a.recv);
  if (!fp32_sum) {
    reduce_finish(a.dtype, a.op, P, acc_bytes, out, a.n);
    return Status::ok();
  }
  if (a.op == ReduceOp::kAverage) {
    const auto div = static_cast<float>(P);
    for (uint64_t i = 0; i < a.n; ++i) acc[i] /= div;
  }
  if (in_output) return Status::ok();
  return encode(passthrough(codec_dtype(a.dtype) ? a.dtype : DType::kFloat32), DType::kFloat32, acc,
                a.n, out, a.n * es, {}, cpu);
}

}  // namespace lowcomm::collectives
