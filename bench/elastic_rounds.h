#pragma once
// The DiLoCo-style round the elastic benches (elastic_chaos.cc, elastic_partition.cc) run on
// every member: registered state (a parameter vector and the round count), a contribution that
// depends on (member, round), its q4 average, and the update applied after the commit. Every
// commit checks that the members' registered state agrees; hash() is what the drivers compare.
#include <xxhash.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "lowcomm/elastic.h"

namespace lowcomm::bench {

class ElasticRounds {
 public:
  static constexpr uint64_t kParams = 1 << 16;

  // Registers the state with `ec`, which must outlive this object's use.
  explicit ElasticRounds(ElasticCommunicator& ec)
      : ec_(ec), params_(kParams, 0.0f), g_(kParams), round_(1, 0) {
    (void)ec_.register_state("params", params_.data(), kParams * 4);
    (void)ec_.register_state("round", round_.data(), 8);
    ar_.codec = *parse_codec_spec("q4");
  }

  // One round; the all-reduce's status when it failed (the state is then as before).
  Status step() {
    const uint32_t m = ec_.member_id();
    for (uint64_t i = 0; i < kParams; ++i)
      g_[i] = std::sin(0.01f * static_cast<float>(i + m) + static_cast<float>(round_[0] % 97));
    Status st =
        ec_.all_reduce(g_.data(), g_.data(), kParams, DType::kFloat32, ReduceOp::kAverage, ar_);
    if (!st.is_ok()) return st;
    for (uint64_t i = 0; i < kParams; ++i) params_[i] = 0.5f * params_[i] + g_[i];
    ++round_[0];
    return Status::ok();
  }

  uint64_t round() const { return round_[0]; }
  uint64_t hash() const { return XXH3_64bits(params_.data(), kParams * 4) ^ round_[0]; }

 private:
  ElasticCommunicator& ec_;
  std::vector<float> params_, g_;
  std::vector<uint64_t> round_;
  AllReduceOptions ar_;
};

// A failed call that means this member takes no further part (evicted, or on the minority side).
inline bool fenced(const Status& s) {
  return s.message().find("evicted") != std::string::npos ||
         s.message().find("no quorum") != std::string::npos;
}

}  // namespace lowcomm::bench
