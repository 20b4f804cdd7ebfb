#pragma once
// The 48-byte header in front of every chunk on a data stream (all fields little-endian):
//
//   off size field
//     0    4 magic        "LCC1"
//     4    4 chunk_len    payload bytes that follow this header
//     8    8 tag          user tag
//    16    8 seq          per-tag message sequence number (k-th isend on this tag -> k-th irecv)
//    24    8 msg_len      total length of the message this chunk belongs to
//    32    8 offset       where the payload goes in the message
//    40    4 reserved     zero
//    44    4 checksum     FNV-1a 32 over bytes [0, 44)
//
// The checksum guards the header against corruption and desynchronisation, not against an
// attacker (streams are authenticated at set-up). parse_chunk_header validates magic,
// checksum, reserved and range (offset + chunk_len <= msg_len) before anything is used.

#include <cstdint>

#include "lowcomm/status.h"

namespace lowcomm::transport {

inline constexpr size_t kChunkHeaderBytes = 48;
inline constexpr uint32_t kChunkMagic = 0x3143434Cu;  // "LCC1"

struct ChunkHeader {
  uint32_t chunk_len = 0;
  uint64_t tag = 0;
  uint64_t seq = 0;
  uint64_t msg_len = 0;
  uint64_t offset = 0;
};

void write_chunk_header(const ChunkHeader& h, uint8_t out[kChunkHeaderBytes]);
// kCorruptData naming the bad field; `who` (the peer and stream) prefixes the message.
Result<ChunkHeader> parse_chunk_header(const uint8_t in[kChunkHeaderBytes], const std::string& who);

}  // namespace lowcomm::transport
