#include "ef_state.h"

#include <c10/util/Exception.h>

#include "backend.h"

namespace lowcomm::torch_backend {
namespace {

constexpr uint32_t kMagic = 0x4645434Cu;  // "LCEF", little-endian
constexpr uint32_t kVersion = 1;
constexpr size_t kChecksumBytes = 8;
// The call-order keys (LowcommBackend::group_allreduce_options): "ef/order/<slot>/<signature>".
constexpr const char* kCallOrderKeys = "ef/order";

uint64_t load_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void store_le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint64_t fnv1a64(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

struct Entry {
  std::string key;
  size_t begin = 0, end = 0;  // its bytes in the state
};

// Reads every length against what is left before using it.
class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& s) : s_(s), end_(s.size() - kChecksumBytes) {}
  uint64_t u(int bytes) { return load_le(take(static_cast<size_t>(bytes)), bytes); }
  std::string str(uint64_t n) {
    const uint8_t* p = take(n);
    return std::string(reinterpret_cast<const char*>(p), n);
  }
  void floats(uint64_t n) {
    TORCH_CHECK(n <= (end_ - pos_) / 4, "lowcomm: error-feedback state: truncated residual");
    take(n * 4);
  }
  size_t pos() const { return pos_; }
  bool done() const { return pos_ == end_; }

 private:
  const uint8_t* take(uint64_t n) {
    TORCH_CHECK(n <= end_ - pos_, "lowcomm: error-feedback state: truncated");
    const uint8_t* p = s_.data() + pos_;
    pos_ += n;
    return p;
  }
  const std::vector<uint8_t>& s_;
  size_t end_;
  size_t pos_ = 0;
};

std::vector<Entry> parse(const std::vector<uint8_t>& s) {
  TORCH_CHECK(s.size() >= 16 + kChecksumBytes, "lowcomm: error-feedback state: too short");
  const size_t body = s.size() - kChecksumBytes;
  TORCH_CHECK(load_le(s.data() + body, 8) == fnv1a64(s.data(), body),
              "lowcomm: error-feedback state: checksum mismatch");
  Reader r(s);
  TORCH_CHECK(r.u(4) == kMagic, "lowcomm: error-feedback state: bad magic");
  const uint64_t version = r.u(4);
  TORCH_CHECK(version == kVersion, "lowcomm: error-feedback state: version ", version,
              ", this plugin reads version ", kVersion);
  const uint64_t count = r.u(8);
  std::vector<Entry> entries;
  for (uint64_t i = 0; i < count; ++i) {
    Entry e;
    e.begin = r.pos();
    e.key = r.str(r.u(4));
    const uint64_t n = r.u(8);
    r.u(8);  // owner_begin
    const uint64_t owner_count = r.u(8);
    if (r.u(1) == 1) r.floats(n);
    r.floats(owner_count);
    e.end = r.pos();
    entries.push_back(std::move(e));
  }
  TORCH_CHECK(r.done(), "lowcomm: error-feedback state: trailing bytes");
  return entries;
}

}  // namespace

std::vector<std::string> ef_state_keys(const std::vector<uint8_t>& state) {
  std::vector<std::string> keys;
  for (auto& e : parse(state)) keys.push_back(std::move(e.key));
  return keys;
}

std::vector<uint8_t> ef_state_without(const std::vector<uint8_t>& state,
                                      const std::function<bool(const std::string&)>& drop,
                                      size_t* dropped) {
  std::vector<Entry> kept;
  *dropped = 0;
  for (auto& e : parse(state)) {
    if (drop(e.key)) {
      ++*dropped;
    } else {
      kept.push_back(std::move(e));
    }
  }
  std::vector<uint8_t> out;
  store_le(out, kMagic, 4);
  store_le(out, kVersion, 4);
  store_le(out, kept.size(), 8);
  for (const auto& e : kept) out.insert(out.end(), state.begin() + e.begin, state.begin() + e.end);
  store_le(out, fnv1a64(out.data(), out.size()), 8);
  return out;
}

bool ef_key_under(const std::string& key, const std::string& name) {
  if (name.empty() || key == name) return true;
  const std::string prefix = name.back() == '/' ? name : name + "/";
  return key.compare(0, prefix.size(), prefix) == 0;
}

std::vector<uint8_t> LowcommBackend::save_error_feedback() {
  auto r = comm()->save_error_feedback();
  TORCH_CHECK(r.is_ok(), "lowcomm: ", r.status().to_string());
  return *r;
}

void LowcommBackend::restore_error_feedback(const std::vector<uint8_t>& bytes) {
  lowcomm::Status s = comm()->restore_error_feedback(bytes.data(), bytes.size());
  TORCH_CHECK(s.is_ok(), "lowcomm: ", s.to_string());
}

std::vector<std::string> LowcommBackend::error_feedback_keys() {
  return ef_state_keys(save_error_feedback());
}

size_t LowcommBackend::reset_error_feedback(const std::string& name) {
  size_t dropped = 0;
  const std::vector<uint8_t> kept = ef_state_without(
      save_error_feedback(), [&](const std::string& key) { return ef_key_under(key, name); },
      &dropped);
  if (dropped > 0) restore_error_feedback(kept);
  if (ef_key_under(kCallOrderKeys, name)) order_keys_.reset();
  return dropped;
}

}  // namespace lowcomm::torch_backend
