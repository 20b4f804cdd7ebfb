// The cuda binary's TestDevice (test_device.h): the process's CUDA runtime. Device buffers are
// managed memory so host work queued with cudaLaunchHostFunc can write inputs and read results
// in stream order, as the emulated tests' "kernels" do.

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#include "test_device.h"

namespace lowcomm::testing {
namespace {

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::abort();
}

class CudaTestDevice final : public TestDevice {
 public:
  explicit CudaTestDevice(device::Runtime& rt) : rt_(rt) {}
  device::Runtime& runtime() override { return rt_; }
  void* device_alloc(uint64_t bytes) override {
    void* p = nullptr;
    check(cudaMallocManaged(&p, bytes == 0 ? 1 : bytes), "cudaMallocManaged");
    return p;
  }
  void device_free(void* p) override { check(cudaFree(p), "cudaFree"); }
  void upload(void* dev, const void* host, uint64_t bytes) override {
    // cudaMemcpy may return before its DMA lands; work on non-blocking streams would not wait.
    check(cudaMemcpy(dev, host, bytes, cudaMemcpyDefault), "cudaMemcpy");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  void download(void* host, const void* dev, uint64_t bytes) override {
    check(cudaMemcpy(host, dev, bytes, cudaMemcpyDefault), "cudaMemcpy");
  }
  void download_blocking(void* host, const void* dev, uint64_t bytes, device::Stream s) override {
    // Pageable destination: the driver stages it and returns once the bytes have landed.
    check(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(s)),
          "cudaMemcpyAsync");
  }
  void launch(device::Stream s, std::function<void()> work) override {
    auto* fn = new std::function<void()>(std::move(work));
    check(cudaLaunchHostFunc(
              static_cast<cudaStream_t>(s),
              [](void* p) {
                auto* f = static_cast<std::function<void()>*>(p);
                (*f)();
                delete f;
              },
              fn),
          "cudaLaunchHostFunc");
  }

 private:
  device::Runtime& rt_;
};

}  // namespace

std::shared_ptr<TestDevice> install_device(std::string* why) {
  device::Runtime* rt = device::runtime();
  if (rt == nullptr) {
    if (why) *why = device::why_none();
    return nullptr;
  }
  return std::make_shared<CudaTestDevice>(*rt);
}

bool emulated_device() {
  return false;
}

}  // namespace lowcomm::testing
