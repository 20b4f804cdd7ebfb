#pragma once
// LowcommBackend: the c10d::Backend named "lowcomm". Rendezvous through the Store
// torch hands the backend: rank 0 creates the communicator id (address and secret) and sets it
// under the group's prefix; the others read it. Every op maps onto one lowcomm collective over
// host tensors (no copy for contiguous ones; non-contiguous inputs are staged, outputs copied
// back at completion) or CUDA tensors of one device (device.h: the library's device path, or
// staged through pinned host memory; Gloo's semantics for CUDA tensors: wait() blocks the host).
// Exact by default; float sum/avg all-reduces at or above codec_threshold bytes are compressed with
// `codec` when one is set.

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "call_order_keys.h"
#include "device.h"
#include "lowcomm/communicator.h"
#include "tensor_util.h"

namespace lowcomm::torch_backend {

struct BackendConfig {
  std::string codec;                  // "": exact
  int64_t codec_threshold = 1 << 20;  // bytes; smaller all-reduces stay exact
  // Error feedback on the compressed ones, one residual per gradient buffer, keyed by:
  enum class ErrorFeedback { kOff, kAddress, kCallOrder };
  // kAddress: the tensor's address and shape (a buffer that lives across steps: DDP's buckets,
  // gradients accumulated in place); kCallOrder: the call's place in the repeating sequence of
  // compressed calls (a fresh tensor per parameter every step; call_order_keys.h).
  ErrorFeedback error_feedback = ErrorFeedback::kOff;
  // All-reduces of at most this many bytes take one hop (CommOptions::direct_bytes); -1: the
  // core's default (LOWCOMM_DIRECT_BYTES, else never).
  int64_t direct_bytes = -1;
  // A randk codec's all-reduce schedule (CommOptions::sparse_schedule); "": the core's default
  // (LOWCOMM_SPARSE_SCHEDULE, else auto).
  std::string sparse_schedule;
  // CommOptions::join_timeout; 0: none. Non-root ranks wait this long for rank 0's id in the
  // store too (torchft's ProcessGroupLowcomm sets it: its quorum's members start together).
  std::chrono::milliseconds join_timeout{0};
};

class LowcommBackend : public c10d::Backend {
 public:
  // reconfigurable: torch's enable_reconfigure. The backend then has no communicator (and its
  // operations fail, saying so) until reconfigure() gives it one; the store is not used.
  LowcommBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                 std::chrono::milliseconds timeout, BackendConfig config,
                 bool reconfigurable = false);
  ~LowcommBackend() override;

  // lowcomm.torch's creator (register_backend with the extended API): the group's store,
  // rank, size and timeout, and the codec settings of its options (or the environment).
  static c10::intrusive_ptr<c10d::Backend> create(
      const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
      const std::chrono::duration<float>& timeout, const std::string& codec,
      int64_t codec_threshold, const std::string& error_feedback, int64_t direct_bytes,
      bool enable_reconfigure = false, const std::string& sparse_schedule = "",
      int64_t join_timeout_ms = 0);

  const std::string getBackendName() const override { return "lowcomm"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // The coalesced collectives (coalesced.cc) of FSDP2, DTensor's functional collectives and
  // dist._coalescing_manager: one Work for a list of tensors, each result as if its tensor's
  // collective ran alone (Gloo's). torch 2.15 calls all_gather_single_coalesced and
  // reduce_scatter_single_coalesced, whose defaults forward to these older names (2.11 calls
  // these directly), so overriding these serves both.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  // Gloo's semantics: every rank reports to rank 0, which waits at most opts.timeout and names
  // the first rank (waitAllRanks: every rank) that did not come; then releases the others. On a
  // failure the group is aborted (a receive is left waiting), so later operations fail at once.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;

  // The group's collectives so far (the same on every rank of a healthy group): torch's
  // ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL) puts it in each op's fingerprint.
  void setSequenceNumberForGroup() override {}  // numbering starts at 0 on every rank
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  // torch.distributed.shrink_group (torch >= 2.11): a new backend over the ranks not in
  // `ranks_to_exclude` (ranks of this group), ranked in order; only those ranks call it, each
  // once per shrink and in the same order. Rendezvous through this group's store under a key of
  // its own. SHRINK_ABORT (flag 1) aborts this backend's operations in flight first. The new
  // backend has this one's codec settings and timeout (opts_override is not used).
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranks_to_exclude, int shrink_flags = 0,
      const c10::intrusive_ptr<c10d::Backend::Options>& opts_override = nullptr) override;

#ifdef C10D_BACKEND_HAS_RECONFIGURE
  // torch 2.15's membership change without a new group (dist._get_reconfigure_handle,
  // dist._reconfigure). A handle is this process's own root id ("lowcomm1:<address>/<secret>":
  // a listening socket opened when the handle is first asked for, so exchange handles only
  // among the members, as torch's store does). reconfigure(uuid, handles) builds a communicator
  // over the members the handles name: rank = position in a list, or in the sorted order of a
  // set; the first handle's process is the root and its listener serves; every member derives
  // the secret from the uuid (derive_unique_id), so members that disagree on the uuid fail
  // the handshake. The previous communicator, if any, is aborted first (its peers may be dead);
  // error-feedback residuals move to the new one when the old one can still give them.
  // Blocks until every member is connected (or opts.timeout, else the group's timeout) and
  // returns a completed Work; on failure it throws and the backend has no communicator. A uuid
  // used before, a handle list without this process's current handle, a handle twice, or an
  // unparsable handle is refused by name. A root's handle is spent: ask again for the next one.
  // No operation may run concurrently with reconfigure on this group.
  bool supportsReconfigure() const override {
    return true;
  }
  c10d::ReconfigureHandle get_reconfigure_handle() const override;
  c10::intrusive_ptr<c10d::Work> reconfigure(const c10d::ReconfigureOptions& opts) override;
#endif

