#include "transport/failure_detector.h"

#include <algorithm>

namespace lowcomm::transport {

void FailureDetector::rtt_sample(std::chrono::nanoseconds rtt) {
  if (samples_++ == 0) {
    srtt_ = rtt;
    rttvar_ = rtt / 2;
    return;
  }
  auto err = srtt_ > rtt ? srtt_ - rtt : rtt - srtt_;
  rttvar_ = (3 * rttvar_ + err) / 4;  // beta = 1/4
  srtt_ = (7 * srtt_ + rtt) / 8;      // alpha = 1/8
}

std::chrono::nanoseconds FailureDetector::timeout() const {
  return std::max(floor_, 2 * interval_ + 4 * (srtt_ + 4 * rttvar_));
}

}  // namespace lowcomm::transport
