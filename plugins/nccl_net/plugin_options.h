#pragma once
// PluginOptions: everything the plugin takes from the environment, read once per process when
// the first communicator initialises, validated as a whole (an error names the variable), and
// logged through NCCL's logger at INFO so NCCL_DEBUG=INFO shows what is in force.
//
//   LOWCOMM_SECRET / LOWCOMM_SECRET_FILE   the shared secret streams authenticate with (HMAC;
//                                          never sent). One is required: NCCL exchanges the
//                                          connection handles itself and cannot carry it. The
//                                          file must not be readable by group or others.
//   LOWCOMM_STREAMS, LOWCOMM_SOCKET_BUFFER, LOWCOMM_UNEXPECTED_LIMIT, LOWCOMM_WAN (its default
//                                          section; per-rank rules need ranks, which a net
//                                          plugin does not have), LOWCOMM_SOCKET_IFNAME
//   LOWCOMM_HANDSHAKE_TIMEOUT_S            a half-open connection is dropped after this (10)
//   LOWCOMM_NCCL_COMPRESS                  off | lz4 | zstd[:level] | auto (lossless;
//                                          auto: zstd:1 while it saves time on the link)
//   LOWCOMM_NCCL_SHUFFLE                   0 | 2 | 4: byte-plane shuffle before compressing
//   LOWCOMM_NCCL_SPEED_MBPS, LOWCOMM_NCCL_LATENCY_US   what getProperties reports
//   LOWCOMM_NCCL_EAGER_BYTES               bytes a connection sends ahead of posted receives

#include <string>

#include "lossless.h"
#include "lowcomm/status.h"
#include "transport/peer_config.h"
#include "transport/socket_address.h"

namespace lowcomm::nccl_net {

struct PluginOptions {
  transport::PeerConfig peer;               // secret, streams, buffers, the emulated link
  std::string secret_source;                // "LOWCOMM_SECRET" or "LOWCOMM_SECRET_FILE=<path>"
  transport::SocketAddress listen_address;  // port 0
  LosslessConfig lossless;     // LOWCOMM_NCCL_COMPRESS (auto: zstd:1) and LOWCOMM_NCCL_SHUFFLE
  bool compress_auto = false;  // only while it saves wall time (compress_policy.h)
  // Bytes a send comm may have on the way ahead of the receives NCCL has posted
  // (LOWCOMM_NCCL_EAGER_BYTES; default twice the link's bandwidth-delay product, at least
  // 16 MiB): the receiver holds them until their receives come.
  uint64_t eager_bytes = 16u << 20;
  int speed_mbps = 0;       // reported to NCCL's tuner
  float latency_us = 0.0f;  // reported to NCCL's tuner (one-way)
  std::string device_name;  // "lowcomm-<address>", the topology key

  static Result<PluginOptions> from_env();
  // One line per option, for the INFO log.
  std::string describe() const;
};

}  // namespace lowcomm::nccl_net
