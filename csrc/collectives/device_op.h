#pragma once
// Collectives on device buffers (MemoryKind::kCuda; docs/collectives.md, "CUDA buffers").
//
//   DeviceContext  per communicator: the runtime, the pinned staging pool and one stream of the
//                  communicator's own per device (non-blocking: it neither waits for the user's
//                  legacy-stream work nor holds it).
//   DeviceCall     one call, made on the caller's thread: the device its buffers are on, the
//                  caller's stream, and an event recorded on that stream at the call, so the
//                  operation reads its input after the work the caller queued before it.
//   DeviceOp       the same call on the executor: its stream waits for that event; pinned and
//                  device scratch for the run; copies counted into OpStats; the stream
//                  synchronised before the operation completes (and before its memory is given
//                  back, whatever happened), so a completed Work means results in place.
//
// Two ways to run: run_staged() copies the inputs to pinned host memory, runs the host
// algorithm there and copies the outputs back on success (Gloo's pattern; outputs untouched on
// failure); the owner reduction's GPU-codec path (owner_reduce_device.cc) encodes and decodes on
// the device and moves only encoded bytes.

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "collectives/ef_store.h"
#include "collectives/op_stats.h"
#include "device/pinned_pool.h"
#include "device/runtime.h"

namespace lowcomm::collectives {

struct DeviceCall {
  device::Runtime* rt = nullptr;
  int device = -1;
  device::Stream user = nullptr;
  device::Event ready = nullptr;
  DeviceCall() = default;
  DeviceCall(const DeviceCall&) = delete;
  DeviceCall& operator=(const DeviceCall&) = delete;
  ~DeviceCall();
};

class DeviceContext {
 public:
  DeviceContext(device::Runtime& rt, uint64_t pinned_limit)
      : rt_(rt), pinned_(rt, pinned_limit), allocator_(device::device_allocator()) {}
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;
  ~DeviceContext();

  device::Runtime& rt() { return rt_; }
  device::PinnedPool& pinned() { return pinned_; }
  // Device memory for an operation's scratch and residuals, on the current device, ordered on
  // `s`: from the allocator installed when this context was made (set_device_allocator), else
  // the runtime's; given back the same way.
  Result<void*> alloc_device(uint64_t bytes, device::Stream s);
  void free_device(void* p, device::Stream s);
  // The communicator's stream on `device`, created on first use (the device must be current).
  Result<device::Stream> stream(int device);

  // At the call, on the caller's thread: `what` names the call in errors; `buffers` are the
  // call's device pointers (null entries skipped; all must be on one device); `blocks` the
  // pinned blocks its run will most likely take at once (reserved in the pool now, so the
  // executor allocates no page-locked memory, a device-wide wait, while it runs);
  // `worst_pinned`: the pool bytes of the most its run can take, whichever path it takes
  // (kUnsupported when that or the blocks' classes pass the pool's limit: no run of it can then
  // find the pool short, since a communicator runs one operation at a time). A stream being
  // captured into a CUDA graph is refused (kInvalidArgument).
  Result<std::shared_ptr<DeviceCall>> begin_call(const char* what,
                                                 std::initializer_list<const void*> buffers,
                                                 void* user_stream,
                                                 const std::vector<uint64_t>& blocks,
                                                 uint64_t worst_pinned = 0);
  // Runs the codec kernels a call with `wire` on `dtype` buffers of `call`'s device will launch
  // (encode, with error feedback, decode), once per process for each: under CUDA's lazy module
  // loading a kernel loads at its first launch, which may wait for the whole device to be idle
  // (for the user's long kernels, in the middle of an operation). Called on the caller's
  // thread, before the operation is queued.
  Status preload(const DeviceCall& call, const CodecSpec& wire, DType dtype);

 private:
  device::Runtime& rt_;
  device::PinnedPool pinned_;
  const DeviceAllocator allocator_;
  std::mutex mu_;
  std::map<int, device::Stream> streams_;
};

class DeviceOp {
 public:
  // `restore_device`: the run is on a caller's thread (a collective run inline), whose current
  // device begin() changes and the destructor gives back. (The executor's is left on the last
  // operation's device: restoring its initial device 0 would make a context on GPU 0 in every
  // rank.)
  DeviceOp(DeviceContext& ctx, const DeviceCall& call, OpCounters& counters,
           bool restore_device = false)
      : ctx_(ctx), call_(call), counters_(counters), restore_device_(restore_device) {}
  DeviceOp(const DeviceOp&) = delete;
  DeviceOp& operator=(const DeviceOp&) = delete;
  // Waits for the stream (errors ignored: a failure was already reported), then gives back
  // the run's pinned and device memory, and the caller's current device (restore_device).
  ~DeviceOp();

  // Makes the call's device current and orders this run's stream after the call's event.
  Status begin(const char* path);
  device::Runtime& rt() { return ctx_.rt(); }
  device::Stream stream() const { return stream_; }
  int device() const { return call_.device; }
  DeviceContext& context() { return ctx_; }

  Result<uint8_t*> pinned(uint64_t bytes);       // until the run ends
  Result<void*> device_scratch(uint64_t bytes);  // until the run ends (stream-ordered)
  // Enqueued copies, counted as device-to-host / host-to-device bytes.
  Status to_host(void* host, const void* dev, uint64_t bytes);
  Status to_device(void* dev, const void* host, uint64_t bytes);
  Status sync();
  OpCounters& counters() { return counters_; }

 private:
  DeviceContext& ctx_;
  const DeviceCall& call_;
  OpCounters& counters_;
  const bool restore_device_;
  int previous_device_ = -1;  // the caller's, to restore (restore_device_, when it differed)
  device::Stream stream_ = nullptr;
  bool begun_ = false;
  std::vector<device::PinnedBlock> pinned_;
  std::vector<void*> scratch_;
};

// Runs `body` on pinned host copies of the call's buffers: `send` (send_bytes) copied in
// first; `recv` (recv_bytes; may be null with 0) copied back after a successful body, never
// after a failed one. send == recv shares one host buffer.
Status run_staged(DeviceOp& d, const void* send, uint64_t send_bytes, void* recv,
                  uint64_t recv_bytes, const std::function<Status(const void*, void*)>& body);

// The sender residual of `entry` (n fp32) in device memory on d's device, moved there from the
// host when it was kept on the host (or zero when new).
Result<float*> device_residual(DeviceOp& d, ErrorFeedbackEntry& entry);

// Encodes the device tensor x (n elements) on the device into `codes` (host memory, `bytes`),
// with error feedback under `ef_key` (the residual in device memory) when it is not empty;
// waits for the codes. The bytes are those of lowcomm::encode / encode_error_feedback.
Status encode_on_device(DeviceOp& d, ErrorFeedbackStore& ef, const std::string& ef_key,
                        const CodecSpec& wire, DType dtype, const void* x, uint64_t n,
                        uint8_t* codes, uint64_t bytes, RoundingKey key);

}  // namespace lowcomm::collectives
