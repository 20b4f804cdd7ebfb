#include "transport/peer_core.h"
#include "transport/socket_options.h"

#include <errno.h>
#include <linux/sockios.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "core/little_endian.h"
#include "core/log.h"
#include "core/sys_check.h"
#include "transport/path_model.h"

namespace lowcomm::transport {

namespace {

// A reset or broken connection means the peer went away (killed, crashed, aborted): the same
// remote error as an orderly EOF, whichever of the three this side happens to see first.
bool peer_went_away(int err) {
  return err == ECONNRESET || err == EPIPE;
}

Status socket_error(const char* call, const std::string& who, int err) {
  if (peer_went_away(err)) {
    return Status(StatusCode::kRemoteError, who + ": connection reset by the peer (" + call + ")");
  }
  return sys_error(call, who, err);
}

}  // namespace
namespace {

// Per readiness event, move at most this much per stream so one busy stream cannot starve the
// others or the timers (the epoll loop is level-triggered and comes back).
constexpr uint64_t kMaxBytesPerEvent = 4u << 20;
// What an unexpected message costs besides its payload, charged against the allowance.
constexpr uint64_t kUnexpectedOverheadBytes = 256;
// Re-sends: a receiver ACKs once this many chunks of a stream are finished, or this long after
// the first unacknowledged one, whichever comes first (one ACK per chunk would cost a syscall
// and a wake-up on both ends per chunk); and a peer keeps up to this many chunk-sized copies
// for reuse (the copies of unacknowledged chunks come and go with every operation).
constexpr uint64_t kAckEveryChunks = 16;
constexpr auto kAckDelay = std::chrono::milliseconds(1);
constexpr size_t kSpareCopies = 32;

}  // namespace

PeerCore::PeerCore(ProgressEngine& engine, std::vector<StreamSocket> fds, int remote_rank,
                   std::string remote_address, PeerConfig config)
    : engine_(engine),
      config_(std::move(config)),
      remote_rank_(remote_rank),
      remote_address_(std::move(remote_address)),
      name_("peer rank " + std::to_string(remote_rank_) + " (" + remote_address_ + ")"),
      streams_(fds.size()) {
  for (size_t i = 0; i < fds.size(); ++i) {
    streams_[i].index = static_cast<int>(i);
    streams_[i].fd = std::move(fds[i].fd);
    // Control frames (PING/PONG, ACK/NACK) jump lowcomm's own queue at chunk boundaries, but
    // not what the kernel already holds: a full send buffer on a slow link (8 MiB at 20 Mbit/s
    // is 3.4 s) put a PING behind seconds of data, and a live peer read as frozen.
    limit_unsent_bytes(streams_[i].fd.get(), kUnsentBytes);
    Status a = streams_[i].sealer.init(fds[i].keys);
    Status b = a ? streams_[i].opener.init(fds[i].keys) : a;
    if (!b && setup_.is_ok()) setup_ = Status(b.code(), name_ + ": " + b.message());
  }
  if (config_.chunk_bytes == 0) config_.chunk_bytes = 512 << 10;
  plan_streams();
  if (config_.failure_timeout.count() > 0) {
    ping_interval_ = std::clamp(config_.failure_timeout / 5, std::chrono::milliseconds(10),
                                std::chrono::milliseconds(500));
    alive_ = FailureDetector(config_.failure_timeout, ping_interval_);
  }
}

void PeerCore::plan_streams() {
  const int opened = static_cast<int>(streams_.size());
  const uint64_t window = stream_window_bytes(streams_[0].fd.get(), config_.socket_buffer_bytes);
  const double rtt = kernel_rtt_seconds(streams_[0].fd.get());
  stripe_ = config_.adapt_streams
                ? transport::stripe_streams(config_.path_rate_bps, rtt, window, opened)
                : opened;
  if (config_.wan.shaped()) {
    // The kernel sees loopback; the emulator models the path's windows on every stream.
    if (link_) {
      link_->set_link(config_.wan, window);  // chunks already submitted keep their times
    } else {
      link_ = std::make_unique<LinkEmulator>(
          config_.wan, config_.site,
          0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(config_.local_rank), opened, window);
    }
    stripe_ = opened;
  } else if (link_ && link_->idle()) {
    link_.reset();  // a real link from now on
  } else if (link_) {
    // Chunks still held keep their times; new ones pass at once (a peer in this rank's site:
    // the local network, off the site's uplink and downlink).
    link_->set_link(config_.wan, window);
  }
  LOWCOMM_LOG(kInfo,
              "%s: %d of %d streams striped (window %llu bytes per stream, kernel rtt %.3f ms%s)",
              name_.c_str(), stripe_, opened, static_cast<unsigned long long>(window), rtt * 1e3,
              config_.wan.shaped() ? ", emulated link models the windows" : "");
}

void PeerCore::set_link(const WanLink& link) {
  config_.wan = link;
  plan_streams();  // a new pacer on the same site links; chunks already submitted keep theirs
}

std::string PeerCore::stream_name(const Stream& s) const {
  return name_ + " stream " + std::to_string(s.index);
}

void PeerCore::start() {
  if (!failure_.is_ok()) return;  // aborted before it started: never watch shut-down sockets
  if (!setup_.is_ok()) {
    fail(setup_);
    return;
  }
  auto self = shared_from_this();
  for (auto& s : streams_) {
    Stream* sp = &s;
    auto id =
        engine_.watch(s.fd.get(), EPOLLIN, [self, sp](uint32_t ev) { self->on_event(*sp, ev); });
    if (!id) {
      fail(id.status());
      return;
    }
    s.watch_id = *id;
    s.watching = true;
  }
  if (ping_interval_.count() > 0 && !streams_.empty()) {
    alive_.heard(FailureDetector::Clock::now());
    arm_alive_timer();
  }
}

bool PeerCore::awaited() const {
  for (const auto& [key, m] : in_msgs_)
    if (m->req && !m->standing && !m->req->done()) return true;
  for (const auto& s : streams_)
    if (!s.sendq.empty()) return true;
  return link_ && !link_->idle();
}

void PeerCore::arm_alive_timer() {
  auto self = shared_from_this();
  alive_timer_armed_ = true;
  alive_due_ = FailureDetector::Clock::now() + ping_interval_;
  alive_timer_ = engine_.add_timer(PaceClock::now() + ping_interval_, [self] {
    self->alive_timer_armed_ = false;
    self->check_alive();
  });
}

void PeerCore::check_alive() {
  if (!failure_.is_ok() || shut_down_) return;
  const auto now = FailureDetector::Clock::now();
  // Bytes in a socket not read yet were heard: this engine is behind (a busy or starved
  // thread), not the peer silent.
  auto unread = [&] {
    for (const auto& st : streams_) {
      int n = 0;
      if (st.fd && ::ioctl(st.fd.get(), FIONREAD, &n) == 0 && n > 0) return true;
    }
    return false;
  };
  if (!awaited()) {
    alive_.heard(now);  // silence while nobody waits is no sign of anything
  } else if (now - alive_due_ > ping_interval_) {
    // This tick comes more than an interval late: this process was stopped or starved of CPU
    // itself, and the silence it would read into the peer is its own. Start counting again.
    alive_.heard(now);
  } else if (alive_.expired(now) && !unread()) {
    using std::chrono::duration_cast;
    using std::chrono::milliseconds;
    const auto silent = duration_cast<milliseconds>(alive_.silent_for(now)).count();
    const auto limit = duration_cast<milliseconds>(alive_.timeout()).count();
    fail(Status(StatusCode::kRemoteError,
                name_ + " frozen or cut off: silent for " + std::to_string(silent) +
                    " ms while an operation waits on it (no answer to " +
                    std::to_string(pings_sent_.load(std::memory_order_relaxed)) +
                    " pings; failure timeout " + std::to_string(limit) +
                    " ms, LOWCOMM_FAILURE_TIMEOUT_MS)"));
    return;
  } else if (alive_.silent_for(now) >= ping_interval_) {
    const auto t = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch());
    pings_sent_.fetch_add(1, std::memory_order_relaxed);
    // A PING queued behind data on a real link waits for the chunk being written and what the
    // kernel holds unsent: its round trip measures the queue, not the path, and would stretch
    // the timeout to seconds on a slow link. The lowest bit of its time says so; its PONG still
    // counts as heard but is not a sample. (Emulated links carry control frames by timer.)
    int unsent = 0;
    const bool queued =
        !link_ &&
        (!streams_[0].sendq.empty() ||
         (::ioctl(streams_[0].fd.get(), SIOCOUTQNSD, &unsent) == 0 && unsent > kUnsentSampleBytes));
    send_control(streams_[0], kControlPing,
                 (static_cast<uint64_t>(t.count()) & ~uint64_t{1}) | (queued ? 1 : 0));
  }
  arm_alive_timer();
}

