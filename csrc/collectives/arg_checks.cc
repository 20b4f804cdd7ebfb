#include "collectives/arg_checks.h"

#include <string>

#include "collectives/algorithms.h"
#include "collectives/reduce_kernels.h"
#include "collectives/tags.h"

namespace lowcomm::collectives {

Status check_dtype(const char* what, DType dtype) {
  if (valid_dtype(dtype)) return Status::ok();
  return invalid_argument(std::string(what) + ": unknown dtype " +
                          std::to_string(static_cast<int>(dtype)));
}

Status check_op(const char* what, DType dtype, ReduceOp op) {
  if (static_cast<uint8_t>(op) > kMaxReduceOp)
    return invalid_argument(std::string(what) + ": unknown reduction " +
                            std::to_string(static_cast<int>(op)));
  return check_reduction(what, dtype, op);
}

// A codec (one that changes the bytes: quantized, or a passthrough to another dtype) takes
// floating-point SUM and AVG only, and `count` elements in one piece (reduce-scatter: each
// rank's slice is encoded on its own, so the slice length is checked).
Status check_codec(const char* what, const std::optional<CodecSpec>& codec, uint64_t count,
                   DType dtype, ReduceOp op) {
  if (!codec) return Status::ok();
  if (Status s = validate_spec(*codec); !s)
    return invalid_argument(std::string(what) + ": invalid codec: " + s.message());
  if (plain_codec(codec, dtype)) return Status::ok();
  if (!codec_dtype(dtype))
    return invalid_argument(std::string(what) + ": codec " + to_string(*codec) +
                            " takes fp32, bf16 or fp16 tensors, not " + dtype_name(dtype));
  if (op != ReduceOp::kSum && op != ReduceOp::kAverage)
    return invalid_argument(std::string(what) + ": codec " + to_string(*codec) +
                            " takes sum or avg, not " + reduce_op_name(op));
  if (Status s = check_count(*codec, count); !s)
    return invalid_argument(std::string(what) + ": codec " + to_string(*codec) + ": " +
                            s.message());
  return Status::ok();
}

// count elements, each standing for `per` elements of the whole operation (the rank count for
// reduce_scatter and all_gather): divides instead of multiplying, which could wrap.
Status check_elements(const char* what, uint64_t count, uint64_t per) {
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
                          " is not another rank of [0, " + std::to_string(size) +
                          ") (this is rank " + std::to_string(rank) + ")");
}

Status check_p2p(const char* what, const void* buf, uint64_t count, DType dtype, int peer,
                 uint64_t tag, int rank, int size) {
  LOWCOMM_CHECK(check_dtype(what, dtype));
  LOWCOMM_CHECK(check_peer(what, peer, rank, size));
  if (tag > tags::kMaxUserTag)
    return invalid_argument(std::string(what) + ": tag " + std::to_string(tag) +
                            " is not below 2^60");
  LOWCOMM_CHECK(check_buffer(what, "the", buf, count));
  return check_elements(what, count);
}

Status check_recv_any(const void* buf, uint64_t count, DType dtype, uint64_t tag, int rank,
                      int size) {
  if (size < 2) return invalid_argument("recv from any rank: the group has no other rank");
  return check_p2p("recv", buf, count, dtype, rank == 0 ? 1 : 0, tag, rank, size);
}

// `codec` is the one the call resolves to (its own or CommOptions::codec), before an
// uncompressed spec in the tensor's dtype is dropped. Validated before anything divides by its
// block size.
Status check_all_reduce(const void* send, void* recv, uint64_t count, DType dtype, ReduceOp op,
                        const std::optional<CodecSpec>& codec,
                        const std::string& error_feedback_key) {
  const char* what = "all_reduce";
  LOWCOMM_CHECK(check_dtype(what, dtype));
  LOWCOMM_CHECK(check_op(what, dtype, op));
  LOWCOMM_CHECK(check_elements(what, count));
  LOWCOMM_CHECK(check_buffer(what, "send", send, count));
  LOWCOMM_CHECK(check_buffer(what, "recv", recv, count));
  LOWCOMM_CHECK(check_codec(what, codec, count, dtype, op));
  return check_error_feedback_key(what, codec, dtype, error_feedback_key);
}

Status check_error_feedback_key(const char* what, const std::optional<CodecSpec>& codec,
                                DType dtype, const std::string& error_feedback_key) {
  if (plain_codec(codec, dtype) && !error_feedback_key.empty())
    return invalid_argument(std::string(what) + ": error feedback (error_feedback_key '" +
                            error_feedback_key + "') needs a codec that loses precision; this " +
                            what + " is uncompressed");
  return Status::ok();
}

