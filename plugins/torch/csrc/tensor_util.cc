#include "tensor_util.h"

#include <c10/util/Exception.h>

namespace lowcomm::torch_backend {

lowcomm::DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kDouble:
      return DType::kFloat64;
    case at::kChar:
      return DType::kInt8;
    case at::kByte:
      return DType::kUInt8;
    case at::kShort:
      return DType::kInt16;
    case at::kInt:
      return DType::kInt32;
    case at::kLong:
      return DType::kInt64;
    case at::kBool:
      return DType::kBool;
    case at::kUInt32:
      return DType::kUInt32;
    case at::kUInt64:
      return DType::kUInt64;
    default:
      TORCH_CHECK(false, "lowcomm: unsupported dtype ", t);
  }
}

lowcomm::ReduceOp to_op(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return lowcomm::ReduceOp::kSum;
    case c10d::ReduceOp::AVG:
      return lowcomm::ReduceOp::kAverage;
    case c10d::ReduceOp::PRODUCT:
      return lowcomm::ReduceOp::kProduct;
    case c10d::ReduceOp::MIN:
      return lowcomm::ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return lowcomm::ReduceOp::kMax;
    case c10d::ReduceOp::BAND:
      return lowcomm::ReduceOp::kBAnd;
    case c10d::ReduceOp::BOR:
      return lowcomm::ReduceOp::kBOr;
    case c10d::ReduceOp::BXOR:
      return lowcomm::ReduceOp::kBXor;
    default:
      TORCH_CHECK(false, "lowcomm: unsupported reduction (PREMUL_SUM is not implemented)");
  }
}

at::Tensor flat_of(const std::vector<at::Tensor>& parts, const DeviceScope& dev,
                   at::ScalarType dtype, bool fill) {
  int64_t n = 0;
  for (const auto& p : parts) n += p.numel();
  at::Tensor flat = dev.empty(n, dtype);
  if (fill) {
    int64_t off = 0;
    for (const auto& p : parts) {
      flat.narrow(0, off, p.numel()).copy_(p.reshape({-1}));
      off += p.numel();
    }
  }
  return flat;
}

void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& parts) {
  int64_t off = 0;
  for (const auto& p : parts) {
    p.copy_(flat.narrow(0, off, p.numel()).view(p.sizes()), /*non_blocking=*/true);
    off += p.numel();
  }
}

std::vector<at::Tensor> all_of(std::initializer_list<const std::vector<at::Tensor>*> lists) {
  std::vector<at::Tensor> out;
  for (const auto* l : lists) out.insert(out.end(), l->begin(), l->end());
  return out;
}

at::Tensor bytes_of(const at::Tensor& contiguous) {
  TORCH_INTERNAL_ASSERT(contiguous.is_contiguous());
  return contiguous.reshape({-1}).view(at::kByte);
}

}  // namespace lowcomm::torch_backend
