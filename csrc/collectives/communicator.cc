// Communicator: the public C++ API; builds each operation's descriptor and hands the algorithm
// to CommImpl's executor.

#include "lowcomm/communicator.h"
#include "collectives/work_state.h"

#include "collectives/algorithms.h"
#include "collectives/comm_impl.h"
#include "collectives/tags.h"

namespace lowcomm {

using collectives::OpDescriptor;
using collectives::OpKind;
using collectives::OpRun;

namespace {

// Arguments that are wrong on this rank alone are refused here, before a sequence number is
// taken or anything is queued: the other ranks never hear of the call, so the group stays
// usable (NCCL's ncclInvalidArgument). Failing them in the algorithm body instead would latch
// the failure and send every peer an abort notice. The bodies keep their own checks as a
// defence.
constexpr uint64_t kMaxElements = uint64_t{1} << 56;

Work refused(Status why) { return Work(WorkState::refused(std::move(why))); }

Status check_dtype(const char* what, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kBFloat16:
    case DType::kFloat16: return Status::ok();
  }
  return invalid_argument(std::string(what) + ": unknown dtype " +
                          std::to_string(static_cast<int>(dtype)));
}

Status check_op(const char* what, ReduceOp op) {
  if (op == ReduceOp::kSum || op == ReduceOp::kAverage) return Status::ok();
  return invalid_argument(std::string(what) + ": unknown reduction " +
                          std::to_string(static_cast<int>(op)));
}

// count elements, each standing for `per` elements of the whole operation (the rank count for
// reduce_scatter and all_gather): divides instead of multiplying, which could wrap.
Status check_elements(const char* what, uint64_t count, uint64_t per = 1) {
  if (count <= kMaxElements / per) return Status::ok();
  return invalid_argument(std::string(what) + ": element count " + std::to_string(count) +
                          (per > 1 ? " times " + std::to_string(per) + " ranks" : std::string()) +
                          " is above the limit of 2^56");
}

Status check_buffer(const char* what, const char* name, const void* buf, uint64_t count) {
  if (buf || count == 0) return Status::ok();
  return invalid_argument(std::string(what) + ": " + name + " buffer is null with a count of " +
                          std::to_string(count));
}

Status check_peer(const char* what, int peer, int rank, int size) {
  if (peer >= 0 && peer < size && peer != rank) return Status::ok();
  return invalid_argument(std::string(what) + ": peer " + std::to_string(peer) +
                          " is not another rank of [0, " + std::to_string(size) + ") (this is rank " +
                          std::to_string(rank) + ")");
}

Status check_p2p(const char* what, const void* buf, uint64_t count, DType dtype, int peer,
                 uint64_t tag, int rank, int size) {
  LOWCOMM_CHECK(check_dtype(what, dtype));
  LOWCOMM_CHECK(check_peer(what, peer, rank, size));
  if (tag > collectives::tags::kMaxUserTag)
    return invalid_argument(std::string(what) + ": tag " + std::to_string(tag) + " is not below 2^60");
  LOWCOMM_CHECK(check_buffer(what, "the", buf, count));
  return check_elements(what, count);
}

// `codec` is the one the call resolves to (its own or CommOptions::codec), before an
// uncompressed spec in the tensor's dtype is dropped. Validated before anything divides by its
// block size.
Status check_all_reduce(const void* send, void* recv, uint64_t count, DType dtype, ReduceOp op,
                        const std::optional<CodecSpec>& codec, const AllReduceOptions& options) {
  const char* what = "all_reduce";
  LOWCOMM_CHECK(check_dtype(what, dtype));
  LOWCOMM_CHECK(check_op(what, op));
  LOWCOMM_CHECK(check_elements(what, count));
  LOWCOMM_CHECK(check_buffer(what, "send", send, count));
  LOWCOMM_CHECK(check_buffer(what, "recv", recv, count));
  if (codec) {
    if (Status s = validate_spec(*codec); !s)
      return invalid_argument(std::string(what) + ": invalid codec: " + s.message());
    if (Status s = check_count(*codec, count); !s)
      return invalid_argument(std::string(what) + ": codec " + to_string(*codec) + ": " + s.message());
  }
  const bool uncompressed = !codec || (!codec->quantized() && codec->wire_dtype == dtype);
  if (uncompressed && !options.ef_key.empty())
    return invalid_argument(std::string(what) + ": error feedback (ef_key '" + options.ef_key +
                            "') needs a codec that loses precision; this all_reduce is uncompressed");
  return Status::ok();
}

// recv_count * size elements in `send`: checked without multiplying, which could wrap.
Status check_reduce_scatter(const void* send, void* recv, uint64_t recv_count, DType dtype, ReduceOp op,
                            int size) {
  const char* what = "reduce_scatter";
  LOWCOMM_CHECK(check_dtype(what, dtype));
  LOWCOMM_CHECK(check_op(what, op));
  LOWCOMM_CHECK(check_elements(what, recv_count, static_cast<uint64_t>(size)));
  LOWCOMM_CHECK(check_buffer(what, "send", send, recv_count));
  return check_buffer(what, "recv", recv, recv_count);
}

Status check_all_gather(const void* send, void* recv, uint64_t send_count, DType dtype, int size) {
  const char* what = "all_gather";
  LOWCOMM_CHECK(check_dtype(what, dtype));
  LOWCOMM_CHECK(check_elements(what, send_count, static_cast<uint64_t>(size)));
  LOWCOMM_CHECK(check_buffer(what, "send", send, send_count));
  return check_buffer(what, "recv", recv, send_count);
}

Status check_broadcast(const void* send, void* recv, uint64_t count, DType dtype, int root, int rank,
                       int size) {
  const char* what = "broadcast";
  LOWCOMM_CHECK(check_dtype(what, dtype));
  if (root < 0 || root >= size)
    return invalid_argument(std::string(what) + ": root " + std::to_string(root) + " is outside [0, " +
                            std::to_string(size) + ")");
  LOWCOMM_CHECK(check_elements(what, count));
  if (rank == root) LOWCOMM_CHECK(check_buffer(what, "send", send, count));  // others ignore send
  return check_buffer(what, "recv", recv, count);
}

}  // namespace

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::kAverage ? "avg" : "sum"; }

