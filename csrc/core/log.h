#pragma once
// Logging to stderr, one line per call, threshold from LOWCOMM_DEBUG.
//
//   LOWCOMM_DEBUG = NONE | WARN (default) | INFO | TRACE
//
// Each line is "[lowcomm <pid> <thread name>] LEVEL file:line message" and is emitted with a
// single write(2), so lines from concurrent threads never interleave. Log once, where an error
// is first understood (STYLE.md). Usage: LOWCOMM_LOG(kWarn, "peer %s: %s", who, why);

namespace lowcomm {

enum class LogLevel { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

// The threshold parsed from LOWCOMM_DEBUG on first use (an unknown value means WARN); with a
// sink installed, the sink's threshold.
LogLevel log_threshold();

// A host that has its own logger (the NCCL plugin: NCCL's, filtered by NCCL_DEBUG) takes the
// lines instead of stderr: `message` is the formatted text without prefix or newline, and every
// line up to `threshold` is passed. nullptr restores stderr and LOWCOMM_DEBUG. The sink must be
// callable from any thread until it is replaced.
using LogSink = void (*)(LogLevel level, const char* file, int line, const char* message);
void set_log_sink(LogSink sink, LogLevel threshold);
inline bool log_enabled(LogLevel level) {
  return level != LogLevel::kNone && static_cast<int>(level) <= static_cast<int>(log_threshold());
}
void log_write(LogLevel level, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

}  // namespace lowcomm

#define LOWCOMM_LOG(level, ...)                                                          \
  do {                                                                                   \
    if (::lowcomm::log_enabled(::lowcomm::LogLevel::level))                              \
      ::lowcomm::log_write(::lowcomm::LogLevel::level, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