  // Fails everything in flight with an error and closes the connections (torch's abort).
  void abort() override;
  // Finishes queued operations, says goodbye to every peer and closes (destroy_process_group).
  void shutdown() override;
  // lowcomm.torch's atexit hook: every backend of this process still open (no
  // destroy_process_group) is aborted and closed while Python can still run other threads.
  // Otherwise a communicator's thread could release the last reference to a tensor (completing
  // an operation) after the interpreter began to finalize, where taking the GIL ends the
  // thread by a forced unwind and the process aborts ("terminate called without an active
  // exception"). The peers see this process go, as if it had exited. Returns how many closed.
  static int close_all_at_exit();
  // SUCCESS, or why the group broke: TIMEOUT for a deadline, REMOTE_ERROR for a peer's
  // failure or disconnection, COMM_ERROR otherwise.
  c10d::ErrorType getError() override;

  // Python: per-op statistics of the last completed operation.
  lowcomm::OpStats last_op_stats() const {
    return comm()->last_op_stats();
  }

  // lowcomm.torch.all_reduce / the DDP hook: one all-reduce with its own codec ("" exact) and
  // error-feedback key ("" none), whatever the group's defaults. step >= 0: the stochastic
  // rounding step (else the operation's sequence number), so a resumed run rounds alike.
  // owner_ef: error feedback on the owners' re-quantization of the average too (same key).
  c10::intrusive_ptr<c10d::Work> allreduce_with(at::Tensor& tensor, const std::string& codec,
                                                const std::string& error_feedback_key,
                                                c10d::ReduceOp op, int64_t step = -1,
                                                bool owner_ef = false);
  // Error-feedback residuals of every key, as bytes (checkpoints), and back.
  std::vector<uint8_t> save_error_feedback();
  void restore_error_feedback(const std::vector<uint8_t>& bytes);
  // The keys that hold residuals, sorted.
  std::vector<std::string> error_feedback_keys();
  // Drops the residuals under `name`: the key itself and every key below it ("name/...");
  // "": every key. The call-order keys start over when all of them were dropped. The next call
  // under a dropped key starts from a zero residual. Returns how many keys were dropped; runs
  // in order with the operations queued before it (Communicator::reset_error_feedback).
  size_t reset_error_feedback(const std::string& name);

 private:
  lowcomm::Communicator* comm() const {
    TORCH_CHECK(comm_ != nullptr,
                awaiting_members_ ? "lowcomm: this group has no members yet: it was created with "
                                    "enable_reconfigure=True (or its last reconfigure failed); "
                                    "dist._reconfigure(...) gives it a communicator"
                                  : "lowcomm: the process group was shut down");
    return comm_.get();
  }

  // The options of this group's communicators (the constructor's and reconfigure's).
  lowcomm::CommOptions comm_options() const {
    lowcomm::CommOptions o;
    o.timeout = timeout_;
    if (config_.direct_bytes >= 0) o.direct_bytes = static_cast<uint64_t>(config_.direct_bytes);
    o.sparse_schedule = config_.sparse_schedule;
    o.join_timeout = config_.join_timeout;
    return o;
  }

  void remember();  // joins the set close_all_at_exit closes
  void forget();    // leaves it

  // Sparse COO tensors (SUM): all-gathers of the counts, indices and values, summed locally.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(at::Tensor& tensor,
                                                  const c10d::AllreduceOptions& opts);
  // A Work over `works` (completes when they all have; `finish` then runs); counts collectives.
  // `inputs`: the tensors the profiler records (unset: `outputs`, for in-place operations);
  // `title`: the profiler's event name (unset: the one `type` has). A CUDA operation (`dev`)
  // runs `finish` (its copies back) on the side stream once it has completed.
  c10::intrusive_ptr<c10d::Work> launch(DeviceScope& dev, c10d::OpType type,
                                        std::vector<at::Tensor> outputs,
                                        std::vector<lowcomm::Work> works,
                                        std::function<void()> finish = {},
                                        std::optional<std::vector<at::Tensor>> inputs = {},
                                        const char* title = nullptr);
  // The group's options for an all-reduce of the user's tensor `t` (contiguous or not: the
  // error-feedback key names it, not a staged copy): its codec and error-feedback key when the
  // group compresses such a call (a codec is set, a float dtype, SUM or AVG, at least
  // codec_threshold bytes), else exact.
  lowcomm::AllReduceOptions group_allreduce_options(const at::Tensor& t, lowcomm::ReduceOp op);
  bool group_compresses(const at::Tensor& b, lowcomm::ReduceOp op) const;

  std::unique_ptr<lowcomm::Communicator> comm_;
  c10::intrusive_ptr<c10d::Store> store_;  // for shrink's rendezvous
  std::chrono::milliseconds timeout_;
  uint64_t shrinks_ = 0;
  // reconfigure: no communicator until one succeeds; the uuids seen; this process's handle.
  bool awaiting_members_ = false;
  std::set<int64_t> uuids_;
  mutable std::mutex handle_mu_;
  mutable std::optional<lowcomm::UniqueId> handle_;  // guarded by handle_mu_
  std::atomic<uint64_t> seq_{0};
  BackendConfig config_;
  std::optional<lowcomm::CodecSpec> codec_;  // config_.codec, parsed
  CallOrderKeys order_keys_;
  SideStreams streams_;  // CUDA operations' side stream per device (device.h)
};

}  // namespace lowcomm::torch_backend
