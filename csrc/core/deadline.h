#pragma once
// Deadline: when a wait must give up, on the steady clock.
//
// Three kinds, because "no timeout" and "whatever the library default is" are different
// requests: none() never expires; use_default() is resolved against default_timeout() at the
// moment an operation starts (resolve()); at()/after() are absolute instants. A Deadline is a
// value type, cheap to copy, and thread-safe to read.

#include <chrono>

namespace lowcomm {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  Deadline() = default;  // use_default()
  static Deadline none() { return Deadline(Kind::kNone, {}); }
  static Deadline use_default() { return Deadline(); }
  static Deadline at(Clock::time_point t) { return Deadline(Kind::kAt, t); }
  static Deadline after(Clock::duration d, Clock::time_point now = Clock::now()) {
    return Deadline(Kind::kAt, now + d);
  }
  static Deadline after_seconds(double s, Clock::time_point now = Clock::now());

  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_default() const { return kind_ == Kind::kDefault; }

  // A default deadline becomes after(default_timeout, now); the others are returned unchanged.
  Deadline resolve(Clock::time_point now = Clock::now()) const;
  Deadline resolve(Clock::duration default_timeout, Clock::time_point now = Clock::now()) const;

  // For resolved deadlines; a default one is resolved against `now` first (so never expired).
  bool expired(Clock::time_point now = Clock::now()) const;
  // Time left, zero when expired, Clock::duration::max() for none().
  Clock::duration remaining(Clock::time_point now = Clock::now()) const;
  // Milliseconds for poll()/epoll_wait(): -1 for none (or cap_ms if cap_ms >= 0), rounded up so
  // a poll never returns just before the deadline, capped at cap_ms when cap_ms >= 0.
  int poll_timeout_ms(int cap_ms = -1, Clock::time_point now = Clock::now()) const;
  // Only meaningful for at()/after() deadlines.
  Clock::time_point time() const { return t_; }

 private:
  enum class Kind { kDefault, kNone, kAt };
  Deadline(Kind k, Clock::time_point t) : kind_(k), t_(t) {}
  Kind kind_ = Kind::kDefault;
  Clock::time_point t_{};
};

// LOWCOMM_TIMEOUT_S (seconds, fractional allowed), default 1800 (30 minutes). Read once.
Deadline::Clock::duration default_timeout();

}  // namespace lowcomm
