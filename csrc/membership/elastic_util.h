#pragma once
// Small helpers the elastic communicator's files share: member id lists in messages, and a
// duration from the environment.

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

namespace lowcomm::membership {

// "{0,2,5}"
inline std::string id_list(const std::vector<uint32_t>& ids) {
  std::string s = "{";
  for (uint32_t id : ids) s += (s.size() > 1 ? "," : "") + std::to_string(id);
  return s + "}";
}
inline std::string id_list(const std::set<uint32_t>& ids) {
  return id_list(std::vector<uint32_t>(ids.begin(), ids.end()));
}

inline int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace lowcomm::membership

namespace lowcomm {
using membership::id_list;
using membership::steady_ns;
}  // namespace lowcomm
