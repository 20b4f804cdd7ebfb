#pragma once
// LinkEmulator: the emulated WAN link (LOWCOMM_WAN; wan_link.h, pacer.h) between one peer's
// sends and its sockets, and the downlink its received chunks pass (site model). It sits
// outside the production path: a peer on a real link has none and writes every chunk at once;
// a peer with one hands each chunk to submit() and writes it when the emulator delivers it.
//
// Send side: submit() asks the pacer for the chunk's stream, departure time (its last bit has
// left the sender's end of the link) and delivery time (it has crossed; the transport writes it
// to the socket then). advance(now) hands every chunk whose departure has come to `depart` (the
// sender's buffer is free from then on: copy or seal the bytes), then every chunk whose delivery
// has come to `deliver`, in order; next_event() says when to call it again. A send completes at
// departure, as a kernel socket takes bytes long before they arrive.
//
// Loss (loss=, wan_link.h): a chunk with a lost segment is released later by TCP's recovery
// time, and no chunk after it is released before it (head of line).
//
// Liveness control frames (PING, PONG: peer_core.h) cross the link too: control_arrival() says
// when one sent now reaches the far end (the one-way delay, jitter and loss of the link, in
// order among themselves). Not its rate (a few bytes) and not behind queued chunks: control
// frames jump lowcomm's send queue; on a real link they would still wait behind the kernel's
// socket buffer, which is not modelled. ACKs and NACKs are not delayed.
//
// Receive side (site model): pass_downlink() says when a chunk that arrived now has passed the
// rank's one downlink, shared by all its peers; the peer completes the message no earlier.
//
// Engine thread only, like the peer that owns it.

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>

#include "lowcomm/status.h"
#include "transport/out_chunk.h"
#include "transport/pacer.h"
#include "transport/wan_link.h"

namespace lowcomm::transport {

class LinkEmulator {
 public:
  using Clock = PaceClock;

  // `site`: the rank's shared site links (site model; created here when null). `streams` of
  // `window_bytes` each are modelled; `seed` keys the jitter.
  LinkEmulator(const WanLink& link, std::shared_ptr<LinkClocks> site, uint64_t seed, int streams,
               uint64_t window_bytes);

  // A new link from now on (a per-pair rule): chunks already submitted keep their times.
  void set_link(const WanLink& link, uint64_t window_bytes);
  const WanLink& link() const { return link_; }
  const std::shared_ptr<LinkClocks>& site() const { return site_; }

  // Returns when the chunk's last bit leaves this end of the emulated link.
  Clock::time_point submit(OutChunk c, Clock::time_point now);
  // Stops at the first error `depart` returns (the peer then fails).
  Status advance(Clock::time_point now, const std::function<Status(OutChunk&)>& depart,
                 const std::function<void(OutChunk)>& deliver);
  std::optional<Clock::time_point> next_event() const;
  bool idle() const { return held_.empty(); }
  // Hands every held chunk to `fn` (to fail its send) and forgets them.
  void drain(const std::function<void(OutChunk&)>& fn);
  // When a control frame sent now reaches the far end (see above).
  Clock::time_point control_arrival(Clock::time_point now);

  // When a received chunk of `payload_bytes` (plus its header) arriving at `now` has passed the
  // downlink; `now` without one.
  Clock::time_point pass_downlink(uint64_t chunk_bytes, Clock::time_point now);
  // How long a chunk occupies this rank's emulated uplink / downlink (0: unlimited, or a peer
  // in the same site): with submit()'s and pass_downlink()'s times, the span of a rate sample.
  Clock::duration uplink_time(uint64_t chunk_bytes) const;
  Clock::duration downlink_time(uint64_t chunk_bytes) const;

 private:
  void make_pacer(uint64_t window_bytes);
  // TCP's recovery of the chunk's lost segments, drawn from `rng`.
  Clock::duration loss_penalty(uint64_t bytes, std::mt19937_64& rng);

  WanLink link_;
  std::shared_ptr<LinkClocks> site_;
  uint64_t seed_;
  int streams_;
  Pacer pacer_;
  std::deque<OutChunk> held_;  // release times non-decreasing (the pacer never reorders)
  size_t departed_ = 0;        // held_[0, departed_) have left the sender's end
  std::mt19937_64 loss_rng_;   // loss= draws, keyed by the seed
  Clock::time_point last_release_{};
  std::mt19937_64 control_rng_;  // control frames' jitter and loss, apart from the chunks'
  Clock::time_point last_control_{};
};

}  // namespace lowcomm::transport
