#include "core/log.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/params.h"

namespace lowcomm {

namespace {
std::atomic<LogSink> g_sink{nullptr};
std::atomic<int> g_sink_threshold{0};
}  // namespace

void set_log_sink(LogSink sink, LogLevel threshold) {
  g_sink_threshold.store(static_cast<int>(threshold));
  g_sink.store(sink);
}

LogLevel log_threshold() {
  if (g_sink.load(std::memory_order_relaxed))
    return static_cast<LogLevel>(g_sink_threshold.load(std::memory_order_relaxed));
  static const LogLevel level = [] {
    auto set = params::choice("LOWCOMM_DEBUG");  // malformed: WARN here, and init says so
    if (!set.is_ok() || !set->has_value()) return LogLevel::kWarn;
    const std::string& v = **set;
    if (v == "NONE" || v == "OFF" || v == "0") return LogLevel::kNone;
    if (v == "INFO") return LogLevel::kInfo;
    if (v == "TRACE") return LogLevel::kTrace;
    return LogLevel::kWarn;
  }();
  return level;
}

static const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kTrace:
      return "TRACE";
    case LogLevel::kNone:
      break;
  }
  return "?";
}

void log_write(LogLevel level, const char* file, int line, const char* fmt, ...) {
  if (LogSink sink = g_sink.load()) {
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    sink(level, file, line, text);
    return;
  }
  char thread_name[16] = "?";
  pthread_getname_np(pthread_self(), thread_name, sizeof(thread_name));
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;

  char buf[1024];
  int n = std::snprintf(buf, sizeof(buf), "[lowcomm %d %s] %s %s:%d ", static_cast<int>(getpid()),
                        thread_name, level_name(level), base, line);
  if (n < 0) return;
  size_t used = static_cast<size_t>(n) < sizeof(buf) ? static_cast<size_t>(n) : sizeof(buf) - 1;
  va_list ap;
  va_start(ap, fmt);
  int m = std::vsnprintf(buf + used, sizeof(buf) - used, fmt, ap);
  va_end(ap);
  if (m > 0) used += static_cast<size_t>(m);
  if (used > sizeof(buf) - 2) used = sizeof(buf) - 2;  // truncated: keep room for the newline
  buf[used++] = '\n';
  // One write so concurrent lines never interleave; a failed log write has nowhere to go.
  ssize_t ignored = ::write(STDERR_FILENO, buf, used);
  (void)ignored;
}

}  // namespace lowcomm
