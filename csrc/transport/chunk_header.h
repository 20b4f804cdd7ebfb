#pragma once
// The 64-byte header in front of every chunk on a data stream (all fields little-endian):
//
//   off size field
//     0    4 magic        "LCC2"
//     4    4 chunk_len    payload bytes that follow this header
//     8    8 tag          user tag
//    16    8 seq          per-tag message sequence number (k-th isend on this tag -> k-th irecv)
//    24    8 msg_len      total length of the message this chunk belongs to
//    32    8 offset       where the payload goes in the message
//    40    4 flags        bit 0: sealed (payload encrypted; check is an AES-256-GCM tag);
//                         bit 1: control frame (below); other bits zero
//    44    4 checksum     FNV-1a 32 over bytes [0, 44)
//    48   16 check        the payload's check (payload_guard.h): XXH3-128 of the payload, or,
//                         sealed, the AES-256-GCM tag over bytes [0, 48) and the payload
//
// The header checksum finds a corrupted or desynchronised header before any field is used; the
// payload check covers every payload byte and is verified before the message completes. Sealed,
// the GCM tag also authenticates the header (bytes [0, 48) are the AEAD's associated data).
// parse_chunk_header validates magic, checksum, flags and range (offset + chunk_len <= msg_len)
// before anything is used.
//
// Control frames: a header with the control flag, chunk_len, msg_len and offset zero, no payload
// and a zero check (on a sealed stream, where only PING and PONG travel, the check is the GCM
// tag over bytes [0, 48): payload_guard.h); `tag` is the kind and `seq` its argument. They
// travel in the direction opposite to the data they speak of, on the same stream:
//   kControlAck   seq = n: the receiver has verified (or given up on) every data chunk it read
//                 on this stream before the n-th; the sender may drop its copies of them.
//   kControlNack  seq = r: the r-th data chunk read on this stream (counting from 0) failed its
//                 check: send it again (as a new chunk, on any stream).
//   kControlPing  seq = the sender's clock (ns): an operation waits on the receiver, which has
//                 been silent; answer at once.
//   kControlPong  seq = the ping's: the answer (the receiver's engine runs), and a round trip.

#include <cstdint>
#include <string>

#include "lowcomm/status.h"

namespace lowcomm::transport {

inline constexpr size_t kChunkHeaderBytes = 64;
inline constexpr size_t kChunkCheckOffset = 48;  // [48, 64): the payload check
inline constexpr size_t kChunkCheckBytes = 16;
inline constexpr uint32_t kChunkMagic = 0x3243434Cu;  // "LCC2"
inline constexpr uint32_t kChunkFlagSealed = 1u;
inline constexpr uint32_t kChunkFlagControl = 2u;
inline constexpr uint64_t kControlAck = 1;
inline constexpr uint64_t kControlNack = 2;
inline constexpr uint64_t kControlPing = 3;
inline constexpr uint64_t kControlPong = 4;

struct ChunkHeader {
  uint32_t chunk_len = 0;
  uint64_t tag = 0;
  uint64_t seq = 0;
  uint64_t msg_len = 0;
  uint64_t offset = 0;
  uint32_t flags = 0;
};

// A control frame's header, check zeroed (whole: nothing follows it).
void write_control_frame(uint64_t kind, uint64_t arg, uint8_t out[kChunkHeaderBytes]);
// Writes bytes [0, 48); the check [48, 64) is the payload guard's to fill (zeroed here).
void write_chunk_header(const ChunkHeader& h, uint8_t out[kChunkHeaderBytes]);
// kCorruptData naming the bad field; `who` (the peer and stream) prefixes the message.
Result<ChunkHeader> parse_chunk_header(const uint8_t in[kChunkHeaderBytes], const std::string& who);

}  // namespace lowcomm::transport
