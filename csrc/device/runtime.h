#pragma once
// device::Runtime: what the collectives need of a GPU runtime to run an operation on device
// buffers (MemoryKind::kCuda): memory kinds, pinned host memory, streams and events, copies, the
// codec kernels. The CUDA implementation (cuda_runtime.cc) is the production
// one; tests drive the same collective code with a host emulation of streams
// (tests/emulated_device.h), so the ordering and lifetime logic runs where no GPU is.
//
// Streams and events are opaque handles (cudaStream_t / cudaEvent_t in CUDA). A null stream is
// the legacy default stream. Every call that enqueues returns at once; synchronize() waits.
// Thread safety: every method may be called from any thread.
//
// No device-side wait on host progress: nothing here holds a stream until the host says so.
// The executor makes CUDA calls while an operation runs (copies, codec kernels), and a thread
// blocked in a CUDA call that waits for such a stream while holding the driver's lock (a
// pageable copy, e.g. torch's `t.cpu()`) would block those calls: a deadlock, seen on the
// first GPU run with the one-thread "stream gate" kernel this interface used to have. Callers
// that need a CUDA operation's result on a stream wait for its completion on the host.

#include <cstdint>
#include <memory>

#include "lowcomm/codec.h"
#include "lowcomm/communicator.h"
#include "lowcomm/status.h"

namespace lowcomm::device {

using Stream = void*;
using Event = void*;

class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual const char* name() const = 0;

  // The device `p` lies on; kInvalidArgument when it is not device memory (host, pinned or
  // unknown pointers).
  virtual Result<int> device_of(const void* p) = 0;
  // Makes `device` current on the calling thread / the calling thread's current device.
  virtual Status set_device(int device) = 0;
  virtual Result<int> current_device() = 0;

  // Page-locked host memory (copies to and from it are asynchronous). Freed only when nothing
  // may still read it (freeing it synchronises the device in CUDA).
  virtual Result<void*> alloc_pinned(uint64_t bytes) = 0;
  virtual void free_pinned(void* p) = 0;
  // Device memory, stream-ordered: usable by work queued on `s` after the call; freed after the
  // work queued on `s` before free_device.
  virtual Result<void*> alloc_device(uint64_t bytes, Stream s) = 0;
  virtual void free_device(void* p, Stream s) = 0;

  // A stream on the current device that does not synchronise with the legacy default stream
  // (the communicator's copies neither wait for the user's legacy-stream work nor hold it).
  virtual Result<Stream> create_stream() = 0;
  virtual void destroy_stream(Stream s) = 0;
  // Whether work queued on `s` is being captured into a CUDA graph.
  virtual Result<bool> capturing(Stream s) = 0;
  virtual Result<Event> create_event() = 0;
  virtual void destroy_event(Event e) = 0;
  virtual Status record(Event e, Stream s) = 0;
  // Work queued on `s` after this waits for the work before e's last record().
  virtual Status wait(Stream s, Event e) = 0;
  // Blocks the calling thread until the work queued on `s` is done; its failures surface here.
  virtual Status synchronize(Stream s) = 0;
  // Any direction (device, pinned or pageable host memory), ordered on `s`.
  virtual Status copy(void* dst, const void* src, uint64_t bytes, Stream s) = 0;
  // Sets `bytes` of device memory to zero, ordered on `s`.
  virtual Status zero(void* dst, uint64_t bytes, Stream s) = 0;

  // The codec kernels (include/lowcomm/codec_cuda.h), on `s`: the same bytes as codec.h's.
  virtual Status encode(const CodecSpec& spec, DType dtype, const void* x, uint64_t n, void* codes,
                        uint64_t codes_bytes, RoundingKey key, Stream s) = 0;
  virtual Status encode_error_feedback(const CodecSpec& spec, DType dtype, const void* x,
                                       float* residual, uint64_t n, void* codes,
                                       uint64_t codes_bytes, RoundingKey key, Stream s) = 0;
  virtual Status decode(const CodecSpec& spec, const void* codes, uint64_t codes_bytes, uint64_t n,
                        DType dtype, void* out, Stream s) = 0;
};

// The allocator set_device_allocator() installed (both null: none, the runtime's own).
DeviceAllocator device_allocator();

// Makes a device current for a scope and restores the thread's previous one after, so a call
// on the caller's thread (or a collective run inline on it) leaves its current device alone.
class DeviceGuard {
 public:
  DeviceGuard(Runtime& rt, int device) : rt_(rt) {
    auto cur = rt.current_device();
    if (cur) previous_ = *cur;
    status_ = previous_ == device ? Status::ok() : rt.set_device(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0) (void)rt_.set_device(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const Status& status() const { return status_; }

 private:
  Runtime& rt_;
  int previous_ = -1;
  Status status_;
};

// The process's runtime: the CUDA runtime when this build has CUDA and the process sees a
// device, else null (and `why_none` says why, for error messages). A runtime installed by
// set_runtime_for_testing takes precedence.
Runtime* runtime();
const char* why_none();
// Tests: installs `r` as the process's runtime (null: back to the default). Call before any
// communicator uses it.
void set_runtime_for_testing(std::shared_ptr<Runtime> r);

}  // namespace lowcomm::device
