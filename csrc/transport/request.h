#pragma once
// Request: the completion object of one isend or irecv. Cheap to copy (shared state).
//
// A request completes exactly once, with ok or with the error that stopped it. test() and
// wait() may be called from any thread. After wait() returns kTimeout the operation is still in
// flight and its buffer still in use: keep waiting, or abort() the peer (which finishes every
// request before it returns) before freeing the buffer.

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "core/deadline.h"
#include "lowcomm/status.h"

namespace lowcomm::transport {

class Peer;

class RequestState {
 public:
  // First completion wins; later ones are ignored. Returns whether this call completed it.
  // `bytes`: what a receive took in (irecv_upto); 0 for sends and failures.
  bool complete(Status s, uint64_t bytes = 0);
  bool done() const;
  Status wait(Deadline deadline) const;
  Status status() const;
  uint64_t bytes() const;
  // A receive: chunks of its message that failed their check and were sent again (set by the
  // engine before it completes the request).
  void set_resent_chunks(uint64_t n) { resent_chunks_.store(n, std::memory_order_relaxed); }
  uint64_t resent_chunks() const { return resent_chunks_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> resent_chunks_{0};
  mutable std::mutex mu_;  // guards done_, status_ and bytes_
  mutable std::condition_variable cv_;
  bool done_ = false;
  Status status_;
  uint64_t bytes_ = 0;
};

class Request {
 public:
  Request() = default;  // not a request: test() is true, status is invalid argument
  explicit Request(std::shared_ptr<RequestState> s) : state_(std::move(s)) {}

  bool valid() const { return state_ != nullptr; }
  // True once complete (successfully or not).
  bool test() const { return !state_ || state_->done(); }
  // The final status once test() is true; kInternal "still in flight" before.
  Status status() const;
  // Once complete: the length of the message a receive took in (its posted length for irecv, at
  // most the capacity for Peer::irecv_upto); 0 for sends, failures and before completion.
  uint64_t received_bytes() const { return state_ ? state_->bytes() : 0; }
  // Once complete: for a receive, how many chunks of its message failed their check and were
  // sent again by the peer (peer_core.h); 0 otherwise.
  uint64_t resent_chunks() const { return state_ ? state_->resent_chunks() : 0; }
  // Waits until complete or the deadline; kTimeout when the deadline passed first.
  Status wait(Deadline deadline = Deadline::use_default()) const;
  // The same request (copies share their state).
  bool operator==(const Request& other) const { return state_ == other.state_; }

 private:
  friend class Peer;  // Peer::cancel finds the receive by its state
  std::shared_ptr<RequestState> state_;
};

}  // namespace lowcomm::transport
