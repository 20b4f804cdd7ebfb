#pragma once
// Moves the parts of an elastic all-reduce's result into the caller's buffer while the rest of
// the result is still arriving (docs/membership.md, "A collective"): the data collective reports
// each part of its output as it becomes final (AllReduceOptions::on_result), and a thread of the
// mover's own copies it over the caller's buffer, keeping what it replaces. If the collective
// commits, only the parts never reported remain to be copied; if it aborts (or the replica check
// fails), what was replaced is put back, so the caller's buffer is untouched. One per attempt.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace lowcomm {

class ResultMover {
 public:
  // result: where the data collective writes; dst: the caller's buffer; backup: room for what
  // the moved parts replace; each `bytes` long, distinct.
  ResultMover(const uint8_t* result, uint8_t* dst, uint8_t* backup, uint64_t bytes);
  ResultMover(const ResultMover&) = delete;
  ResultMover& operator=(const ResultMover&) = delete;
  ~ResultMover();  // an attempt that did not commit: undo()

  // For AllReduceOptions::on_result: queues a part (called on the communicator's thread).
  std::function<void(uint64_t offset, uint64_t bytes)> hook();
  // The collective committed: dst takes the whole result (the parts not moved yet are copied
  // here, without keeping what they replace). `from_scratch`: the result was replaced since
  // the parts were moved (fetched from another member): all of it is copied.
  void commit(bool from_scratch = false);
  // The collective aborted: dst gets back every byte the moved parts replaced.
  void undo();
  // Every part queued so far moved (what it replaced kept), the thread gone; before the
  // result buffer is written by anything else.
  void stop();
  uint64_t moved_bytes() const { return moved_bytes_; }

 private:
  void run();

  const uint8_t* result_;
  uint8_t* dst_;
  uint8_t* backup_;
  uint64_t bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, uint64_t>> queue_;
  bool stopping_ = false;
  bool keep_replaced_ = true;  // false once committed: nothing needs putting back
  std::vector<std::pair<uint64_t, uint64_t>> moved_;  // (offset, bytes), the mover thread's
  uint64_t moved_bytes_ = 0;
  bool settled_ = false;  // committed or undone
  std::thread thread_;
};

}  // namespace lowcomm
