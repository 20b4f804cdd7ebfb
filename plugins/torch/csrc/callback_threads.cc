#include "callback_threads.h"

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace lowcomm::torch_backend {

namespace {

class CallbackThreads {
 public:
  void run(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    // Every idle thread takes one task: more tasks than idle threads need another thread, or a
    // task would wait behind one that blocks.
    if (tasks_.size() > idle_) {
      std::thread([this] { work(); }).detach();
    } else {
      cv_.notify_one();
    }
  }

 private:
  void work() {
    pthread_setname_np(pthread_self(), "lc-torch-cb");
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      ++idle_;
      const bool woken =
          cv_.wait_for(lock, std::chrono::seconds(10), [&] { return !tasks_.empty(); });
      --idle_;
      if (!woken) return;  // idle for 10 s: leave
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      task = nullptr;  // what it holds (the work) is released off the lock
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  size_t idle_ = 0;
};

}  // namespace

void run_on_callback_thread(std::function<void()> task) {
  // Never destroyed: detached threads may still wait on it while the process exits.
  static auto* threads = new CallbackThreads;
  threads->run(std::move(task));
}

}  // namespace lowcomm::torch_backend
