#include "plugin_api.h"

#include <climits>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>

#include "connection_handle.h"
#include "net_comms.h"
#include "net_shared.h"
#include "plugin_log.h"

namespace lowcomm::nccl_net {
namespace {

// NCCL's code for a failure of ours, by what failed. `misuse`: NCCL called us wrongly.
int result_of(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return abi::kSuccess;
    case StatusCode::kInvalidArgument:
    case StatusCode::kCorruptData:  // e.g. a message larger than the posted receive
      return abi::kInvalidUsage;
    case StatusCode::kRemoteError:
      return abi::kRemoteError;
    case StatusCode::kInternal:
      return abi::kInternalError;
    default:
      return abi::kSystemError;
  }
}

int fail(const char* call, const Status& s) {
  NET_WARN("%s: %s", call, s.to_string().c_str());
  return result_of(s);
}

int misuse(const char* call, const std::string& what) {
  NET_WARN("%s: %s", call, what.c_str());
  return abi::kInternalError;
}

struct MemoryRegion {
  void* data;
  size_t size;
};

}  // namespace

int plugin_init(NetContext** ctx, uint64_t comm_id, int traffic_class, abi::DebugLogger log) {
  install_nccl_logger(log);
  if (!ctx) return misuse("init", "null context pointer");
  *ctx = nullptr;
  auto shared = NetShared::acquire();
  if (!shared) return fail("init", shared.status());
  auto* c = new (std::nothrow) NetContext();
  if (!c) return fail("init", Status(StatusCode::kSystem, "out of memory"));
  c->shared = std::move(shared).value();
  c->comm_id = comm_id;
  c->traffic_class = traffic_class;
  *ctx = c;
  NET_INFO(abi::kLogInit | abi::kLogNet, "init for communicator %016llx (traffic class %d)",
           static_cast<unsigned long long>(comm_id), traffic_class);
  return abi::kSuccess;
}

int plugin_finalize(NetContext* ctx) {
  delete ctx;  // NCCL finalizes a context whose init failed too: null is fine
  return abi::kSuccess;
}

int plugin_devices(int* ndev) {
  if (!ndev) return misuse("devices", "null count pointer");
  *ndev = 1;
  return abi::kSuccess;
}

int plugin_properties(int dev, abi::PropertiesHead* head, int* vdev_count, int* vdev0,
                      size_t* max_p2p_bytes, size_t* max_coll_bytes) {
  if (dev != 0) return misuse("getProperties", "device " + std::to_string(dev) + " of 1");
  auto shared = NetShared::acquire();  // NCCL asks before and between inits too
  if (!shared) return fail("getProperties", shared.status());
  const PluginOptions& o = (*shared)->options();
  // NCCL keeps the name pointer: storage that lives as long as the library, set once.
  static char name[96];
  static std::once_flag name_once;
  std::call_once(name_once,
                 [&] { std::snprintf(name, sizeof(name), "%s", o.device_name.c_str()); });
  head->name = name;
  head->pci_path = nullptr;  // a virtual NIC: NCCL attaches it to the first CPU
  head->guid = 0x6c6f77636f6d6d00ull;
  head->ptr_support = abi::kPtrHost;
  head->reg_is_global = 0;
  head->force_flush = 0;
  head->speed = o.speed_mbps;
  head->port = 0;
  head->latency = o.latency_us;
  head->max_comms = 65536;
  head->max_recvs = 1;
  head->net_device_type = abi::kDeviceHost;
  head->net_device_version = 0;
  *vdev_count = 1;
  *vdev0 = 0;
  // test() reports sizes as int.
  *max_p2p_bytes = INT_MAX;
  *max_coll_bytes = INT_MAX;
  return abi::kSuccess;
}

int plugin_listen(NetContext* ctx, int dev, void* handle, void** listen_comm) {
  if (!ctx || !handle || !listen_comm) return misuse("listen", "null argument");
  if (dev != 0) return misuse("listen", "device " + std::to_string(dev) + " of 1");
  *listen_comm = nullptr;
  auto l = ListenComm::create(ctx->shared);
  if (!l) return fail("listen", l.status());
  ConnectionHandle h{};
  h.magic = ConnectionHandle::kMagic;
  h.version = ConnectionHandle::kVersion;
  const std::string addr = (*l)->address().to_string();
  if (addr.size() >= sizeof(h.address))
    return fail("listen", invalid_argument("address " + addr + " does not fit the handle"));
  std::memcpy(h.address, addr.c_str(), addr.size() + 1);
  std::memset(handle, 0, abi::kHandleMaxBytes);
  std::memcpy(handle, &h, sizeof(h));
  *listen_comm = std::move(l).value().release();
  NET_INFO(abi::kLogNet, "listening on %s", addr.c_str());
  return abi::kSuccess;
}

