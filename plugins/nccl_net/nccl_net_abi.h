#pragma once
// The NCCL net plugin ABI ("ext-net") this plugin implements: versions 10 (NCCL 2.26-2.27),
// 11 (2.28-2.29) and 12 (2.30), written here from NCCL's published interface description. NCCL
// finds a plugin by dlsym("ncclNetPlugin_v<N>"), newest version first, and calls through the
// table as is, so every struct below must match NCCL's layout to the byte: the static_asserts
// at the end pin each size and the offsets that differ between versions (x86-64 and aarch64,
// LP64).
//
// Enumerations NCCL passes (ncclResult_t, ncclDebugLogLevel, ncclNetDeviceType) are int-sized C
// enums; they appear here as int so nothing depends on NCCL's headers.

#include <cstddef>
#include <cstdint>

namespace lowcomm::nccl_net::abi {

// ncclResult_t values a plugin returns.
enum Result : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,    // network or OS failure
  kInternalError = 3,  // NCCL used the plugin wrongly (too many requests, bad arguments)
  kInvalidArgument = 4,
  kInvalidUsage = 5,  // the user's configuration (size mismatch, bad environment)
  kRemoteError = 6,
};

// ncclDebugLogLevel and the subsystem flags of NCCL's logger.
enum LogLevel : int { kLogNone = 0, kLogVersion = 1, kLogWarn = 2, kLogInfo = 3, kLogTrace = 5 };
inline constexpr unsigned long kLogInit = 1, kLogNet = 16, kLogEnv = 128, kLogAll = ~0ul;
using DebugLogger = void (*)(int level, unsigned long flags, const char* file, int line,
                             const char* fmt, ...);
using ProfilerCallback = int (*)(void** event_handle, int type, void* parent_handle,
                                 int64_t plugin_id, void* ext_data);

inline constexpr int kHandleMaxBytes = 128;  // NCCL_NET_HANDLE_MAXSIZE
inline constexpr int kPtrHost = 0x1, kPtrCuda = 0x2, kPtrDmaBuf = 0x4;
inline constexpr int kMaxRequests = 32;  // NCCL_NET_MAX_REQUESTS, per comm
inline constexpr int kDeviceHost = 0;    // ncclNetDeviceType: host memory, no device offload
inline constexpr uint64_t kMaxNetSizeBytes = 1ull << 40;  // NCCL_MAX_NET_SIZE_BYTES

// ncclNetDeviceHandle_v10_t .. _v12_t (one type).
struct DeviceHandle {
  int net_device_type;
  int net_device_version;
  void* handle;
  size_t size;
  int needs_proxy_progress;
};

// ncclNetCommConfig_v10_t .. _v12_t.
struct CommConfig {
  int traffic_class;  // -1: undefined
};

template <int kDevs>
struct VDeviceProps {  // ncclNetVDeviceProps: 4 devices up to v11, 8 from v12
  int ndevs;
  int devs[kDevs];
};
using VDevicePropsV10 = VDeviceProps<4>;
using VDevicePropsV12 = VDeviceProps<8>;

// The fields every version from 10 on shares, in NCCL's order, up to the virtual-device props.
struct PropertiesHead {
  char* name;      // log name and topology key, unique per device
  char* pci_path;  // /sys path of the NIC, or null (a virtual NIC)
  uint64_t guid;
  int ptr_support;    // kPtrHost | ...
  int reg_is_global;  // 1: registrations are cached and cheap
  int force_flush;
  int speed;  // Mbit/s
  int port;
  float latency;  // microseconds (NCCL truncates it to an integer)
  int max_comms;
  int max_recvs;  // irecv's n at most this
  int net_device_type;
  int net_device_version;
};

struct PropertiesV10 {  // ncclNetProperties_v10_t
  PropertiesHead head;
  VDevicePropsV10 vprops;
  size_t max_p2p_bytes;   // must be in (0, 1 TiB]
  size_t max_coll_bytes;  // likewise
};

struct PropertiesV11 {  // ncclNetProperties_v11_t
  PropertiesHead head;
  VDevicePropsV10 vprops;
  size_t max_p2p_bytes;
  size_t max_coll_bytes;
  int max_multi_request_size;
};

struct PropertiesV12 {  // ncclNetProperties_v12_t: 8 virtual-device slots, rail and plane ids
  PropertiesHead head;
  VDevicePropsV12 vprops;
  size_t max_p2p_bytes;
  size_t max_coll_bytes;
  int max_multi_request_size;
  int16_t rail_id;   // -1: no rail
  int16_t plane_id;  // -1: no plane
};

struct CommAttr {  // ncclNetCommAttr_v11_t
  int32_t max_concurrent_peers, min_concurrent_peers, max_flows_per_peer, min_flows_per_peer;
};
struct NetAttr {  // ncclNetAttr_v11_t / _v12_t
  CommAttr send_comm_attr, recv_comm_attr;
  uint32_t op, algo, proto;
};

