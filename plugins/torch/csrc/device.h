#pragma once
// CUDA tensors in the backend's operations (docs/torch.md, "CUDA tensors"), with Gloo's
// semantics for CUDA tensors: an operation reads its inputs after the work queued on the
// caller's current stream before the call, runs on the host, and Work::wait() blocks the host
// until it has completed, then makes the caller's current stream wait for the copies back.
//
// Why the host waits: a device-side wait (a kernel or stream wait that the operation's
// completion releases) would hold a stream on the executor's progress, and the executor makes
// CUDA calls (its copies, the codec kernels). Any thread blocked in a CUDA call that waits for
// that stream while holding the driver's lock (a pageable copy such as `t.cpu()` or `.item()`)
// then blocks the executor's next CUDA call: a deadlock, found on the first GPU run.
//
// Two paths. kDevice: the library takes the device buffers (all-reduce, reduce-scatter,
// reduce, all-gather, broadcast and the coalesced forms built on them; compressed ones encode
// on the GPU). The operation runs on the backend's side stream of the device (one per device,
// from torch's pool): the side stream waits for an event on the caller's stream, the plugin's
// own copies (contiguous staging, laying out flat buffers) run there, and the library orders
// its reads after the side stream; its results are in place when it completes. kStaged: the
// library takes host memory only (gather, scatter, all-to-all, send/recv): inputs are copied
// into pinned host memory on the caller's stream (the host waits for that copy) and the host
// operation runs. On both, once the operation has completed successfully, its copies back to
// the user's tensors run on the side stream, and an event recorded after them is what wait()
// and the future order on. Every CUDA tensor of the operation is marked used on the side stream
// (recordStream), and the Work holds the buffers until the operation completes, so the caching
// allocator never hands their memory out early.
//
// In a build without CUDA (LOWCOMM_WITH_CUDA undefined) the same interface refuses CUDA tensors
// with a clear error and everything else is CPU-only.

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "lowcomm/communicator.h"

#ifdef LOWCOMM_WITH_CUDA
#include <c10/core/Event.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace lowcomm::torch_backend {

// The backend's side stream per CUDA device, taken from torch's pool on first use. Thread-safe.
class SideStreams {
 public:
#ifdef LOWCOMM_WITH_CUDA
  c10::cuda::CUDAStream get(c10::DeviceIndex device);

 private:
  std::mutex mu_;
  std::vector<std::optional<c10::cuda::CUDAStream>> streams_;  // by device index; guarded by mu_
#endif
};

// What a CUDA operation's Work orders on: its device, its side stream, and the event recorded
// there after the copies back once the operation has completed (never recorded when it failed:
// nothing of it runs on the device afterwards).
class DeviceDone {
 public:
#ifdef LOWCOMM_WITH_CUDA
  DeviceDone(c10::Device device, c10::cuda::CUDAStream side) : device_(device), side_(side) {}
#endif
  c10::Device device() const;
  // At the operation's successful completion, on the thread completing it, before anyone
  // waits on this: runs `copy_back` on the side stream and records the done event after it.
  void finish(const std::function<void()>& copy_back);
  // The caller's current stream of the device waits for the copies back (after completion).
  void block_current_stream() const;
  // The host waits for the copies back (after completion).
  void synchronize() const;
  // The device work after the operation has finished (true when there is none).
  bool query() const;
  // Completes `future` (made with this device) with `value`, its events ordered after the
  // copies back: on a pool stream that waits for the done event. Any thread.
  void mark_completed(c10::ivalue::Future& future, const c10::IValue& value) const;

 private:
#ifdef LOWCOMM_WITH_CUDA
  c10::Device device_;
  c10::cuda::CUDAStream side_;
  std::optional<c10::Event> done_;  // set by finish(), before completion is published
#endif
};

class DeviceScope {
 public:
  enum class Path { kDevice, kStaged };
  // `tensors`: every tensor of the operation (undefined ones are skipped). They must be on one
  // device: the CPU (the scope does nothing), or one CUDA device in a build with CUDA. For a
  // CUDA device: refuses a stream being captured in a CUDA graph, guards the device, makes the
  // side stream wait for the caller's stream, and for kDevice makes it current until the scope
  // ends. `op` names the operation in errors.
  DeviceScope(SideStreams& streams, Path path, const char* op,
              const std::vector<at::Tensor>& tensors);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  bool cuda() const { return cuda_; }
  Path path() const { return path_; }
  // Refuses a tensor on another device than the operation's (tensors checked later than the
  // constructor: a list's elements).
  void check(const at::Tensor& t) const;
  // The library's view of the buffers: host memory, or (kDevice) this device on the side stream.
  lowcomm::BufferOptions where() const;
  void apply(lowcomm::AllReduceOptions& o) const;
  // kStaged: a pinned host copy of `t` made on the caller's stream (the host waits for it), or
  // `t` itself (contiguous) when it is a CPU tensor.
  at::Tensor to_host(const at::Tensor& t) const;
  // kStaged: an uninitialized pinned host tensor shaped like `t` (contiguous); `t` for CPU.
  at::Tensor host_like(const at::Tensor& t) const;
  // A new flat tensor of `n` elements of `dtype` where this operation's buffers live: pinned
  // host memory for kStaged CUDA operations, else the device of the tensors.
  at::Tensor empty(int64_t n, at::ScalarType dtype) const;
  // For CUDA operations, what the Work orders on (device.h's DeviceDone); null for CPU ones.
  std::shared_ptr<DeviceDone> done() const;

 private:
  Path path_;
  bool cuda_ = false;
#ifdef LOWCOMM_WITH_CUDA
  c10::Device device_{c10::kCPU};
  std::optional<c10::cuda::CUDAGuard> guard_;
  std::optional<c10::cuda::CUDAStream> caller_, side_;
  std::optional<c10::cuda::CUDAStreamGuard> on_side_;
#endif
};

// Makes torch's CUDA caching allocator the library's device allocator (set_device_allocator):
// the scratch and error-feedback residuals of operations on CUDA tensors then come from it, so
// torch.cuda.memory_allocated() counts them and a shortage first empties torch's cache. Called
// once, when the extension is imported (before any communicator's first CUDA operation); a
// build without CUDA does nothing.
void install_torch_device_allocator();

}  // namespace lowcomm::torch_backend
