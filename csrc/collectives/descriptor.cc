#include "collectives/descriptor.h"

#include <cstdio>
#include <cstring>

#include "core/fnv1a.h"
#include "core/little_endian.h"
#include "topology/partition.h"

namespace lowcomm::collectives {
namespace {

constexpr uint32_t kDescriptorMagic = 0x3144434Cu;  // "LCD1"
constexpr uint8_t kMaxAlgorithm = static_cast<uint8_t>(Algorithm::kTwoLevel);

bool valid_dtype_byte(uint8_t v) {
  return v >= 1 && v <= kMaxDType && valid_dtype(static_cast<DType>(v));
}

}  // namespace

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kSend:
      return "send";
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kGather:
      return "gather";
    case OpKind::kScatter:
      return "scatter";
    case OpKind::kAllToAll:
      return "all_to_all";
    case OpKind::kRecv:
      return "recv";
  }
  return "?";
}

std::array<uint8_t, kDescriptorBytes> OpDescriptor::encode() const {
  std::array<uint8_t, kDescriptorBytes> b{};
  uint8_t* p = b.data();
  store_le32(p, kDescriptorMagic);
  p[4] = static_cast<uint8_t>(kind);
  p[5] = static_cast<uint8_t>(dtype);
  p[6] = static_cast<uint8_t>(op);
  // Codec kind 0xFF: uncompressed (distinct from a passthrough spec, which converts dtypes).
  p[7] = codec ? static_cast<uint8_t>(codec->kind) : 0xFF;
  store_le64(p + 8, seq);
  store_le64(p + 16, count);
  store_le32(p + 24, static_cast<uint32_t>(root));
  if (codec) {
    p[28] = static_cast<uint8_t>(codec->bits);
    p[29] = static_cast<uint8_t>(codec->wire_dtype);
    p[30] = static_cast<uint8_t>(codec->grouping);
    p[31] = static_cast<uint8_t>(codec->rounding);
    if (codec->sparse()) {
      // K and C (C up to 65536: wider than the 16 bits a dense block takes); no columns.
      store_le32(p + 40, codec->keep);
      store_le32(p + 44, codec->block);
    } else {
      // A validated block is at most kMaxBlock (4096); other groupings do not use it.
      if (codec->grouping == Grouping::kBlock)
        store_le16(p + 32, static_cast<uint16_t>(codec->block));
      store_le64(p + 40, codec->cols);
    }
  }
  p[34] = static_cast<uint8_t>(algorithm);
  store_le32(p + 36, nranks);
  // The tag word (the header's comment).
  const uint64_t word = kind == OpKind::kSend || kind == OpKind::kRecv ? user_tag
                        : carries_report() ? (agree_hash & 0xffffffffu) << 32 | report
                                           : agree_hash;
  store_le64(p + 48, word);
  // In scale groups: segment_elems is a multiple of the granule (reduce_segment_elems).
  store_le32(p + 56, static_cast<uint32_t>(segment_elems / topology::granule(codec)));
  store_le32(p + 60, fnv1a32(p, 60));
  return b;
}

Result<OpDescriptor> OpDescriptor::decode(const uint8_t* p, const std::string& who) {
  if (load_le32(p) != kDescriptorMagic)
    return corrupt_data(who + ": operation descriptor has a bad magic");
  if (load_le32(p + 60) != fnv1a32(p, 60))
    return corrupt_data(who + ": operation descriptor checksum mismatch");
  if (p[4] < 1 || p[4] > 11 || p[4] == 7 || !valid_dtype_byte(p[5]) || p[6] > kMaxReduceOp ||
      p[34] > kMaxAlgorithm || p[35] != 0)
    return corrupt_data(who + ": operation descriptor has out-of-range fields");
  OpDescriptor d;
  d.kind = static_cast<OpKind>(p[4]);
  d.dtype = static_cast<DType>(p[5]);
  d.op = static_cast<ReduceOp>(p[6]);
  d.seq = load_le64(p + 8);
  d.count = load_le64(p + 16);
  d.root = static_cast<int32_t>(load_le32(p + 24));
  d.nranks = load_le32(p + 36);
  d.algorithm = static_cast<Algorithm>(p[34]);
  if (p[7] != 0xFF) {
    CodecSpec s;
    s.kind = static_cast<CodecKind>(p[7]);
    s.bits = p[28];
    s.wire_dtype = static_cast<DType>(p[29]);
    s.grouping = static_cast<Grouping>(p[30]);
    s.rounding = static_cast<Rounding>(p[31]);
    if (s.sparse()) {
      s.keep = load_le32(p + 40);
      s.block = load_le32(p + 44);
    } else {
      if (s.grouping == Grouping::kBlock) s.block = load_le16(p + 32);
      s.cols = load_le64(p + 40);
    }
    if (p[7] > 4 || !valid_dtype_byte(p[29]) || p[30] > 2 || p[31] > 1 || !validate_spec(s).is_ok())
      return corrupt_data(who + ": operation descriptor carries an invalid codec spec");
    d.codec = s;
  }
  const uint64_t groups = load_le32(p + 56), g = topology::granule(d.codec);
  if (groups > UINT64_MAX / g)
    return corrupt_data(who + ": operation descriptor has out-of-range fields");
  d.segment_elems = groups * g;
  // The tag word, by kind (carries_report() needs the codec and algorithm, read above).
  const uint64_t word = load_le64(p + 48);
  if (d.kind == OpKind::kSend || d.kind == OpKind::kRecv) {
    d.user_tag = word;
  } else if (d.carries_report()) {
    d.agree_hash = word >> 32;
    d.report = static_cast<uint32_t>(word);
  } else {
    d.agree_hash = word;
  }
  return d;
}

