#include "collectives/ef_store.h"

#include <cstring>

#include "core/fnv1a.h"
#include "core/little_endian.h"

namespace lowcomm::collectives {
namespace {

using lowcomm::load_le32;
using lowcomm::load_le64;
using lowcomm::store_le32;
using lowcomm::store_le64;

constexpr uint32_t kStoreMagic = 0x4645434Cu;  // "LCEF"
constexpr uint32_t kStoreVersion = 1;

void put32(std::vector<uint8_t>& out, uint32_t v) {
  size_t at = out.size();
  out.resize(at + 4);
  store_le32(out.data() + at, v);
}
void put64(std::vector<uint8_t>& out, uint64_t v) {
  size_t at = out.size();
  out.resize(at + 8);
  store_le64(out.data() + at, v);
}
void put_floats(std::vector<uint8_t>& out, const std::vector<float>& v) {
  for (float f : v) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    put32(out, bits);
  }
}

// Bounds-checked reader: every length read is checked against what is left before use.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), left_(n) {}
  bool u32(uint32_t& v) { return take(4) ? (v = load_le32(p_ - 4), true) : false; }
  bool u64(uint64_t& v) { return take(8) ? (v = load_le64(p_ - 8), true) : false; }
  bool bytes(std::string& s, uint64_t n) {
    if (!take(n)) return false;
    s.assign(reinterpret_cast<const char*>(p_ - n), n);
    return true;
  }
  bool floats(std::vector<float>& v, uint64_t n) {
    if (n > left_ / 4) return false;
    v.resize(n);
    for (auto& f : v) {
      uint32_t bits = 0;
      u32(bits);
      std::memcpy(&f, &bits, 4);
    }
    return true;
  }
  size_t left() const { return left_; }

 private:
  bool take(uint64_t n) {
    if (n > left_) return false;
    p_ += n;
    left_ -= n;
    return true;
  }
  const uint8_t* p_;
  size_t left_;
};

}  // namespace

Result<ErrorFeedbackEntry*> ErrorFeedbackStore::entry(const std::string& key, uint64_t n) {
  auto [it, inserted] = entries_.try_emplace(key);
  if (inserted) it->second.n = n;
  if (it->second.n != n)
    return invalid_argument("error feedback key '" + key + "' holds state for " +
                            std::to_string(it->second.n) + " elements, this call has " +
                            std::to_string(n) + " (use one key per tensor)");
  return &it->second;
}

Result<ErrorFeedbackEntry*> ErrorFeedbackStore::sender(const std::string& key, uint64_t n) {
  auto e = entry(key, n);
  if (!e) return e;
  ErrorFeedbackEntry& en = **e;
  if (en.device) {
    en.sender.resize(n);
    LOWCOMM_CHECK(en.device->to_host(en.sender.data()));
    en.device.reset();
  }
  if (en.sender.size() != n) en.sender.assign(n, 0.0f);
  return e;
}

Status ErrorFeedbackStore::copy_device_residuals() {
  for (auto& [key, e] : entries_) {
    if (!e.device) continue;
    e.sender.resize(e.n);
    LOWCOMM_CHECK(e.device->to_host(e.sender.data()));
  }
  return Status::ok();
}

void ErrorFeedbackStore::drop_host_copies() {
  for (auto& [key, e] : entries_) {
    if (!e.device) continue;
    e.sender.clear();
    e.sender.shrink_to_fit();
  }
}

Result<float*> ErrorFeedbackStore::owner(const std::string& key, uint64_t n, uint64_t begin,
                                         uint64_t count) {
  auto e = entry(key, n);
  if (!e) return e.status();
  ErrorFeedbackEntry& en = **e;
  if (en.owner_begin != begin || en.owner.size() != count) {
    en.owner_begin = begin;
    en.owner.assign(count, 0.0f);
  }
  return en.owner.data();
}

std::vector<uint8_t> ErrorFeedbackStore::save() const {
  std::vector<uint8_t> out;
  put32(out, kStoreMagic);
  put32(out, kStoreVersion);
  put64(out, entries_.size());
  for (const auto& [key, e] : entries_) {
    put32(out, static_cast<uint32_t>(key.size()));
    out.insert(out.end(), key.begin(), key.end());
    put64(out, e.n);
    put64(out, e.owner_begin);
    put64(out, e.owner.size());
    out.push_back(e.sender.empty() ? 0 : 1);
    put_floats(out, e.sender);
    put_floats(out, e.owner);
  }
  put64(out, fnv1a64(out.data(), out.size()));
  return out;
}

Status ErrorFeedbackStore::restore(const uint8_t* bytes, size_t len) {
  auto bad = [](const std::string& why) {
    return invalid_argument("error feedback state: " + why);
  };
  if (len < 24) return bad("too short");
  if (load_le64(bytes + len - 8) != fnv1a64(bytes, len - 8)) return bad("checksum mismatch");
  Reader r(bytes, len - 8);
  uint32_t magic = 0, version = 0;
  uint64_t count = 0;
  if (!r.u32(magic) || magic != kStoreMagic) return bad("bad magic");
  if (!r.u32(version) || version != kStoreVersion) return bad("unknown version");
  if (!r.u64(count)) return bad("truncated");
  std::map<std::string, ErrorFeedbackEntry> loaded;
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t klen = 0;
    std::string key;
    ErrorFeedbackEntry e;
    uint64_t owner_count = 0;
    if (!r.u32(klen) || !r.bytes(key, klen) || !r.u64(e.n) || !r.u64(e.owner_begin) ||
        !r.u64(owner_count))
      return bad("truncated entry");
    std::string flag;
    if (!r.bytes(flag, 1)) return bad("truncated entry");
    if (flag[0] == 1 && !r.floats(e.sender, e.n))
      return bad("truncated sender residual of '" + key + "'");
    if (!r.floats(e.owner, owner_count)) return bad("truncated owner residual of '" + key + "'");
    if (e.owner_begin > e.n || owner_count > e.n - e.owner_begin)
      return bad("owner range outside the tensor");
    loaded[key] = std::move(e);
  }
  if (r.left() != 0) return bad("trailing bytes");
  entries_ = std::move(loaded);
  return Status::ok();
}

std::vector<std::string> ErrorFeedbackStore::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [k, e] : entries_) out.push_back(k);
  return out;
}

size_t ErrorFeedbackStore::drop(const std::string& name) {
  size_t n = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    const std::string& k = it->first;
    const bool under =
        name.empty() || k == name ||
        (k.size() > name.size() && k.compare(0, name.size(), name) == 0 && k[name.size()] == '/');
    if (under) {
      it = entries_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

}  // namespace lowcomm::collectives
