#include "transport/pacer.h"

#include <algorithm>

namespace lowcomm::transport {
namespace {

Pacer::Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Pacer::Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

Pacer::Pacer(const WanLink& link, uint64_t jitter_seed) : link_(link), rng_state_(jitter_seed) {}

double Pacer::next_jitter_s() {
  // splitmix64: deterministic per seed, so a jittered run can be reproduced.
  uint64_t z = (rng_state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  double u = static_cast<double>(z >> 11) * 0x1.0p-53;  // [0, 1)
  return (2.0 * u - 1.0) * link_.jitter_s;
}

Pacer::Clock::time_point Pacer::submit(uint64_t bytes, Clock::time_point now) {
  Clock::time_point depart = std::max(now, link_free_);
  if (link_.bits_per_second > 0.0) {
    link_free_ = depart + seconds(8.0 * static_cast<double>(bytes) / link_.bits_per_second);
  } else {
    link_free_ = depart;
  }
  double delay = link_.one_way_delay_s;
  if (link_.jitter_s > 0.0) delay = std::max(0.0, delay + next_jitter_s());
  Clock::time_point deliver = std::max(link_free_ + seconds(delay), last_deliver_);
  last_deliver_ = deliver;
  return deliver;
}

}  // namespace lowcomm::transport
