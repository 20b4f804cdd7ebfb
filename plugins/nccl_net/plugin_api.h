#pragma once
// The plugin's entry points, version-neutral: exports.cc adapts them to each ncclNet_vN table.
// Every function returns an abi::Result and logs the reason for any failure as a WARN through
// NCCL's logger (NCCL shows it and makes it ncclGetLastError()).

#include <cstdint>

#include "nccl_net_abi.h"

namespace lowcomm::nccl_net {

struct NetContext;

int plugin_init(NetContext** ctx, uint64_t comm_id, int traffic_class, abi::DebugLogger log);
int plugin_finalize(NetContext* ctx);
int plugin_devices(int* ndev);
// Fills the fields every version shares; the caller sets the version's own.
int plugin_properties(int dev, abi::PropertiesHead* head, int* vdev_count, int* vdev0,
                      size_t* max_p2p_bytes, size_t* max_coll_bytes);
int plugin_listen(NetContext* ctx, int dev, void* handle, void** listen_comm);
int plugin_connect(NetContext* ctx, int dev, void* handle, void** send_comm,
                   abi::DeviceHandle** send_dev_comm);
int plugin_accept(void* listen_comm, void** recv_comm, abi::DeviceHandle** recv_dev_comm);
int plugin_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle);
int plugin_dereg_mr(void* comm, void* mhandle);
int plugin_isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                 void** request);
int plugin_irecv(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                 void** phandles, void** request);
int plugin_iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles, void** request);
int plugin_test(void* request, int* done, int* sizes);
int plugin_close_send(void* send_comm);
int plugin_close_recv(void* recv_comm);
int plugin_close_listen(void* listen_comm);

// v10 has no per-communicator context: one for the process, made by its init, kept until the
// library is unloaded.
NetContext* v10_context();
int plugin_init_v10(abi::DebugLogger log);

}  // namespace lowcomm::nccl_net