void PeerCore::isend(uint64_t tag, const uint8_t* data, uint64_t len,
                     std::shared_ptr<RequestState> req) {
  auto op = std::make_shared<SendOp>();
  op->req = std::move(req);
  op->what =
      "isend tag " + std::to_string(tag) + " (" + std::to_string(len) + " bytes) to " + name_;
  if (!failure_.is_ok()) {
    op->req->complete(Status(failure_.code(), op->what + ": " + failure_.message()));
    return;
  }
  uint64_t seq = send_seq_[tag]++;
  uint64_t chunk = config_.chunk_bytes;
  uint64_t nchunks = len == 0 ? 1 : (len + chunk - 1) / chunk;
  op->chunks_left = nchunks;
  op->departs_left = nchunks;
  auto now = PaceClock::now();
  for (uint64_t i = 0; i < nchunks; ++i) {
    OutChunk c;
    c.op = op;
    uint64_t off = i * chunk;
    c.len = static_cast<uint32_t>(std::min(chunk, len - off));
    c.data = data + off;
    c.fields = {c.len, tag, seq, len, off, 0};
    if (link_) {
      const uint64_t bytes = kChunkHeaderBytes + c.len;
      const auto sent = link_->submit(std::move(c), now);
      // Traffic inside a site is not the site's link, and an unlimited uplink says nothing
      // of its rate: not measured.
      const auto busy = link_->uplink_time(bytes);
      if (!link_->link().local && busy.count() > 0)
        engine_.up_meter().record(sent - busy, sent, bytes);
    } else {
      enqueue(std::move(c));
    }
  }
  if (link_) run_link();
}

void PeerCore::flush(std::shared_ptr<RequestState> req) {
  if (!failure_.is_ok()) {
    req->complete(Status(failure_.code(), "flush to " + name_ + ": " + failure_.message()));
    return;
  }
  flush_waiters_.push_back(std::move(req));
  check_flushed();
}

void PeerCore::check_flushed() {
  if (flush_waiters_.empty() || (link_ && !link_->idle())) return;
  // Unsealed, also acknowledged: a chunk the peer may still ask for again is not yet done with.
  for (const auto& s : streams_)
    if (!s.sendq.empty() || !s.retained.empty()) return;
  for (auto& w : flush_waiters_) w->complete(Status::ok());
  flush_waiters_.clear();
}

