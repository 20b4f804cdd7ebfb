#include "transport/progress_engine.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <condition_variable>
#include <future>

#include "core/log.h"
#include "core/sys_check.h"

namespace lowcomm::transport {
namespace {
constexpr uint64_t kWakeTag = 0;
constexpr uint64_t kTimerTag = 1;
}  // namespace

Result<std::shared_ptr<ProgressEngine>> ProgressEngine::create(const std::string& thread_name) {
  std::shared_ptr<ProgressEngine> e(new ProgressEngine());
  e->epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!e->epoll_fd_) return sys_error("epoll_create1", "progress engine", errno);
  e->wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!e->wake_fd_) return sys_error("eventfd", "progress engine", errno);
  e->timer_fd_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!e->timer_fd_) return sys_error("timerfd_create", "progress engine", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  LOWCOMM_CHECK_SYS(::epoll_ctl(e->epoll_fd_.get(), EPOLL_CTL_ADD, e->wake_fd_.get(), &ev),
                    "progress engine eventfd");
  ev.data.u64 = kTimerTag;
  LOWCOMM_CHECK_SYS(::epoll_ctl(e->epoll_fd_.get(), EPOLL_CTL_ADD, e->timer_fd_.get(), &ev),
                    "progress engine timerfd");

  // The thread waits for `go` so that thread_id_ is written (by us) before the loop can read
  // it; the shared state lives on the heap, so neither side outlives what it touches.
  std::promise<void> go;
  std::shared_future<void> go_signal = go.get_future().share();
  ProgressEngine* raw = e.get();
  std::string name = thread_name.substr(0, 15);
  e->thread_ = std::thread([raw, go_signal] {
    go_signal.wait();
    raw->loop();
  });
  // Named from here, so the name is in place when create() returns (tools and tests that look
  // for the thread by name do not race its start).
  pthread_setname_np(e->thread_.native_handle(), name.c_str());
  e->thread_id_ = e->thread_.get_id();
  go.set_value();
  return e;
}

ProgressEngine::~ProgressEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_.get(), &one, sizeof(one));
  (void)ignored;
  if (thread_.joinable()) thread_.join();
}

void ProgressEngine::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    posted_.push_back(std::move(fn));
  }
  uint64_t one = 1;
  // EAGAIN means the counter is already non-zero: the loop will wake anyway.
  ssize_t ignored = LOWCOMM_SYS_RETRY(::write(wake_fd_.get(), &one, sizeof(one)));
  (void)ignored;
}

void ProgressEngine::run_sync(const std::function<void()>& fn) {
  if (on_engine_thread()) {
    fn();
    return;
  }
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool done = false;
  post([&] {
    fn();
    std::lock_guard<std::mutex> lock(done_mu);
    done = true;
    done_cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(done_mu);
  done_cv.wait(lock, [&] { return done; });
}

Result<uint64_t> ProgressEngine::watch(int fd, uint32_t events, Handler handler) {
  uint64_t id = next_id_++;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
    return sys_error("epoll_ctl(ADD)", "fd " + std::to_string(fd), errno);
  }
  watches_.emplace(id, Watch{fd, std::make_shared<Handler>(std::move(handler))});
  return id;
}

Status ProgressEngine::rewatch(uint64_t id, uint32_t events) {
  auto it = watches_.find(id);
  if (it == watches_.end()) return internal_error("rewatch of an unknown watch id");
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  LOWCOMM_CHECK_SYS(::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, it->second.fd, &ev),
                    "fd " + std::to_string(it->second.fd));
  return Status::ok();
}

void ProgressEngine::unwatch(uint64_t id) {
  auto it = watches_.find(id);
  if (it == watches_.end()) return;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, it->second.fd, nullptr);
  watches_.erase(it);
}

uint64_t ProgressEngine::add_timer(Clock::time_point when, std::function<void()> fn) {
  uint64_t id = next_id_++;
  auto it = timers_.emplace(when, std::make_pair(id, std::move(fn)));
  timer_index_.emplace(id, it);
  if (when < armed_for_) arm_timerfd();
  return id;
}

void ProgressEngine::cancel_timer(uint64_t id) {
  auto it = timer_index_.find(id);
  if (it == timer_index_.end()) return;
  timers_.erase(it->second);
  timer_index_.erase(it);
}

void ProgressEngine::arm_timerfd() {
  itimerspec spec{};
  if (timers_.empty()) {
    armed_for_ = Clock::time_point::max();
  } else {
    armed_for_ = timers_.begin()->first;
    auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(armed_for_.time_since_epoch()).count();
    if (ns <= 0) ns = 1;  // zero would disarm
    spec.it_value.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
    spec.it_value.tv_nsec = static_cast<long>(ns % 1'000'000'000);
  }
  if (::timerfd_settime(timer_fd_.get(), TFD_TIMER_ABSTIME, &spec, nullptr) != 0) {
    LOWCOMM_LOG(kWarn, "%s",
                sys_error("timerfd_settime", "progress engine", errno).to_string().c_str());
  }
}

void ProgressEngine::run_posted() {
  std::vector<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(posted_);
  }
  for (auto& fn : batch) fn();
}

void ProgressEngine::run_due_timers() {
  auto now = Clock::now();
  while (!timers_.empty() && timers_.begin()->first <= now) {
    auto node = timers_.extract(timers_.begin());
    timer_index_.erase(node.mapped().first);
    node.mapped().second();
  }
  arm_timerfd();
}

void ProgressEngine::loop() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) break;
    }
    int n = ::epoll_wait(epoll_fd_.get(), events, kMaxEvents, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      LOWCOMM_LOG(kWarn, "%s",
                  sys_error("epoll_wait", "progress engine", errno).to_string().c_str());
      break;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) {
        uint64_t count;
        ssize_t ignored = ::read(wake_fd_.get(), &count, sizeof(count));
        (void)ignored;
        run_posted();
      } else if (tag == kTimerTag) {
        uint64_t expirations;
        ssize_t ignored = ::read(timer_fd_.get(), &expirations, sizeof(expirations));
        (void)ignored;
        run_due_timers();
      } else {
        auto it = watches_.find(tag);
        if (it == watches_.end()) continue;  // unwatched earlier in this batch
        auto handler = it->second.handler;   // keeps the handler alive if it unwatches itself
        (*handler)(events[i].events);
      }
    }
  }
  // Drop timers and handlers here, on the engine thread, so captured objects are released in
  // one place; queued posted tasks are dropped by the destructor.
  timers_.clear();
  timer_index_.clear();
  watches_.clear();
}

}  // namespace lowcomm::transport
