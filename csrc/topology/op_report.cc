#include "topology/op_report.h"

#include <algorithm>
#include <cmath>

namespace lowcomm::topology {

uint16_t encode_rate(double bytes_per_second) {
  if (!(bytes_per_second >= kMinRate && bytes_per_second <= kMaxRate)) return 0;
  const double code = 1 + std::round(1024 * std::log2(bytes_per_second / kMinRate));
  return static_cast<uint16_t>(std::clamp(code, 1.0, 65535.0));
}

double decode_rate(uint16_t code) {
  return code == 0 ? 0 : kMinRate * std::exp2((code - 1) / 1024.0);
}

uint16_t encode_time(double seconds) {
  if (!(seconds >= 0)) return 0;
  const double us = std::max(seconds * 1e6, 1.0);
  const double code = 1 + std::round(2048 * std::log2(us));
  return static_cast<uint16_t>(std::clamp(code, 1.0, 65535.0));
}

double decode_time(uint16_t code) {
  return code == 0 ? 0 : std::exp2((code - 1) / 2048.0) * 1e-6;
}

}  // namespace lowcomm::topology
