// A build without CUDA (LOWCOMM_CUDA=OFF or no nvcc): no device runtime.

#include "device/cuda_runtime.h"

namespace lowcomm::device {

std::unique_ptr<Runtime> make_cuda_runtime(std::string* why) {
  *why = "this build of lowcomm has no CUDA (built with LOWCOMM_CUDA=OFF or without nvcc)";
  return nullptr;
}

}  // namespace lowcomm::device
