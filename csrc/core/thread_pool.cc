#include "core/thread_pool.h"

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "core/params.h"

namespace lowcomm {

// One parallel_for call. Helpers take indices from `next` until none remain; `active` counts
// threads inside run() so the caller can wait until the last one has left.
struct ThreadPool::Loop {
  const std::function<void(uint64_t)>* fn;
  uint64_t count;
  std::atomic<uint64_t> next{0};
  std::atomic<int> helpers_left;  // how many more pool threads may join
  std::mutex mu;
  std::condition_variable done_cv;
  int active = 0;  // guarded by mu

  void run() {
    for (uint64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) (*fn)(i);
  }
};

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_main(int index) {
  std::string name = "lc-codec-" + std::to_string(index);
  pthread_setname_np(pthread_self(), name.c_str());
  while (true) {
    Loop* loop = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      loop = queue_.front();
      if (loop->helpers_left.fetch_sub(1) <= 1) queue_.pop_front();
      std::lock_guard<std::mutex> loop_lock(loop->mu);
      ++loop->active;
    }
    loop->run();
    std::lock_guard<std::mutex> loop_lock(loop->mu);
    if (--loop->active == 0) loop->done_cv.notify_all();
  }
}

void ThreadPool::parallel_for(uint64_t count, int max_threads,
                              const std::function<void(uint64_t)>& fn) {
  if (count == 0) return;
  int threads = (max_threads <= 0 || max_threads > size()) ? size() : max_threads;
  if (static_cast<uint64_t>(threads) > count) threads = static_cast<int>(count);
  if (threads <= 1) {
    for (uint64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  Loop loop;
  loop.fn = &fn;
  loop.count = count;
  loop.helpers_left = threads - 1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(&loop);
  }
  cv_.notify_all();
  loop.run();
  {
    // Withdraw the loop so no worker joins after we return.
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (*it == &loop) {
        queue_.erase(it);
        break;
      }
    }
  }
  std::unique_lock<std::mutex> loop_lock(loop.mu);
  loop.done_cv.wait(loop_lock, [&] { return loop.active == 0; });
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    auto set = params::integer("LOWCOMM_CODEC_THREADS");  // malformed: init says so
    int n = set.is_ok() && set->has_value() ? static_cast<int>(**set) : 0;
    if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
    return n > 0 ? n : 1;
  }());
  return pool;
}

}  // namespace lowcomm
