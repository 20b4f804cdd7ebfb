#include "core/deadline.h"

#include <cstdlib>

#include "core/params.h"

namespace lowcomm {

using Clock = Deadline::Clock;

Deadline Deadline::after_seconds(double s, Clock::time_point now) {
  return after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)), now);
}

Deadline Deadline::resolve(Clock::time_point now) const {
  return resolve(default_timeout(), now);
}

Deadline Deadline::resolve(Clock::duration default_timeout_value, Clock::time_point now) const {
  if (kind_ != Kind::kDefault) return *this;
  return after(default_timeout_value, now);
}

bool Deadline::expired(Clock::time_point now) const {
  return kind_ == Kind::kAt && now >= t_;
}

Clock::duration Deadline::remaining(Clock::time_point now) const {
  switch (kind_) {
    case Kind::kNone:
      return Clock::duration::max();
    case Kind::kDefault:
      return default_timeout();
    case Kind::kAt:
      return now >= t_ ? Clock::duration::zero() : t_ - now;
  }
  return Clock::duration::zero();
}

int Deadline::poll_timeout_ms(int cap_ms, Clock::time_point now) const {
  if (kind_ == Kind::kNone) return cap_ms;
  auto left = remaining(now);
  // Round up: a poll that wakes 0.4 ms early would otherwise spin with timeout 0.
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  if (cap_ms >= 0 && ms > cap_ms) ms = cap_ms;
  if (ms > 1'000'000'000) ms = 1'000'000'000;
  return static_cast<int>(ms);
}

Clock::duration default_timeout() {
  static const Clock::duration value = [] {
    // Malformed: the default here, and init fails naming it (params::check_all).
    auto set = params::number("LOWCOMM_TIMEOUT_S");
    const double s = set.is_ok() && set->has_value() ? **set : 1800.0;
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }();
  return value;
}

}  // namespace lowcomm
