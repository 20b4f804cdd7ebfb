// Communicator: the public C++ API; builds each operation's descriptor and hands the algorithm
// to CommImpl's executor.

#include "lowcomm/communicator.h"
#include "collectives/work_state.h"

#include <cstring>
#include <functional>

#include "collectives/algorithms.h"
#include "collectives/arg_checks.h"
#include "collectives/comm_impl.h"
#include "collectives/device_op.h"
#include "collectives/tags.h"
#include "core/fnv1a.h"
#include "topology/partition.h"

namespace lowcomm {

using collectives::OpDescriptor;
using collectives::OpKind;
using collectives::OpRun;

using collectives::check_all_gather;
using collectives::check_all_reduce;
using collectives::check_broadcast;
using collectives::check_p2p;
using collectives::check_recv_any;
using collectives::check_reduce_scatter;

namespace {

// A call whose arguments are wrong on this rank alone (collectives/arg_checks.h): refused before
// a sequence number is taken, so the other ranks never hear of it and the group stays usable.
Work refused(Status why) {
  return Work(WorkState::refused(std::move(why)));
}

// A CUDA call this rank cannot set up for a reason of its own (no device runtime, a failed
// runtime call or allocation, a pinned pool too small for it): the other ranks make the call, so
// refusing it here would leave them waiting for it in vain and match this rank's next call of
// the same shape against it. Instead it takes its sequence number and fails in turn, latching
// the communicator and telling every peer why, so the call fails on every rank naming this
// rank and the reason. Wrong arguments (kInvalidArgument: host memory passed as device memory,
// buffers on two devices, a stream being captured) are refused as every other argument error,
// and so is a process with no device runtime at all (kUnsupported: a build without CUDA, no
// driver or no device, which a job's ranks share; the C API's lowcommUnsupported, as NCCL's).
Work refuse_or_fail(CommImpl& impl, OpKind kind, uint64_t count, DType dtype, Status why) {
  if (why.code() == StatusCode::kInvalidArgument || !impl.device_context())
    return refused(std::move(why));
  OpDescriptor d;
  d.kind = kind;
  d.count = count;
  d.dtype = dtype;
  Status s(why.code(), "refused on this rank (so failed on every rank): " + why.message());
  return impl.submit_collective(d, [s](OpRun&) { return s; });
}

// The compression policy of this communicator (decide_compression).
CompressionPolicy policy_of(const CommImpl& impl) {
  return CompressionPolicy{impl.options().codec, impl.options().codec_min_bytes};
}

// What all_reduce, reduce_scatter and reduce share once their arguments are checked: the
// descriptor (a plain spec dropped, so "none" on one rank and no codec on another agree; the
// segment size from the owner chunk) and the algorithm's arguments, the rounding step taken
// from the sequence number when the call names none.
// An all-reduce may take the one-hop algorithm instead (one_hop): its descriptor says so
// (OpDescriptor::algorithm), so ranks configured differently fail the descriptor check.
Work submit_reduce(CommImpl& impl, OpDescriptor d, std::optional<CodecSpec> codec,
                   uint64_t chunk_elems, collectives::ReduceArgs a, std::optional<uint64_t> step,
                   std::function<Status(OpRun&, const collectives::ReduceArgs&)> body,
                   collectives::Algorithm algorithm = collectives::Algorithm::kDefault) {
  const bool one_hop = algorithm == collectives::Algorithm::kOneHop;
  d.dtype = a.dtype;
  d.op = a.op;
  d.codec = std::move(codec);
  if (collectives::plain_codec(d.codec, a.dtype)) d.codec.reset();
  // The schedule the planner chose (topology/planner.h); a two-level one's site-map hash joins
  // the descriptor when it runs (stamp_agreement), so ranks that disagree about the sites fail
  // the check instead of mixing schedules.
  d.algorithm = algorithm;
  d.segment_elems = one_hop ? 0
                            : collectives::reduce_segment_elems(*impl.options().segment_bytes,
                                                                a.dtype, d.codec, chunk_elems);
  a.codec = d.codec;
  return impl.submit_collective(d, [a, step, body = std::move(body)](OpRun& run) mutable {
    a.step = step ? *step : run.desc().seq;
    return body(run, a);
  });
}

// A sparse codec (topk, randk) sums its P messages where they arrive (all_reduce's one-hop
// schedule); an owner-based reduction would re-sparsify the union. So reduce_scatter and reduce
// take none: named by the call, refused; the communicator's default, left exact (bypassed).
Result<Compression> dense_only(Compression c, const std::optional<CodecSpec>& named,
                               const char* what) {
  if (!c.codec || !c.codec->sparse()) return c;
  if (named)
    return invalid_argument(std::string(what) + ": sparse codecs (" + to_string(*c.codec) +
                            ") take all_reduce only (their sum is gathered, not owned); use a "
                            "dense codec such as q4");
  c.codec.reset();
  c.bypassed = true;
  c.error_feedback_key.clear();
  c.owner_error_feedback = false;
  return c;
}

using ReduceBody = std::function<Status(OpRun&, const collectives::ReduceArgs&)>;

// The device side of a CUDA-buffer call (collectives/device_op.h), made on the caller's thread:
// refused (nothing sent, no sequence number taken) without a device runtime, for buffers not on
// one device, or for staging beyond the pinned pool's limit.
Result<std::shared_ptr<collectives::DeviceCall>> device_call(
    CommImpl& impl, const char* what, std::initializer_list<const void*> buffers, void* stream,
    const std::vector<uint64_t>& blocks, uint64_t worst_pinned = 0) {
  auto ctx = impl.device_context();
  if (!ctx)
    return Status(ctx.status().code(), std::string(what) + " on CUDA buffers: " +
                                           ctx.status().message() + "; pass host buffers");
  return (*ctx)->begin_call(what, buffers, stream, blocks, worst_pinned);
}

// The pinned blocks a staged run takes at once: the input and the output (one when in place).
std::vector<uint64_t> staged_blocks(const void* send, uint64_t in, const void* recv, uint64_t out) {
  if (send != nullptr && send == recv) return {std::max(in, out)};
  return {send ? in : 0, recv ? out : 0};
}

// The pinned blocks a GPU-encoded reduction of n elements takes at once: the contributions'
// codes and the results' (each segment's padded to 16 bytes: at most one segment per 8,192
// elements plus one per owner chunk), and the output of a one-hop or reduce-scatter run.
std::vector<uint64_t> codec_blocks(const CodecSpec& wire, uint64_t n, int P, uint64_t out) {
  const uint64_t codes = encoded_size(wire, n) + 16 * (n / 8192 + static_cast<uint64_t>(P) + 1);
  return {codes, codes, out};
}

// Whether a reduction of device buffers runs the owner reduction's GPU-codec path: a flat
// all-reduce or reduce-scatter with a dense lossy codec the CUDA kernels take (error feedback
// without decay). Everything else is staged.
bool gpu_codec(const OpRun& run, const collectives::ReduceArgs& a) {
  const auto& d = run.desc();
  const bool kind = d.kind == OpKind::kAllReduce || d.kind == OpKind::kReduceScatter;
  return kind && d.algorithm == collectives::Algorithm::kDefault && a.codec &&
         a.codec->quantized() && !a.codec->sparse() &&
         (a.error_feedback_key.empty() || a.codec->ef_decay == 1.0f);
}

// Whether a one-hop all-reduce of device buffers encodes on the GPU (dense lossy codecs as
// gpu_codec(); sparse ones with or without decay): the input side only, the output staged.
bool gpu_encode(const OpRun& run, const collectives::ReduceArgs& a) {
  const auto& d = run.desc();
  return d.kind == OpKind::kAllReduce && d.algorithm == collectives::Algorithm::kOneHop &&
         a.codec && (a.codec->quantized() || a.codec->sparse()) &&
         (a.error_feedback_key.empty() || a.codec->sparse() || a.codec->ef_decay == 1.0f);
}

// `body` run for a CUDA-buffer call: on the GPU-codec path where gpu_codec() allows, the
// GPU-encode path where gpu_encode() does, else on pinned host copies of send (in_bytes) and
// recv (out_bytes).
ReduceBody on_device(CommImpl* impl, std::shared_ptr<collectives::DeviceCall> call, ReduceBody body,
                     uint64_t in_bytes, uint64_t out_bytes) {
  return [impl, call = std::move(call), body = std::move(body), in_bytes, out_bytes](
             OpRun& run, const collectives::ReduceArgs& a) -> Status {
    // No buffer (a count of 0): nothing on any device to order, encode or copy; the host
    // algorithm moves the empty tensor (no device memory, no stream, no synchronisation).
    if (call->device < 0) {
      LOWCOMM_CHECK(body(run, a));
      return run.wait_all();
    }
    auto ctx = impl->device_context();
    if (!ctx) return ctx.status();
    collectives::DeviceOp d(**ctx, *call, run.counters(), !impl->on_executor());
    const bool gpu = gpu_codec(run, a);
    const bool encode_only = !gpu && gpu_encode(run, a);
    LOWCOMM_CHECK(d.begin(gpu ? "gpu-codec" : encode_only ? "gpu-encode" : "staged"));
    if (encode_only) {
      auto out = d.pinned(out_bytes);
      if (!out) return out.status();
      collectives::ReduceArgs b = a;
      b.device = &d;
      b.recv = *out;
      LOWCOMM_CHECK(body(run, b));
      LOWCOMM_CHECK(run.wait_all());
      LOWCOMM_CHECK(d.to_device(a.recv, *out, out_bytes));
      return d.sync();
    }
    // Every request waited for inside: the pinned memory they read or write is d's. (A failed
    // body returns before its requests are waited for and gives d's blocks back; that is safe
    // only because a failure latches the communicator, so no later operation takes them.)
    if (gpu) {
      collectives::ReduceArgs b = a;
      b.device = &d;
      LOWCOMM_CHECK(body(run, b));
      return run.wait_all();
    }
    return collectives::run_staged(d, a.send, in_bytes, a.recv, out_bytes,
                                   [&](const void* send, void* recv) {
                                     collectives::ReduceArgs b = a;
                                     b.send = send;
                                     b.recv = recv;
                                     LOWCOMM_CHECK(body(run, b));
                                     return run.wait_all();
                                   });
  };
}

// A body of another collective run on pinned host copies for a CUDA-buffer call.
CommImpl::Body staged(CommImpl* impl, std::shared_ptr<collectives::DeviceCall> call,
                      const void* send, uint64_t in_bytes, void* recv, uint64_t out_bytes,
                      std::function<Status(OpRun&, const void*, void*)> body) {
  return [=, call = std::move(call), body = std::move(body)](OpRun& run) -> Status {
    auto ctx = impl->device_context();
    if (!ctx) return ctx.status();
    collectives::DeviceOp d(**ctx, *call, run.counters(), !impl->on_executor());
    LOWCOMM_CHECK(d.begin("staged"));
    return collectives::run_staged(d, send, in_bytes, recv, out_bytes, [&](const void* s, void* r) {
      LOWCOMM_CHECK(body(run, s, r));
      return run.wait_all();  // before the copy back
    });
  };
}

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAverage:
      return "avg";
    case ReduceOp::kProduct:
      return "product";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kBAnd:
      return "band";
    case ReduceOp::kBOr:
      return "bor";
    case ReduceOp::kBXor:
      return "bxor";
  }
  return "?";
}

