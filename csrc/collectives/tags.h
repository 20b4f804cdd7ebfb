#pragma once
// Transport tags of the communicator's messages. The transport matches the k-th send on a tag
// with the k-th receive on it, and every rank runs its collectives in the same order, so a
// small set of tags suffices (tags carrying sequence numbers would grow the transport's per-tag
// tables forever). The operation descriptor sent first on kDescriptor checks that the k-th
// messages really belong to the same operation.
//
// Collective payloads travel on payload(channel, shape): the channel below plus a 16-bit hash
// of the operation's shape (its descriptor less the sequence number). Payload is sent and
// received before the descriptors are checked (op_run.h), and this keeps a mismatched peer's
// payload away from our receives: it waits, unclaimed, on another tag until the descriptor
// check fails the operation, instead of failing the connection with a length mismatch before
// its descriptor is read, or landing in a user buffer. Per-tag tables stay bounded: at most
// 3 * 2^16 payload tags, and a program uses one per channel and distinct shape.

#include <cstdint>

#include "rendezvous/bootstrap.h"
#include "topology/rtt_matrix.h"

namespace lowcomm::collectives::tags {

inline constexpr uint64_t kBootstrap = rendezvous::kBootstrapTag;  // init (rendezvous/bootstrap.h)
inline constexpr uint64_t kControl = 2;     // one message per peer and lifetime: abort or goodbye
inline constexpr uint64_t kDescriptor = 3;  // collectives' descriptors
// Init, where the sites are measured (topology/rtt_matrix.h): each rank's row of round-trip
// times. (7 and 8 were the pings and echoes of the probe before the kernel's figures replaced
// it.)
inline constexpr uint64_t kRttRow = topology::kRttRowTag;
// Init, between ranks of one site: each one's UCX worker address, or nothing
// (transport/ucx_transport.h).
inline constexpr uint64_t kUcxAddress = 10;
// Payload channels (only inside payload()).
inline constexpr uint64_t kReduce = 4;   // contributions to an owner chunk
inline constexpr uint64_t kGather = 5;   // owners' results, all-gather blocks, broadcast relay
inline constexpr uint64_t kScatter = 6;  // broadcast: root to each relay

// Bit 61, the shape hash's low 16 bits in bits 4..19, the channel in bits 0..3.
inline uint64_t payload(uint64_t channel, uint64_t shape_hash) {
  return (uint64_t{1} << 61) | ((shape_hash & 0xFFFFu) << 4) | channel;
}

// Whether `tag` is a payload tag, and its 20 bits below bit 61 (what a UCX tag carries).
inline bool is_payload(uint64_t tag) {
  return (tag >> 20) == (uint64_t{1} << 41);
}
inline uint64_t payload_bits(uint64_t tag) {
  return tag & 0xFFFFFu;
}

// Point-to-point: user tag t (< 2^60) uses these two transport tags (bit 62; never bit 61).
inline constexpr uint64_t kMaxUserTag = (uint64_t{1} << 60) - 1;
inline uint64_t p2p_descriptor(uint64_t user_tag) {
  return (uint64_t{1} << 62) | (user_tag << 1);
}
inline uint64_t p2p_data(uint64_t user_tag) {
  return (uint64_t{1} << 62) | (user_tag << 1) | 1;
}

}  // namespace lowcomm::collectives::tags
