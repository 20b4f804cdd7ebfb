#include "membership/message.h"

#include <cstring>

#include "core/little_endian.h"

namespace lowcomm::membership {
namespace {

using lowcomm::load_le16;
using lowcomm::load_le32;
using lowcomm::load_le64;

// One body layout for every type (unused fields are zero or empty): a handful of bytes more on
// a heartbeat, one decoder to check.
class Writer {
 public:
  // Room for a typical message up front: fewer reallocations (and GCC 12's -Warray-bounds no
  // longer misreads the growth of the empty vector).
  Writer() { b_.reserve(256); }
  void u32(uint32_t v) {
    size_t o = grow(4);
    lowcomm::store_le32(b_.data() + o, v);
  }
  void u64(uint64_t v) {
    size_t o = grow(8);
    lowcomm::store_le64(b_.data() + o, v);
  }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    size_t o = grow(s.size());
    if (!s.empty()) std::memcpy(b_.data() + o, s.data(), s.size());
  }
  std::vector<uint8_t>& bytes() { return b_; }

 private:
  size_t grow(size_t n) {
    size_t o = b_.size();
    b_.resize(o + n);
    return o;
  }
  std::vector<uint8_t> b_;
};

class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool u32(uint32_t& v) {
    if (n_ - o_ < 4) return false;
    v = load_le32(p_ + o_);
    o_ += 4;
    return true;
  }
  bool u64(uint64_t& v) {
    if (n_ - o_ < 8) return false;
    v = load_le64(p_ + o_);
    o_ += 8;
    return true;
  }
  bool str(std::string& s) {
    uint32_t len = 0;
    if (!u32(len) || n_ - o_ < len) return false;
    s.assign(reinterpret_cast<const char*>(p_ + o_), len);
    o_ += len;
    return true;
  }
  // A count of items of at least `min_bytes` each that the rest of the message can hold.
  bool count(uint32_t& c, size_t min_bytes) { return u32(c) && c <= (n_ - o_) / min_bytes; }
  bool at_end() const { return o_ == n_; }
  void skip(size_t n) { o_ += n; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t o_ = 0;
};

}  // namespace

const char* msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::kPing:
      return "ping";
    case MsgType::kPong:
      return "pong";
    case MsgType::kChange:
      return "change";
    case MsgType::kReport:
      return "report";
    case MsgType::kNewView:
      return "new-view";
    case MsgType::kDone:
      return "done";
    case MsgType::kCommit:
      return "commit";
    case MsgType::kNoQuorum:
      return "no-quorum";
    case MsgType::kLeave:
      return "leave";
    case MsgType::kJoin:
      return "join";
    case MsgType::kFetch:
      return "fetch";
    case MsgType::kStart:
      return "start";
    case MsgType::kAdmit:
      return "admit";
    case MsgType::kReady:
      return "ready";
  }
  return "?";
}

std::vector<uint8_t> encode(const Message& m) {
  Writer w;
  w.u32(kMagic);
  w.u32(kVersion | (static_cast<uint32_t>(m.type) << 16));
  w.u32(m.from);
  w.u32(0);
  w.u64(m.view);
  w.u64(m.seq);
  w.u64(m.time_ns);
  w.u64(m.committed);
  w.u64(m.staged);
  w.u64(m.hash);
  w.u64(m.length);
  w.u64(m.tag);
  w.u32(m.next_id);
  w.u32(static_cast<uint32_t>(m.failed.size()));
  for (uint32_t id : m.failed) w.u32(id);
  w.str(m.text);
  w.str(m.data_root);
  w.u32(static_cast<uint32_t>(m.members.size()));
  for (const auto& a : m.members) {
    w.u32(a.id);
    w.str(a.address);
  }
  w.u32(static_cast<uint32_t>(m.hashes.size()));
  for (const auto& [id, h] : m.hashes) {
    w.u32(id);
    w.u64(h);
  }
  w.u32(static_cast<uint32_t>(m.holders.size()));
  for (uint32_t id : m.holders) w.u32(id);
  return std::move(w.bytes());
}

Result<Message> decode(const uint8_t* p, size_t n, const std::string& who) {
  auto bad = [&](const char* what) {
    return corrupt_data("membership message from " + who + ": " + what + " (" + std::to_string(n) +
                        " bytes)");
  };
  if (n < kHeaderBytes || n > kMaxMessageBytes) return bad("bad length");
  if (load_le32(p) != kMagic) return bad("bad magic");
  if (load_le16(p + 4) != kVersion) return bad("unknown version");
  uint16_t type = load_le16(p + 6);
  if (type < static_cast<uint16_t>(MsgType::kPing) || type > static_cast<uint16_t>(MsgType::kReady))
    return bad("unknown type");
  Message m;
  m.type = static_cast<MsgType>(type);
  m.from = load_le32(p + 8);
  m.view = load_le64(p + 16);
  m.seq = load_le64(p + 24);
  Reader r(p, n);
  r.skip(kHeaderBytes);
  uint32_t c = 0;
  if (!r.u64(m.time_ns) || !r.u64(m.committed) || !r.u64(m.staged) || !r.u64(m.hash) ||
      !r.u64(m.length) || !r.u64(m.tag) || !r.u32(m.next_id) || !r.count(c, 4))
    return bad("truncated body");
  if (m.type == MsgType::kFetch && !is_state_tag(m.tag)) return bad("fetch outside the state tags");
  m.failed.resize(c);
  for (auto& id : m.failed) (void)r.u32(id);
  if (!r.str(m.text) || !r.str(m.data_root) || !r.count(c, 8)) return bad("truncated body");
  m.members.resize(c);
  for (auto& a : m.members)
    if (!r.u32(a.id) || !r.str(a.address)) return bad("truncated member list");
  if (!r.count(c, 12)) return bad("truncated body");
  m.hashes.resize(c);
  for (auto& [id, h] : m.hashes) (void)(r.u32(id) && r.u64(h));
  if (!r.count(c, 4)) return bad("truncated body");
  m.holders.resize(c);
  for (auto& id : m.holders) (void)r.u32(id);
  if (!r.at_end()) return bad("trailing bytes");
  return m;
}

}  // namespace lowcomm::membership
