#include "emulated_device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <string>

#include "lowcomm/codec.h"

namespace lowcomm::testing {

struct EmulatedDevice::StreamImpl {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<Status()>> tasks;
  bool stop = false;
  Status error;  // the first failure of a task, reported by synchronize
  std::thread worker;

  StreamImpl() {
    worker = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu);
      for (;;) {
        cv.wait(lock, [this] { return stop || !tasks.empty(); });
        if (tasks.empty()) return;
        auto t = std::move(tasks.front());
        lock.unlock();
        Status s = t();
        lock.lock();
        tasks.pop_front();
        if (!s && error.is_ok()) error = s;
        cv.notify_all();
      }
    });
  }
  ~StreamImpl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    worker.join();
  }
  void push(std::function<Status()> t) {
    std::lock_guard<std::mutex> lock(mu);
    tasks.push_back(std::move(t));
    cv.notify_all();
  }
};

struct EmulatedDevice::EventImpl {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // records issued
  uint64_t completed = 0;  // records their stream has reached
};

namespace {
constexpr int kDevices = 2;
// Each thread's current device per emulated runtime (CUDA's is per thread, 0 until set), by
// the runtime's serial number (a runtime made where an earlier one was starts afresh).
thread_local std::map<uint64_t, int> t_current;
std::atomic<uint64_t> g_serial{0};
}  // namespace

EmulatedDevice::EmulatedDevice()
    : serial_(g_serial.fetch_add(1)), legacy_(std::make_unique<StreamImpl>()) {}
EmulatedDevice::~EmulatedDevice() {
  legacy_.reset();
  for (auto& [p, n] : device_) std::free(reinterpret_cast<void*>(p));
}

EmulatedDevice::StreamImpl* EmulatedDevice::stream_of(device::Stream s) {
  return s == nullptr ? legacy_.get() : static_cast<StreamImpl*>(s);
}

void EmulatedDevice::enqueue(device::Stream s, std::function<Status()> task) {
  std::shared_lock<std::shared_mutex> driver(driver_);
  stream_of(s)->push(std::move(task));
}

Result<int> EmulatedDevice::device_of(const void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = device_.upper_bound(a);
  if (it != device_.begin()) {
    --it;
    if (a < it->first + std::max<uint64_t>(it->second.bytes, 1)) return it->second.device;
  }
  return invalid_argument("the pointer is host memory, not device memory (emulated device)");
}

Status EmulatedDevice::set_device(int device) {
  if (device < 0 || device >= kDevices)
    return invalid_argument("emulated device: no device " + std::to_string(device));
  t_current[serial_] = device;
  return Status::ok();
}

Result<int> EmulatedDevice::current_device() {
  auto it = t_current.find(serial_);
  return it == t_current.end() ? 0 : it->second;
}

Result<void*> EmulatedDevice::alloc_pinned(uint64_t bytes) {
  ++pinned_allocs_;
  void* p = std::malloc(bytes);
  if (p == nullptr) return Status(StatusCode::kSystem, "emulated pinned allocation failed");
  return p;
}
void EmulatedDevice::free_pinned(void* p) {
  std::free(p);
}

void* EmulatedDevice::device_alloc(uint64_t bytes) {
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  std::lock_guard<std::mutex> lock(mu_);
  device_[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, *current_device()};
  return p;
}

void EmulatedDevice::device_free(void* p) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    device_.erase(reinterpret_cast<uintptr_t>(p));
  }
  std::free(p);
}

Result<void*> EmulatedDevice::alloc_device(uint64_t bytes, device::Stream) {
  device_allocs_.fetch_add(1);
  if (fail_allocs_.load() > 0 && fail_allocs_.fetch_sub(1) > 0)
    return Status(StatusCode::kSystem, "cudaMallocAsync of " + std::to_string(bytes) +
                                           " bytes: out of memory (emulated)");
  return device_alloc(bytes);
}

void EmulatedDevice::free_device(void* p, device::Stream s) {
  enqueue(s, [this, p] {
    device_free(p);
    return Status::ok();
  });
}

Result<device::Stream> EmulatedDevice::create_stream() {
  return static_cast<device::Stream>(new StreamImpl);
}
void EmulatedDevice::destroy_stream(device::Stream s) {
  delete static_cast<StreamImpl*>(s);
}

// An event handle owns a reference; the stream tasks that record or wait hold their own, so a
// destroyed event's pending work still completes (CUDA defers the destruction alike).
Result<device::Event> EmulatedDevice::create_event() {
  return static_cast<device::Event>(new std::shared_ptr<EventImpl>(std::make_shared<EventImpl>()));
}
void EmulatedDevice::destroy_event(device::Event e) {
  delete static_cast<std::shared_ptr<EventImpl>*>(e);
}