Status PeerCore::depart(OutChunk& c) {
  // Sealed, the copy is the ciphertext, made here rather than at delivery: the encryption
  // overlaps the emulated link's delay instead of adding to it. The pacer never reorders, so
  // each stream's chunks depart in the order they are written (the record counter's order).
  Stream& s = streams_[static_cast<size_t>(c.stream)];
  if (s.sealer.sealed()) {
    if (Status st = protect(s, c); !st) return st;
  } else if (c.len && !c.owned) {  // a re-sent chunk is a copy already
    c.owned = take_copy(c.len);
    std::memcpy(c.owned.get(), c.data, c.len);
    c.data = c.owned.get();
  }
  if (--c.op->departs_left == 0) c.op->req->complete(Status::ok());
  return Status::ok();
}

void PeerCore::run_link() {
  Status st = link_->advance(
      PaceClock::now(), [this](OutChunk& c) { return depart(c); },
      [this](OutChunk c) { enqueue(std::move(c)); });
  if (!st) {
    fail(st);
    return;
  }
  auto next = link_->next_event();
  if (!next) return;
  // A chunk submitted now may leave before the event the timer waits for (the previous
  // chunk's delivery): move the timer earlier.
  if (link_timer_armed_) {
    if (link_timer_at_ <= *next) return;
    engine_.cancel_timer(link_timer_);
  }
  auto self = shared_from_this();
  link_timer_armed_ = true;
  link_timer_at_ = *next;
  link_timer_ = engine_.add_timer(*next, [self] {
    self->link_timer_armed_ = false;
    if (self->link_) self->run_link();
  });
}

void PeerCore::enqueue(OutChunk chunk) {
  // The pacer's stream, or the striped stream with the least queued work: stripes a large
  // message evenly and keeps a small one from queueing behind a large one.
  Stream* best = &streams_[0];
  if (chunk.stream >= 0) {
    best = &streams_[static_cast<size_t>(chunk.stream)];
  } else {
    for (int i = 1; i < stripe_; ++i)
      if (streams_[i].queued_bytes < best->queued_bytes) best = &streams_[i];
  }
  if (Status st = chunk.protected_ ? Status::ok() : protect(*best, chunk); !st) {
    chunk.op->req->complete(Status(st.code(), chunk.op->what + ": " + st.message()));
    fail(st);
    return;
  }
  best->queued_bytes += kChunkHeaderBytes + chunk.len;
  best->sendq.push_back(std::move(chunk));
  // Try at once: the socket is usually writable, which saves an epoll round trip.
  do_write(*best);
}

Status PeerCore::protect(Stream& s, OutChunk& c) {
  if (s.sealer.sealed()) c.fields.flags |= kChunkFlagSealed;
  write_chunk_header(c.fields, c.header);
  c.protected_ = true;
  if (!s.sealer.sealed()) return s.sealer.protect(c.header, c.data, nullptr, c.len);
  // The user's buffer is never written: seal into a copy.
  if (!c.owned && c.len) c.owned = std::make_unique_for_overwrite<uint8_t[]>(c.len);
  Status st = s.sealer.protect(c.header, c.data, c.owned.get(), c.len);
  if (c.len) c.data = c.owned.get();
  return st;
}

Status PeerCore::open_payload(Stream& s, uint8_t* into, size_t n) {
  Status st = s.opener.update(into, n);
  return st ? st : Status(st.code(), stream_name(s) + ": " + st.message());
}

void PeerCore::update_write_interest(Stream& s) {
  if (!s.watching) return;
  bool want = !s.sendq.empty() || !s.ctrlq.empty();
  if (want == s.want_write) return;
  s.want_write = want;
  Status st = engine_.rewatch(s.watch_id, EPOLLIN | (want ? EPOLLOUT : 0u));
  if (!st) fail(st);
}

void PeerCore::on_event(Stream& s, uint32_t events) {
  if (!failure_.is_ok() || shut_down_) return;
  if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) do_read(s);
  if (!failure_.is_ok()) return;
  if (events & EPOLLOUT) do_write(s);
}

void PeerCore::do_write(Stream& s) {
  if (!failure_.is_ok()) return;
  uint64_t moved = 0;
  while ((!s.sendq.empty() || !s.ctrlq.empty()) && moved < kMaxBytesPerEvent) {
    // Control frames go first at a chunk boundary: an ACK lets the peer drop its copies, a
    // NACK gets a chunk sent again, and neither should wait behind megabytes of data.
    const bool ctrl =
        !s.ctrlq.empty() && (s.ctrl_written > 0 || s.sendq.empty() || s.sendq.front().written == 0);
    iovec iov[2];
    int n_iov = 0;
    if (ctrl) {
      iov[n_iov++] = {s.ctrlq.front().data() + s.ctrl_written, kChunkHeaderBytes - s.ctrl_written};
    } else if (OutChunk& c = s.sendq.front(); c.written < kChunkHeaderBytes) {
      iov[n_iov++] = {c.header + c.written, kChunkHeaderBytes - c.written};
      if (c.len) iov[n_iov++] = {const_cast<uint8_t*>(c.data), c.len};
    } else {
      uint64_t off = c.written - kChunkHeaderBytes;
      iov[n_iov++] = {const_cast<uint8_t*>(c.data + off), c.len - off};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n_iov);
    long n = LOWCOMM_SYS_RETRY(::sendmsg(s.fd.get(), &msg, MSG_NOSIGNAL));
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      const int err = errno;
      fail(socket_error("sendmsg", stream_name(s), err), peer_went_away(err));
      return;
    }
    if (ctrl) {
      s.ctrl_written += static_cast<size_t>(n);
      moved += static_cast<uint64_t>(n);
      if (s.ctrl_written == kChunkHeaderBytes) {
        s.ctrlq.pop_front();
        s.ctrl_written = 0;
      }
      continue;
    }
    OutChunk& c = s.sendq.front();
    c.written += static_cast<uint64_t>(n);
    moved += static_cast<uint64_t>(n);
    if (c.written == kChunkHeaderBytes + c.len) {
      s.queued_bytes -= kChunkHeaderBytes + c.len;
      if (!s.sealer.sealed()) retain(s, c);
      auto op = std::move(c.op);
      s.sendq.pop_front();
      if (--op->chunks_left == 0) {
        if (op->retained) detach_retained(*op);
        op->req->complete(Status::ok());
      }
    }
  }
  update_write_interest(s);
  check_flushed();
}

