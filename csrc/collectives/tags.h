#pragma once
// Transport tags of the communicator's messages. The transport matches the k-th send on a tag
// with the k-th receive on it, and every rank runs its collectives in the same order, so a
// fixed small set of tags suffices (tags carrying sequence numbers would grow the transport's
// per-tag tables forever). The operation descriptor sent first on kDescriptor checks that the
// k-th messages really belong to the same operation.

#include <cstdint>

namespace lowcomm::collectives::tags {

inline constexpr uint64_t kBootstrap = 1;   // init: hello to the root, the address table back
inline constexpr uint64_t kControl = 2;     // one message per peer and lifetime: abort or goodbye
inline constexpr uint64_t kDescriptor = 3;  // collectives' descriptors
inline constexpr uint64_t kReduce = 4;      // contributions to an owner chunk
inline constexpr uint64_t kGather = 5;      // owners' results, all-gather blocks, broadcast relay
inline constexpr uint64_t kScatter = 6;     // broadcast: root to each relay

// Point-to-point: user tag t (< 2^60) uses these two transport tags.
inline constexpr uint64_t kMaxUserTag = (uint64_t{1} << 60) - 1;
inline uint64_t p2p_descriptor(uint64_t user_tag) { return (uint64_t{1} << 62) | (user_tag << 1); }
inline uint64_t p2p_data(uint64_t user_tag) { return (uint64_t{1} << 62) | (user_tag << 1) | 1; }

}  // namespace lowcomm::collectives::tags
