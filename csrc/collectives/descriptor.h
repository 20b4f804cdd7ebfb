#pragma once
// OpDescriptor: what one rank believes the current operation is. Every collective starts by
// sending its descriptor to every peer and checking theirs before any payload is used; a
// point-to-point send precedes its data with one. Two ranks that disagree (another collective,
// count, dtype, reduction, codec, root, sequence number) get an error naming the peer and both
// descriptors instead of reading each other's bytes as something they are not.
//
// Wire layout (64 bytes, little-endian; docs/collectives.md):
//   0 "LCD1" | 4 kind u8, dtype u8, op u8, codec kind u8 | 8 seq u64 | 16 count u64
//   24 root i32 | 28 codec bits u8, wire dtype u8, grouping u8, rounding u8 | 32 block u32
//   36 nranks u32 | 40 cols u64 | 48 tag u64 | 56 reserved u32 0 | 60 FNV-1a 32 of [0, 60)

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "lowcomm/codec.h"
#include "lowcomm/communicator.h"
#include "lowcomm/status.h"

namespace lowcomm::collectives {

enum class OpKind : uint8_t {
  kBarrier = 1,
  kBroadcast = 2,
  kAllGather = 3,
  kReduceScatter = 4,
  kAllReduce = 5,
  kSend = 6,  // a recv expects the sender's kSend descriptor
  kRecv = 7,  // local only (names the operation in errors); never on the wire
  kReduce = 8,
  kGather = 9,
  kScatter = 10,
  kAllToAll = 11,
};
const char* op_kind_name(OpKind kind);

inline constexpr size_t kDescriptorBytes = 64;

struct OpDescriptor {
  OpKind kind = OpKind::kBarrier;
  uint64_t seq = 0;    // collective: the communicator's operation number; p2p: per (pair, tag)
  uint64_t count = 0;  // elements (reduce-scatter: per rank; all-gather: per rank)
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  std::optional<CodecSpec> codec;  // all-reduce only; unset: uncompressed
  int32_t root = -1;               // broadcast: the root; send: the sending rank
  uint32_t nranks = 0;
  uint64_t tag = 0;  // p2p

  std::array<uint8_t, kDescriptorBytes> encode() const;
  // kCorruptData naming `who` when the bytes are not a descriptor.
  static Result<OpDescriptor> decode(const uint8_t* bytes, const std::string& who);
  // "all_reduce #7 (count 1000, fp32, sum, codec q4)"
  std::string to_string() const;
};

bool same_operation(const OpDescriptor& a, const OpDescriptor& b);

}  // namespace lowcomm::collectives
