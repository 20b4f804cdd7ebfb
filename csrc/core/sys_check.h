#pragma once
// System-call checks: retry on EINTR, turn errno into a Status that names the call, the peer
// (or whatever the call was acting on) and strerror.
//
//   LOWCOMM_CHECK_SYS(setsockopt(fd, ...), peer_name);   // returns the Status on failure
//   long n = LOWCOMM_SYS_RETRY(read(fd, p, len));         // -1 with errno set, never EINTR

#include <cerrno>
#include <string_view>

#include "lowcomm/status.h"

namespace lowcomm {

// kSystem: "<syscall> failed for <what>: <strerror> (errno N)". `call_text` may be a whole
// expression ("setsockopt(fd, ...)"): only the text before the first '(' is kept.
Status sys_error(std::string_view call_text, std::string_view what, int err);

}  // namespace lowcomm

#define LOWCOMM_SYS_RETRY(expr)                   \
  ([&]() {                                        \
    long lowcomm_r_;                              \
    do {                                          \
      lowcomm_r_ = static_cast<long>(expr);       \
    } while (lowcomm_r_ == -1 && errno == EINTR); \
    return lowcomm_r_;                            \
  }())

#define LOWCOMM_CHECK_SYS(expr, what)                                                     \
  do {                                                                                    \
    if (LOWCOMM_SYS_RETRY(expr) == -1) return ::lowcomm::sys_error(#expr, (what), errno); \
  } while (0)
