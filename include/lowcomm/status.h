#pragma once
// Status and Result: the one error type used inside lowcomm and at its C++ API.
// Errors are values; nothing in lowcomm throws across a layer boundary.

#include <string>
#include <utility>
#include <variant>

#include "lowcomm/export.h"

namespace lowcomm {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller passed something lowcomm cannot use
  kCorruptData,      // received bytes failed validation (header, length, checksum)
  kUnsupported,      // valid request, not supported in this build or on this device
  kInternal,         // a lowcomm bug or an unexpected library failure
  kSystem,           // the OS or a device API failed (errno / cudaError named in the message)
  kTimeout,
  kRemoteError,
  kAborted,
  // An elastic member cut off from its group for good (evicted, no quorum, a view change that
  // never finished, or it left): it takes no further part; every later call returns this at
  // once. Not "call again" (kAborted): rejoin as a new member.
  kFenced,
};

LOWCOMM_API const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code name>: <message>", for logs and exceptions at the edges.
  LOWCOMM_API std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string msg) {
  return Status(StatusCode::kInvalidArgument, std::move(msg));
}
inline Status corrupt_data(std::string msg) {
  return Status(StatusCode::kCorruptData, std::move(msg));
}
inline Status unsupported(std::string msg) {
  return Status(StatusCode::kUnsupported, std::move(msg));
}
inline Status internal_error(std::string msg) {
  return Status(StatusCode::kInternal, std::move(msg));
}

// A value or the Status explaining why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  const T* operator->() const { return &value(); }
  Status status() const { return is_ok() ? Status() : std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace lowcomm

// Returns early from the enclosing function when `expr` yields a non-ok Status.
#define LOWCOMM_CHECK(expr)                               \
  do {                                                    \
    ::lowcomm::Status lowcomm_status_ = (expr);           \
    if (!lowcomm_status_.is_ok()) return lowcomm_status_; \
  } while (0)
