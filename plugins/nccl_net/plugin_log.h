#pragma once
// Logging through NCCL's logger: NCCL filters by NCCL_DEBUG / NCCL_DEBUG_SUBSYS and turns a
// WARN into ncclGetLastError()'s text. Before the first init (or with a null logger) lines go
// to lowcomm's own stderr log. lowcomm's transport logs through the same function once
// install_nccl_logger() has run (core/log.h's sink).
//
//   NET_WARN("connect to %s failed: %s", addr, why);
//   NET_INFO(abi::kLogNet, "streams %d", n);

#include "nccl_net_abi.h"

namespace lowcomm::nccl_net {

// The logger of the latest init; safe to call from any thread at any time.
void install_nccl_logger(abi::DebugLogger logger);
void net_log(int level, unsigned long flags, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

}  // namespace lowcomm::nccl_net

#define NET_WARN(...)                                              \
  ::lowcomm::nccl_net::net_log(::lowcomm::nccl_net::abi::kLogWarn, \
                               ::lowcomm::nccl_net::abi::kLogAll, __FILE__, __LINE__, __VA_ARGS__)
#define NET_INFO(flags, ...)                                                                    \
  ::lowcomm::nccl_net::net_log(::lowcomm::nccl_net::abi::kLogInfo, (flags), __FILE__, __LINE__, \
                               __VA_ARGS__)
