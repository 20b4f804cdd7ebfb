#pragma once
// LowcommWork: torch's c10d::Work over one or more lowcomm::Work. It completes when all of them
// have (then it copies staged outputs back into non-contiguous user tensors), from the
// communicator's executor thread; a future asked for before then is completed first, on a
// callback thread (callback_threads.h), so DDP communication hooks chain on it without a
// waiting thread and its callbacks may call collectives or wait for later works. A failure
// becomes a C10 error naming the operation, raised by wait() and set on the future.
//
// wait() on CPU tensors waits through lowcomm::Work::wait, so a small collective that nothing
// has started yet runs on the waiting thread (CommOptions::inline_bytes: the hand-offs to the
// communicator's thread and back leave the critical path); its completion, the future's
// included, then runs on that thread before wait() returns. An operation the caller waits for
// at once (torch's asyncOp = false: dist.all_reduce without async_op) starts that way inside
// the backend's call (run_now), before torch's Python layer gets the Work back.
//
// A CUDA operation (set_device, device.h) has Gloo's semantics for CUDA tensors: completion
// runs `finish` (the copies back) on the backend's side stream; wait() blocks the host until
// completion, as for CPU tensors, then makes the caller's current stream wait for the copies
// back; synchronize() also blocks the host for them; the future is made for the device and
// completed with events ordered after them. (No device-side wait: device.h says why.)

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "device.h"
#include "lowcomm/communicator.h"

namespace lowcomm::torch_backend {

class LowcommWork : public c10d::Work {
 public:
  // `outputs`: what the future yields; `finish`: run once all works succeeded (copy-back);
  // `inputs`: the shapes torch's profiler records, under the event "lowcomm:<op>" (Gloo's
  // naming; `title` when set, a string literal), open from here to completion.
  LowcommWork(c10d::OpType type, int rank, std::vector<at::Tensor> outputs,
              std::function<void()> finish = {},
              const std::optional<std::vector<at::Tensor>>& inputs = std::nullopt,
              const char* title = nullptr);
  // A CUDA operation: what wait(), synchronize() and the future order on. Before start().
  void set_device(std::shared_ptr<DeviceDone> device) { device_ = std::move(device); }
  // Call once, after the constructor, with the operation's works (may be empty: complete now).
  void start(std::vector<lowcomm::Work> works);

  // The caller waits for this operation next (torch's asyncOp = false): runs it as wait()
  // would (on this thread if it is small and next in line, else until it completes), leaving
  // its error for wait() to raise.
  void run_now();

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  // Made on the first call (most works are only waited on; a future costs an allocation and a
  // completion on the executor's thread), completed when the work is, or at once if it was.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // recv: the peer; recvAnysource: the sender it matched, once complete.
  int sourceRank() const override { return source_rank_.load(); }
  void set_source_rank(int r) { source_rank_ = r; }

 private:
  void on_one_done(const lowcomm::Status& s);
  // lowcomm::Work::wait on each work in turn: the core runs a small one here when nothing has
  // started it (else waits for the communicator's thread); completion runs on_one_done.
  void wait_works() const;
  // Until the operation completes (any timeout: kNoTimeout waits without one); rethrows its error.
  void wait_completed(std::chrono::milliseconds timeout);

  std::vector<at::Tensor> outputs_;
  std::function<void()> finish_;  // dropped once run (the buffers it holds are freed then)
  std::shared_ptr<DeviceDone> device_;
  void complete_future(const c10::intrusive_ptr<c10::ivalue::Future>& f) const;
  std::mutex future_mu_;  // guards future_, finished_, error_
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool finished_ = false;
  std::exception_ptr error_;
  std::vector<lowcomm::Work> works_;
  std::atomic<size_t> left_{0};
  std::mutex first_error_mu_;
  lowcomm::Status first_error_;
  std::atomic<int> source_rank_{-1};
};

// `w` (a LowcommWork), run first (run_now) when torch's caller waits for it at once
// (opts.asyncOp false: dist.all_reduce and the other collectives without async_op).
template <class Options>
c10::intrusive_ptr<c10d::Work> started(const Options& opts, c10::intrusive_ptr<c10d::Work> w) {
  if (!opts.asyncOp)
    if (auto* lw = dynamic_cast<LowcommWork*>(w.get())) lw->run_now();
  return w;
}

}  // namespace lowcomm::torch_backend
