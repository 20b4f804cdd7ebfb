#include "transport/pacer.h"

#include <algorithm>

namespace lowcomm::transport {
namespace {

Pacer::Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Pacer::Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

PaceClock::time_point LinkClock::free() const {
  return PaceClock::time_point(PaceClock::duration(ns->load(std::memory_order_acquire)));
}

bool LinkClock::advance(PaceClock::time_point& seen, PaceClock::time_point next) {
  int64_t expect = seen.time_since_epoch().count();
  if (ns->compare_exchange_strong(expect, next.time_since_epoch().count(),
                                  std::memory_order_acq_rel))
    return true;
  seen = PaceClock::time_point(PaceClock::duration(expect));
  return false;
}

PaceClock::time_point Downlink::pass(double wire_bytes, PaceClock::time_point t) {
  if (bits_per_second <= 0) return t;
  const auto cost = seconds(8.0 * wire_bytes / bits_per_second);
  PaceClock::time_point seen = clock.free();
  for (;;) {
    PaceClock::time_point passed = std::max(t, seen + cost);
    if (clock.advance(seen, passed)) return passed;
  }
}

Pacer::Pacer(const WanLink& link, uint64_t jitter_seed, int streams, uint64_t window_bytes,
             std::shared_ptr<LinkClock> uplink)
    : link_(link),
      window_(window_bytes),
      streams_(static_cast<size_t>(std::max(1, streams))),
      up_(uplink ? std::move(uplink) : std::make_shared<LinkClock>()),
      rng_state_(jitter_seed) {}

double Pacer::next_jitter_s() {
  // splitmix64: deterministic per seed, so a jittered run can be reproduced.
  uint64_t z = (rng_state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  double u = static_cast<double>(z >> 11) * 0x1.0p-53;  // [0, 1)
  return (2.0 * u - 1.0) * link_.jitter_s;
}

Pacer::Clock::time_point Pacer::room_at(const InFlight& s, Clock::time_point t) const {
  if (window_ == 0) return t;
  // A chunk departs while the window is open (fewer than W bytes in flight), as TCP sends
  // whenever its window has room; so at most W plus one chunk is in flight, and W itself on
  // average over a round trip (the chunk is the model's unit, not the segment).
  uint64_t need_free = s.bytes >= window_ ? s.bytes - window_ + 1 : 0;
  uint64_t freed = 0;
  for (const auto& [ack, b] : s.acks) {
    if (freed >= need_free) break;
    freed += b;
    t = std::max(t, ack);
  }
  return t;
}

Pacer::Slot Pacer::submit(uint64_t bytes, Clock::time_point now) {
  // The link's time is reserved with a compare-and-swap: another pacer on the same site (in this
  // process or another) may take it first, and then the chunk goes after that one.
  Clock::time_point seen = up_->free();
  int best = 0;
  Clock::time_point sent;
  for (;;) {
    Clock::time_point earliest = std::max(now, seen);
    // Acknowledged by `earliest` is acknowledged for every later chunk too: `earliest` never
    // goes back (the link's free time only grows, and callers pass a monotonic clock).
    for (auto& s : streams_) {
      while (!s.acks.empty() && s.acks.front().first <= earliest) {
        s.bytes -= s.acks.front().second;
        s.acks.pop_front();
      }
    }
    best = 0;
    Clock::time_point depart = room_at(streams_[0], earliest);
    for (int i = 1; i < static_cast<int>(streams_.size()); ++i) {
      Clock::time_point t = room_at(streams_[i], earliest);
      if (t < depart || (t == depart && streams_[i].bytes < streams_[best].bytes)) {
        best = i;
        depart = t;
      }
    }
    sent = depart;
    if (link_.bits_per_second > 0.0)
      sent += seconds(8.0 * link_.wire_bytes(bytes) / link_.bits_per_second);
    if (up_->advance(seen, std::max(seen, sent))) break;
  }
  double delay = link_.one_way_delay_s;
  if (link_.jitter_s > 0.0) delay = std::max(0.0, delay + next_jitter_s());
  Clock::time_point deliver = std::max(sent + seconds(delay), last_deliver_);
  last_deliver_ = deliver;
  if (window_ > 0) {
    InFlight& s = streams_[static_cast<size_t>(best)];
    s.acks.emplace_back(deliver + seconds(link_.one_way_delay_s), bytes);
    s.bytes += bytes;
  }
  return Slot{best, sent, deliver};
}

}  // namespace lowcomm::transport
