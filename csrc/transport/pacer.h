#pragma once
// Pacer: the arithmetic of one direction of an emulated WanLink. Pure: it never reads a clock
// or sleeps; the caller passes "now", so tests drive it with an injected clock.
//
// A chunk of B bytes submitted at time t leaves the sender's end of the link at
//   d = max(t, link_free)            (the link sends one chunk at a time)
// occupies it until
//   link_free = d + 8 W(B) / bw      (serialisation at the link rate; W(B): B plus the TCP/IP
//                                     framing of its segments, WanLink::wire_bytes)
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
// Site model (wan_link.h): every pacer of a rank shares one uplink clock, so the link is busy
// with one chunk at a time across all peers, and the receive side passes each arriving chunk
// through the rank's one Downlink. Pair model: each pacer has its own clock; no downlink.
//
// Not thread-safe: one pacer belongs to one peer's send side, used on its engine thread; the
// LinkClocks of a rank are used only on the engine thread all its peers share.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "transport/wan_link.h"

namespace lowcomm::transport {

using PaceClock = std::chrono::steady_clock;

// A link's serialisation clock: when it has sent everything submitted so far, in nanoseconds of
// the steady clock (CLOCK_MONOTONIC, the same in every process of a host). Atomic, and at an
// address that may be another process's too: the ranks of one emulated site (site= rules,
// wan_link.h) are separate processes sharing one uplink and one downlink (shared_clocks.h), and
// each reserves its time on them with a compare-and-swap.
struct LinkClock {
  LinkClock() = default;
  LinkClock(const LinkClock&) = delete;
  LinkClock& operator=(const LinkClock&) = delete;
  PaceClock::time_point free() const;
  // Moves the clock from `seen` (what the caller read) to `next`; false (and `seen` updated)
  // when another submitter moved it first.
  bool advance(PaceClock::time_point& seen, PaceClock::time_point next);
  std::atomic<int64_t> own{0};
  std::atomic<int64_t>* ns = &own;  // own, or a site's shared memory
};

// A site's downlink: a chunk whose last byte reaches it at t has passed it at
//   max(t, free + 8 B / rate)  (then free = that)
// cut-through: an idle downlink adds nothing, a busy one queues the chunk behind the others, so
// P-1 peers sending at full uplink rate into one rank take P-1 times as long to arrive.
struct Downlink {
  double bits_per_second = 0;  // 0: unlimited
  LinkClock clock;
  // wire_bytes: framing included (WanLink::wire_bytes).
  PaceClock::time_point pass(double wire_bytes, PaceClock::time_point t);
};

// One site's access link, shared by its peers (site model): by one rank's peers, or, for a
// site of several ranks, by every peer of each of them (the clocks in shared memory, `mapping`
// keeps it mapped).
struct LinkClocks {
  LinkClock up;
  Downlink down;
  std::shared_ptr<void> mapping;
};

class Pacer {
 public:
  using Clock = PaceClock;

  struct Slot {
    int stream = 0;             // the stream the chunk must be written to
    Clock::time_point sent;     // when its last bit has left the sender's end of the link
    Clock::time_point deliver;  // when it may be written
  };

  // `streams` streams of `window_bytes` each (0: unlimited).
  // `uplink`: the clock of a link shared with other pacers (site model); null: its own.
  explicit Pacer(const WanLink& link, uint64_t jitter_seed = 0x6c6f77636f6d6dull, int streams = 1,
                 uint64_t window_bytes = 0, std::shared_ptr<LinkClock> uplink = nullptr);

  bool shaped() const { return link_.shaped(); }
  const WanLink& link() const { return link_; }
  // Where and when a chunk of `bytes` submitted at `now` becomes deliverable.
  Slot submit(uint64_t bytes, Clock::time_point now);
  // When the link finishes serialising everything submitted so far.
  Clock::time_point link_free() const { return up_->free(); }

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
  std::shared_ptr<LinkClock> up_;
  Clock::time_point last_deliver_{};
  uint64_t rng_state_;
};

}  // namespace lowcomm::transport
