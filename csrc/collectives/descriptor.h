#pragma once
// OpDescriptor: what one rank believes the current operation is. Every collective starts by
// sending its descriptor to every peer and checking theirs before any payload is used; a
// point-to-point send precedes its data with one. Two ranks that disagree (another collective,
// count, dtype, reduction, codec, root, algorithm, pipeline segment, sequence number, tag) get
// an error naming the peer and both descriptors instead of reading each other's bytes as
// something they are not.
//
// Wire layout (64 bytes, little-endian; docs/collectives.md):
//   0 "LCD1" | 4 kind u8, dtype u8, op u8, codec kind u8 | 8 seq u64 | 16 count u64
//   24 root i32 | 28 codec bits u8, wire dtype u8, grouping u8, rounding u8
//   32 block u16 (block-grouped codecs; else 0) | 34 algorithm u8 | 35 reserved u8 0
//   36 nranks u32 | 40 cols u64 | 48 p2p tag u64 | 56 segment u32 | 60 FNV-1a 32 of [0, 60)
// Each field has one meaning whatever the kind (0 where it does not apply). The algorithm and
// the segment got fields of their own within the fixed 64 bytes: the block takes 16 bits (a
// valid block is at most 4096) and the segment is counted in the codec's scale groups
// (granule(): the block, the column count, or one element), so 32 bits hold any segment
// reduce_segment_elems makes. (Until issue 21 the segment travelled in the tag field, 0 meaning
// one hop, and bytes 32-35 and 56-59 were a u32 block and a reserved 0; descriptors without a
// codec or a segment are unchanged byte for byte.)

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

// Which schedule an operation runs, where its kind has more than one: ranks must agree.
enum class Algorithm : uint8_t {
  kDefault = 0,   // the kind's own schedule (all-reduce, reduce-scatter, reduce: owner reduction)
  kOneHop = 1,    // all-reduce: every contribution to every rank (one_hop_reduce.cc)
  kTwoLevel = 2,  // all-reduce (two_level.cc), all-gather (two_level_all_gather.cc) over sites;
                  // the tag field carries the site map's hash (SitePlan::hash): ranks must agree
};

inline constexpr size_t kDescriptorBytes = 64;
// The most scale groups a pipeline segment may hold: what the descriptor's u32 carries.
inline constexpr uint64_t kMaxSegmentGroups = UINT32_MAX;

struct OpDescriptor {
  OpKind kind = OpKind::kBarrier;
  uint64_t seq = 0;    // collective: the communicator's operation number; p2p: per (pair, tag)
  uint64_t count = 0;  // elements (reduce-scatter: per rank; all-gather: per rank)
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  std::optional<CodecSpec> codec;  // reductions only; unset: uncompressed
  int32_t root = -1;               // broadcast: the root; send: the sending rank
  uint32_t nranks = 0;
  // send/recv: the user's tag (below tags::kMaxUserTag); a two-level all-gather, broadcast or
  // reduce-scatter: the hash of its site map; an all-reduce, flat or two-level: in the high 32
  // bits the hash of its owner shares (shares.h) or of its site map (folded to 32 bits), in
  // the low 32 the sender's report (op_report.h: its rate, its last call's time), the one
  // field a rank's peers need not agree with (agreed() clears it); a sparse all-reduce: the
  // report likewise, and for randk the hash of its positions' (seed, step) in the high half;
  // 0 otherwise
  uint64_t tag = 0;
  Algorithm algorithm = Algorithm::kDefault;
  // The owner reduction: elements per pipeline segment (reduce_segment_elems: a multiple of
  // granule(codec), at most kMaxSegmentGroups groups); 0 otherwise.
  uint64_t segment_elems = 0;

  std::array<uint8_t, kDescriptorBytes> encode() const;
  // Local, never on the wire: the caller left the schedule to the communicator, which picks
  // flat or two levels (a randk codec: owner or gather-all) when the operation runs
  // (schedule_picker.h).
  bool auto_schedule = false;

  // Whether the low half of the tag is the sender's report (a flat or two-level all-reduce, or
  // a sparse one, whose schedule the picker may choose too).
  bool carries_report() const {
    return kind == OpKind::kAllReduce &&
           (algorithm == Algorithm::kDefault || algorithm == Algorithm::kTwoLevel ||
            (codec && codec->sparse()));
  }
  uint32_t report() const { return carries_report() ? static_cast<uint32_t>(tag) : 0; }
  // This descriptor less what only the sender decides (the rate): what peers must agree on.
  OpDescriptor agreed() const;
  // kCorruptData naming `who` when the bytes are not a descriptor.
  static Result<OpDescriptor> decode(const uint8_t* bytes, const std::string& who);
  // "all_reduce #7 (count 1000, fp32, sum, codec q4)"
  std::string to_string() const;
};

bool same_operation(const OpDescriptor& a, const OpDescriptor& b);

}  // namespace lowcomm::collectives
