#pragma once
// FailureDetector: when to declare a silent peer failed, from the round trips of its
// heartbeats (RFC 6298's smoothed RTT and variance). A closed connection needs no detector;
// this is for a peer whose sockets stay open while it makes no progress (SIGSTOP, a hung
// process, a cut path). Used by an elastic group's members (membership/) and by every peer
// connection an operation waits on (peer_core.h).
//
// timeout = max(floor, 2 * interval + 4 * (srtt + 4 * rttvar)): at 200 ms RTT with jitter, a
// lost heartbeat segment costs TCP one retransmission timeout (>= 200 ms), and the timeout
// leaves room for two in a row before a slow, lossy link reads as a dead member.
//
// Thread safety: none; one thread owns it (the membership thread, or a peer's engine thread).

#include <chrono>

namespace lowcomm::transport {

class FailureDetector {
 public:
  using Clock = std::chrono::steady_clock;
  FailureDetector(std::chrono::milliseconds floor, std::chrono::milliseconds interval)
      : floor_(floor), interval_(interval) {}

  void heard(Clock::time_point now) { last_heard_ = now; }
  void rtt_sample(std::chrono::nanoseconds rtt);
  std::chrono::nanoseconds timeout() const;
  // Silent for longer than timeout() at `now`.
  bool expired(Clock::time_point now) const { return now - last_heard_ > timeout(); }
  std::chrono::nanoseconds silent_for(Clock::time_point now) const { return now - last_heard_; }
  std::chrono::nanoseconds srtt() const { return srtt_; }
  int samples() const { return samples_; }

 private:
  std::chrono::nanoseconds floor_;
  std::chrono::nanoseconds interval_;
  Clock::time_point last_heard_ = Clock::now();
  std::chrono::nanoseconds srtt_{0};
  std::chrono::nanoseconds rttvar_{0};
  int samples_ = 0;
};

}  // namespace lowcomm::transport
