#pragma once
// The CUDA implementation of device::Runtime (cuda_runtime.cc; no_cuda_runtime.cc in a build
// without CUDA).

#include <memory>
#include <string>

#include "device/runtime.h"

namespace lowcomm::device {

// The CUDA runtime, or null with `why` set: built without CUDA, no driver, no device.
std::unique_ptr<Runtime> make_cuda_runtime(std::string* why);

}  // namespace lowcomm::device
