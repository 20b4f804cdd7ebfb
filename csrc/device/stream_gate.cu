// The stream gate's kernel: one thread polls a flag in mapped pinned host memory until the host
// sets it or the timeout passes (%globaltimer, nanoseconds), sleeping between reads so the poll
// costs the memory system almost nothing.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device/stream_gate.h"

namespace lowcomm::device {
namespace {

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void gate_kernel(const volatile uint32_t* flag, uint64_t timeout_ns) {
  const uint64_t start = global_ns();
  while (*flag == 0) {
    if (global_ns() - start > timeout_ns) return;
    __nanosleep(2000);
  }
}

}  // namespace

cudaError_t load_gate() {
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, gate_kernel);
}

cudaError_t launch_gate(const uint32_t* flag, uint64_t timeout_ns, cudaStream_t stream) {
  gate_kernel<<<1, 1, 0, stream>>>(flag, timeout_ns);
  return cudaGetLastError();
}

}  // namespace lowcomm::device
