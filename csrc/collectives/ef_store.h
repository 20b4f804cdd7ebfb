#pragma once
// ErrorFeedbackStore: the residuals of error feedback, kept across all-reduce calls under a
// user key (AllReduceOptions::error_feedback_key).
//
// Per key: the sender residual covers the whole tensor (n fp32 values: each rank quantizes
// every element once, its own chunk included) and does not depend on how the tensor is cut
// into owner chunks; the owner residual covers this rank's owner chunk [owner_begin,
// owner_begin + owner.size()) of the sum's re-quantization. A call whose element count differs
// from the key's is an error (a different tensor under the same key is a caller bug, and
// silently resetting would hide it); an owner range that changed (another codec's block size)
// restarts the owner residual at zero.
//
// Serialised form (save/restore): "LCEF", u32 version 1, u64 entries, then per entry: u32 key
// length, key bytes, u64 n, u64 owner_begin, u64 owner_count, n fp32 sender values (0 or n:
// u8 flag first), owner_count fp32 values; finally u64 FNV-1a 64 of everything before it.
// Little-endian; fp32 as their IEEE bits.
//
// Thread safety: none; the communicator calls it from its executor thread only.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lowcomm/status.h"

namespace lowcomm::collectives {

struct ErrorFeedbackEntry {
  uint64_t n = 0;
  std::vector<float> sender;  // empty until first used
  uint64_t owner_begin = 0;
  std::vector<float> owner;  // empty until first used
};

class ErrorFeedbackStore {
 public:
  // The entry for key, created with n elements of zero sender residual when new.
  Result<ErrorFeedbackEntry*> sender(const std::string& key, uint64_t n);
  // The owner residual for [begin, begin + count) of key's tensor (zeroed when new or moved).
  Result<float*> owner(const std::string& key, uint64_t n, uint64_t begin, uint64_t count);

  // The names kept, sorted.
  std::vector<std::string> names() const;
  // Drops `name` and every name under it ("layer3" drops "layer3" and "layer3/w", not
  // "layer30"); "" drops all. Returns how many were dropped.
  size_t drop(const std::string& name);

  std::vector<uint8_t> save() const;
  Status restore(const uint8_t* bytes, size_t len);  // all-or-nothing

 private:
  Result<ErrorFeedbackEntry*> entry(const std::string& key, uint64_t n);
  std::map<std::string, ErrorFeedbackEntry> entries_;
};

}  // namespace lowcomm::collectives