// The function tables. Members in NCCL's order; unused optional members are null.
struct NetV10 {  // ncclNet_v10_t
  const char* name;
  int (*init)(DebugLogger log, ProfilerCallback prof);
  int (*devices)(int* ndev);
  int (*get_properties)(int dev, PropertiesV10* props);
  int (*listen)(int dev, void* handle, void** listen_comm);
  int (*connect)(int dev, CommConfig* config, void* handle, void** send_comm,
                 DeviceHandle** send_dev_comm);
  int (*accept)(void* listen_comm, void** recv_comm, DeviceHandle** recv_dev_comm);
  int (*reg_mr)(void* comm, void* data, size_t size, int type, void** mhandle);
  int (*reg_mr_dma_buf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                        void** mhandle);
  int (*dereg_mr)(void* comm, void* mhandle);
  int (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle,
               void** request);
  int (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
               void** phandles, void** request);
  int (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles, void** request);
  int (*test)(void* request, int* done, int* sizes);
  int (*close_send)(void* send_comm);
  int (*close_recv)(void* recv_comm);
  int (*close_listen)(void* listen_comm);
  int (*get_device_mr)(void* comm, void* mhandle, void** dptr_mhandle);
  int (*irecv_consumed)(void* recv_comm, int n, void* request);
  int (*make_vdevice)(int* d, VDevicePropsV10* props);
};

// v11 and v12: a context per communicator (init/finalize), listen and connect take it.
template <typename Properties, typename VProps>
struct NetWithContext {
  const char* name;
  int (*init)(void** ctx, uint64_t comm_id, CommConfig* config, DebugLogger log,
              ProfilerCallback prof);
  int (*devices)(int* ndev);
  int (*get_properties)(int dev, Properties* props);
  int (*listen)(void* ctx, int dev, void* handle, void** listen_comm);
  int (*connect)(void* ctx, int dev, void* handle, void** send_comm, DeviceHandle** send_dev_comm);
  int (*accept)(void* listen_comm, void** recv_comm, DeviceHandle** recv_dev_comm);
  int (*reg_mr)(void* comm, void* data, size_t size, int type, void** mhandle);
  int (*reg_mr_dma_buf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                        void** mhandle);
  int (*dereg_mr)(void* comm, void* mhandle);
  int (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle,
               void** request);
  int (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
               void** phandles, void** request);
  int (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles, void** request);
  int (*test)(void* request, int* done, int* sizes);
  int (*close_send)(void* send_comm);
  int (*close_recv)(void* recv_comm);
  int (*close_listen)(void* listen_comm);
  int (*get_device_mr)(void* comm, void* mhandle, void** dptr_mhandle);
  int (*irecv_consumed)(void* recv_comm, int n, void* request);
  int (*make_vdevice)(int* d, VProps* props);
  int (*finalize)(void* ctx);
  int (*set_net_attr)(void* ctx, NetAttr* attr);
};
using NetV11 = NetWithContext<PropertiesV11, VDevicePropsV10>;  // ncclNet_v11_t
using NetV12 = NetWithContext<PropertiesV12, VDevicePropsV12>;  // ncclNet_v12_t

// ---- layout checks (NCCL's published sizes and offsets, LP64) ----
static_assert(sizeof(DeviceHandle) == 32);
static_assert(sizeof(CommConfig) == 4);
static_assert(sizeof(VDevicePropsV10) == 20 && sizeof(VDevicePropsV12) == 36);
static_assert(offsetof(PropertiesHead, latency) == 44);
static_assert(offsetof(PropertiesHead, net_device_type) == 56);
static_assert(sizeof(PropertiesHead) == 64);

static_assert(offsetof(PropertiesV10, vprops) == 64);
static_assert(offsetof(PropertiesV10, max_p2p_bytes) == 88);
static_assert(offsetof(PropertiesV10, max_coll_bytes) == 96);
static_assert(sizeof(PropertiesV10) == 104);

static_assert(offsetof(PropertiesV11, vprops) == 64);
static_assert(offsetof(PropertiesV11, max_p2p_bytes) == 88);
static_assert(offsetof(PropertiesV11, max_coll_bytes) == 96);
static_assert(offsetof(PropertiesV11, max_multi_request_size) == 104);
static_assert(sizeof(PropertiesV11) == 112);

static_assert(offsetof(PropertiesV12, vprops) == 64);
static_assert(offsetof(PropertiesV12, max_p2p_bytes) == 104);
static_assert(offsetof(PropertiesV12, max_coll_bytes) == 112);
static_assert(offsetof(PropertiesV12, max_multi_request_size) == 120);
static_assert(offsetof(PropertiesV12, rail_id) == 124);
static_assert(offsetof(PropertiesV12, plane_id) == 126);
static_assert(sizeof(PropertiesV12) == 128);

static_assert(sizeof(CommAttr) == 16 && sizeof(NetAttr) == 44);

static_assert(sizeof(NetV10) == 160);  // name + 19 functions
static_assert(offsetof(NetV10, make_vdevice) == 152);
static_assert(sizeof(NetV11) == 176 && sizeof(NetV12) == 176);  // name + 21 functions
static_assert(offsetof(NetV11, test) == 104);
static_assert(offsetof(NetV11, finalize) == 160);
static_assert(offsetof(NetV11, set_net_attr) == 168);
static_assert(offsetof(NetV12, finalize) == 160);

}  // namespace lowcomm::nccl_net::abi
