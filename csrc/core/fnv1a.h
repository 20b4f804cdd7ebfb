#pragma once
// FNV-1a, 32 and 64 bits: the checksum of small fixed-size control records (chunk headers,
// operation descriptors, unique ids) -- catches corruption and confusion, not an attacker (the
// streams are authenticated), and cheap hashes of them. Bulk payload uses XXH3 (frame/frame.h).

#include <cstddef>
#include <cstdint>

namespace lowcomm {

inline uint32_t fnv1a32(const uint8_t* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

inline uint64_t fnv1a64(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace lowcomm
