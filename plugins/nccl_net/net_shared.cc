#include "net_shared.h"

#include "plugin_log.h"

namespace lowcomm::nccl_net {
namespace {
std::mutex g_mu;  // guards g_live
std::weak_ptr<NetShared> g_live;
}  // namespace

Result<std::shared_ptr<NetShared>> NetShared::acquire() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (auto live = g_live.lock()) return live;
  auto options = PluginOptions::from_env();
  if (!options) return options.status();
  auto engine = transport::ProgressEngine::create("lc-nccl-net");
  if (!engine) return engine.status();
  std::shared_ptr<NetShared> s(new NetShared());
  s->options_ = std::move(options).value();
  s->engine_ = std::move(engine).value();
  NET_INFO(abi::kLogInit | abi::kLogNet | abi::kLogEnv, "%s", s->options_.describe().c_str());
  g_live = s;
  return s;
}

NetShared::~NetShared() {
  NET_INFO(abi::kLogNet, "last communicator gone: stopping the engine thread");
}

}  // namespace lowcomm::nccl_net
