// device::Runtime on the CUDA runtime API. Every call checks its cudaError_t (kSystem naming
// the call); the codec kernels are codec_cuda.h's. Gates poll flags in one mapped pinned slab
// per 1,024 gates, allocated once and never freed (cudaFreeHost would synchronise the device,
// which a pending gate holds); a flag is reused once an event recorded after its kernel has
// completed.

#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "device/cuda_runtime.h"
#include "device/stream_gate.h"
#include "lowcomm/codec_cuda.h"

namespace lowcomm::device {
namespace {

cudaStream_t cs(Stream s) {
  return static_cast<cudaStream_t>(s);
}
cudaEvent_t ce(Event e) {
  return static_cast<cudaEvent_t>(e);
}

class CudaRuntime;

// One flag of a slab, and the event that says its kernel has returned.
struct GateSlot {
  volatile uint32_t* flag = nullptr;
  cudaEvent_t done = nullptr;
};

class CudaGate final : public Gate {
 public:
  CudaGate(CudaRuntime& rt, int device, GateSlot slot) : rt_(rt), device_(device), slot_(slot) {}
  ~CudaGate() override;
  void release() override { *slot_.flag = 1u; }

 private:
  CudaRuntime& rt_;
  int device_;
  GateSlot slot_;
};

class CudaRuntime final : public Runtime {
 public:
  const char* name() const override { return "cuda"; }

  Result<int> device_of(const void* p) override {
    cudaPointerAttributes attr{};
    cudaError_t err = cudaPointerGetAttributes(&attr, p);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it
      return invalid_argument(std::string("not a CUDA pointer (") + cudaGetErrorName(err) + ")");
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
      return invalid_argument("the pointer is host memory, not device memory");
    return attr.device;
  }

  Status set_device(int device) override {
    LOWCOMM_CHECK_CUDA(cudaSetDevice(device));
    return Status::ok();
  }
  Result<int> current_device() override {
    int d = 0;
    LOWCOMM_CHECK_CUDA(cudaGetDevice(&d));
    return d;
  }

  Result<void*> alloc_pinned(uint64_t bytes) override {
    void* p = nullptr;
    LOWCOMM_CHECK_CUDA(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
    return p;
  }
  void free_pinned(void* p) override { (void)cudaFreeHost(p); }

  Result<void*> alloc_device(uint64_t bytes, Stream s) override {
    void* p = nullptr;
    LOWCOMM_CHECK_CUDA(cudaMallocAsync(&p, bytes, cs(s)));
    return p;
  }
  void free_device(void* p, Stream s) override { (void)cudaFreeAsync(p, cs(s)); }

  Result<Stream> create_stream() override {
    cudaStream_t s = nullptr;
    LOWCOMM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return static_cast<Stream>(s);
  }
  void destroy_stream(Stream s) override { (void)cudaStreamDestroy(cs(s)); }
  Result<bool> capturing(Stream s) override {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    LOWCOMM_CHECK_CUDA(cudaStreamIsCapturing(cs(s), &st));
    return st != cudaStreamCaptureStatusNone;
  }

  Result<Event> create_event() override {
    cudaEvent_t e = nullptr;
    LOWCOMM_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return static_cast<Event>(e);
  }
  void destroy_event(Event e) override { (void)cudaEventDestroy(ce(e)); }

  Status record(Event e, Stream s) override {
    LOWCOMM_CHECK_CUDA(cudaEventRecord(ce(e), cs(s)));
    return Status::ok();
  }
  Status wait(Stream s, Event e) override {
    LOWCOMM_CHECK_CUDA(cudaStreamWaitEvent(cs(s), ce(e), 0));
    return Status::ok();
  }
  Status synchronize(Stream s) override {
    LOWCOMM_CHECK_CUDA(cudaStreamSynchronize(cs(s)));
    return Status::ok();
  }
  Status copy(void* dst, const void* src, uint64_t bytes, Stream s) override {
    if (bytes == 0) return Status::ok();
    LOWCOMM_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cs(s)));
    return Status::ok();
  }

  Status zero(void* dst, uint64_t bytes, Stream s) override {
    if (bytes == 0) return Status::ok();
    LOWCOMM_CHECK_CUDA(cudaMemsetAsync(dst, 0, bytes, cs(s)));
    return Status::ok();
  }

