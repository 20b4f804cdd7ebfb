#pragma once
// WorkState: the completion of one communicator operation (behind lowcomm::Work).
// Completes exactly once, with its status and its statistics (OpStats); test/wait from any
// thread (its own mutex).

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "lowcomm/communicator.h"

namespace lowcomm {

class WorkState {
 public:
  // `identity`: the statistics of the operation before it runs (identity_stats).
  explicit WorkState(uint64_t seq, OpStats identity = {})
      : seq_(seq), stats_(std::move(identity)) {}
  // An operation refused before it was queued (Work::refused): complete with `why` already.
  static std::shared_ptr<WorkState> refused(Status why);
  // First completion wins. Without stats (never ran): the identity, zero counters.
  void complete(Status s);
  // `source`: the rank a receive took its message from (-1: not a receive).
  void complete(Status s, OpStats stats, int source = -1);
  bool done() const;
  Status wait() const;
  Status wait_for(std::chrono::milliseconds d) const;
  Status status() const;
  Result<OpStats> stats() const;  // kInternal "in flight" before completion, as status()
  // Work::on_complete: runs fn(status) now if complete (and its callbacks released), else with
  // the others once they are.
  void on_complete(std::function<void(const Status&)> fn);
  // Set once, before the state is shared (a communicator's queued operations): completion wakes
  // the waiters but leaves the callbacks to release_callbacks(), which the communicator calls
  // once the thread that ran the operation has given up the executor's place, so that a
  // callback may call a collective or wait on a later operation (comm_impl.h, "Callbacks").
  void hold_callbacks() { held_ = true; }
  // Runs the callbacks registered so far (once complete), and lets later ones run at once.
  void release_callbacks();
  uint64_t seq() const { return seq_; }
  int source() const;
  bool is_refused() const { return refused_; }
  // Set once, before the state is shared: what wait() calls first, to run the operation on the
  // waiting thread if nothing has started it yet (CommImpl, small collectives).
  void set_run_here(std::function<void(WorkState*)> fn) { run_here_ = std::move(fn); }

 private:
  const uint64_t seq_;
  bool refused_ = false;   // set before the state is shared, constant after
  bool held_ = false;      // hold_callbacks: set before the state is shared, constant after
  bool released_ = false;  // release_callbacks has run (guarded by mu_)
  mutable std::mutex mu_;  // guards done_, status_ and stats_
  mutable std::condition_variable cv_;
  bool done_ = false;
  Status status_;
  OpStats stats_;
  int source_ = -1;
  std::vector<std::function<void(const Status&)>> callbacks_;  // until done_
  std::function<void(WorkState*)> run_here_;                   // constant once shared

  void finish(Status s, OpStats* stats, int source = -1);
};

}  // namespace lowcomm
