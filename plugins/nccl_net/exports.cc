// The symbols NCCL looks up: ncclNetPlugin_v12 (NCCL 2.30), _v11 (2.28-2.29), _v10 (2.26-2.27).
// Each is a table of the version's own signatures over the version-neutral entry points of
// plugin_api.h; only these three symbols are exported (nccl_net.map).

#include "plugin_api.h"

namespace lowcomm::nccl_net {
namespace {

constexpr const char* kName = "lowcomm";  // what NCCL_NET matches

template <typename Properties>
int properties_with_context(int dev, Properties* props) {
  if (!props) return abi::kInternalError;
  // NCCL hands the struct over uninitialised: every field is set, padding included.
  *props = Properties{};
  int rc = plugin_properties(dev, &props->head, &props->vprops.ndevs, &props->vprops.devs[0],
                             &props->max_p2p_bytes, &props->max_coll_bytes);
  props->max_multi_request_size = 1;
  return rc;
}

int init_v11(void** ctx, uint64_t comm_id, abi::CommConfig* config, abi::DebugLogger log,
             abi::ProfilerCallback /*prof*/) {
  NetContext* c = nullptr;
  int rc = plugin_init(&c, comm_id, config ? config->traffic_class : -1, log);
  if (ctx) *ctx = c;
  return rc;
}
int finalize_v11(void* ctx) {
  return plugin_finalize(static_cast<NetContext*>(ctx));
}
int listen_v11(void* ctx, int dev, void* handle, void** listen_comm) {
  return plugin_listen(static_cast<NetContext*>(ctx), dev, handle, listen_comm);
}
int connect_v11(void* ctx, int dev, void* handle, void** send_comm,
                abi::DeviceHandle** send_dev_comm) {
  return plugin_connect(static_cast<NetContext*>(ctx), dev, handle, send_comm, send_dev_comm);
}

int properties_v12(int dev, abi::PropertiesV12* props) {
  int rc = properties_with_context(dev, props);
  props->rail_id = -1;
  props->plane_id = -1;
  return rc;
}
int properties_v11(int dev, abi::PropertiesV11* props) {
  return properties_with_context(dev, props);
}

int init_v10(abi::DebugLogger log, abi::ProfilerCallback /*prof*/) {
  return plugin_init_v10(log);
}
int properties_v10(int dev, abi::PropertiesV10* props) {
  if (!props) return abi::kInternalError;
  *props = abi::PropertiesV10{};
  return plugin_properties(dev, &props->head, &props->vprops.ndevs, &props->vprops.devs[0],
                           &props->max_p2p_bytes, &props->max_coll_bytes);
}
int listen_v10(int dev, void* handle, void** listen_comm) {
  return plugin_listen(v10_context(), dev, handle, listen_comm);
}
int connect_v10(int dev, abi::CommConfig* /*config*/, void* handle, void** send_comm,
                abi::DeviceHandle** send_dev_comm) {
  return plugin_connect(v10_context(), dev, handle, send_comm, send_dev_comm);
}

// v11 and v12 differ only in the properties struct (and the virtual-device props, unused).
template <typename Net, typename Properties>
constexpr Net table_with_context(int (*get_properties)(int, Properties*)) {
  return Net{
      .name = kName,
      .init = init_v11,
      .devices = plugin_devices,
      .get_properties = get_properties,
      .listen = listen_v11,
      .connect = connect_v11,
      .accept = plugin_accept,
      .reg_mr = plugin_reg_mr,
      .reg_mr_dma_buf = nullptr,  // no NCCL_PTR_DMABUF
      .dereg_mr = plugin_dereg_mr,
      .isend = plugin_isend,
      .irecv = plugin_irecv,
      .iflush = plugin_iflush,
      .test = plugin_test,
      .close_send = plugin_close_send,
      .close_recv = plugin_close_recv,
      .close_listen = plugin_close_listen,
      .get_device_mr = nullptr,   // no device offload
      .irecv_consumed = nullptr,  // requests are recycled when test() reports them done
      .make_vdevice = nullptr,    // physical devices only
      .finalize = finalize_v11,
      .set_net_attr = nullptr,  // NCCL's per-transfer hints are not used
  };
}

}  // namespace
}  // namespace lowcomm::nccl_net

using namespace lowcomm::nccl_net;  // NOLINT: the tables below name many entry points

extern "C" {

// Declared first: a const object at namespace scope would otherwise have internal linkage.
__attribute__((visibility("default"))) extern const abi::NetV12 ncclNetPlugin_v12;
__attribute__((visibility("default"))) extern const abi::NetV11 ncclNetPlugin_v11;
__attribute__((visibility("default"))) extern const abi::NetV10 ncclNetPlugin_v10;

const abi::NetV12 ncclNetPlugin_v12 = table_with_context<abi::NetV12>(properties_v12);
const abi::NetV11 ncclNetPlugin_v11 = table_with_context<abi::NetV11>(properties_v11);

const abi::NetV10 ncclNetPlugin_v10 = {
    .name = kName,
    .init = init_v10,
    .devices = plugin_devices,
    .get_properties = properties_v10,
    .listen = listen_v10,
    .connect = connect_v10,
    .accept = plugin_accept,
    .reg_mr = plugin_reg_mr,
    .reg_mr_dma_buf = nullptr,  // no NCCL_PTR_DMABUF
    .dereg_mr = plugin_dereg_mr,
    .isend = plugin_isend,
    .irecv = plugin_irecv,
    .iflush = plugin_iflush,
    .test = plugin_test,
    .close_send = plugin_close_send,
    .close_recv = plugin_close_recv,
    .close_listen = plugin_close_listen,
    .get_device_mr = nullptr,   // no device offload
    .irecv_consumed = nullptr,  // requests are recycled when test() reports them done
    .make_vdevice = nullptr,    // physical devices only
};

}  // extern "C"