std::string OpDescriptor::to_string() const {
  std::string s = std::string(op_kind_name(kind)) + " #" + std::to_string(seq) + " (count " +
                  std::to_string(count) + ", " + dtype_name(dtype);
  const bool reduces =
      kind == OpKind::kAllReduce || kind == OpKind::kReduceScatter || kind == OpKind::kReduce;
  if (reduces) s += std::string(", ") + reduce_op_name(op);
  if (reduces) s += ", codec " + (codec ? lowcomm::to_string(*codec) : "uncompressed");
  if (algorithm == Algorithm::kOneHop) s += ", one hop";
  if (algorithm == Algorithm::kTwoLevel) {
    // An all-reduce's low half is the sender's report, not part of the operation.
    char h[24];
    std::snprintf(h, sizeof(h), carries_report() ? "%08llx" : "%016llx",
                  static_cast<unsigned long long>(agree_hash));
    s += std::string(", two-level, sites ") + h;
  }
  const bool sparse = codec && codec->sparse();
  if (carries_report() && (algorithm == Algorithm::kDefault || sparse) && agree_hash != 0) {
    char h[24];
    std::snprintf(h, sizeof(h), "%08llx", static_cast<unsigned long long>(agree_hash));
    s += std::string(sparse ? ", positions " : ", shares ") + h;
  }
  if (kind == OpKind::kBroadcast || kind == OpKind::kReduce || kind == OpKind::kGather ||
      kind == OpKind::kScatter)
    s += ", root " + std::to_string(root);
  if (kind == OpKind::kSend)
    s += ", from rank " + std::to_string(root) + ", tag " + std::to_string(user_tag);
  if (kind == OpKind::kRecv)
    s += (root < 0 ? std::string(", from any rank") : ", from rank " + std::to_string(root)) +
         ", tag " + std::to_string(user_tag);
  s += ", " + std::to_string(nranks) + " ranks)";
  return s;
}

OpDescriptor OpDescriptor::agreed() const {
  OpDescriptor d = *this;
  d.report = 0;
  d.auto_schedule = false;
  d.positions = 0;
  return d;
}

bool same_operation(const OpDescriptor& a, const OpDescriptor& b) {
  return a.agreed().encode() == b.agreed().encode();
}

OpDescriptor p2p_descriptor(OpKind kind, uint64_t count, DType dtype, int32_t root,
                            uint64_t user_tag) {
  OpDescriptor d;
  d.kind = kind;
  d.count = count;
  d.dtype = dtype;
  d.root = root;
  d.user_tag = user_tag;
  return d;
}

uint32_t positions_hash(uint64_t seed, std::optional<uint64_t> step) {
  uint8_t key[17] = {};
  std::memcpy(key, &seed, 8);
  key[8] = step ? 1 : 0;
  if (step) std::memcpy(key + 9, &*step, 8);
  return fnv1a32(key, sizeof(key)) | 1u;
}

void stamp_agreement(OpDescriptor& d, uint64_t sites_hash, uint32_t shares_hash, uint32_t report) {
  if (d.kind == OpKind::kSend || d.kind == OpKind::kRecv) return;
  const bool sparse = d.codec && d.codec->sparse();
  if (!d.carries_report()) {
    d.agree_hash = d.algorithm == Algorithm::kTwoLevel ? sites_hash : 0;
    return;
  }
  d.report = report;
  if (sparse)
    d.agree_hash = d.positions;  // randk; 0 for top-k
  else if (d.algorithm == Algorithm::kTwoLevel)
    d.agree_hash = (sites_hash ^ (sites_hash >> 32)) & 0xffffffffu;
  else
    d.agree_hash = shares_hash;
}

}  // namespace lowcomm::collectives
