#include "transport/request.h"

namespace lowcomm::transport {

bool RequestState::complete(Status s, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_) return false;
  done_ = true;
  bytes_ = s.is_ok() ? bytes : 0;
  status_ = std::move(s);
  cv_.notify_all();
  return true;
}

bool RequestState::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

Status RequestState::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) return internal_error("request still in flight");
  return status_;
}

Status RequestState::wait(Deadline deadline) const {
  deadline = deadline.resolve();
  std::unique_lock<std::mutex> lock(mu_);
  if (deadline.is_none()) {
    cv_.wait(lock, [&] { return done_; });
  } else if (!cv_.wait_until(lock, deadline.time(), [&] { return done_; })) {
    return Status(StatusCode::kTimeout, "request did not complete before its deadline");
  }
  return status_;
}

uint64_t RequestState::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ ? bytes_ : 0;
}

Status Request::status() const {
  if (!state_) return invalid_argument("empty request");
  return state_->status();
}

Status Request::wait(Deadline deadline) const {
  if (!state_) return invalid_argument("empty request");
  return state_->wait(deadline);
}

}  // namespace lowcomm::transport
