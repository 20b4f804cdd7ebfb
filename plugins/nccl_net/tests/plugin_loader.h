#pragma once
// The plugin as NCCL sees it: dlopen(RTLD_NOW | RTLD_LOCAL) of libnccl-net-lowcomm.so and the
// tables looked up by name, newest version first. For the GPU-free driver tests.

#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "nccl_net_abi.h"

namespace lowcomm::nccl_net::testing {

namespace abi = ::lowcomm::nccl_net::abi;

// NCCL's logger, as the plugin gets it: keeps the last WARN for assertions; prints when
// LOWCOMM_DRIVER_VERBOSE is set.
inline std::mutex& log_mu() {
  static std::mutex mu;
  return mu;
}
inline std::string& last_warn() {
  static std::string s;
  return s;
}
inline std::vector<std::string>& info_lines() {
  static std::vector<std::string> v;
  return v;
}
inline void driver_logger(int level, unsigned long /*flags*/, const char* file, int line,
                          const char* fmt, ...) {
  char text[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(log_mu());
  if (level == abi::kLogWarn) last_warn() = text;
  if (level == abi::kLogInfo && info_lines().size() < 10000) info_lines().push_back(text);
  if (std::getenv("LOWCOMM_DRIVER_VERBOSE") || level == abi::kLogWarn)
    std::fprintf(stderr, "[driver %d] %s %s:%d %s\n", static_cast<int>(getpid()),
                 level == abi::kLogWarn ? "WARN" : "INFO", file, line, text);
}
// Whether an INFO line containing `what` was logged (and forget them all).
inline bool logged_info(const std::string& what) {
  std::lock_guard<std::mutex> lock(log_mu());
  bool found = false;
  for (const auto& l : info_lines()) found = found || l.find(what) != std::string::npos;
  return found;
}
inline void forget_info() {
  std::lock_guard<std::mutex> lock(log_mu());
  info_lines().clear();
}
inline std::string take_last_warn() {
  std::lock_guard<std::mutex> lock(log_mu());
  return std::exchange(last_warn(), std::string());
}

class PluginLib {
 public:
  explicit PluginLib(const char* path = LOWCOMM_NCCL_NET_PLUGIN_PATH) {
    handle_ = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle_) throw std::runtime_error(std::string("dlopen: ") + dlerror());
    v12_ = static_cast<const abi::NetV12*>(dlsym(handle_, "ncclNetPlugin_v12"));
    v11_ = static_cast<const abi::NetV11*>(dlsym(handle_, "ncclNetPlugin_v11"));
    v10_ = static_cast<const abi::NetV10*>(dlsym(handle_, "ncclNetPlugin_v10"));
  }
  ~PluginLib() {
    if (handle_) dlclose(handle_);
  }
  PluginLib(const PluginLib&) = delete;
  PluginLib& operator=(const PluginLib&) = delete;

  void* handle() const { return handle_; }
  const abi::NetV12* v12() const { return v12_; }
  const abi::NetV11* v11() const { return v11_; }
  const abi::NetV10* v10() const { return v10_; }

 private:
  void* handle_ = nullptr;
  const abi::NetV12* v12_ = nullptr;
  const abi::NetV11* v11_ = nullptr;
  const abi::NetV10* v10_ = nullptr;
};

}  // namespace lowcomm::nccl_net::testing