void PeerCore::retain(Stream& s, OutChunk& c) {
  Retained r;
  r.fields = c.fields;
  if (c.owned) {  // emulated: the copy made at departure
    r.copy = std::move(c.owned);
    r.data = r.copy.get();
  } else {
    r.data = c.data;
    if (c.len) {
      r.borrowed = c.op.get();
      ++c.op->retained;
    }
  }
  s.retained.push_back(std::move(r));
  ++s.chunks_written;
}

void PeerCore::detach_retained(const SendOp& op) {
  // The isend completes: its buffer is the caller's again. The chunks the peer has not yet
  // acknowledged (about what is in flight) are copied.
  for (auto& s : streams_) {
    for (auto& r : s.retained) {
      if (r.borrowed != &op) continue;
      r.copy = take_copy(r.fields.chunk_len);
      std::memcpy(r.copy.get(), r.data, r.fields.chunk_len);
      r.data = r.copy.get();
      r.borrowed = nullptr;
    }
  }
}

void PeerCore::send_control(Stream& s, uint64_t kind, uint64_t arg) {
  // On an emulated link a PING or PONG crosses its delay, jitter and loss
  // (LinkEmulator::control_arrival), so the failure detector sees the emulated round trip. It is
  // sealed when it goes out, after any frame sent before it.
  if (link_ && (kind == kControlPing || kind == kControlPong)) {
    auto self = shared_from_this();
    Stream* sp = &s;
    auto id = std::make_shared<uint64_t>(0);
    *id = engine_.add_timer(link_->control_arrival(PaceClock::now()), [self, sp, kind, arg, id] {
      self->control_timers_.erase(*id);
      if (self->failure_.is_ok() && !self->shut_down_) self->write_control(*sp, kind, arg);
    });
    control_timers_.insert(*id);
    return;
  }
  write_control(s, kind, arg);
}

void PeerCore::write_control(Stream& s, uint64_t kind, uint64_t arg) {
  std::array<uint8_t, kChunkHeaderBytes> f;
  write_control_frame(kind, arg, f.data());
  if (Status st = s.sealer.protect_control(f.data()); !st) {
    fail(Status(st.code(), stream_name(s) + ": " + st.message()));
    return;
  }
  s.ctrlq.push_back(f);
  do_write(s);
}

// Copies of chunks of at least half a chunk are chunk-sized and reused (spare_copies_); smaller
// ones (the tail of a message, a small message) are their own size: a 64-byte message's copy
// is 64 bytes, not a 512 KiB buffer.
bool PeerCore::pooled_copy(uint32_t len) const {
  return len <= config_.chunk_bytes && uint64_t{len} * 2 >= config_.chunk_bytes;
}

std::unique_ptr<uint8_t[]> PeerCore::take_copy(uint32_t len) {
  if (pooled_copy(len) && !spare_copies_.empty()) {
    auto b = std::move(spare_copies_.back());
    spare_copies_.pop_back();
    return b;
  }
  const uint64_t bytes = pooled_copy(len) ? config_.chunk_bytes : len;
  copy_bytes_allocated_.fetch_add(bytes, std::memory_order_relaxed);
  return std::make_unique_for_overwrite<uint8_t[]>(bytes);
}

void PeerCore::give_copy(std::unique_ptr<uint8_t[]> b, uint32_t len) {
  if (b && pooled_copy(len) && spare_copies_.size() < kSpareCopies)
    spare_copies_.push_back(std::move(b));
}

void PeerCore::maybe_ack(Stream& s, bool now) {
  if (!failure_.is_ok() || shut_down_ || s.opener.sealed() || s.chunks_finished == s.chunks_acked)
    return;
  if (!now && s.chunks_finished - s.chunks_acked < kAckEveryChunks) {
    if (!s.ack_timer_armed) {
      auto self = shared_from_this();
      Stream* sp = &s;
      s.ack_timer_armed = true;
      s.ack_timer = engine_.add_timer(PaceClock::now() + kAckDelay, [self, sp] {
        sp->ack_timer_armed = false;
        self->maybe_ack(*sp, /*now=*/true);
      });
    }
    return;
  }
  if (s.ack_timer_armed) {
    engine_.cancel_timer(s.ack_timer);
    s.ack_timer_armed = false;
  }
  s.chunks_acked = s.chunks_finished;
  // The last frame queued is an ACK not yet begun: raise it instead of queueing another.
  const bool back_begun = s.ctrlq.size() == 1 && s.ctrl_written > 0;
  if (!s.ctrlq.empty() && !back_begun && load_le64(s.ctrlq.back().data() + 8) == kControlAck) {
    write_control_frame(kControlAck, s.chunks_acked, s.ctrlq.back().data());
    return;
  }
  send_control(s, kControlAck, s.chunks_acked);
}

