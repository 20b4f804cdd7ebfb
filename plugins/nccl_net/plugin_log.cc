#include "plugin_log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>

#include "core/log.h"

namespace lowcomm::nccl_net {
namespace {

std::atomic<abi::DebugLogger> g_logger{nullptr};

// lowcomm's own lines (transport, core) into NCCL's logger, tagged NET.
void core_sink(LogLevel level, const char* file, int line, const char* message) {
  const int nccl_level = level == LogLevel::kWarn   ? abi::kLogWarn
                         : level == LogLevel::kInfo ? abi::kLogInfo
                                                    : abi::kLogTrace;
  net_log(nccl_level, abi::kLogNet, file, line, "%s", message);
}

}  // namespace

void install_nccl_logger(abi::DebugLogger logger) {
  if (!logger) return;
  g_logger.store(logger);
  // TRACE only when asked for (LOWCOMM_DEBUG=TRACE): NCCL would filter it, but formatting every
  // chunk's line would cost.
  set_log_sink(core_sink, log_enabled(LogLevel::kTrace) ? LogLevel::kTrace : LogLevel::kInfo);
}

void net_log(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  if (abi::DebugLogger logger = g_logger.load()) {
    logger(level, flags, file, line, "NET/lowcomm: %s", text);
    return;
  }
  const LogLevel ours = level == abi::kLogWarn   ? LogLevel::kWarn
                        : level == abi::kLogInfo ? LogLevel::kInfo
                                                 : LogLevel::kTrace;
  if (log_enabled(ours)) log_write(ours, file, line, "NET/lowcomm: %s", text);
}

}  // namespace lowcomm::nccl_net
