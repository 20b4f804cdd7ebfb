#pragma once
// ArrivalMeter: what a rank's link has been seen to carry, learned from the traffic itself (no
// probes). Samples are bytes that crossed the link within a span of time: a chunk passing an
// emulated downlink or leaving an emulated uplink (LOWCOMM_WAN: a point in time, its last bit),
// or, on a kernel socket, what the kernel received between two reads (TCP_INFO's
// tcpi_bytes_received, so bytes that waited in the socket buffer are counted when they came,
// not when they were read). peak_rate() spreads the samples over a fine grid of time and returns
// the highest throughput over any stretch holding at least a fraction of the bytes: an
// operation that keeps the link busy for part of its time shows the link's rate there, whatever
// it waited for in between (a slower peer's results, its own encode).
//
// Thread-safe: the engine thread records, the executor reads after an operation.

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "transport/pacer.h"

namespace lowcomm::transport {

struct MeterSample {
  int64_t start_ns = 0;  // steady clock; start == end: a point
  int64_t end_ns = 0;
  uint64_t bytes = 0;
};

class ArrivalMeter {
 public:
  static constexpr size_t kCapacity = 1 << 15;  // the most recent samples kept
  static constexpr uint64_t kMinBytes = 1 << 20;

  void record(PaceClock::time_point start, PaceClock::time_point end, uint64_t bytes);
  // Bytes per second over the best stretch after `since` holding at least `fraction` of the
  // bytes since then; 0 when fewer than kMinBytes crossed.
  double peak_rate(PaceClock::time_point since, double fraction = 0.125) const;

 private:
  mutable std::mutex mu_;
  std::vector<MeterSample> ring_;  // grows to kCapacity, then overwritten at next_
  size_t next_ = 0;
};

// The peak of samples from `since_ns` on (what peak_rate() computes), exposed for tests.
double peak_rate_of(const std::vector<MeterSample>& samples, int64_t since_ns, double fraction);

// The bytes the kernel has received on the TCP socket `fd` (TCP_INFO tcpi_bytes_received);
// 0 when it cannot say.
uint64_t kernel_bytes_received(int fd);

}  // namespace lowcomm::transport