Status PeerCore::on_control(Stream& s, const ChunkHeader& h) {
  if (s.opener.sealed()) {
    // Sealed streams carry only the liveness frames (no ACKs or NACKs: a sealed chunk that
    // fails its tag fails the connection), each authenticated like a chunk.
    if (h.tag != kControlPing && h.tag != kControlPong)
      return corrupt_data(stream_name(s) + ": a control frame of kind " + std::to_string(h.tag) +
                          " on a sealed stream");
    auto authentic = s.opener.open_control(s.header);
    if (!authentic)
      return Status(authentic.status().code(),
                    stream_name(s) + ": " + authentic.status().message());
    if (!*authentic)
      return corrupt_data(stream_name(s) +
                          ": a control frame failed authentication (altered, dropped, repeated "
                          "or reordered)");
  }
  if (h.tag == kControlPing) {
    send_control(s, kControlPong, h.seq);
    return Status::ok();
  }
  if (h.tag == kControlPong) {
    const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
        FailureDetector::Clock::now().time_since_epoch());
    const auto sent = static_cast<int64_t>(h.seq & ~uint64_t{1});
    const bool queued = (h.seq & 1) != 0;  // sent behind data (check_alive): not a sample
    // A round trip from this side's own clock; anything implausible is not a sample.
    if (!queued && sent > 0 && sent <= now.count() && now.count() - sent < int64_t{60} * 1000000000)
      alive_.rtt_sample(std::chrono::nanoseconds(now.count() - sent));
    return Status::ok();  // heard: read_stream counted its bytes
  }
  const uint64_t end = s.retained_base + s.retained.size();
  if (h.tag == kControlAck) {
    if (h.seq < s.retained_base || h.seq > end)
      return corrupt_data(stream_name(s) + ": ACK of chunk " + std::to_string(h.seq) +
                          " outside the chunks written and not yet acknowledged [" +
                          std::to_string(s.retained_base) + ", " + std::to_string(end) + ")");
    while (s.retained_base < h.seq) {
      Retained& r = s.retained.front();
      if (r.borrowed) --r.borrowed->retained;
      give_copy(std::move(r.copy), r.fields.chunk_len);
      s.retained.pop_front();
      ++s.retained_base;
    }
    check_flushed();
    return Status::ok();
  }
  // NACK: the receiver's check of chunk h.seq on this stream failed; it has not acknowledged
  // it (an ACK comes after the NACKs of the chunks it covers), so it is still here.
  if (h.seq < s.retained_base || h.seq >= end)
    return corrupt_data(stream_name(s) + ": request to send chunk " + std::to_string(h.seq) +
                        " again, outside the chunks written and not yet acknowledged [" +
                        std::to_string(s.retained_base) + ", " + std::to_string(end) + ")");
  Retained& r = s.retained[h.seq - s.retained_base];
  // A receiver asks for a chunk at most kMaxChunkResends times, then fails its message: more
  // NACKs are not ours (an unauthenticated frame injected on the path would otherwise buy a
  // chunk-sized re-send each).
  if (++r.resends > kMaxChunkResends)
    return corrupt_data(stream_name(s) + ": chunk " + std::to_string(h.seq) + " asked for again " +
                        std::to_string(r.resends) + " times, more than a receiver asks (" +
                        std::to_string(kMaxChunkResends) + ")");
  auto op = std::make_shared<SendOp>();
  op->req = std::make_shared<RequestState>();  // nobody waits: the receiver's irecv does
  op->what = "re-send of tag " + std::to_string(r.fields.tag) + " (seq " +
             std::to_string(r.fields.seq) + ", offset " + std::to_string(r.fields.offset) +
             ") to " + name_;
  op->chunks_left = op->departs_left = 1;
  OutChunk c;
  c.op = std::move(op);
  c.fields = r.fields;
  c.fields.flags = 0;
  c.len = r.fields.chunk_len;
  if (c.len) {
    c.owned = take_copy(c.len);
    std::memcpy(c.owned.get(), r.data, c.len);
  }
  c.data = c.owned.get();
  resent_chunks_.fetch_add(1, std::memory_order_relaxed);
  LOWCOMM_LOG(
      kInfo, "%s: sending again the chunk [%llu, +%u) of the message on tag %llu (seq %llu)",
      stream_name(s).c_str(), static_cast<unsigned long long>(r.fields.offset), c.len,
      static_cast<unsigned long long>(r.fields.tag), static_cast<unsigned long long>(r.fields.seq));
  if (link_) {  // across the emulated link like any chunk
    (void)link_->submit(std::move(c), PaceClock::now());
    run_link();
  } else {
    enqueue(std::move(c));
  }
  return Status::ok();
}

void PeerCore::note_received(Stream& s) {
  // What the kernel took in since the last read event, in the span between the two (emulated
  // links record each chunk as it passes the downlink instead: finish_payload).
  if (!metered_) return;
  const uint64_t total = kernel_bytes_received(s.fd.get());
  if (total == 0) return;  // not known (yet): no sample, and the count is not reset
  const auto now = PaceClock::now();
  if (total > s.kernel_received && s.kernel_received_at != PaceClock::time_point{})
    engine_.down_meter().record(s.kernel_received_at, now, total - s.kernel_received);
  s.kernel_received = total;
  s.kernel_received_at = now;
}

void PeerCore::do_read(Stream& s) {
  if (ping_interval_.count() > 0) alive_.heard(FailureDetector::Clock::now());
  read_stream(s);
  maybe_ack(s);
}

