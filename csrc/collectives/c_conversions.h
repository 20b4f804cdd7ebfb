#pragma once
// Between the C API's types (lowcomm.h) and the C++ ones: result codes, data types, reductions.
// Shared by the communicator's C API (c_api.cc) and the elastic communicator's
// (membership/c_api_elastic.cc).
#include <string>

#include "lowcomm/communicator.h"
#include "lowcomm/lowcomm.h"
#include "lowcomm/status.h"

namespace lowcomm {

inline lowcommResult_t to_result(StatusCode c) {
  switch (c) {
    case StatusCode::kOk:
      return lowcommSuccess;
    case StatusCode::kInvalidArgument:
      return lowcommInvalidArgument;
    case StatusCode::kCorruptData:
      return lowcommCorruptData;
    case StatusCode::kUnsupported:
      return lowcommUnsupported;
    case StatusCode::kInternal:
      return lowcommInternalError;
    case StatusCode::kSystem:
      return lowcommSystemError;
    case StatusCode::kTimeout:
      return lowcommTimeout;
    case StatusCode::kRemoteError:
      return lowcommRemoteError;
    case StatusCode::kAborted:
      return lowcommAborted;
    case StatusCode::kFenced:
      return lowcommFenced;
  }
  return lowcommInternalError;
}

inline Result<DType> to_dtype(lowcommDataType_t t) {
  switch (t) {
    case lowcommInt8:
      return DType::kInt8;
    case lowcommUint8:
      return DType::kUInt8;
    case lowcommInt32:
      return DType::kInt32;
    case lowcommUint32:
      return DType::kUInt32;
    case lowcommInt64:
      return DType::kInt64;
    case lowcommUint64:
      return DType::kUInt64;
    case lowcommFloat16:
      return DType::kFloat16;
    case lowcommFloat32:
      return DType::kFloat32;
    case lowcommFloat64:
      return DType::kFloat64;
    case lowcommBfloat16:
      return DType::kBFloat16;
    case lowcommInt16:
      return DType::kInt16;
    case lowcommBool:
      return DType::kBool;
  }
  return invalid_argument("unsupported datatype " + std::to_string(static_cast<int>(t)) +
                          " (a lowcommDataType_t value)");
}

inline Result<ReduceOp> to_op(lowcommRedOp_t op) {
  switch (op) {
    case lowcommSum:
      return ReduceOp::kSum;
    case lowcommProd:
      return ReduceOp::kProduct;
    case lowcommMax:
      return ReduceOp::kMax;
    case lowcommMin:
      return ReduceOp::kMin;
    case lowcommAvg:
      return ReduceOp::kAverage;
    case lowcommBand:
      return ReduceOp::kBAnd;
    case lowcommBor:
      return ReduceOp::kBOr;
    case lowcommBxor:
      return ReduceOp::kBXor;
  }
  return invalid_argument("unsupported reduction " + std::to_string(static_cast<int>(op)) +
                          " (a lowcommRedOp_t value)");
}

}  // namespace lowcomm
