#pragma once
// PeerConfig: what both ends of a peer connection need to agree on or know locally.

#include <cstdint>
#include <string>

#include "transport/wan_link.h"

namespace lowcomm::transport {

struct PeerConfig {
  int local_rank = 0;
  std::string secret;             // shared communicator secret; never sent; must be non-empty
  int streams = 4;                // TCP streams per peer (connect side decides; LOWCOMM_STREAMS)
  int socket_buffer_bytes = 32 << 20;  // requested SO_SNDBUF/SO_RCVBUF per stream
  uint32_t chunk_bytes = 512 << 10;    // striping unit; also the pacing unit
  WanLink wan;                    // shaping of this side's sends to the peer
  double handshake_timeout_s = 10.0;   // a half-open or silent connection is dropped after this
  uint64_t max_unexpected_bytes = 1ull << 30;  // buffered messages nobody has posted yet

  // streams from LOWCOMM_STREAMS and wan from LOWCOMM_WAN, other fields default. The error
  // names the bad variable.
  static Result<PeerConfig> from_env(int local_rank, std::string secret);
};

inline constexpr int kMaxStreams = 64;

}  // namespace lowcomm::transport
