#include "transport/arrival_meter.h"

#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>

namespace lowcomm::transport {
namespace {

int64_t ns_of(PaceClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

constexpr size_t kBins = 1024;

}  // namespace

void ArrivalMeter::record(PaceClock::time_point start, PaceClock::time_point end, uint64_t bytes) {
  MeterSample s{ns_of(start), ns_of(end), bytes};
  if (s.start_ns > s.end_ns) s.start_ns = s.end_ns;
  std::lock_guard<std::mutex> lock(mu_);
  if (ring_.size() < kCapacity) {
    ring_.push_back(s);
    return;
  }
  ring_[next_] = s;
  next_ = (next_ + 1) % kCapacity;
}

double ArrivalMeter::peak_rate(PaceClock::time_point since, double fraction) const {
  std::vector<MeterSample> copy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    copy = ring_;
  }
  return peak_rate_of(copy, ns_of(since), fraction);
}

double peak_rate_of(const std::vector<MeterSample>& samples, int64_t since_ns, double fraction) {
  // The grid: kBins over [since, the last end]; each sample's bytes spread evenly over its span
  // (the part before `since` dropped), a point into its bin.
  int64_t last = since_ns;
  for (const MeterSample& s : samples)
    if (s.end_ns >= since_ns) last = std::max(last, s.end_ns);
  if (last <= since_ns) return 0;
  const double origin = static_cast<double>(since_ns);
  const double width = static_cast<double>(last - since_ns) / kBins;
  std::vector<double> bin(kBins, 0.0);
  auto at = [&](double t) {
    return std::min(kBins - 1, static_cast<size_t>(std::max(0.0, t - origin) / width));
  };
  double total = 0;
  for (const MeterSample& s : samples) {
    if (s.end_ns < since_ns || s.bytes == 0) continue;
    const double b = static_cast<double>(s.bytes);
    if (s.start_ns >= s.end_ns) {
      bin[at(static_cast<double>(s.end_ns))] += b;
      total += b;
      continue;
    }
    const double s0 = static_cast<double>(s.start_ns), s1 = static_cast<double>(s.end_ns);
    const double per_ns = b / (s1 - s0);
    const double from = std::max(s0, origin);
    for (size_t k = at(from); k <= at(s1); ++k) {
      const double lo = std::max(from, origin + width * static_cast<double>(k));
      const double hi = std::min(s1, origin + width * static_cast<double>(k + 1));
      if (hi > lo) {
        bin[k] += per_ns * (hi - lo);
        total += per_ns * (hi - lo);
      }
    }
  }
  if (total < static_cast<double>(ArrivalMeter::kMinBytes) || !(fraction > 0)) return 0;
  // The densest stretch of whole bins holding `fraction` of the bytes.
  const double want = total * fraction;
  double best = 0, sum = 0;
  size_t r = 0;  // bins [l, r)
  for (size_t l = 0; l < kBins; ++l) {
    while (r < kBins && sum < want) sum += bin[r++];
    if (sum < want) break;
    best = std::max(best, sum / (width * static_cast<double>(r - l)) * 1e9);
    sum -= bin[l];
  }
  return best;
}

uint64_t kernel_bytes_received(int fd) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return 0;
  if (len < offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received)) return 0;
  return info.tcpi_bytes_received;
}

}  // namespace lowcomm::transport
