#pragma once
// NetShared: the process-wide half of the plugin: the options, one transport engine thread
// for every connection, and the emulated site links they share. Each init() (one per NCCL
// communicator from v11 on) holds a NetContext, and each comm holds the NetShared, so the
// engine thread is joined when the last context is finalized and the last comm closed, before
// NCCL dlcloses the library; the next init starts afresh (options are read again).

#include <map>
#include <memory>
#include <mutex>

#include "plugin_options.h"
#include "transport/connector.h"
#include "transport/progress_engine.h"

namespace lowcomm::nccl_net {

class NetShared {
 public:
  // The live instance, or a new one (options read and logged, engine started).
  static Result<std::shared_ptr<NetShared>> acquire();
  ~NetShared();

  const PluginOptions& options() const { return options_; }
  const std::shared_ptr<transport::ProgressEngine>& engine() const { return engine_; }

 private:
  NetShared() = default;
  PluginOptions options_;
  std::shared_ptr<transport::ProgressEngine> engine_;
};

// What init() returns as NCCL's context: the communicator's view of the plugin. Connections in
// progress are kept here by the address of NCCL's handle (NCCL passes the same handle to every
// connect() retry), so nothing in the handle itself is trusted as a pointer.
struct NetContext {
  std::shared_ptr<NetShared> shared;
  uint64_t comm_id = 0;
  int traffic_class = -1;
  std::mutex mu;  // guards connecting
  std::map<const void*, std::unique_ptr<transport::ConnectOp>> connecting;
};

}  // namespace lowcomm::nccl_net
