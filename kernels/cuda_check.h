#pragma once
// CUDA runtime errors as lowcomm Status values (kSystem, naming the call and the cudaError), and
// the check macro the host wrappers use at every runtime call and launch.

#include <cuda_runtime_api.h>

#include <string>

#include "lowcomm/status.h"

namespace lowcomm::cuda {

inline Status cuda_status(cudaError_t err, const char* what) {
  return Status(StatusCode::kSystem, std::string(what) + " failed: " + cudaGetErrorName(err) +
                                         " (" + cudaGetErrorString(err) + ")");
}

}  // namespace lowcomm::cuda

// Returns a kSystem Status from the enclosing function when `expr` is not cudaSuccess.
#define LOWCOMM_CHECK_CUDA(expr)                                     \
  do {                                                               \
    cudaError_t lowcomm_cuda_err_ = (expr);                          \
    if (lowcomm_cuda_err_ != cudaSuccess) {                          \
      return ::lowcomm::cuda::cuda_status(lowcomm_cuda_err_, #expr); \
    }                                                                \
  } while (0)