Result<std::unique_ptr<Communicator>> Communicator::init(const UniqueId& id, int rank, int nranks,
                                                         const CommOptions& options) {
  auto impl = CommImpl::create(id, rank, nranks, options);
  if (!impl) return impl.status();
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl).value()));
}

Communicator::Communicator(std::unique_ptr<CommImpl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

int Communicator::rank() const { return impl_->rank(); }
int Communicator::size() const { return impl_->size(); }

Work Communicator::all_reduce(const void* send, void* recv, uint64_t count, DType dtype, ReduceOp op,
                              const AllReduceOptions& options) {
  if (options.memory != MemoryKind::kHost) {
    // Refused before any descriptor is sent: the group is not broken by an unsupported call.
    return refused(unsupported(
        "all_reduce on CUDA buffers: this build has no GPU collective path yet (CUDA codec "
        "kernels exist; the stream-ordered collective is issue 4); pass host buffers"));
  }
  std::optional<CodecSpec> codec = options.codec ? options.codec : impl_->options().codec;
  if (Status s = check_all_reduce(send, recv, count, dtype, op, codec, options); !s) return refused(s);
  OpDescriptor d;
  d.kind = OpKind::kAllReduce;
  d.count = count;
  d.dtype = dtype;
  d.op = op;
  d.codec = codec;
  // An uncompressed spec in the tensor's own dtype is the plain algorithm: one descriptor
  // for both spellings, so "none" on one rank and no codec on another agree.
  if (d.codec && !d.codec->quantized() && d.codec->wire_dtype == dtype) d.codec.reset();
  d.tag = collectives::reduce_segment_elems(impl_->options().segment_bytes, dtype, d.codec);
  collectives::ReduceArgs a{send, recv, count, dtype, op, d.codec, options.ef_key,
                            options.owner_error_feedback, options.seed, 0};
  auto step = options.step;
  return impl_->submit_collective(d, [a, step](OpRun& run) mutable {
    a.step = step ? *step : run.desc().seq;
    return collectives::all_reduce(run, a);
  });
}

Work Communicator::reduce_scatter(const void* send, void* recv, uint64_t recv_count, DType dtype,
                                  ReduceOp op) {
  if (Status s = check_reduce_scatter(send, recv, recv_count, dtype, op, size()); !s) return refused(s);
  OpDescriptor d;
  d.kind = OpKind::kReduceScatter;
  d.count = recv_count;
  d.dtype = dtype;
  d.op = op;
  d.tag = collectives::reduce_segment_elems(impl_->options().segment_bytes, dtype, std::nullopt);
  collectives::ReduceArgs a{send, recv, recv_count * static_cast<uint64_t>(size()), dtype, op,
                            std::nullopt, {}, false, 0, 0};
  return impl_->submit_collective(d, [a](OpRun& run) { return collectives::reduce_scatter(run, a); });
}

Work Communicator::all_gather(const void* send, void* recv, uint64_t send_count, DType dtype) {
  if (Status s = check_all_gather(send, recv, send_count, dtype, size()); !s) return refused(s);
  OpDescriptor d;
  d.kind = OpKind::kAllGather;
  d.count = send_count;
  d.dtype = dtype;
  return impl_->submit_collective(d, [=](OpRun& run) {
    return collectives::all_gather(run, send, recv, send_count, dtype);
  });
}

Work Communicator::broadcast(const void* send, void* recv, uint64_t count, DType dtype, int root) {
  if (Status s = check_broadcast(send, recv, count, dtype, root, rank(), size()); !s) return refused(s);
  OpDescriptor d;
  d.kind = OpKind::kBroadcast;
  d.count = count;
  d.dtype = dtype;
  d.root = root;
  return impl_->submit_collective(d, [=](OpRun& run) {
    return collectives::broadcast(run, send, recv, count, dtype, root);
  });
}

Work Communicator::send(const void* buf, uint64_t count, DType dtype, int peer, uint64_t tag) {
  if (Status s = check_p2p("send", buf, count, dtype, peer, tag, rank(), size()); !s) return refused(s);
  OpDescriptor d;
  d.kind = OpKind::kSend;
  d.count = count;
  d.dtype = dtype;
  d.root = rank();
  d.tag = tag;
  return impl_->submit_p2p(d, peer, true, [=](OpRun& run) {
    return collectives::send(run, buf, count, dtype, peer, tag);
  });
}

Work Communicator::recv(void* buf, uint64_t count, DType dtype, int peer, uint64_t tag) {
  if (Status s = check_p2p("recv", buf, count, dtype, peer, tag, rank(), size()); !s) return refused(s);
  OpDescriptor d;
  d.kind = OpKind::kRecv;
  d.count = count;
  d.dtype = dtype;
  d.root = peer;
  d.tag = tag;
  return impl_->submit_p2p(d, peer, false, [=](OpRun& run) {
    return collectives::recv(run, buf, count, dtype, peer, tag);
  });
}

Work Communicator::barrier() {
  OpDescriptor d;
  d.kind = OpKind::kBarrier;
  return impl_->submit_collective(d, [](OpRun& run) { return collectives::barrier(run); });
}

void Communicator::abort() { impl_->abort(); }
Status Communicator::status() const { return impl_->status(); }

Result<std::vector<uint8_t>> Communicator::save_error_feedback() {
  std::vector<uint8_t> out;
  CommImpl* impl = impl_.get();
  Status s = impl_->submit_local([impl, &out] {
                     out = impl->ef().save();
                     return Status::ok();
                   }).wait();
  if (!s) return s;
  return out;
}

Status Communicator::restore_error_feedback(const void* bytes, size_t len) {
  CommImpl* impl = impl_.get();
  return impl_->submit_local([impl, bytes, len] {
                return impl->ef().restore(static_cast<const uint8_t*>(bytes), len);
              }).wait();
}

}  // namespace lowcomm