int plugin_connect(NetContext* ctx, int dev, void* handle, void** send_comm,
                   abi::DeviceHandle** send_dev_comm) {
  if (!ctx || !handle || !send_comm) return misuse("connect", "null argument");
  *send_comm = nullptr;
  if (send_dev_comm) *send_dev_comm = nullptr;
  if (dev != 0) return misuse("connect", "device " + std::to_string(dev) + " of 1");
  std::unique_lock<std::mutex> lock(ctx->mu);
  auto it = ctx->connecting.find(handle);
  if (it == ctx->connecting.end()) {
    if (!ConnectionHandle::valid(handle))
      return fail("connect", Status(StatusCode::kInvalidArgument,
                                    "the handle is not a lowcomm connection handle (is every "
                                    "node using the same plugin version?)"));
    ConnectionHandle h;
    std::memcpy(&h, handle, sizeof(h));
    auto addr = transport::SocketAddress::parse(h.address);
    if (!addr) return fail("connect", addr.status());
    auto op =
        transport::ConnectOp::start(ctx->shared->engine(), *addr, ctx->shared->options().peer);
    if (!op) return fail("connect", op.status());
    it = ctx->connecting.emplace(handle, std::move(op).value()).first;
  }
  auto done = it->second->test();
  if (!done) {
    ctx->connecting.erase(it);
    return fail("connect", done.status());
  }
  if (!*done) return abi::kSuccess;  // NCCL calls again
  auto peer = it->second->take_peer();
  ctx->connecting.erase(it);
  lock.unlock();
  *send_comm = SendComm::start(ctx->shared, std::move(peer)).release();
  NET_INFO(abi::kLogNet, "connected to %s", static_cast<SendComm*>(*send_comm)->name().c_str());
  return abi::kSuccess;
}

int plugin_accept(void* listen_comm, void** recv_comm, abi::DeviceHandle** recv_dev_comm) {
  if (!listen_comm || !recv_comm) return misuse("accept", "null argument");
  *recv_comm = nullptr;
  if (recv_dev_comm) *recv_dev_comm = nullptr;
  auto c = static_cast<ListenComm*>(listen_comm)->accept();
  if (!c) return fail("accept", c.status());
  if (*c) {
    NET_INFO(abi::kLogNet, "accepted %s", (*c)->name().c_str());
    *recv_comm = std::move(c).value().release();
  }
  return abi::kSuccess;
}

int plugin_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  if (!comm || !mhandle) return misuse("regMr", "null argument");
  *mhandle = nullptr;
  if (type != abi::kPtrHost)
    return misuse("regMr", "memory type " + std::to_string(type) +
                               ": this plugin takes host memory only (NCCL_PTR_HOST)");
  auto* mr = new (std::nothrow) MemoryRegion{data, size};
  if (!mr) return fail("regMr", Status(StatusCode::kSystem, "out of memory"));
  *mhandle = mr;
  return abi::kSuccess;
}

int plugin_dereg_mr(void* /*comm*/, void* mhandle) {
  delete static_cast<MemoryRegion*>(mhandle);
  return abi::kSuccess;
}

int plugin_isend(void* send_comm, void* data, size_t size, int /*tag*/, void* /*mhandle*/,
                 void* /*phandle*/, void** request) {
  if (!send_comm || !request) return misuse("isend", "null argument");
  NetRequest* r = nullptr;
  Status s = static_cast<SendComm*>(send_comm)->isend(data, size, &r);
  *request = r;
  return s.is_ok() ? abi::kSuccess : fail("isend", s);
}

int plugin_irecv(void* recv_comm, int n, void** data, size_t* sizes, int* /*tags*/,
                 void** /*mhandles*/, void** /*phandles*/, void** request) {
  if (!recv_comm || !request || !data || !sizes) return misuse("irecv", "null argument");
  *request = nullptr;  // NCCL may have left a hint (0x1) here
  if (n != 1)
    return misuse("irecv", std::to_string(n) + " buffers: this plugin advertises maxRecvs 1");
  NetRequest* r = nullptr;
  Status s = static_cast<RecvComm*>(recv_comm)->irecv(data[0], sizes[0], &r);
  *request = r;
  return s.is_ok() ? abi::kSuccess : fail("irecv", s);
}

int plugin_iflush(void* recv_comm, int /*n*/, void** /*data*/, int* /*sizes*/, void** /*mhandles*/,
                  void** request) {
  if (!recv_comm || !request) return misuse("iflush", "null argument");
  *request = nullptr;  // host memory: the data is visible once test() said done
  return abi::kSuccess;
}

int plugin_test(void* request, int* done, int* sizes) {
  if (!request || !done) return misuse("test", "null argument");
  auto* r = static_cast<NetRequest*>(request);
  bool finished = false;
  size_t bytes = 0;
  Status s = r->comm->test(*r, &finished, &bytes);
  *done = finished ? 1 : 0;
  if (!s.is_ok()) return fail("test", s);
  if (finished && sizes) *sizes = static_cast<int>(bytes);
  return abi::kSuccess;
}

int plugin_close_send(void* send_comm) {
  delete static_cast<SendComm*>(send_comm);
  return abi::kSuccess;
}

int plugin_close_recv(void* recv_comm) {
  delete static_cast<RecvComm*>(recv_comm);
  return abi::kSuccess;
}

int plugin_close_listen(void* listen_comm) {
  delete static_cast<ListenComm*>(listen_comm);
  return abi::kSuccess;
}

namespace {
std::mutex g_v10_mu;
NetContext* g_v10_context = nullptr;
// Unloading the library ends the v10 context, and with it the engine thread.
struct V10Holder {
  ~V10Holder() { plugin_finalize(g_v10_context); }
} g_v10_holder;
}  // namespace

NetContext* v10_context() {
  std::lock_guard<std::mutex> lock(g_v10_mu);
  return g_v10_context;
}

int plugin_init_v10(abi::DebugLogger log) {
  std::lock_guard<std::mutex> lock(g_v10_mu);
  if (g_v10_context) {
    install_nccl_logger(log);
    return abi::kSuccess;
  }
  return plugin_init(&g_v10_context, 0, -1, log);
}

}  // namespace lowcomm::nccl_net
