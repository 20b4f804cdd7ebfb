#pragma once
// ProgressEngine: one named thread running an epoll loop. Every socket of every peer attached
// to an engine is read and written only on this thread, so peer state needs no locks; other
// threads hand work over with post() (woken through an eventfd). Timers (the WAN pacer's
// release times) run on the same thread, driven by one timerfd armed at the earliest timer.
//
// Thread safety: post(), run_sync() and on_engine_thread() may be called from any thread.
// watch/rewatch/unwatch/add_timer/cancel_timer must be called on the engine thread (from a
// posted task, a handler or a timer). Handlers and tasks must not block and must not throw.
//
// Destruction stops the loop and joins the thread; tasks still queued are destroyed unrun.
// Everything attached (peers) must be detached first; Peer holds a shared_ptr to its engine.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/unique_fd.h"
#include "lowcomm/status.h"
#include "transport/arrival_meter.h"

namespace lowcomm::transport {

class ProgressEngine {
 public:
  using Clock = std::chrono::steady_clock;
  using Handler = std::function<void(uint32_t epoll_events)>;

  // thread_name is truncated to 15 characters (the kernel's limit).
  static Result<std::shared_ptr<ProgressEngine>> create(
      const std::string& thread_name = "lc-engine");
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  // Runs fn on the engine thread, after every task posted before it.
  void post(std::function<void()> fn);
  // Runs fn on the engine thread and waits for it; runs it inline when called on that thread.
  void run_sync(const std::function<void()>& fn);
  bool on_engine_thread() const { return std::this_thread::get_id() == thread_id_; }

  // --- engine thread only ---
  // Returns a watch id; the handler gets the epoll event mask.
  Result<uint64_t> watch(int fd, uint32_t events, Handler handler);
  Status rewatch(uint64_t id, uint32_t events);
  void unwatch(uint64_t id);  // safe inside the handler being removed
  uint64_t add_timer(Clock::time_point when, std::function<void()> fn);
  void cancel_timer(uint64_t id);

  // What the peers on this engine have received and sent, for rate estimates (any thread).
  ArrivalMeter& down_meter() { return down_meter_; }
  ArrivalMeter& up_meter() { return up_meter_; }

 private:
  ProgressEngine() = default;
  ArrivalMeter down_meter_;
  ArrivalMeter up_meter_;
  void loop();
  void run_posted();
  void run_due_timers();
  void arm_timerfd();

  UniqueFd epoll_fd_;
  UniqueFd wake_fd_;   // eventfd
  UniqueFd timer_fd_;  // timerfd, CLOCK_MONOTONIC (the steady clock)
  std::thread thread_;
  std::thread::id thread_id_;

  std::mutex mu_;  // guards posted_ and stop_
  std::vector<std::function<void()>> posted_;
  bool stop_ = false;

  // Engine-thread state.
  struct Watch {
    int fd;
    std::shared_ptr<Handler> handler;
  };
  std::unordered_map<uint64_t, Watch> watches_;
  std::multimap<Clock::time_point, std::pair<uint64_t, std::function<void()>>> timers_;
  std::unordered_map<uint64_t, decltype(timers_)::iterator> timer_index_;
  Clock::time_point armed_for_ = Clock::time_point::max();
  uint64_t next_id_ = 2;  // 0 and 1 tag the eventfd and the timerfd in epoll data
};

}  // namespace lowcomm::transport
