#pragma once
// TestDevice: what the CUDA-buffer tests (collectives_device_test.cc) do with a device, as a
// program would with cudaMalloc, cudaMemcpy and kernels: the host emulation of a device
// (emulated_device.h, in every build) or the process's real CUDA runtime (cuda_test_device.cc,
// the cuda-labelled binary that runs on a GPU machine).

#include <functional>
#include <memory>
#include <string>

#include "device/runtime.h"

namespace lowcomm::testing {

class TestDevice {
 public:
  virtual ~TestDevice() = default;
  virtual device::Runtime& runtime() = 0;
  // Device memory that host work queued by launch() may read and write (CUDA: managed).
  virtual void* device_alloc(uint64_t bytes) = 0;
  virtual void device_free(void* p) = 0;
  // Blocking copies (the legacy default stream, then synchronised).
  virtual void upload(void* dev, const void* host, uint64_t bytes) = 0;
  virtual void download(void* host, const void* dev, uint64_t bytes) = 0;
  // A copy to pageable host memory ordered on `s`, blocking until it lands: torch's `t.cpu()`.
  // The CUDA driver holds a lock of its own while such a copy waits for its stream, and every
  // other call that enqueues work waits for that lock (seen on an H200: docs/gpu.md, "Second
  // session"); the emulation models that, so a device-side wait on the executor's progress
  // deadlocks here as it did there.
  virtual void download_blocking(void* host, const void* dev, uint64_t bytes, device::Stream s) = 0;
  // Host work run in `s`'s order, as a kernel would (CUDA: cudaLaunchHostFunc).
  virtual void launch(device::Stream s, std::function<void()> work) = 0;
};

// The device of this test binary, made the process's runtime; null with `why` when there is
// none (no GPU in the CUDA binary). Call in each rank's process, after fork.
std::shared_ptr<TestDevice> install_device(std::string* why = nullptr);
// Whether this binary runs against the emulation (whose runtime can be swapped out).
bool emulated_device();

}  // namespace lowcomm::testing
