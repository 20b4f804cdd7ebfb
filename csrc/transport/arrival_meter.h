#pragma once
// ArrivalMeter: what this rank's downlink has been seen to carry, learned from the traffic
// itself (no probes). Every chunk that arrives from any peer is recorded with its arrival time:
// when the receiving socket gave its last byte, or, on an emulated link (LOWCOMM_WAN), when it
// passed the rank's emulated downlink. peak_rate() is the highest throughput over any run of
// consecutive arrivals holding at least a fraction of the bytes since a point in time: an
// operation that keeps the downlink busy for part of its time shows the link's rate there,
// whatever it waited for in between (a slower peer's results, its own encode).
//
// Thread-safe: the engine thread records, the executor reads after an operation.

#include <cstdint>
#include <mutex>
#include <vector>

#include "transport/pacer.h"

namespace lowcomm::transport {

class ArrivalMeter {
 public:
  static constexpr size_t kCapacity = 1 << 15;  // the most recent arrivals kept

  void record(PaceClock::time_point at, uint64_t bytes);
  // Bytes per second over the best run of arrivals at or after `since` that holds at least
  // `fraction` of their bytes; 0 when fewer than kMinBytes arrived, or in fewer than four chunks.
  double peak_rate(PaceClock::time_point since, double fraction = 0.125) const;

  static constexpr uint64_t kMinBytes = 1 << 20;

 private:
  struct Arrival {
    int64_t ns;
    uint64_t bytes;
  };
  mutable std::mutex mu_;
  std::vector<Arrival> ring_;  // grows to kCapacity, then overwritten at next_
  size_t next_ = 0;
};

// The peak of a list of arrivals (sorted here by time): the function peak_rate() applies,
// exposed for tests.
double peak_rate_of(std::vector<std::pair<int64_t, uint64_t>> arrivals, double fraction);

}  // namespace lowcomm::transport
