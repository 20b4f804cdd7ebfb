#include "work.h"

#include "callback_threads.h"

#include <ATen/ThreadLocalState.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

namespace lowcomm::torch_backend {

namespace {
// String literals: the profiler keeps the pointer.
const char* profiling_title(c10d::OpType type) {
  switch (type) {
    case c10d::OpType::BROADCAST:
      return "lowcomm:broadcast";
    case c10d::OpType::ALLREDUCE:
    case c10d::OpType::ALLREDUCE_COALESCED:
      return "lowcomm:all_reduce";
    case c10d::OpType::REDUCE:
      return "lowcomm:reduce";
    case c10d::OpType::ALLGATHER:
    case c10d::OpType::ALLGATHER_COALESCED:
      return "lowcomm:all_gather";
    case c10d::OpType::_ALLGATHER_BASE:
      return "lowcomm:all_gather_into_tensor";
    case c10d::OpType::GATHER:
      return "lowcomm:gather";
    case c10d::OpType::SCATTER:
      return "lowcomm:scatter";
    case c10d::OpType::REDUCE_SCATTER:
      return "lowcomm:reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE:
      return "lowcomm:reduce_scatter_tensor";
    case c10d::OpType::ALLTOALL_BASE:
    case c10d::OpType::ALLTOALL:
      return "lowcomm:all_to_all";
    case c10d::OpType::SEND:
      return "lowcomm:send";
    case c10d::OpType::RECV:
      return "lowcomm:recv";
    case c10d::OpType::RECVANYSOURCE:
      return "lowcomm:recvAnySource";
    case c10d::OpType::BARRIER:
      return "lowcomm:barrier";
    default:
      return "lowcomm:op";
  }
}

// `finish` runs on the thread that completes the operation, often lowcomm's executor: with the
// caller's thread-local state (grad and inference mode, the profiler's), as torch's own future
// callbacks are, and without autograd: writing the results into the user's tensors is the
// communication itself, as NCCL's in-place writes are (a recv into a leaf that requires grad,
// under no_grad, must not fail because another thread runs the copy).
std::function<void()> with_callers_state(std::function<void()> finish) {
  if (!finish) return finish;
  return at::wrapPropagateTLSState([f = std::move(finish)] {
    at::NoGradGuard no_grad;
    f();
  });
}

}  // namespace

LowcommWork::LowcommWork(c10d::OpType type, int rank, std::vector<at::Tensor> outputs,
                         std::function<void()> finish,
                         const std::optional<std::vector<at::Tensor>>& inputs, const char* title)
    : c10d::Work(rank, type, title != nullptr ? title : profiling_title(type), inputs),
      outputs_(std::move(outputs)),
      finish_(with_callers_state(std::move(finish))) {}

c10::intrusive_ptr<c10::ivalue::Future> LowcommWork::getFuture() {
  std::lock_guard<std::mutex> lock(future_mu_);
  if (!future_) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()),
        device_ ? std::vector<c10::Device>{device_->device()} : std::vector<c10::Device>{});
    if (finished_) complete_future(future_);
  }
  return future_;
}

void LowcommWork::complete_future(const c10::intrusive_ptr<c10::ivalue::Future>& f) const {
  if (error_) {
    f->setError(error_);
  } else if (device_) {
    device_->mark_completed(*f, c10::IValue(outputs_));
  } else {
    f->markCompleted(c10::IValue(outputs_));
  }
}

void LowcommWork::start(std::vector<lowcomm::Work> works) {
  works_ = std::move(works);
  left_ = works_.size();
  if (works_.empty()) {
    on_one_done(lowcomm::Status::ok());  // nothing to wait for
    return;
  }
  // Each callback holds a reference: the Work outlives its lowcomm works' completion.
  for (auto& w : works_) {
    c10::intrusive_ptr<LowcommWork> self =
        c10::intrusive_ptr<LowcommWork>::unsafe_reclaim_from_nonowning(this);
    w.on_complete([self](const lowcomm::Status& s) { self->on_one_done(s); });
  }
}

