#include "collectives/work_state.h"

#include "device/runtime.h"

namespace lowcomm {

std::shared_ptr<WorkState> WorkState::refused(Status why) {
  auto s = std::make_shared<WorkState>(0);
  s->refused_ = true;
  s->complete(std::move(why));
  return s;
}

void WorkState::complete(Status s) {
  finish(std::move(s), nullptr);
}

void WorkState::complete(Status s, OpStats stats, int source) {
  finish(std::move(s), &stats, source);
}

int WorkState::source() const {
  std::lock_guard<std::mutex> lock(mu_);
  return source_;
}

void WorkState::finish(Status s, OpStats* stats, int source) {
  std::vector<std::function<void(const Status&)>> callbacks;
  Status done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    status_ = std::move(s);
    if (stats) stats_ = std::move(*stats);
    source_ = source;
    if (!held_ || released_) callbacks.swap(callbacks_);
    done = status_;
    cv_.notify_all();
  }
  // Outside the lock: a callback may read this Work (status, stats) or wait on it.
  for (auto& fn : callbacks) fn(done);
}

void WorkState::release_callbacks() {
  std::vector<std::function<void(const Status&)>> callbacks;
  Status done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (released_) return;
    released_ = true;
    if (!done_) return;  // complete() runs them
    callbacks.swap(callbacks_);
    done = status_;
  }
  for (auto& fn : callbacks) fn(done);
}

void WorkState::on_complete(std::function<void(const Status&)> fn) {
  Status done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_ || (held_ && !released_)) {
      callbacks_.push_back(std::move(fn));
      return;
    }
    done = status_;
  }
  fn(done);
}

bool WorkState::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

Status WorkState::wait() const {
  // Only an unbounded wait runs the operation itself: wait_for's caller wants control back.
  if (run_here_ && !done()) run_here_(const_cast<WorkState*>(this));
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  return status_;
}

Status WorkState::wait_for(std::chrono::milliseconds d) const {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, d, [&] { return done_; }))
    return Status(StatusCode::kTimeout, "operation #" + std::to_string(seq_) + " still running");
  return status_;
}

Status WorkState::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) return internal_error("operation still in flight");
  return status_;
}

Result<OpStats> WorkState::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) return internal_error("operation still in flight");
  return stats_;
}

bool Work::refused() const {
  return state_ && state_->is_refused();
}
bool Work::test() const {
  return !state_ || state_->done();
}
Status Work::wait() const {
  return state_ ? state_->wait() : invalid_argument("empty Work");
}
Status Work::wait_for(std::chrono::milliseconds d) const {
  return state_ ? state_->wait_for(d) : invalid_argument("empty Work");
}
Status Work::status() const {
  return state_ ? state_->status() : invalid_argument("empty Work");
}
Result<OpStats> Work::stats() const {
  if (!state_) return invalid_argument("empty Work");
  return state_->stats();
}
void Work::on_complete(std::function<void(const Status&)> fn) const {
  if (!state_) {
    fn(invalid_argument("empty Work"));
    return;
  }
  state_->on_complete(std::move(fn));
}
Status Work::wait_on_stream(void* /*cuda_stream*/) const {
  if (!state_) return invalid_argument("wait_on_stream: empty Work");
  if (device::runtime() == nullptr)
    return unsupported(std::string("wait_on_stream: no device runtime: ") + device::why_none());
  // On the host (device/runtime.h says why no device-side wait): once the operation has
  // completed, its device results are in place for any stream's later work.
  (void)state_->wait();
  return Status::ok();
}

int Work::source() const {
  return state_ ? state_->source() : -1;
}
uint64_t Work::sequence() const {
  return state_ ? state_->seq() : 0;
}

}  // namespace lowcomm
