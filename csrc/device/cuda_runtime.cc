// device::Runtime on the CUDA runtime API. Every call checks its cudaError_t (kSystem naming
// the call); the codec kernels are codec_cuda.h's.

#include <cuda_runtime_api.h>

#include <string>

#include "cuda_check.h"
#include "device/cuda_runtime.h"
#include "lowcomm/codec_cuda.h"

namespace lowcomm::device {
namespace {

cudaStream_t cs(Stream s) {
  return static_cast<cudaStream_t>(s);
}
cudaEvent_t ce(Event e) {
  return static_cast<cudaEvent_t>(e);
}

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
};

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
  return std::make_unique<CudaRuntime>();
}

}  // namespace lowcomm::device
