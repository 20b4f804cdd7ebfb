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
//   36 nranks u32 | 40 cols u64 | 48 tag word u64 | 56 segment u32 | 60 FNV-1a 32 of [0, 60)
// The tag word holds, by kind: a send's or receive's user_tag; an operation that carries a
// report (carries_report()), agree_hash in its high 32 bits and the report in the low 32;
// any other, agree_hash. Only encode() and decode() pack and unpack it: in memory each field
// has one meaning whatever the kind (0 where it does not apply). The block takes 16
// bits (a valid block is at most 4096) and the segment is counted in the codec's scale groups
// (granule(): the block, the column count, or one element), so 32 bits hold any segment
// reduce_segment_elems makes (the layout's history: docs/collectives.md).

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "lowcomm/codec.h"
#include "lowcomm/communicator.h"
#include "lowcomm/status.h"
#include "topology/schedule.h"

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

// Which schedule an operation runs, where its kind has more than one (topology/schedule.h).
using topology::Algorithm;

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
  // send/recv: the user's tag (below tags::kMaxUserTag); 0 otherwise. Set by p2p_descriptor.
  uint64_t user_tag = 0;
  // What else the ranks must agree on, set when the operation runs (stamp_agreement): a
  // two-level all-gather, broadcast or reduce-scatter, its site map's hash; a two-level
  // all-reduce, the site map's hash folded to 32 bits; a flat all-reduce, its owner shares'
  // hash (shares.h; 0: equal); a randk all-reduce, its positions' hash (positions_hash); 0
  // otherwise. 32 bits where the operation carries a report.
  uint64_t agree_hash = 0;
  // The sender's report (op_report.h: its rate, its last call's time) where carries_report():
  // the one field a rank's peers need not agree with (agreed() clears it). Set by
  // stamp_agreement.
  uint32_t report = 0;
  Algorithm algorithm = Algorithm::kDefault;
  // The owner reduction: elements per pipeline segment (reduce_segment_elems: a multiple of
  // granule(codec), at most kMaxSegmentGroups groups); 0 otherwise.
  uint64_t segment_elems = 0;

  std::array<uint8_t, kDescriptorBytes> encode() const;
  // Local, never on the wire: the caller left the schedule to the communicator, which picks
  // flat or two levels (a randk codec: owner or gather-all) when the operation runs
  // (schedule_picker.h).
  bool auto_schedule = false;
  // Local, never on the wire: a randk all-reduce's positions' hash (positions_hash), which
  // stamp_agreement makes its agree_hash.
  uint32_t positions = 0;

  // Whether the low half of the tag is the sender's report (a flat or two-level all-reduce, or
  // a sparse one, whose schedule the picker may choose too).
  bool carries_report() const {
    return kind == OpKind::kAllReduce &&
           (algorithm == Algorithm::kDefault || algorithm == Algorithm::kTwoLevel ||
            (codec && codec->sparse()));
  }
  // This descriptor less what only the sender decides (the rate): what peers must agree on.
  OpDescriptor agreed() const;
  // kCorruptData naming `who` when the bytes are not a descriptor.
  static Result<OpDescriptor> decode(const uint8_t* bytes, const std::string& who);
  // "all_reduce #7 (count 1000, fp32, sum, codec q4)"
  std::string to_string() const;
};

bool same_operation(const OpDescriptor& a, const OpDescriptor& b);

// A send's (kSend: root is the sender) or a receive's (kRecv: root is the source, -1 any)
// descriptor.
OpDescriptor p2p_descriptor(OpKind kind, uint64_t count, DType dtype, int32_t root,
                            uint64_t user_tag);

// The hash a randk all-reduce's positions follow from (its seed, and its step where given):
// ranks that would keep different positions fail the descriptor check instead of summing
// values of different elements. Never 0.
uint32_t positions_hash(uint64_t seed, std::optional<uint64_t> step);

// What the ranks agree on besides the operation itself, and this rank's report, stamped when
// the operation runs (its schedule is chosen then): the one writer of agree_hash and report
// (besides decode). `sites_hash`: SitePlan::hash; `shares_hash`: the owner shares' plan hash in
// use (0: equal); `report`: OpReport::pack() of this rank.
void stamp_agreement(OpDescriptor& d, uint64_t sites_hash, uint32_t shares_hash, uint32_t report);

}  // namespace lowcomm::collectives
