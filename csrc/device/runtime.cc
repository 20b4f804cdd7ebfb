// The process's device runtime: the one a test installed, else the CUDA runtime where this build
// has CUDA and the process sees a device (cuda_runtime.cc or no_cuda_runtime.cc), found once.

#include "device/runtime.h"

#include <mutex>
#include <string>

#include "device/cuda_runtime.h"

namespace lowcomm::device {
namespace {

struct Installed {
  std::mutex mu;
  std::shared_ptr<Runtime> testing;
  DeviceAllocator allocator;
};

Installed& installed() {
  static Installed* i = new Installed;  // never destroyed: communicators may outlive statics
  return *i;
}

struct Default {
  std::unique_ptr<Runtime> runtime;
  std::string why;
};

Default& default_runtime() {
  static Default* d = [] {
    auto* out = new Default;
    out->runtime = make_cuda_runtime(&out->why);
    return out;
  }();
  return *d;
}

}  // namespace

Runtime* runtime() {
  {
    std::lock_guard<std::mutex> lock(installed().mu);
    if (installed().testing) return installed().testing.get();
  }
  return default_runtime().runtime.get();
}

const char* why_none() {
  return default_runtime().why.c_str();
}

void set_runtime_for_testing(std::shared_ptr<Runtime> r) {
  std::lock_guard<std::mutex> lock(installed().mu);
  installed().testing = std::move(r);
}

DeviceAllocator device_allocator() {
  std::lock_guard<std::mutex> lock(installed().mu);
  return installed().allocator;
}

}  // namespace lowcomm::device

namespace lowcomm {

void set_device_allocator(const DeviceAllocator& allocator) {
  std::lock_guard<std::mutex> lock(device::installed().mu);
  device::installed().allocator =
      allocator.alloc != nullptr && allocator.release != nullptr ? allocator : DeviceAllocator{};
}

}  // namespace lowcomm