Status EmulatedDevice::record(device::Event e, device::Stream s) {
  std::shared_ptr<EventImpl> ev = *static_cast<std::shared_ptr<EventImpl>*>(e);
  // The generation and its task under one hold of the driver lock: a wait() that sees the
  // generation finds its task queued (not stuck behind a download_blocking).
  std::shared_lock<std::shared_mutex> driver(driver_);
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(ev->mu);
    gen = ++ev->recorded;
  }
  stream_of(s)->push([ev, gen] {
    std::lock_guard<std::mutex> lock(ev->mu);
    ev->completed = std::max(ev->completed, gen);
    ev->cv.notify_all();
    return Status::ok();
  });
  return Status::ok();
}

Status EmulatedDevice::wait(device::Stream s, device::Event e) {
  std::shared_ptr<EventImpl> ev = *static_cast<std::shared_ptr<EventImpl>*>(e);
  std::shared_lock<std::shared_mutex> driver(driver_);  // as record()
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(ev->mu);
    target = ev->recorded;
  }
  if (target == 0) return Status::ok();  // never recorded: no wait, as in CUDA
  stream_of(s)->push([ev, target] {
    std::unique_lock<std::mutex> lock(ev->mu);
    ev->cv.wait(lock, [&] { return ev->completed >= target; });
    return Status::ok();
  });
  return Status::ok();
}

Status EmulatedDevice::synchronize(device::Stream s) {
  syncs_.fetch_add(1);
  auto done = std::make_shared<std::promise<void>>();
  auto f = done->get_future();
  enqueue(s, [done] {
    done->set_value();
    return Status::ok();
  });
  f.wait();
  StreamImpl* st = stream_of(s);
  std::lock_guard<std::mutex> lock(st->mu);
  Status e = st->error;
  st->error = Status::ok();
  return e;
}

Status EmulatedDevice::copy(void* dst, const void* src, uint64_t bytes, device::Stream s) {
  enqueue(s, [dst, src, bytes] {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  });
  return Status::ok();
}

Status EmulatedDevice::zero(void* dst, uint64_t bytes, device::Stream s) {
  enqueue(s, [dst, bytes] {
    std::memset(dst, 0, bytes);
    return Status::ok();
  });
  return Status::ok();
}

Status EmulatedDevice::encode(const CodecSpec& spec, DType dtype, const void* x, uint64_t n,
                              void* codes, uint64_t codes_bytes, RoundingKey key,
                              device::Stream s) {
  enqueue(s, [=] { return lowcomm::encode(spec, dtype, x, n, codes, codes_bytes, key); });
  return Status::ok();
}

Status EmulatedDevice::encode_error_feedback(const CodecSpec& spec, DType dtype, const void* x,
                                             float* residual, uint64_t n, void* codes,
                                             uint64_t codes_bytes, RoundingKey key,
                                             device::Stream s) {
  enqueue(s, [=] {
    return lowcomm::encode_error_feedback(spec, dtype, x, residual, n, codes, codes_bytes, key);
  });
  return Status::ok();
}

Status EmulatedDevice::decode(const CodecSpec& spec, const void* codes, uint64_t codes_bytes,
                              uint64_t n, DType dtype, void* out, device::Stream s) {
  enqueue(s, [=] { return lowcomm::decode(spec, codes, codes_bytes, n, dtype, out); });
  return Status::ok();
}

void EmulatedDevice::launch(device::Stream s, std::function<void()> kernel) {
  enqueue(s, [k = std::move(kernel)] {
    k();
    return Status::ok();
  });
}

void EmulatedDevice::download_blocking(void* host, const void* dev, uint64_t bytes,
                                       device::Stream s) {
  std::unique_lock<std::shared_mutex> driver(driver_);  // held while the stream gets here
  auto done = std::make_shared<std::promise<void>>();
  auto f = done->get_future();
  stream_of(s)->push([=] {
    std::memcpy(host, dev, bytes);
    done->set_value();
    return Status::ok();
  });
  f.wait();
}

void EmulatedDevice::upload(void* dev, const void* host, uint64_t bytes) {
  (void)copy(dev, host, bytes, nullptr);
  (void)synchronize(nullptr);
}

void EmulatedDevice::download(void* host, const void* dev, uint64_t bytes) {
  (void)copy(host, dev, bytes, nullptr);
  (void)synchronize(nullptr);
}

}  // namespace lowcomm::testing
