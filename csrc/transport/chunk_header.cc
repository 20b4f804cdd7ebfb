#include "transport/chunk_header.h"

#include <cstring>

#include "core/fnv1a.h"
#include "core/little_endian.h"

namespace lowcomm::transport {

void write_chunk_header(const ChunkHeader& h, uint8_t out[kChunkHeaderBytes]) {
  store_le32(out, kChunkMagic);
  store_le32(out + 4, h.chunk_len);
  store_le64(out + 8, h.tag);
  store_le64(out + 16, h.seq);
  store_le64(out + 24, h.msg_len);
  store_le64(out + 32, h.offset);
  store_le32(out + 40, h.flags);
  store_le32(out + 44, fnv1a32(out, 44));
  std::memset(out + kChunkCheckOffset, 0, kChunkCheckBytes);
}

void write_control_frame(uint64_t kind, uint64_t arg, uint8_t out[kChunkHeaderBytes]) {
  write_chunk_header({0, kind, arg, 0, 0, kChunkFlagControl}, out);
}

Result<ChunkHeader> parse_chunk_header(const uint8_t in[kChunkHeaderBytes],
                                       const std::string& who) {
  if (load_le32(in) != kChunkMagic)
    return corrupt_data(who + ": bad chunk magic (stream out of sync or not lowcomm)");
  if (load_le32(in + 44) != fnv1a32(in, 44))
    return corrupt_data(who + ": chunk header checksum mismatch");
  ChunkHeader h;
  h.flags = load_le32(in + 40);
  if ((h.flags & ~(kChunkFlagSealed | kChunkFlagControl)) != 0 ||
      h.flags == (kChunkFlagSealed | kChunkFlagControl))
    return corrupt_data(who + ": chunk header has unknown flags " + std::to_string(h.flags));
  h.chunk_len = load_le32(in + 4);
  h.tag = load_le64(in + 8);
  h.seq = load_le64(in + 16);
  h.msg_len = load_le64(in + 24);
  h.offset = load_le64(in + 32);
  if (h.offset > h.msg_len || h.chunk_len > h.msg_len - h.offset) {
    return corrupt_data(who + ": chunk [" + std::to_string(h.offset) + ", +" +
                        std::to_string(h.chunk_len) + ") outside its message of " +
                        std::to_string(h.msg_len) + " bytes (tag " + std::to_string(h.tag) + ")");
  }
  if ((h.flags & kChunkFlagControl) &&
      (h.chunk_len != 0 || h.msg_len != 0 || (h.tag < kControlAck || h.tag > kControlPong)))
    return corrupt_data(who + ": malformed control frame (kind " + std::to_string(h.tag) + ", " +
                        std::to_string(h.chunk_len) + " payload bytes)");
  return h;
}

}  // namespace lowcomm::transport
