#pragma once
// EmulatedDevice: device::Runtime on the host, for driving the collectives' CUDA-buffer path
// (collectives/device_op.h) where no GPU is. It is not a model of a GPU's speed; it keeps the
// properties the path's correctness rests on:
//   - streams run their work asynchronously and in order, each on its own thread, so a copy or
//     kernel the path forgets to order or to wait for reads or writes at the wrong time (tests
//     put slow "kernels" on the caller's stream to make such races certain, not likely);
//   - events and waits behave as CUDA's: a wait on an event orders after its last record at
//     the time of the wait;
//   - the driver's lock: every call that enqueues work takes it shared, and a blocking copy to
//     pageable memory (download_blocking, torch's `t.cpu()`) holds it exclusively while it
//     waits for its stream, as the CUDA driver was seen to do;
//   - "device memory" is memory only alloc_device / device_alloc handed out: device_of refuses
//     any other pointer, and test code touches device memory only through copies or launch(),
//     as a program would;
//   - two devices (0 and 1) and a current device per thread, 0 until the thread sets one, as
//     CUDA's: memory is on the device current where it was allocated (device_of says which);
//   - the codec kernels are the CPU codec (the CUDA kernels' bytes equal the CPU's, which
//     lowcomm_cuda_test checks on a GPU).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "device/runtime.h"
#include "test_device.h"

namespace lowcomm::testing {

class EmulatedDevice final : public device::Runtime, public TestDevice {
 public:
  EmulatedDevice();
  ~EmulatedDevice() override;

  const char* name() const override { return "emulated"; }
  Result<int> device_of(const void* p) override;
  Status set_device(int device) override;
  Result<int> current_device() override;
  Result<void*> alloc_pinned(uint64_t bytes) override;
  void free_pinned(void* p) override;
  Result<void*> alloc_device(uint64_t bytes, device::Stream s) override;
  void free_device(void* p, device::Stream s) override;
  Result<device::Stream> create_stream() override;
  void destroy_stream(device::Stream s) override;
  Result<bool> capturing(device::Stream) override { return false; }
  Result<device::Event> create_event() override;
  void destroy_event(device::Event e) override;
  Status record(device::Event e, device::Stream s) override;
  Status wait(device::Stream s, device::Event e) override;
  Status synchronize(device::Stream s) override;
  Status copy(void* dst, const void* src, uint64_t bytes, device::Stream s) override;
  Status zero(void* dst, uint64_t bytes, device::Stream s) override;
  Status encode(const CodecSpec& spec, DType dtype, const void* x, uint64_t n, void* codes,
                uint64_t codes_bytes, RoundingKey key, device::Stream s) override;
  Status encode_error_feedback(const CodecSpec& spec, DType dtype, const void* x, float* residual,
                               uint64_t n, void* codes, uint64_t codes_bytes, RoundingKey key,
                               device::Stream s) override;
  Status decode(const CodecSpec& spec, const void* codes, uint64_t codes_bytes, uint64_t n,
                DType dtype, void* out, device::Stream s) override;

  // TestDevice
  device::Runtime& runtime() override { return *this; }
  void* device_alloc(uint64_t bytes) override;
  void device_free(void* p) override;
  void launch(device::Stream s, std::function<void()> kernel) override;
  void upload(void* dev, const void* host, uint64_t bytes) override;
  void download(void* host, const void* dev, uint64_t bytes) override;
  void download_blocking(void* host, const void* dev, uint64_t bytes, device::Stream s) override;
  uint64_t pinned_allocations() const { return pinned_allocs_.load(); }
  // The next n alloc_device calls fail as cudaMallocAsync does when the device is full
  // (kSystem, "out of memory"): a rank-local refusal for the tests.
  void fail_next_device_allocs(int n) { fail_allocs_.store(n); }
  // Calls of alloc_device and synchronize made so far.
  uint64_t device_allocations() const { return device_allocs_.load(); }
  uint64_t synchronizations() const { return syncs_.load(); }

 private:
  struct StreamImpl;
  struct EventImpl;
  StreamImpl* stream_of(device::Stream s);
  void enqueue(device::Stream s, std::function<Status()> task);

  const uint64_t serial_;               // this runtime's, for the threads' current devices
  std::shared_mutex driver_;            // the driver's lock (download_blocking)
  std::unique_ptr<StreamImpl> legacy_;  // the null stream
  struct Allocation {
    uint64_t bytes;
    int device;
  };
  std::mutex mu_;                           // guards device_
  std::map<uintptr_t, Allocation> device_;  // device allocations by their first byte
  std::atomic<uint64_t> pinned_allocs_{0};
  std::atomic<int> fail_allocs_{0};
  std::atomic<uint64_t> device_allocs_{0};
  std::atomic<uint64_t> syncs_{0};
};

}  // namespace lowcomm::testing
