#pragma once
// WorkState: the completion of one communicator operation (behind lowcomm::Work).
// Completes exactly once; test/wait from any thread (its own mutex).

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "lowcomm/communicator.h"

namespace lowcomm {

class WorkState {
 public:
  explicit WorkState(uint64_t seq) : seq_(seq) {}
  // An operation refused before it was queued (Work::refused): complete with `why` already.
  static std::shared_ptr<WorkState> refused(Status why);
  void complete(Status s);  // first completion wins
  bool done() const;
  Status wait() const;
  Status wait_for(std::chrono::milliseconds d) const;
  Status status() const;
  uint64_t seq() const { return seq_; }
  bool is_refused() const { return refused_; }

 private:
  const uint64_t seq_;
  bool refused_ = false;   // set before the state is shared, constant after
  mutable std::mutex mu_;  // guards done_ and status_
  mutable std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

}  // namespace lowcomm