// recv_count * size elements in `send`: checked without multiplying, which could wrap.
Status check_reduce_scatter(const void* send, void* recv, uint64_t recv_count, DType dtype,
                            ReduceOp op, int size, const std::optional<CodecSpec>& codec,
                            const std::string& error_feedback_key) {
  const char* what = "reduce_scatter";
  LOWCOMM_CHECK(check_dtype(what, dtype));
  LOWCOMM_CHECK(check_op(what, dtype, op));
  LOWCOMM_CHECK(check_elements(what, recv_count, static_cast<uint64_t>(size)));
  LOWCOMM_CHECK(check_buffer(what, "send", send, recv_count));
  LOWCOMM_CHECK(check_buffer(what, "recv", recv, recv_count));
  LOWCOMM_CHECK(check_codec(what, codec, recv_count, dtype, op));
  return check_error_feedback_key(what, codec, dtype, error_feedback_key);
}

Status check_all_gather(const void* send, void* recv, uint64_t send_count, DType dtype, int size) {
  const char* what = "all_gather";
  LOWCOMM_CHECK(check_dtype(what, dtype));
  LOWCOMM_CHECK(check_elements(what, send_count, static_cast<uint64_t>(size)));
  LOWCOMM_CHECK(check_buffer(what, "send", send, send_count));
  return check_buffer(what, "recv", recv, send_count);
}

Status check_broadcast(const void* send, void* recv, uint64_t count, DType dtype, int root,
                       int rank, int size) {
  const char* what = "broadcast";
  LOWCOMM_CHECK(check_dtype(what, dtype));
  if (root < 0 || root >= size)
    return invalid_argument(std::string(what) + ": root " + std::to_string(root) +
                            " is outside [0, " + std::to_string(size) + ")");
  LOWCOMM_CHECK(check_elements(what, count));
  if (rank == root) LOWCOMM_CHECK(check_buffer(what, "send", send, count));  // others ignore send
  return check_buffer(what, "recv", recv, count);
}

Status check_reduce(const void* send, void* recv, uint64_t count, DType dtype, ReduceOp op,
                    int root, int rank, int size, const std::optional<CodecSpec>& codec,
                    const std::string& error_feedback_key) {
  const char* what = "reduce";
  LOWCOMM_CHECK(check_dtype(what, dtype));
  LOWCOMM_CHECK(check_op(what, dtype, op));
  LOWCOMM_CHECK(check_root(what, root, size));
  LOWCOMM_CHECK(check_elements(what, count));
  LOWCOMM_CHECK(check_buffer(what, "send", send, count));
  if (rank == root) LOWCOMM_CHECK(check_buffer(what, "recv", recv, count));  // others: unused
  LOWCOMM_CHECK(check_codec(what, codec, count, dtype, op));
  return check_error_feedback_key(what, codec, dtype, error_feedback_key);
}

Status check_root(const char* what, int root, int size) {
  if (root >= 0 && root < size) return Status::ok();
  return invalid_argument(std::string(what) + ": root " + std::to_string(root) +
                          " is outside [0, " + std::to_string(size) + ")");
}

// Gather (root_holds_all): every rank's send holds count, the root's recv count * size.
// Scatter: the root's send holds count * size, every rank's recv count.
Status check_rooted(const char* what, const void* send, void* recv, uint64_t count, DType dtype,
                    int root, int rank, int size, bool root_holds_all) {
  LOWCOMM_CHECK(check_dtype(what, dtype));
  LOWCOMM_CHECK(check_root(what, root, size));
  LOWCOMM_CHECK(check_elements(what, count, static_cast<uint64_t>(size)));
  if (root_holds_all) {
    LOWCOMM_CHECK(check_buffer(what, "send", send, count));
    return rank == root ? check_buffer(what, "recv", recv, count) : Status::ok();
  }
  if (rank == root) LOWCOMM_CHECK(check_buffer(what, "send", send, count));
  return check_buffer(what, "recv", recv, count);
}

Status check_all_to_all(const void* send, const std::vector<uint64_t>& send_counts,
                        const std::vector<uint64_t>& send_offsets, void* recv,
                        const std::vector<uint64_t>& recv_counts,
                        const std::vector<uint64_t>& recv_offsets, DType dtype, int rank,
                        int size) {
  const char* what = "all_to_all";
  LOWCOMM_CHECK(check_dtype(what, dtype));
  const auto n = static_cast<size_t>(size);
  if (send_counts.size() != n || send_offsets.size() != n || recv_counts.size() != n ||
      recv_offsets.size() != n)
    return invalid_argument(std::string(what) + ": counts and offsets need one entry per rank (" +
                            std::to_string(size) + ")");
  for (size_t j = 0; j < n; ++j) {
    for (uint64_t v : {send_counts[j], send_offsets[j], recv_counts[j], recv_offsets[j]})
      LOWCOMM_CHECK(check_elements(what, v));
    LOWCOMM_CHECK(check_buffer(what, "send", send, send_counts[j]));
    LOWCOMM_CHECK(check_buffer(what, "recv", recv, recv_counts[j]));
  }
  const auto me = static_cast<size_t>(rank);
  if (send_counts[me] != recv_counts[me])
    return invalid_argument(std::string(what) + ": this rank (" + std::to_string(rank) +
                            ") sends itself " + std::to_string(send_counts[me]) +
                            " elements but expects " + std::to_string(recv_counts[me]));
  return Status::ok();
}

}  // namespace lowcomm::collectives
