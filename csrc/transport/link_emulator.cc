#include "transport/link_emulator.h"

#include <algorithm>

#include "transport/emulated_links.h"

namespace lowcomm::transport {

LinkEmulator::LinkEmulator(const WanLink& link, std::shared_ptr<LinkClocks> site, uint64_t seed,
                           int streams, uint64_t window_bytes)
    : link_(link),
      site_(std::move(site)),
      seed_(seed),
      streams_(streams),
      pacer_(link),
      loss_rng_(seed ^ 0x6c6f737321ull),
      control_rng_(seed ^ 0x70696e6721ull) {
  if (link_.model == WanModel::kSite && !site_) {
    // A shared site is set up by its creator (and read on the engine thread meanwhile: never
    // written here); a peer without one gets its own (only shaped links are emulated).
    site_ = own_site_links(link_);
  }
  make_pacer(window_bytes);
}

void LinkEmulator::make_pacer(uint64_t window_bytes) {
  std::shared_ptr<LinkClock> up;
  // A peer in the same site (a local link) does not cross the site's access link; a peer at the
  // end of a path takes the path's link instead.
  if (link_.path_clock)
    up = link_.path_clock;
  else if (link_.model == WanModel::kSite && site_ && !link_.local)
    up = std::shared_ptr<LinkClock>(site_, &site_->up);
  pacer_ = Pacer(link_, seed_, streams_, window_bytes, std::move(up));
}

void LinkEmulator::set_link(const WanLink& link, uint64_t window_bytes) {
  link_ = link;
  make_pacer(window_bytes);
}

LinkEmulator::Clock::time_point LinkEmulator::submit(OutChunk c, Clock::time_point now) {
  // Headers cross the emulated link too: they cost bandwidth on a real one.
  Pacer::Slot slot = pacer_.submit(kChunkHeaderBytes + c.len, now);
  c.depart = slot.sent;
  c.release = slot.deliver;
  if (link_.loss > 0) c.release += loss_penalty(kChunkHeaderBytes + c.len, loss_rng_);
  // In order, as TCP delivers (a recovering segment holds back what follows it).
  c.release = std::max(c.release, last_release_);
  last_release_ = c.release;
  c.stream = slot.stream;
  held_.push_back(std::move(c));
  return slot.sent;
}

LinkEmulator::Clock::time_point LinkEmulator::control_arrival(Clock::time_point now) {
  double delay = link_.one_way_delay_s;
  if (link_.jitter_s > 0.0) {
    std::uniform_real_distribution<double> j(-link_.jitter_s, link_.jitter_s);
    delay = std::max(0.0, delay + j(control_rng_));
  }
  Clock::time_point t =
      now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(delay));
  if (link_.loss > 0) t += loss_penalty(kChunkHeaderBytes, control_rng_);
  t = std::max(t, last_control_);  // one TCP stream: in order
  last_control_ = t;
  return t;
}

LinkEmulator::Clock::duration LinkEmulator::loss_penalty(uint64_t bytes, std::mt19937_64& rng) {
  const uint64_t segments = (bytes + WanLink::kTcpSegmentBytes - 1) / WanLink::kTcpSegmentBytes;
  std::binomial_distribution<uint64_t> lost(segments, link_.loss);
  uint64_t n = lost(rng);
  if (n == 0) return Clock::duration::zero();
  const double rtt = 2.0 * link_.one_way_delay_s;
  // Several losses in one window recover together (SACK): the slowest sets the delay. A segment
  // with three or more behind it is fast-retransmitted after one RTT; a tail segment waits for
  // the retransmission timeout (Linux: srtt + max(4 rttvar, 200 ms)).
  std::uniform_int_distribution<uint64_t> at(0, segments - 1);
  double penalty = 0;
  const double rto = rtt + 0.2;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (uint64_t i = 0; i < n; ++i) {
    bool tail = at(rng) + 3 >= segments;
    double p = tail ? rto : rtt;
    // A lost retransmission waits for the timeout again, doubled each time (backoff).
    for (double backoff = rto; u(rng) < link_.loss; backoff *= 2) p += backoff;
    penalty = std::max(penalty, p);
  }
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(penalty));
}

Status LinkEmulator::advance(Clock::time_point now, const std::function<Status(OutChunk&)>& depart,
                             const std::function<void(OutChunk)>& deliver) {
  // Departures (depart <= release, both non-decreasing along held_).
  while (departed_ < held_.size() && held_[departed_].depart <= now) {
    if (Status s = depart(held_[departed_]); !s) return s;
    ++departed_;
  }
  while (!held_.empty() && held_.front().release <= now && departed_ > 0) {
    // Out of held_ before `deliver` runs: a write failure in it fails the peer, which drains.
    OutChunk c = std::move(held_.front());
    held_.pop_front();
    --departed_;
    deliver(std::move(c));
  }
  return Status::ok();
}

std::optional<LinkEmulator::Clock::time_point> LinkEmulator::next_event() const {
  if (held_.empty()) return std::nullopt;
  if (departed_ < held_.size()) return std::min(held_[departed_].depart, held_.front().release);
  return held_.front().release;
}

void LinkEmulator::drain(const std::function<void(OutChunk&)>& fn) {
  std::deque<OutChunk> held;
  held.swap(held_);
  departed_ = 0;
  for (auto& c : held) fn(c);
}

LinkEmulator::Clock::time_point LinkEmulator::pass_downlink(uint64_t chunk_bytes,
                                                            Clock::time_point now) {
  if (!site_ || link_.local || link_.path_clock || link_.model != WanModel::kSite ||
      site_->down.bits_per_second <= 0)
    return now;
  return site_->down.pass(link_.wire_bytes(chunk_bytes), now);
}

namespace {
LinkEmulator::Clock::duration serialisation(double wire_bytes, double bits_per_second) {
  if (bits_per_second <= 0) return {};
  return std::chrono::duration_cast<LinkEmulator::Clock::duration>(
      std::chrono::duration<double>(8.0 * wire_bytes / bits_per_second));
}
}  // namespace

LinkEmulator::Clock::duration LinkEmulator::uplink_time(uint64_t chunk_bytes) const {
  if (link_.local) return {};
  return serialisation(link_.wire_bytes(chunk_bytes), link_.bits_per_second);
}

LinkEmulator::Clock::duration LinkEmulator::downlink_time(uint64_t chunk_bytes) const {
  if (!site_ || link_.local || link_.path_clock || link_.model != WanModel::kSite) return {};
  return serialisation(link_.wire_bytes(chunk_bytes), site_->down.bits_per_second);
}

}  // namespace lowcomm::transport