void LowcommWork::on_one_done(const lowcomm::Status& s) {
  if (!s.is_ok()) {
    std::lock_guard<std::mutex> lock(first_error_mu_);
    if (first_error_.is_ok()) first_error_ = s;
  }
  if (!works_.empty() && --left_ != 0) return;
  lowcomm::Status err;
  {
    std::lock_guard<std::mutex> lock(first_error_mu_);
    err = first_error_;
  }
  if (source_rank_.load() < 0 && works_.size() == 1) source_rank_ = works_[0].source();
  std::exception_ptr e;
  if (err.is_ok()) {
    try {
      if (finish_ && device_) {
        device_->finish(finish_);  // the copies back, on the side stream
      } else if (finish_) {
        finish_();
      }
    } catch (...) {
      e = std::current_exception();
    }
  } else {
    e = std::make_exception_ptr(c10::DistBackendError(
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
        // "Timed out": the words torch's own backends use, which scripts and torch's tests match
        err.code() == lowcomm::StatusCode::kTimeout
            ? "lowcomm: Timed out at the group's timeout: " + err.message()
            : "lowcomm: " + err.to_string()));
  }
  finish_ = nullptr;  // frees the operation's buffers
  // The future first, then wait(): as Gloo's works do. A caller that returns from wait() and
  // then asks for the future must find it complete; torchft chains callbacks on it right after
  // wait() and breaks when they run later, on this thread.
  c10::intrusive_ptr<c10::ivalue::Future> f;
  {
    std::lock_guard<std::mutex> lock(future_mu_);
    finished_ = true;
    error_ = e;
    f = future_;
  }
  if (!f) {
    finish(e);  // c10d::Work: marks completed, wakes wait()
    return;
  }
  // The future's callbacks are user code that may call a collective or wait for a later work:
  // never on lowcomm's executor (callback_threads.h). The work completes after its future.
  c10::intrusive_ptr<LowcommWork> self =
      c10::intrusive_ptr<LowcommWork>::unsafe_reclaim_from_nonowning(this);
  run_on_callback_thread([self, f, e] {
    try {
      self->complete_future(f);  // outside the lock: its callbacks may call getFuture()
    } catch (...) {
      // A callback that throws must not keep wait() from returning.
      TORCH_WARN("lowcomm: a callback on a work's future threw; the work completes anyway");
    }
    self->finish(e);
  });
}

bool LowcommWork::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!completed_) return false;
  }
  return !device_ || device_->query();
}

bool LowcommWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr LowcommWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

void LowcommWork::wait_completed(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == kNoTimeout) {
    cv_.wait(lock, [&] { return completed_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
    TORCH_CHECK(false, "lowcomm: operation timed out after ", timeout.count(), " ms");
  }
  if (exception_) std::rethrow_exception(exception_);
}

void LowcommWork::wait_works() const {
  // Their statuses are not needed here: completion (on_one_done) makes a failure this Work's
  // exception, which wait_completed rethrows once it sees the Work complete.
  for (const lowcomm::Work& w : works_) static_cast<void>(w.wait());
}

void LowcommWork::run_now() {
  wait_works();
}

bool LowcommWork::wait(std::chrono::milliseconds timeout) {
  // Only an unbounded wait may run the operation here (lowcomm::Work::wait; its deadline is
  // the group's timeout); a wait with a timeout of its own must get control back by then.
  if (timeout == kNoTimeout) wait_works();
  wait_completed(timeout);
  // CUDA: the host has waited for the operation (device.h says why); the caller's current
  // stream now waits for its copies back.
  if (device_) device_->block_current_stream();
  return true;
}

void LowcommWork::synchronize() {
  if (!device_) return;  // CPU: nothing to order (c10d::Work's)
  wait_completed(kNoTimeout);
  device_->synchronize();
}

}  // namespace lowcomm::torch_backend
