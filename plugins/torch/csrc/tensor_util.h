#pragma once
// Translations between torch's types and lowcomm's, and the buffers the backend hands the
// communicator: shared by the backend's collectives (backend.cc) and its coalesced ones
// (coalesced.cc).

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstdint>
#include <vector>

#include "lowcomm/communicator.h"

namespace lowcomm::torch_backend {

lowcomm::DType to_dtype(at::ScalarType t);
lowcomm::ReduceOp to_op(const c10d::ReduceOp& op);
void check_host(const at::Tensor& t);

inline uint64_t elems(const at::Tensor& t) {
  return static_cast<uint64_t>(t.numel());
}

// A contiguous buffer for a user tensor: the tensor itself when contiguous (no copy), else a
// contiguous copy that write_back() copies into the user's tensor.
struct Staged {
  at::Tensor user, buf;
  explicit Staged(const at::Tensor& t) : user(t), buf(t.is_contiguous() ? t : t.contiguous()) {
    check_host(t);
  }
  void write_back() const {
    if (!buf.is_same(user)) user.copy_(buf);
  }
};

// A flat contiguous tensor holding `parts` (copied in when `fill`).
at::Tensor flat_of(const std::vector<at::Tensor>& parts, const at::Tensor& like, bool fill);
// Copies consecutive runs of `flat` into `parts`.
void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& parts);
// The bytes of a contiguous tensor, as a flat uint8 view of the same memory.
at::Tensor bytes_of(const at::Tensor& contiguous);

}  // namespace lowcomm::torch_backend