void PeerCore::read_stream(Stream& s) {
  if (!link_) note_received(s);
  uint64_t moved = 0;
  while (moved < kMaxBytesPerEvent && failure_.is_ok()) {
    long n;
    if (!s.cur) {
      n = LOWCOMM_SYS_RETRY(
          ::recv(s.fd.get(), s.header + s.header_got, kChunkHeaderBytes - s.header_got, 0));
    } else {
      uint64_t want = std::min<uint64_t>(s.payload_left, kMaxBytesPerEvent);
      uint8_t* into = s.dst;
      if (!into) {  // a discarded message: read and drop
        want = std::min<uint64_t>(want, sizeof(sink_));
        into = sink_;
      }
      n = LOWCOMM_SYS_RETRY(::recv(s.fd.get(), into, want, 0));
      if (n > 0) {
        if (Status st = open_payload(s, into, static_cast<size_t>(n)); !st) {
          fail(st);
          return;
        }
      }
    }
    if (n == 0) {
      // An orderly close reaches each stream on its own: one stream's end, at a chunk
      // boundary, while the others still deliver their last chunks, loses nothing. The peer
      // is gone when every stream has ended, or at once when one ends inside a chunk or with
      // our data still queued for it.
      // Messages that fully arrived but still cross the emulated downlink complete first.
      const bool cut = s.cur || s.header_got > 0 || !s.sendq.empty();
      if (s.watching) {
        engine_.unwatch(s.watch_id);
        s.watching = false;
      }
      if (cut || ++ended_streams_ == streams_.size()) {
        Status closed(StatusCode::kRemoteError, stream_name(s) + ": connection closed by the peer");
        if (cut || held_.empty())
          fail(std::move(closed), /*keep_arrived=*/true, /*orderly=*/!cut);
        else
          remote_closed_ = std::move(closed);
      }
      return;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      const int err = errno;
      fail(socket_error("recv", stream_name(s), err), peer_went_away(err));
      return;
    }
    moved += static_cast<uint64_t>(n);
    if (!s.cur) {
      s.header_got += static_cast<size_t>(n);
      if (s.header_got < kChunkHeaderBytes) continue;
      s.header_got = 0;
      Status st = on_header(s);
      if (!st) {
        fail(st);
        return;
      }
    } else {
      if (s.dst) s.dst += n;
      s.payload_left -= static_cast<uint64_t>(n);
      if (s.payload_left == 0) finish_payload(s);
    }
  }
}

Status PeerCore::on_header(Stream& s) {
  auto h = parse_chunk_header(s.header, stream_name(s));
  if (!h) return h.status();
  if (h->flags & kChunkFlagControl) return on_control(s, *h);
  if (((h->flags & kChunkFlagSealed) != 0) != s.opener.sealed())
    return corrupt_data(stream_name(s) + (s.opener.sealed()
                                              ? ": an unsealed chunk on a sealed stream"
                                              : ": a sealed chunk on an unsealed stream"));
  if (Status st = s.opener.begin(s.header); !st)
    return Status(st.code(), stream_name(s) + ": " + st.message());
  if (h->chunk_len > config_.chunk_bytes && h->chunk_len > (64u << 20))
    return corrupt_data(stream_name(s) + ": chunk of " + std::to_string(h->chunk_len) +
                        " bytes is implausibly large");
  MsgKey key{h->tag, h->seq};
  auto& slot = in_msgs_[key];
  if (!slot) {
    slot = std::make_shared<InMsg>();
  }
  InMsg& m = *slot;
  if (!m.has_header) {
    if (m.req && !fits(m, h->msg_len)) reject_length(m, h->tag, h->msg_len);
    if (!m.req && !m.discard) {
      // Nobody posted yet: buffer it, within the peer's allowance for unexpected data. Each
      // message is charged its bookkeeping too, so empty ones cannot pile up without bound.
      const uint64_t charge = h->msg_len + kUnexpectedOverheadBytes;
      if (charge >
          config_.max_unexpected_bytes - std::min(unexpected_bytes_, config_.max_unexpected_bytes))
        return Status(StatusCode::kCorruptData,
                      name_ + ": unexpected message of " + std::to_string(h->msg_len) +
                          " bytes on tag " + std::to_string(h->tag) +
                          " exceeds the unexpected-message allowance (post the irecv earlier)");
      unexpected_bytes_ += charge;
      m.buffer.reset(new uint8_t[h->msg_len]);  // non-null even for 0 bytes: marks it unexpected
    }
    m.has_header = true;
    m.msg_len = h->msg_len;
    if (!m.req && !m.discard) notify_watches(key);
  } else if (m.msg_len != h->msg_len) {
    return corrupt_data(stream_name(s) + ": chunks of one message disagree on its length");
  }
  // Chunks of one message must not overlap, counting those still being read on other streams:
  // an overlapping one would write into a buffer the message may already have completed into.
  if (h->chunk_len > 0) {
    const uint64_t begin = h->offset, end = h->offset + h->chunk_len;
    auto next = m.claimed.lower_bound(begin);
    bool overlaps = (next != m.claimed.end() && next->first < end) ||
                    (next != m.claimed.begin() && std::prev(next)->second > begin);
    if (overlaps)
      return corrupt_data(stream_name(s) + ": chunk [" + std::to_string(begin) + ", " +
                          std::to_string(end) + ") overlaps another chunk of the message on tag " +
                          std::to_string(h->tag));
    m.claimed.emplace(begin, end);
  } else if (m.msg_len > 0) {
    return corrupt_data(stream_name(s) + ": empty chunk in a non-empty message on tag " +
                        std::to_string(h->tag));
  }
  uint8_t* base = m.buffer ? m.buffer.get() : m.discard ? nullptr : m.user;
  s.cur = slot;
  s.cur_key = key;
  s.cur_chunk_len = h->chunk_len;
  s.cur_offset = h->offset;
  s.dst = base ? base + h->offset : nullptr;
  s.payload_left = h->chunk_len;
  if (h->chunk_len == 0) finish_payload(s);
  return Status::ok();
}

