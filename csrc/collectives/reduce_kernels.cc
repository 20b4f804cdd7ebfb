#include "collectives/reduce_kernels.h"

#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "codec/quant_math.h"

namespace lowcomm::collectives {
namespace {

bool is_integer(DType d) {
  switch (d) {
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kUInt32:
    case DType::kInt64:
    case DType::kUInt64:
      return true;
    default:
      return false;
  }
}

bool is_bitwise(ReduceOp op) {
  return op == ReduceOp::kBAnd || op == ReduceOp::kBOr || op == ReduceOp::kBXor;
}

// Calls fn(T{}) with T the C++ type of acc_dtype(dtype).
template <typename Fn>
void with_acc_type(DType dtype, Fn&& fn) {
  switch (acc_dtype(dtype)) {
    case DType::kFloat64:
      return fn(double{});
    case DType::kInt8:
      return fn(int8_t{});
    case DType::kUInt8:
    case DType::kBool:
      return fn(uint8_t{});
    case DType::kInt16:
      return fn(int16_t{});
    case DType::kInt32:
      return fn(int32_t{});
    case DType::kUInt32:
      return fn(uint32_t{});
    case DType::kInt64:
      return fn(int64_t{});
    case DType::kUInt64:
      return fn(uint64_t{});
    default:
      return fn(float{});
  }
}

// Integer arithmetic in the unsigned type of the same width: wraps, never overflows (UB).
template <typename T>
T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}
template <typename T>
T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  // uint16_t/uint8_t promote to int, whose product can overflow: multiply as uint64_t.
  return static_cast<T>(
      static_cast<U>(static_cast<uint64_t>(static_cast<U>(a)) * static_cast<U>(b)));
}

template <typename T>
void combine(ReduceOp op, T* acc, const T* x, uint64_t n) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      if constexpr (std::is_floating_point_v<T>) {
        for (uint64_t i = 0; i < n; ++i) acc[i] += x[i];
      } else {
        for (uint64_t i = 0; i < n; ++i) acc[i] = wrap_add(acc[i], x[i]);
      }
      return;
    case ReduceOp::kProduct:
      if constexpr (std::is_floating_point_v<T>) {
        for (uint64_t i = 0; i < n; ++i) acc[i] *= x[i];
      } else {
        for (uint64_t i = 0; i < n; ++i) acc[i] = wrap_mul(acc[i], x[i]);
      }
      return;
    case ReduceOp::kMin:
      if constexpr (std::is_floating_point_v<T>) {
        for (uint64_t i = 0; i < n; ++i)
          acc[i] = (x[i] < acc[i] || std::isnan(x[i])) && !std::isnan(acc[i]) ? x[i] : acc[i];
      } else {
        for (uint64_t i = 0; i < n; ++i) acc[i] = x[i] < acc[i] ? x[i] : acc[i];
      }
      return;
    case ReduceOp::kMax:
      if constexpr (std::is_floating_point_v<T>) {
        for (uint64_t i = 0; i < n; ++i)
          acc[i] = (x[i] > acc[i] || std::isnan(x[i])) && !std::isnan(acc[i]) ? x[i] : acc[i];
      } else {
        for (uint64_t i = 0; i < n; ++i) acc[i] = x[i] > acc[i] ? x[i] : acc[i];
      }
      return;
    case ReduceOp::kBAnd:
    case ReduceOp::kBOr:
    case ReduceOp::kBXor:
      if constexpr (std::is_integral_v<T>) {
        if (op == ReduceOp::kBAnd) {
          for (uint64_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] & x[i]);
        } else if (op == ReduceOp::kBOr) {
          for (uint64_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] | x[i]);
        } else {
          for (uint64_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] ^ x[i]);
        }
      }
      return;
  }
}