  Status encode(const CodecSpec& spec, DType dtype, const void* x, uint64_t n, void* codes,
                uint64_t codes_bytes, RoundingKey key, Stream s) override {
    return encode_cuda(spec, dtype, x, n, codes, codes_bytes, key, cs(s));
  }
  Status encode_error_feedback(const CodecSpec& spec, DType dtype, const void* x, float* residual,
                               uint64_t n, void* codes, uint64_t codes_bytes, RoundingKey key,
                               Stream s) override {
    return encode_error_feedback_cuda(spec, dtype, x, residual, n, codes, codes_bytes, key, cs(s));
  }
  Status decode(const CodecSpec& spec, const void* codes, uint64_t codes_bytes, uint64_t n,
                DType dtype, void* out, Stream s) override {
    return decode_cuda(spec, codes, codes_bytes, n, dtype, out, cs(s));
  }

  // On the current device, which must be the stream's (as for any launch).
  Result<std::unique_ptr<Gate>> gate(Stream s, std::chrono::milliseconds timeout) override {
    int dev = 0;
    LOWCOMM_CHECK_CUDA(cudaGetDevice(&dev));
    auto slot = take_slot(dev);
    if (!slot) return slot.status();
    slot->flag[0] = 0u;
    const auto ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count());
    cudaError_t err = launch_gate(const_cast<const uint32_t*>(slot->flag), ns, cs(s));
    if (err != cudaSuccess) {
      put_slot(dev, *slot);  // nothing launched: its event is as complete as before
      return cuda::cuda_status(err, "stream gate launch");
    }
    err = cudaEventRecord(slot->done, cs(s));
    if (err != cudaSuccess) {
      // Launched, but nothing says when it returns: release it and never reuse the flag.
      slot->flag[0] = 1u;
      return cuda::cuda_status(err, "stream gate event");
    }
    return std::unique_ptr<Gate>(new CudaGate(*this, dev, *slot));
  }

  void put_slot(int dev, GateSlot slot) {
    std::lock_guard<std::mutex> lock(mu_);
    slots_[dev].used.push_back(slot);
  }

 private:
  static constexpr int kSlabFlags = 1024;
  struct Slots {
    std::vector<GateSlot> fresh;  // never launched
    std::vector<GateSlot> used;   // launched; free once `done` has completed
  };

  // A free flag of `dev` (its event made there). A new slab is allocated outside the lock: a
  // page-locked allocation may wait for the device, and a gate's release (put_slot, on the
  // executor) must never wait for that.
  Result<GateSlot> take_slot(int dev) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      Slots& sl = slots_[dev];
      for (size_t i = 0; i < sl.used.size(); ++i) {
        if (cudaEventQuery(sl.used[i].done) == cudaSuccess) {
          GateSlot s = sl.used[i];
          sl.used[i] = sl.used.back();
          sl.used.pop_back();
          return s;
        }
      }
      (void)cudaGetLastError();  // cudaErrorNotReady is not sticky; clear it anyway
      if (!sl.fresh.empty()) {
        GateSlot s = sl.fresh.back();
        sl.fresh.pop_back();
        return s;
      }
    }
    void* slab = nullptr;
    LOWCOMM_CHECK_CUDA(cudaHostAlloc(&slab, kSlabFlags * sizeof(uint32_t),
                                     cudaHostAllocMapped | cudaHostAllocPortable));
    auto* flags = static_cast<volatile uint32_t*>(slab);
    std::vector<GateSlot> made;
    for (int i = 0; i < kSlabFlags; ++i) {
      GateSlot s;
      s.flag = flags + i;
      LOWCOMM_CHECK_CUDA(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
      made.push_back(s);
    }
    GateSlot s = made.back();
    made.pop_back();
    std::lock_guard<std::mutex> lock(mu_);
    Slots& sl = slots_[dev];
    sl.fresh.insert(sl.fresh.end(), made.begin(), made.end());
    return s;
  }

  std::mutex mu_;
  std::map<int, Slots> slots_;  // by device
};

CudaGate::~CudaGate() {
  release();
  rt_.put_slot(device_, slot_);
}

}  // namespace

std::unique_ptr<Runtime> make_cuda_runtime(std::string* why) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    *why = std::string("no CUDA device usable (") + cudaGetErrorName(err) + ": " +
           cudaGetErrorString(err) + ")";
    return nullptr;
  }
  if (n == 0) {
    *why = "no CUDA device in this process";
    return nullptr;
  }
  if (cudaError_t e = load_gate(); e != cudaSuccess) {
    *why = std::string("the stream gate's kernel does not load (") + cudaGetErrorName(e) + ")";
    return nullptr;
  }
  return std::make_unique<CudaRuntime>();
}

}  // namespace lowcomm::device
