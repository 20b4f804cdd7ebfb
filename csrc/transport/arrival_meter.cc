#include "transport/arrival_meter.h"

#include <algorithm>
#include <utility>

namespace lowcomm::transport {

void ArrivalMeter::record(PaceClock::time_point at, uint64_t bytes) {
  const int64_t ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
  std::lock_guard<std::mutex> lock(mu_);
  if (ring_.size() < kCapacity) {
    ring_.push_back({ns, bytes});
    return;
  }
  ring_[next_] = {ns, bytes};
  next_ = (next_ + 1) % kCapacity;
}

double ArrivalMeter::peak_rate(PaceClock::time_point since, double fraction) const {
  const int64_t from =
      std::chrono::duration_cast<std::chrono::nanoseconds>(since.time_since_epoch()).count();
  std::vector<std::pair<int64_t, uint64_t>> picked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Arrival& a : ring_)
      if (a.ns >= from) picked.emplace_back(a.ns, a.bytes);
  }
  return peak_rate_of(std::move(picked), fraction);
}

double peak_rate_of(std::vector<std::pair<int64_t, uint64_t>> arrivals, double fraction) {
  if (arrivals.size() < 4) return 0;
  std::sort(arrivals.begin(), arrivals.end());
  uint64_t total = 0;
  for (const auto& a : arrivals) total += a.second;
  if (total < ArrivalMeter::kMinBytes) return 0;
  // A run from arrival i (its bytes were on the way before it: not counted) to arrival j: the
  // bytes of (i, j] over the time between them.
  const auto want = static_cast<uint64_t>(static_cast<double>(total) * fraction);
  double best = 0;
  size_t j = 0;
  uint64_t in_run = 0;  // bytes of (i, j]
  for (size_t i = 0; i + 1 < arrivals.size(); ++i) {
    if (j < i) {
      j = i;
      in_run = 0;
    }
    while (j + 1 < arrivals.size() && in_run < want) in_run += arrivals[++j].second;
    if (in_run < want) break;
    const int64_t dt = arrivals[j].first - arrivals[i].first;
    if (dt > 0) best = std::max(best, static_cast<double>(in_run) * 1e9 / static_cast<double>(dt));
    in_run -= arrivals[i + 1].second;  // i + 1 leaves the run's counted bytes as i advances
  }
  return best;
}

}  // namespace lowcomm::transport
