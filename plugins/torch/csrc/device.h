#pragma once
// CUDA tensors in the backend's operations (docs/torch.md, "CUDA tensors"), with NCCL's stream
// semantics: an operation reads its inputs after the work queued on the caller's current
// stream before the call, never blocks the host, and Work::wait() makes the caller's current
// stream wait for the results (a device-side wait).
//
// Two paths. kDevice: the library takes the device buffers (all-reduce, reduce-scatter,
// reduce, all-gather, broadcast and the coalesced forms built on them; compressed ones encode
// on the GPU). The operation runs on the backend's side stream of the device (one per device,
// from torch's pool): the side stream waits for an event on the caller's stream, the plugin's
// own copies (contiguous staging, laying out flat buffers) run there, the library orders its
// reads after the side stream, a gate (lowcomm::Work::wait_on_stream) holds the side stream
// until the operation completes, the copies back run after the gate, and an event recorded
// after them is what wait() and the future order on. kStaged: the library takes host memory
// only (gather, scatter, all-to-all, send/recv): inputs are copied into pinned host memory on
// the caller's stream (the host waits for that copy), the host operation runs, and the copies
// back to the device run on the side stream after the gate. Every CUDA tensor of the operation
// is marked used on the side stream (recordStream), and the Work holds the buffers until the
// operation completes, so the caching allocator never hands their memory out early.
//
// In a build without CUDA (LOWCOMM_WITH_CUDA undefined) the same interface refuses CUDA tensors
// with a clear error and everything else is CPU-only.

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

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

// What a CUDA operation's Work orders on once it is issued: its device, and the event recorded
// on the side stream after the operation's gate and copies back (none: nothing of the
// operation runs on the device after the host operation, e.g. a send).
class DeviceDone {
 public:
#ifdef LOWCOMM_WITH_CUDA
  DeviceDone(c10::Device device, std::optional<c10::Event> done)
      : device_(device), done_(std::move(done)) {}
#endif
  c10::Device device() const;
  // The caller's current stream of the device waits for the results; the host does not.
  void block_current_stream() const;
  // The host waits for the copies back (after the operation completed).
  void synchronize() const;
  // The device work after the operation has finished (true when there is none).
  bool query() const;
  // Completes `future` (made with this device) with `value`, its events ordered after the
  // results: on a pool stream that waits for the done event. Any thread.
  void mark_completed(c10::ivalue::Future& future, const c10::IValue& value) const;

 private:
#ifdef LOWCOMM_WITH_CUDA
  c10::Device device_;
  std::optional<c10::Event> done_;
#endif
};

class DeviceScope {
 public:
  enum class Path { kDevice, kStaged };
  // `tensors`: every tensor of the operation (undefined ones are skipped). They must be on one
  // device: the CPU (the scope does nothing), or one CUDA device in a build with CUDA. For a
  // CUDA device: refuses a stream being captured in a CUDA graph, guards the device, and for
  // kDevice makes the side stream wait for the caller's stream and current until the scope
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
  // Issues the device part after the host part was issued: for CUDA operations, gates the side
  // stream on `works` (when `gated`), runs `copy_back` on the side stream, and returns the
  // done event's holder; for CPU, nothing (returns null and does not run copy_back: the Work
  // runs it when the operation completes).
  std::shared_ptr<DeviceDone> issue(const std::vector<lowcomm::Work>& works,
                                    const std::function<void()>& copy_back, bool gated);

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

}  // namespace lowcomm::torch_backend
