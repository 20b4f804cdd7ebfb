#pragma once
// PeerConfig: what both ends of a peer connection need to agree on or know locally.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "transport/wan_link.h"

namespace lowcomm::transport {

struct LinkClocks;  // pacer.h

struct PeerConfig {
  int local_rank = 0;
  std::string secret;  // shared communicator secret; never sent; must be non-empty
  int streams = 4;     // TCP streams per peer (connect side decides; LOWCOMM_STREAMS)
  // true: stripe over as many of the streams as the path needs (path_model.h); false: over all
  // of them (set when the user chose the stream count).
  bool adapt_streams = true;
  double path_rate_bps = 10e9;  // the rate adapt_streams sizes the stripe for
  // Requested SO_SNDBUF/SO_RCVBUF per stream (LOWCOMM_SOCKET_BUFFER); 0: the kernel's autotuning.
  int socket_buffer_bytes = 32 << 20;
  uint32_t chunk_bytes = 512 << 10;  // striping unit; also the pacing unit
  WanLink wan;  // the emulated link to the peer: this side's sends, and (site model) receives
  // Site model: the rank's uplink and downlink, shared by every peer created with this config
  // (they must share one engine thread); its creator sets the downlink's rate. Null: the peer
  // has a site of its own.
  std::shared_ptr<LinkClocks> site;
  // Seal every stream with AES-256-GCM (LOWCOMM_ENCRYPT=1; payload_guard.h). Both ends of a
  // connection must agree or the handshake fails naming the mismatch. Off: payloads still carry
  // an XXH3-128 integrity check.
  bool seal = false;
  double handshake_timeout_s = 10.0;  // a half-open or silent connection is dropped after this
  // Buffered messages nobody has posted a receive for yet, per peer (LOWCOMM_UNEXPECTED_LIMIT):
  // eager sends to a receiver that lags behind; beyond it the peer fails with a clear error.
  uint64_t max_unexpected_bytes = 1ull << 30;
  // The least silence after which a peer that an operation waits on is failed as frozen or cut
  // off (peer_core.h, "Liveness"); the timeout in use grows with the measured round trip. 0:
  // off (a closed connection is still noticed at once).
  std::chrono::milliseconds failure_timeout{0};

  // streams from LOWCOMM_STREAMS (which also turns adapt_streams off), socket_buffer_bytes from
  // LOWCOMM_SOCKET_BUFFER (bytes, K/M/G suffixes of 1024, 0 = kernel autotuning),
  // max_unexpected_bytes from LOWCOMM_UNEXPECTED_LIMIT, seal from LOWCOMM_ENCRYPT (0 or 1) and
  // wan from LOWCOMM_WAN; other fields
  // default. The error names the bad variable.
  static Result<PeerConfig> from_env(int local_rank, std::string secret);
};

inline constexpr int kMaxStreams = 64;

// "33554432", "32M", "512K", "0": a byte count (suffixes are powers of 1024), at most `max`.
Result<uint64_t> parse_byte_size(std::string_view text, uint64_t max);
// A socket buffer size: parse_byte_size up to 1 GiB.
Result<int> parse_buffer_bytes(std::string_view text);

}  // namespace lowcomm::transport