// Bool: normalized to 0/1 on the way in, so OR, AND and XOR of 0/1 bytes are the logic ops.
void combine_bool(ReduceOp op, uint8_t* acc, const uint8_t* x, uint64_t n) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMax:
    case ReduceOp::kBOr:
      for (uint64_t i = 0; i < n; ++i) acc[i] = static_cast<uint8_t>(acc[i] | (x[i] != 0));
      return;
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kBAnd:
      for (uint64_t i = 0; i < n; ++i) acc[i] = static_cast<uint8_t>(acc[i] & (x[i] != 0));
      return;
    case ReduceOp::kBXor:
      for (uint64_t i = 0; i < n; ++i) acc[i] = static_cast<uint8_t>(acc[i] ^ (x[i] != 0));
      return;
    case ReduceOp::kAverage:
      return;  // refused by check_reduction
  }
}

// bf16/fp16 <-> fp32 exactly as the codecs convert (round to nearest even, canonical NaN).
void widen(DType dtype, const void* src, float* dst, uint64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  if (dtype == DType::kBFloat16) {
    for (uint64_t i = 0; i < n; ++i) dst[i] = qm::bf16_to_f32(s[i]);
  } else {
    for (uint64_t i = 0; i < n; ++i) dst[i] = qm::f16_to_f32(s[i]);
  }
}

void narrow(DType dtype, const float* src, void* dst, uint64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  if (dtype == DType::kBFloat16) {
    for (uint64_t i = 0; i < n; ++i) d[i] = qm::f32_to_bf16(src[i]);
  } else {
    for (uint64_t i = 0; i < n; ++i) d[i] = qm::f32_to_f16(src[i]);
  }
}

}  // namespace

DType acc_dtype(DType dtype) {
  return dtype == DType::kBFloat16 || dtype == DType::kFloat16 ? DType::kFloat32 : dtype;
}

Status check_reduction(const char* what, DType dtype, ReduceOp op) {
  const bool integral = is_integer(dtype) || dtype == DType::kBool;
  if (is_bitwise(op) && !integral)
    return invalid_argument(std::string(what) + ": " + reduce_op_name(op) +
                            " takes integer or bool tensors, not " + dtype_name(dtype));
  if (op == ReduceOp::kAverage && dtype == DType::kBool)
    return invalid_argument(std::string(what) + ": avg is not defined on bool tensors");
  return Status::ok();
}

void reduce_first(DType dtype, void* acc, const void* src, uint64_t n) {
  if (acc_dtype(dtype) != dtype) return widen(dtype, src, static_cast<float*>(acc), n);
  if (dtype == DType::kBool) {
    auto* a = static_cast<uint8_t*>(acc);
    const auto* s = static_cast<const uint8_t*>(src);
    for (uint64_t i = 0; i < n; ++i) a[i] = s[i] != 0;
    return;
  }
  if (acc != src) std::memmove(acc, src, n * dtype_size(dtype));
}

void reduce_next(DType dtype, ReduceOp op, void* acc, const void* src, uint64_t n, float* scratch) {
  if (dtype == DType::kBool)
    return combine_bool(op, static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(src), n);
  if (acc_dtype(dtype) != dtype) {
    widen(dtype, src, scratch, n);
    src = scratch;
  }
  with_acc_type(dtype, [&](auto zero) {
    using T = decltype(zero);
    combine<T>(op, static_cast<T*>(acc), static_cast<const T*>(src), n);
  });
}

void reduce_finish(DType dtype, ReduceOp op, int ranks, void* acc, void* out, uint64_t n) {
  if (op == ReduceOp::kAverage) {
    with_acc_type(dtype, [&](auto zero) {
      using T = decltype(zero);
      auto* a = static_cast<T*>(acc);
      const auto div = static_cast<T>(ranks);
      for (uint64_t i = 0; i < n; ++i) a[i] = static_cast<T>(a[i] / div);
    });
  }
  if (acc_dtype(dtype) != dtype) return narrow(dtype, static_cast<const float*>(acc), out, n);
  if (acc != out) std::memmove(out, acc, n * dtype_size(dtype));
}

}  // namespace lowcomm::collectives
