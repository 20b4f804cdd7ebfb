#pragma once
// The stream gate's kernel launch (stream_gate.cu), for cuda_runtime.cc.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lowcomm::device {

// Enqueues on `stream` a one-thread kernel that returns once *flag (mapped pinned memory) is
// non-zero or `timeout_ns` have passed.
cudaError_t launch_gate(const uint32_t* flag, uint64_t timeout_ns, cudaStream_t stream);
// Loads the gate's kernel now (under lazy module loading, the default since CUDA 12.2, a kernel
// loads at its first launch, which may wait for the device to be idle: never let that happen
// while a gate spins).
cudaError_t load_gate();

}  // namespace lowcomm::device