void PeerCore::finish_payload(Stream& s) {
  auto good = s.opener.finish();
  const uint64_t chunk = s.opener.sealed() ? 0 : s.chunks_finished++;  // its number on s
  if (link_) {  // its bytes crossed the emulated downlink, intact or not
    const auto now = PaceClock::now();
    auto passed = link_->pass_downlink(kChunkHeaderBytes + s.cur_chunk_len, now);
    s.cur->ready_at = std::max(s.cur->ready_at, passed);
    const uint64_t bytes = kChunkHeaderBytes + s.cur_chunk_len;
    const auto end = std::max(now, passed);
    const auto busy = link_->downlink_time(bytes);
    if (!link_->link().local && busy.count() > 0)
      engine_.down_meter().record(end - busy, end, bytes);
  }
  if (!good || !*good) {
    payload_failures_.fetch_add(1, std::memory_order_relaxed);
    const std::string what = stream_name(s) + ": chunk [" + std::to_string(s.cur_offset) + ", +" +
                             std::to_string(s.cur_chunk_len) + ") of the message on tag " +
                             std::to_string(s.cur_key.first) + " (seq " +
                             std::to_string(s.cur_key.second) + ")";
    if (!good) {
      fail(Status(good.status().code(), what + ": " + good.status().message()));
      return;
    }
    if (s.opener.sealed()) {
      // Altered, dropped, repeated, reordered or moved: the stream cannot be trusted further.
      fail(Status(StatusCode::kCorruptData,
                  what + " failed AES-256-GCM authentication (altered, dropped, repeated or "
                         "reordered in transit)"));
      return;
    }
    InMsg& m = *s.cur;
    int& asked = m.asked[s.cur_offset];
    if (!m.discard && m.corrupt.is_ok() && asked < kMaxChunkResends) {
      // Noise, and the sender still has the bytes: ask again. The range is free for the
      // re-sent chunk; the message completes only when it has come and passed its check.
      ++asked;
      ++m.resent;
      resend_requests_.fetch_add(1, std::memory_order_relaxed);
      m.claimed.erase(s.cur_offset);
      LOWCOMM_LOG(kWarn,
                  "%s: payload checksum mismatch (corrupted in transit); asked the peer to send "
                  "it again (%d of %d)",
                  what.c_str(), asked, kMaxChunkResends);
      s.cur.reset();
      send_control(s, kControlNack, chunk);
      return;
    }
    if (!m.discard) {
      LOWCOMM_LOG(kWarn, "%s: payload checksum mismatch (corrupted in transit)", what.c_str());
      if (m.corrupt.is_ok())
        m.corrupt = Status(StatusCode::kCorruptData,
                           what + ": payload checksum (XXH3-128) mismatch: corrupted in transit " +
                               std::to_string(asked + 1) + " times (sent again " +
                               std::to_string(asked) + " times)");
    }
  }
  s.cur->received += s.cur_chunk_len;
  s.cur.reset();
  try_complete(s.cur_key);
}

void PeerCore::try_complete(const MsgKey& key) {
  auto it = in_msgs_.find(key);
  if (it == in_msgs_.end()) return;
  InMsg& m = *it->second;
  if (m.discard && m.has_header && m.received == m.msg_len) {  // dropped, all of it read
    if (m.buffer) unexpected_bytes_ -= m.msg_len + kUnexpectedOverheadBytes;
    in_msgs_.erase(it);
    return;
  }
  if (!m.req || !m.has_header || m.received != m.msg_len) return;
  if (m.resent) m.req->set_resent_chunks(m.resent);
  if (!m.corrupt.is_ok()) {  // nothing of it reaches a buffered receive's user buffer
    if (m.buffer) unexpected_bytes_ -= m.msg_len + kUnexpectedOverheadBytes;
    m.req->complete(Status(m.corrupt.code(), m.what + ": " + m.corrupt.message()));
    in_msgs_.erase(it);
    return;
  }
  if (m.buffer) {
    if (m.msg_len) std::memcpy(m.user, m.buffer.get(), m.msg_len);
    unexpected_bytes_ -= m.msg_len + kUnexpectedOverheadBytes;
    m.buffer.reset();
  }
  if (m.ready_at > PaceClock::now()) {
    // Still crossing the emulated downlink: complete it when it has passed.
    const uint64_t hold = ++held_seq_;
    Held& h = held_[hold];
    h.msg = std::move(it->second);
    in_msgs_.erase(it);
    auto self = shared_from_this();
    h.timer = engine_.add_timer(h.msg->ready_at, [self, hold] { self->release_held(hold); });
    return;
  }
  m.req->complete(Status::ok(), m.msg_len);
  in_msgs_.erase(it);
}

void PeerCore::release_held(uint64_t key) {
  auto it = held_.find(key);
  if (it == held_.end()) return;  // failed meanwhile
  std::shared_ptr<InMsg> m = std::move(it->second.msg);
  held_.erase(it);
  m->req->complete(Status::ok(), m->msg_len);
  if (!remote_closed_.is_ok() && held_.empty())
    fail(remote_closed_, /*keep_arrived=*/true, /*orderly=*/true);
}

void PeerCore::irecv(uint64_t tag, uint8_t* data, uint64_t len, bool up_to,
                     std::shared_ptr<RequestState> req, bool standing) {
  std::string what = "irecv tag " + std::to_string(tag) + " (" + (up_to ? "up to " : "") +
                     std::to_string(len) + " bytes) from " + name_;
  if (!failure_.is_ok()) {
    // Failed: only a message that had arrived whole (kept by fail()) can still be received.
    auto it = in_msgs_.find({tag, recv_post_seq_[tag]});
    if (it == in_msgs_.end() || !arrived_unclaimed(*it->second)) {
      req->complete(Status(failure_.code(), what + ": " + failure_.message()));
      return;
    }
  }
  uint64_t seq = recv_post_seq_[tag]++;
  MsgKey key{tag, seq};
  auto& slot = in_msgs_[key];
  if (!slot) slot = std::make_shared<InMsg>();
  InMsg& m = *slot;
  m.req = std::move(req);
  m.what = std::move(what);
  m.user = data;
  m.posted_len = len;
  m.up_to = up_to;
  m.standing = standing;
  if (m.has_header && !fits(m, m.msg_len)) reject_length(m, tag, m.msg_len);
  try_complete(key);
}

