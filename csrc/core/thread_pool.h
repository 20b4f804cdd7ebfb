#pragma once
// A small fixed pool of named worker threads for data-parallel loops (the CPU codec path).
// parallel_for blocks until every index has run; the calling thread runs indices too, so a
// call never waits on a busy pool and concurrent callers cannot deadlock.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lowcomm {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // total parallelism including the caller
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) for i in [0, count) on up to max_threads threads (0 or more than size(): all).
  void parallel_for(uint64_t count, int max_threads, const std::function<void(uint64_t)>& fn);

  // The process-wide codec pool: LOWCOMM_CODEC_THREADS threads, default all hardware threads.
  static ThreadPool& global();

 private:
  struct Loop;
  void worker_main(int index);

  std::mutex mu_;  // guards queue_ and stop_
  std::condition_variable cv_;
  std::deque<Loop*> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace lowcomm
