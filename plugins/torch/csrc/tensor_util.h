#pragma once
// Translations between torch's types and lowcomm's, and the buffers the backend hands the
// communicator: shared by the backend's collectives (backend.cc) and its coalesced ones
// (coalesced.cc).

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstdint>
#include <vector>

#include "device.h"
#include "lowcomm/communicator.h"

namespace lowcomm::torch_backend {

lowcomm::DType to_dtype(at::ScalarType t);
lowcomm::ReduceOp to_op(const c10d::ReduceOp& op);

inline uint64_t elems(const at::Tensor& t) {
  return static_cast<uint64_t>(t.numel());
}

// A contiguous buffer for a user tensor where the operation's library call takes it: the tensor
// itself when contiguous and the library takes its memory (no copy); else a contiguous copy on
// its device, or for a CUDA tensor of a staged operation pinned host memory (device.h), which
// write_back() copies into the user's tensor. `input`: the copy starts with the tensor's values
// (an output-only buffer of a staged operation starts uninitialized).
struct Staged {
  at::Tensor user, buf;
  Staged(const at::Tensor& t, const DeviceScope& dev, bool input = true) : user(t) {
    dev.check(t);
    if (dev.cuda() && dev.path() == DeviceScope::Path::kStaged) {
      buf = input ? dev.to_host(t) : dev.host_like(t);
    } else {
      buf = t.is_contiguous() ? t : t.contiguous();
    }
  }
  // Asynchronous on the current stream for a CUDA tensor (the side stream: device.h).
  void write_back() const {
    if (!buf.is_same(user)) user.copy_(buf, /*non_blocking=*/true);
  }
};

// A flat contiguous tensor of `dtype` holding `parts`, where the operation's buffers live
// (DeviceScope::empty); `parts` copied in when `fill` (for a staged CUDA operation: the host
// waits for that copy).
at::Tensor flat_of(const std::vector<at::Tensor>& parts, const DeviceScope& dev,
                   at::ScalarType dtype, bool fill);
// Copies consecutive runs of `flat` into `parts` (asynchronously for CUDA parts, on the current
// stream).
void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& parts);
// Every tensor of the lists, in order: an operation's tensors for its DeviceScope.
std::vector<at::Tensor> all_of(std::initializer_list<const std::vector<at::Tensor>*> lists);
// The bytes of a contiguous tensor, as a flat uint8 view of the same memory.
at::Tensor bytes_of(const at::Tensor& contiguous);

}  // namespace lowcomm::torch_backend