bool PeerCore::cancel(const std::shared_ptr<RequestState>& req) {
  if (req->done()) return true;
  for (auto it = in_msgs_.begin(); it != in_msgs_.end(); ++it) {
    InMsg& m = *it->second;
    if (m.req != req) continue;
    // Chunks already written into the user's buffer: it cannot be given back before the end.
    if (m.has_header && !m.buffer) return false;
    // Not begun, or arriving into a buffer of its own (unexpected until this receive claimed
    // it): drop it as it comes, or now if it is whole.
    m.req->complete(Status(StatusCode::kAborted, m.what + ": cancelled"));
    m.req.reset();
    m.user = nullptr;
    m.discard = true;
    try_complete(it->first);
    return true;
  }
  // Whole and written, crossing the emulated downlink (held_): it completes when that passes.
  return req->done();
}

void PeerCore::watch(uint64_t tag, std::shared_ptr<ArrivalWatch> w) {
  if (w->done()) return;
  auto next = recv_post_seq_.find(tag);
  auto msg = in_msgs_.find({tag, next == recv_post_seq_.end() ? 0 : next->second});
  if (msg != in_msgs_.end() && msg->second->has_header && !msg->second->req) {
    w->report(remote_rank_);
    return;
  }
  auto& list = watches_[tag];
  std::erase_if(list, [](const auto& x) { return x->done(); });
  list.push_back(std::move(w));
}

void PeerCore::notify_watches(const MsgKey& key) {
  auto it = watches_.find(key.first);
  if (it == watches_.end()) return;
  auto next = recv_post_seq_.find(key.first);
  if (key.second != (next == recv_post_seq_.end() ? 0 : next->second)) return;
  for (auto& w : it->second) w->report(remote_rank_);
  watches_.erase(it);
}

void PeerCore::reject_length(InMsg& m, uint64_t tag, uint64_t msg_len) {
  // The application's error, not the stream's: fail that receive, drop the message's bytes as
  // they come, and keep the connection (the layers above still talk over it, e.g. to tell the
  // sender why).
  m.req->complete(corrupt_data(m.what + ": length mismatch: irecv posted " +
                               std::to_string(m.posted_len) + " bytes but the message on tag " +
                               std::to_string(tag) + " has " + std::to_string(msg_len) + " bytes"));
  m.req.reset();
  m.discard = true;
}

void PeerCore::fail(Status why, bool keep_arrived, bool orderly) {
  if (failure_.is_ok()) {
    failure_ = std::move(why);
    // This side's own abort or close is not news, nor the peer's orderly close (torchft aborts
    // its group at every quorum change: a WARN on every peer each time); a failure of the
    // connection is.
    if (failure_.code() == StatusCode::kAborted || closing_ || orderly) {
      LOWCOMM_LOG(kInfo, "%s", failure_.to_string().c_str());
    } else {
      LOWCOMM_LOG(kWarn, "%s", failure_.to_string().c_str());
    }
    // Shut the sockets down (not close: the fds stay ours until shutdown()) so the remote side
    // sees EOF and fails its requests too, instead of waiting for data that will never come.
    for (auto& s : streams_) {
      if (s.fd) ::shutdown(s.fd.get(), SHUT_RDWR);
      if (s.watching) {
        engine_.unwatch(s.watch_id);
        s.watching = false;
      }
    }
  }
  auto fail_req = [&](RequestState& r, const std::string& what) {
    r.complete(Status(failure_.code(), what + ": " + failure_.message()));
  };
  for (auto& s : streams_) {
    for (auto& c : s.sendq) fail_req(*c.op->req, c.op->what);
    s.sendq.clear();
    s.queued_bytes = 0;
    s.ctrlq.clear();
    s.ctrl_written = 0;
    s.retained.clear();  // nothing is sent again after a failure
    if (s.ack_timer_armed) {
      engine_.cancel_timer(s.ack_timer);
      s.ack_timer_armed = false;
    }
    s.cur.reset();
  }
  if (link_) link_->drain([&](OutChunk& c) { fail_req(*c.op->req, c.op->what); });
  if (link_timer_armed_) {
    engine_.cancel_timer(link_timer_);
    link_timer_armed_ = false;
  }
  if (alive_timer_armed_) {
    engine_.cancel_timer(alive_timer_);
    alive_timer_armed_ = false;
  }
  for (uint64_t t : control_timers_) engine_.cancel_timer(t);
  control_timers_.clear();
  // After the peer's close or reset (keep_arrived), a message that arrived whole and that no
  // irecv has claimed yet stays: the peer sent it before it went, so an irecv posted later
  // still receives it (a goodbye read after the connection's end). The rest fail or go, and
  // any other failure (an abort here, a corrupt or unauthenticated stream) drops everything.
  // A tag whose claimed receive fails here keeps nothing (the unclaimed messages come after
  // it: an irecv must not succeed after an earlier one on its tag failed).
  unexpected_bytes_ = 0;
  std::set<uint64_t> failed_tags;
  for (const auto& [key, m] : in_msgs_)
    if (m->req) failed_tags.insert(key.first);
  for (auto it = in_msgs_.begin(); it != in_msgs_.end();) {
    InMsg& m = *it->second;
    if (m.req) fail_req(*m.req, m.what);
    if (keep_arrived && arrived_unclaimed(m) && !failed_tags.count(it->first.first)) {
      unexpected_bytes_ += m.msg_len + kUnexpectedOverheadBytes;
      ++it;
    } else {
      it = in_msgs_.erase(it);
    }
  }
  for (auto& [key, h] : held_) {
    engine_.cancel_timer(h.timer);
    fail_req(*h.msg->req, h.msg->what);
  }
  held_.clear();
  for (auto& w : flush_waiters_) fail_req(*w, "flush to " + name_);
  flush_waiters_.clear();
}

void PeerCore::shutdown(Status why) {
  fail(std::move(why));
  shut_down_ = true;
  watches_.clear();
  for (auto& s : streams_) s.fd.reset();
}

}  // namespace lowcomm::transport
