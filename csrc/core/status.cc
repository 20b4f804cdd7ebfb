#include "lowcomm/status.h"

namespace lowcomm {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kCorruptData:
      return "corrupt data";
    case StatusCode::kUnsupported:
      return "unsupported";
    case StatusCode::kInternal:
      return "internal error";
    case StatusCode::kSystem:
      return "system error";
    case StatusCode::kTimeout:
      return "timeout";
    case StatusCode::kRemoteError:
      return "remote error";
    case StatusCode::kAborted:
      return "aborted";
    case StatusCode::kFenced:
      return "fenced";
  }
  return "unknown status";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

}  // namespace lowcomm
