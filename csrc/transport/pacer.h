#pragma once
// Pacer: the arithmetic of one direction of an emulated WanLink. Pure: it never reads a clock
// or sleeps; the caller passes "now", so tests drive it with an injected clock.
//
// A chunk of B bytes submitted at time t leaves the sender's end of the link at
//   d = max(t, link_free)            (the link sends one chunk at a time)
// occupies it until
//   link_free = d + 8 B / bw         (serialisation at the link rate)
// and reaches the far end (the transport writes it to the socket) at
//   deliver = link_free + one_way_delay + jitter,   jitter ~ U[-j, +j], clamped so that
//   deliver >= link_free and deliver >= the previous chunk's deliver (a link never reorders).
// So 64 MiB over bw=100mbit,rtt=100ms delivers its last byte after 64*2^20*8/1e8 + 0.05 s.
//
// Not thread-safe: one pacer belongs to one peer's send side, used on its engine thread.

#include <chrono>
#include <cstdint>

#include "transport/wan_link.h"

namespace lowcomm::transport {

class Pacer {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Pacer(const WanLink& link, uint64_t jitter_seed = 0x6c6f77636f6d6dull);

  bool shaped() const { return link_.shaped(); }
  const WanLink& link() const { return link_; }
  // Returns when a chunk of `bytes` submitted at `now` becomes deliverable.
  Clock::time_point submit(uint64_t bytes, Clock::time_point now);
  // When the link finishes serialising everything submitted so far.
  Clock::time_point link_free() const { return link_free_; }

 private:
  double next_jitter_s();  // uniform in [-jitter, +jitter]

  WanLink link_;
  Clock::time_point link_free_{};
  Clock::time_point last_deliver_{};
  uint64_t rng_state_;
};

}  // namespace lowcomm::transport
