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
// TCP window. The transport writes each chunk at its deliver time to a loopback socket, so the
// kernel's TCP never sees the emulated delay and would never be window-limited. The pacer
// models it instead: a chunk's bytes are in flight on its stream from when it departs until its
// acknowledgement is back, one one-way delay after delivery, and a chunk departs only while its
// stream has fewer than W bytes in flight (TCP sends whenever its window is open; the chunk is
// the model's unit). Each chunk takes the stream on which it can depart first (ties: the one
// with fewer bytes in flight), so one stream moves about W per round trip, as one real TCP
// connection does, and S streams S times that, up to the link rate. W = 0: no window limit.
//
// Not thread-safe: one pacer belongs to one peer's send side, used on its engine thread.

#include <chrono>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "transport/wan_link.h"

namespace lowcomm::transport {

class Pacer {
 public:
  using Clock = std::chrono::steady_clock;

  struct Slot {
    int stream = 0;             // the stream the chunk must be written to
    Clock::time_point deliver;  // when it may be written
  };

  // `streams` streams of `window_bytes` each (0: unlimited).
  explicit Pacer(const WanLink& link, uint64_t jitter_seed = 0x6c6f77636f6d6dull, int streams = 1,
                 uint64_t window_bytes = 0);

  bool shaped() const { return link_.shaped(); }
  const WanLink& link() const { return link_; }
  // Where and when a chunk of `bytes` submitted at `now` becomes deliverable.
  Slot submit(uint64_t bytes, Clock::time_point now);
  // When the link finishes serialising everything submitted so far.
  Clock::time_point link_free() const { return link_free_; }

 private:
  struct InFlight {
    std::deque<std::pair<Clock::time_point, uint64_t>> acks;  // (ack time, bytes), ack order
    uint64_t bytes = 0;
  };
  double next_jitter_s();  // uniform in [-jitter, +jitter]
  // The earliest time >= t at which stream s has its window open.
  Clock::time_point room_at(const InFlight& s, Clock::time_point t) const;

  WanLink link_;
  uint64_t window_;
  std::vector<InFlight> streams_;
  Clock::time_point link_free_{};
  Clock::time_point last_deliver_{};
  uint64_t rng_state_;
};

}  // namespace lowcomm::transport