Result<std::unique_ptr<Communicator>> Communicator::init(const UniqueId& id, int rank, int nranks,
                                                         const CommOptions& options) {
  auto impl = CommImpl::create(id, rank, nranks, options);
  if (!impl) return impl.status();
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl).value()));
}

Communicator::Communicator(std::unique_ptr<CommImpl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

int Communicator::rank() const {
  return impl_->rank();
}
int Communicator::size() const {
  return impl_->size();
}

Work Communicator::all_reduce(const void* send, void* recv, uint64_t count, DType dtype,
                              ReduceOp op, const AllReduceOptions& options) {
  const Compression c =
      decide_compression(policy_of(*impl_), options.codec, dtype, op, count * dtype_size(dtype),
                         options.error_feedback_key, options.owner_error_feedback);
  const std::optional<CodecSpec>& codec = c.codec;
  if (Status s = check_all_reduce(send, recv, count, dtype, op, codec, c.error_feedback_key); !s)
    return refused(s);
  OpDescriptor d;
  d.kind = OpKind::kAllReduce;
  d.count = count;
  collectives::ReduceArgs a{
      send,         recv, count, dtype, op, {}, c.error_feedback_key, c.owner_error_feedback,
      options.seed, 0};
  if (options.memory == MemoryKind::kHost) a.on_result = options.on_result;
  const bool sparse = codec && codec->sparse();
  if (sparse && c.owner_error_feedback)
    return refused(invalid_argument(
        "all_reduce: owner_error_feedback does not apply to sparse codecs (" + to_string(*codec) +
        "): every contribution is summed where it arrives, nothing is re-quantized"));
  // Random-k's positions follow (seed, step): ranks must agree on them (stamp_agreement).
  if (sparse && codec->kind == CodecKind::kRandk)
    d.positions = collectives::positions_hash(options.seed, options.step);
  topology::AllReduceCall asked{count,
                                dtype,
                                op,
                                codec,
                                options.schedule,
                                options.sparse_schedule,
                                collectives::can_share_positions(codec, dtype, op)};
  auto schedule = impl_->planner().all_reduce(asked);
  if (!schedule) return refused(schedule.status());
  const collectives::Algorithm alg = schedule->algorithm;
  d.auto_schedule = schedule->auto_schedule;
  CommImpl* impl = impl_.get();
  ReduceBody body = [impl](OpRun& run, const collectives::ReduceArgs& args) {
    switch (run.desc().algorithm) {
      case collectives::Algorithm::kOneHop:
        return collectives::one_hop_all_reduce(run, args);
      case collectives::Algorithm::kTwoLevel:
        return collectives::two_level_all_reduce(run, args, impl->sites());
      default:
        if (args.codec && args.codec->sparse())
          return collectives::shared_positions_all_reduce(run, args);
        return collectives::all_reduce(run, args);
    }
  };
  if (options.memory == MemoryKind::kCuda) {
    const uint64_t bytes = count * dtype_size(dtype);
    // A lossy codec runs GPU-encoded unless the schedule is two levels or Random-k's owner
    // schedule (both staged): reserve for the path the call will most likely take; the output
    // block only where the sum is formed on the host (one hop). The pool's limit is checked
    // against the staged path too when the schedule is left to run time (the picker's flat or
    // two levels).
    const bool lossy = codec && (codec->quantized() || codec->sparse());
    const bool one_hop = alg == collectives::Algorithm::kOneHop;
    const bool decayed = !c.error_feedback_key.empty() && codec && !codec->sparse() &&
                         codec->ef_decay != 1.0f;  // the CUDA kernels take no decay
    const bool staged_likely = !lossy || alg == collectives::Algorithm::kTwoLevel ||
                               (codec->sparse() && !one_hop) || decayed;
    const std::vector<uint64_t> staged = staged_blocks(send, bytes, recv, bytes);
    const std::vector<uint64_t> blocks =
        staged_likely ? staged : codec_blocks(*codec, count, size(), one_hop ? bytes : 0);
    const uint64_t worst = std::max(device::pinned_bytes(blocks),
                                    d.auto_schedule ? device::pinned_bytes(staged) : uint64_t{0});
    auto call = device_call(*impl_, "all_reduce", {send, recv}, options.cuda_stream, blocks, worst);
    if (!call) return refuse_or_fail(*impl_, OpKind::kAllReduce, count, dtype, call.status());
    if (lossy) {
      auto ctx = impl_->device_context();
      if (Status p = (*ctx)->preload(**call, *codec, dtype); !p)
        return refuse_or_fail(*impl_, OpKind::kAllReduce, count, dtype, p);
    }
    body = on_device(impl, std::move(call).value(), std::move(body), bytes, bytes);
  }
  return submit_reduce(*impl_, d, codec, count / static_cast<uint64_t>(size()), a, options.step,
                       std::move(body), alg);
}

Work Communicator::reduce_scatter(const void* send, void* recv, uint64_t recv_count, DType dtype,
                                  ReduceOp op, const ReduceScatterOptions& options) {
  const Result<Compression> decided =
      dense_only(decide_compression(policy_of(*impl_), options.codec, dtype, op,
                                    recv_count * static_cast<uint64_t>(size()) * dtype_size(dtype),
                                    options.error_feedback_key, false),
                 options.codec, "reduce_scatter");
  if (!decided) return refused(decided.status());
  const Compression& c = *decided;
  const std::optional<CodecSpec>& codec = c.codec;
  if (Status s = check_reduce_scatter(send, recv, recv_count, dtype, op, size(), codec,
                                      c.error_feedback_key);
      !s)
    return refused(s);
  if (options.owner_error_feedback)
    return refused(invalid_argument(
        "reduce_scatter: owner_error_feedback does not apply (the owner's sum is rounded to the "
        "dtype, not re-quantized)"));
  OpDescriptor d;
  d.kind = OpKind::kReduceScatter;
  d.count = recv_count;
  collectives::ReduceArgs a{send,
                            recv,
                            recv_count * static_cast<uint64_t>(size()),
                            dtype,
                            op,
                            {},
                            c.error_feedback_key,
                            false,
                            options.seed,
                            0};
  const bool two_level =
      impl_->planner().reduce_scatter(recv_count * static_cast<uint64_t>(size()), dtype, op,
                                      codec) == collectives::Algorithm::kTwoLevel;
  CommImpl* impl = impl_.get();
  ReduceBody body = [impl](OpRun& run, const collectives::ReduceArgs& args) {
    if (run.desc().algorithm == collectives::Algorithm::kTwoLevel)
      return collectives::two_level_reduce_scatter(run, args, impl->sites());
    return collectives::reduce_scatter(run, args);
  };
  if (options.memory == MemoryKind::kCuda) {
    const uint64_t out = recv_count * dtype_size(dtype);
    const uint64_t in = out * static_cast<uint64_t>(size());
    const bool lossy = codec && codec->quantized() && !two_level;
    auto call = device_call(*impl_, "reduce_scatter", {send, recv}, options.cuda_stream,
                            lossy ? codec_blocks(*codec, recv_count * size(), size(), out)
                                  : staged_blocks(send, in, recv, out));
    if (!call)
      return refuse_or_fail(*impl_, OpKind::kReduceScatter, recv_count, dtype, call.status());
    if (lossy) {
      auto ctx = impl_->device_context();
      if (Status p = (*ctx)->preload(**call, *codec, dtype); !p)
        return refuse_or_fail(*impl_, OpKind::kReduceScatter, recv_count, dtype, p);
    }
    body = on_device(impl, std::move(call).value(), std::move(body), in, out);
  }
  return submit_reduce(
      *impl_, d, codec, recv_count, a, options.step, std::move(body),
      two_level ? collectives::Algorithm::kTwoLevel : collectives::Algorithm::kDefault);
}

Work Communicator::all_gather(const void* send, void* recv, uint64_t send_count, DType dtype,
                              const BufferOptions& where) {
  if (Status s = check_all_gather(send, recv, send_count, dtype, size()); !s) return refused(s);
  OpDescriptor d;
  d.kind = OpKind::kAllGather;
  d.count = send_count;
  d.dtype = dtype;
  // Sites: two levels for a large result (the map's hash in the descriptor, as all_reduce's).
  d.algorithm =
      impl_->planner().gather(send_count * dtype_size(dtype) * static_cast<uint64_t>(size()));
  CommImpl* impl = impl_.get();
  auto body = [=](OpRun& run, const void* in, void* out) {
    if (run.desc().algorithm == collectives::Algorithm::kTwoLevel)
      return collectives::two_level_all_gather(run, in, out, send_count, dtype, impl->sites());
    return collectives::all_gather(run, in, out, send_count, dtype);
  };
  if (where.memory == MemoryKind::kCuda) {
    const uint64_t in = send_count * dtype_size(dtype);
    const uint64_t out = in * static_cast<uint64_t>(size());
    auto call = device_call(*impl_, "all_gather", {send, recv}, where.cuda_stream,
                            staged_blocks(send, in, recv, out));
    if (!call) return refuse_or_fail(*impl_, OpKind::kAllGather, send_count, dtype, call.status());
    return impl_->submit_collective(
        d, staged(impl, std::move(call).value(), send, in, recv, out, body));
  }
  return impl_->submit_collective(d, [=](OpRun& run) { return body(run, send, recv); });
}

Work Communicator::reduce(const void* send, void* recv, uint64_t count, DType dtype, ReduceOp op,
                          int root, const AllReduceOptions& options) {
  const Result<Compression> decided = dense_only(
      decide_compression(policy_of(*impl_), options.codec, dtype, op, count * dtype_size(dtype),
                         options.error_feedback_key, options.owner_error_feedback),
      options.codec, "reduce");
  if (!decided) return refused(decided.status());
  const Compression& c = *decided;
  const std::optional<CodecSpec>& codec = c.codec;
  if (Status s = collectives::check_reduce(send, recv, count, dtype, op, root, rank(), size(),
                                           codec, c.error_feedback_key);
      !s)
    return refused(s);
  OpDescriptor d;
  d.kind = OpKind::kReduce;
  d.count = count;
  d.root = root;
  collectives::ReduceArgs a{
      send,         recv, count, dtype, op, {}, c.error_feedback_key, c.owner_error_feedback,
      options.seed, 0};
  ReduceBody body = [root](OpRun& run, const collectives::ReduceArgs& args) {
    return collectives::reduce(run, args, root);
  };
  if (options.memory == MemoryKind::kCuda) {
    const uint64_t bytes = count * dtype_size(dtype);
    void* out = rank() == root ? recv : nullptr;  // other ranks' recv is not used
    auto call = device_call(*impl_, "reduce", {send, out}, options.cuda_stream,
                            staged_blocks(send, bytes, out, out ? bytes : 0));
    if (!call) return refuse_or_fail(*impl_, OpKind::kReduce, count, dtype, call.status());
    a.recv = out;
    body = on_device(impl_.get(), std::move(call).value(), std::move(body), bytes, out ? bytes : 0);
  }
  return submit_reduce(*impl_, d, codec, count / static_cast<uint64_t>(size()), a, options.step,
                       std::move(body));
}

Work Communicator::gather(const void* send, void* recv, uint64_t send_count, DType dtype,
                          int root) {
  if (Status s = collectives::check_rooted("gather", send, recv, send_count, dtype, root, rank(),
                                           size(), true);
      !s)
    return refused(s);
  OpDescriptor d;
  d.kind = OpKind::kGather;
  d.count = send_count;
  d.dtype = dtype;
  d.root = root;
  return impl_->submit_collective(
      d, [=](OpRun& run) { return collectives::gather(run, send, recv, send_count, dtype, root); });
}

Work Communicator::scatter(const void* send, void* recv, uint64_t recv_count, DType dtype,
                           int root) {
  if (Status s = collectives::check_rooted("scatter", send, recv, recv_count, dtype, root, rank(),
                                           size(), false);
      !s)
    return refused(s);
  OpDescriptor d;
  d.kind = OpKind::kScatter;
  d.count = recv_count;
  d.dtype = dtype;
  d.root = root;
  return impl_->submit_collective(d, [=](OpRun& run) {
    return collectives::scatter(run, send, recv, recv_count, dtype, root);
  });
}

Work Communicator::all_to_all(const void* send, std::vector<uint64_t> send_counts,
                              std::vector<uint64_t> send_offsets, void* recv,
                              std::vector<uint64_t> recv_counts, std::vector<uint64_t> recv_offsets,
                              DType dtype) {
  if (Status s = collectives::check_all_to_all(send, send_counts, send_offsets, recv, recv_counts,
                                               recv_offsets, dtype, rank(), size());
      !s)
    return refused(s);
  OpDescriptor d;
  d.kind = OpKind::kAllToAll;
  d.dtype = dtype;  // the splits are per pair: not part of what every rank must agree on
  auto a = std::make_shared<collectives::AllToAllArgs>();
  a->send = send;
  a->send_counts = std::move(send_counts);
  a->send_offsets = std::move(send_offsets);
  a->recv = recv;
  a->recv_counts = std::move(recv_counts);
  a->recv_offsets = std::move(recv_offsets);
  a->dtype = dtype;
  return impl_->submit_collective(d, [a](OpRun& run) { return collectives::all_to_all(run, *a); });
}

Work Communicator::broadcast(const void* send, void* recv, uint64_t count, DType dtype, int root,
                             const BufferOptions& where) {
  if (Status s = check_broadcast(send, recv, count, dtype, root, rank(), size()); !s)
    return refused(s);
  OpDescriptor d;
  d.kind = OpKind::kBroadcast;
  d.count = count;
  d.dtype = dtype;
  d.root = root;
  d.algorithm = impl_->planner().gather(count * dtype_size(dtype));
  CommImpl* impl = impl_.get();
  auto body = [=](OpRun& run, const void* in, void* out) {
    if (run.desc().algorithm == collectives::Algorithm::kTwoLevel)
      return collectives::two_level_broadcast(run, in, out, count, dtype, root, impl->sites());
    return collectives::broadcast(run, in, out, count, dtype, root);
  };
  if (where.memory == MemoryKind::kCuda) {
    const uint64_t bytes = count * dtype_size(dtype);
    const void* in = rank() == root ? send : nullptr;  // other ranks ignore send
    auto call = device_call(*impl_, "broadcast", {in, recv}, where.cuda_stream,
                            staged_blocks(in, bytes, recv, bytes));
    if (!call) return refuse_or_fail(*impl_, OpKind::kBroadcast, count, dtype, call.status());
    return impl_->submit_collective(
        d, staged(impl, std::move(call).value(), in, in ? bytes : 0, recv, bytes, body));
  }
  return impl_->submit_collective(d, [=](OpRun& run) { return body(run, send, recv); });
}

Work Communicator::send(const void* buf, uint64_t count, DType dtype, int peer, uint64_t tag) {
  if (Status s = check_p2p("send", buf, count, dtype, peer, tag, rank(), size()); !s)
    return refused(s);
  OpDescriptor d = collectives::p2p_descriptor(OpKind::kSend, count, dtype, rank(), tag);
  return impl_->submit_p2p(
      d, peer, [=](OpRun& run) { return collectives::send(run, buf, count, dtype, peer, tag); });
}

Work Communicator::recv(void* buf, uint64_t count, DType dtype, int peer, uint64_t tag) {
  if (Status s = check_p2p("recv", buf, count, dtype, peer, tag, rank(), size()); !s)
    return refused(s);
  OpDescriptor d = collectives::p2p_descriptor(OpKind::kRecv, count, dtype, peer, tag);
  return impl_->submit_p2p(
      d, peer, [=](OpRun& run) { return collectives::recv(run, buf, count, dtype, peer, tag); });
}

Work Communicator::recv_any(void* buf, uint64_t count, DType dtype, uint64_t tag) {
  if (Status s = check_recv_any(buf, count, dtype, tag, rank(), size()); !s) return refused(s);
  OpDescriptor d = collectives::p2p_descriptor(OpKind::kRecv, count, dtype, -1, tag);
  return impl_->submit_recv_any(
      d, [=](OpRun& run) { return collectives::recv_any(run, buf, count, dtype, tag); });
}

Work Communicator::barrier() {
  OpDescriptor d;
  d.kind = OpKind::kBarrier;
  return impl_->submit_collective(d, [](OpRun& run) { return collectives::barrier(run); });
}

void Communicator::abort() {
  impl_->abort();
}
Status Communicator::status() const {
  return impl_->status();
}
OpStats Communicator::last_op_stats() const {
  return impl_->last_op_stats();
}

Result<std::vector<uint8_t>> Communicator::save_error_feedback() {
  std::vector<uint8_t> out;
  CommImpl* impl = impl_.get();
  Status s = impl_
                 ->submit_local([impl, &out] {
                   // Residuals kept on a device are copied, not moved: the next GPU call
                   // finds them where they are.
                   LOWCOMM_CHECK(impl->ef().copy_device_residuals());
                   out = impl->ef().save();
                   impl->ef().drop_host_copies();
                   return Status::ok();
                 })
                 .wait();
  if (!s) return s;
  return out;
}

Status Communicator::restore_error_feedback(const void* bytes, size_t len) {
  CommImpl* impl = impl_.get();
  return impl_
      ->submit_local([impl, bytes, len] {
        return impl->ef().restore(static_cast<const uint8_t*>(bytes), len);
      })
      .wait();
}

Result<std::vector<std::string>> Communicator::error_feedback_keys() {
  std::vector<std::string> out;
  CommImpl* impl = impl_.get();
  Status s = impl_
                 ->submit_local([impl, &out] {
                   out = impl->ef().names();
                   return Status::ok();
                 })
                 .wait();
  if (!s) return s;
  return out;
}

Result<size_t> Communicator::reset_error_feedback(const std::string& name) {
  size_t dropped = 0;
  CommImpl* impl = impl_.get();
  Status s = impl_
                 ->submit_local([impl, &name, &dropped] {
                   dropped = impl->ef().drop(name);
                   return Status::ok();
                 })
                 .wait();
  if (!s) return s;
  return dropped;
}

}  // namespace lowcomm
