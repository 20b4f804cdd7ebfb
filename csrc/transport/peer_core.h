#pragma once
// PeerCore: the engine-side state of one peer: its streams, send queues, posted and unexpected
// receives, and (under LOWCOMM_WAN only) the link emulator it hands its chunks to. Every member
// function except the constructor runs on the engine thread (Peer posts to it), so nothing here
// takes a lock; requests are completed through their own locked RequestState.
//
// Send path: isend splits a message into chunks of config.chunk_bytes (one empty chunk for a
// zero-byte message). On a real link each chunk goes straight to the stream with the fewest
// queued bytes among the first stripe_ streams (path_model.h: as many as the path needs).
// Emulated (link_emulator.h), the emulator gives each chunk its stream and deliver time (it
// models each stream's TCP window) and holds it until a timer releases it to that stream. A send
// completes when its last chunk is written to a socket; shaped, when its last chunk has left the
// sender's end of the emulated link (its bytes are copied then and written at the deliver time), as
// a kernel socket takes bytes long before they arrive: consecutive sends pay the link's delay once,
// not once each, and only a bandwidth-delay product of copies is held.
//
// Receive path: each stream reads a header, validates it, then reads the payload directly into
// the posted user buffer at the chunk's offset (zero-copy), or into a buffer for a message that
// no irecv has claimed yet. Messages match by (tag, per-tag sequence number), so chunks of one
// message may arrive on any stream in any order.
//
// Payload checks (payload_guard.h): a chunk's check is filled when it is queued on its stream
// (sealed: its payload is encrypted into a copy then, in that stream's record order), and
// verified as its bytes are read. A sealed chunk that fails its tag fails the connection:
// someone is altering, dropping, repeating or reordering its records.
//
// Re-sends (unsealed streams): an integrity mismatch is noise, and the sender still has the
// bytes. The receiver sends a NACK for the chunk on the stream it came on (control frames,
// chunk_header.h), forgets the chunk's range and keeps the message open; the sender queues the
// chunk again. Each stream's data chunks are numbered in the order they are written (both ends
// count them); the sender keeps every chunk it wrote until the receiver ACKs it (cumulative: once
// 16 chunks are finished or 1 ms after the first unacknowledged one), referring to the user's
// buffer while its isend is in flight and to a copy of the unacknowledged chunks (at most what
// is in flight) once the isend completes; emulated, to the copy the link made at departure.
// Copies are chunk-sized buffers reused from a small pool (no page faults per copy). A chunk asked
// again kMaxChunkResends times fails its message as before (kCorruptData naming the peer and
// stream; a buffered one never reaches the user buffer) and the connection carries on, its framing
// intact. Control frames jump the data queue at chunk boundaries.
//
// Liveness (config.failure_timeout > 0; on sealed streams the PINGs and PONGs are sealed too): a
// frozen process (SIGSTOP, a hung host) or a cut path keeps its sockets open, and its kernel may
// even take our bytes, so no error ever comes. While an operation waits on this peer (a posted
// receive not yet complete, other than a standing one, or data queued for it), the peer must be
// heard: any bytes it sends
// count, and when it has been silent for an interval (a fifth of the floor, 10-500 ms) stream 0
// carries a PING, which the peer's engine answers with a PONG at once, whatever its caller is doing
// (a rank still busy before its collective is alive). Silent past the FailureDetector's timeout
// (the floor, or more on a slow round trip: failure_detector.h), the peer fails with kRemoteError
// "frozen or cut off: silent for N ms while an operation waits on it". An idle peer is never
// pinged, and on a busy link the data itself is the heartbeat: a ping goes out only after a
// silence. Not while this side is behind itself: bytes waiting unread in a socket count as heard,
// and a tick that comes more than an interval late (this process was stopped or starved of CPU)
// starts the count again.
//
// Failure: the first error (EOF on every stream or inside a chunk, reset, bad header, abort)
// latches in failure_; every
// outstanding and later request fails with it (except, after the peer's close or reset, an
// irecv of a message that had arrived whole, unclaimed, on a tag with no failed receive), and
// the sockets are shut down so the remote side fails too. A message whose length differs from its
// irecv's fails only that irecv: its bytes are read and dropped, and the connection carries on.

#include <array>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/unique_fd.h"
#include "transport/arrival_watch.h"
#include "transport/chunk_header.h"
#include "transport/failure_detector.h"
#include "transport/link_emulator.h"
#include "transport/out_chunk.h"
#include "transport/peer_config.h"
#include "transport/progress_engine.h"
#include "transport/request.h"
#include "transport/stream_socket.h"

namespace lowcomm::transport {

class PeerCore : public std::enable_shared_from_this<PeerCore> {
 public:
  PeerCore(ProgressEngine& engine, std::vector<StreamSocket> fds, int remote_rank,
           std::string remote_address, PeerConfig config);

  const std::string& name() const { return name_; }  // "peer rank R (addr)"
  int stripe_streams() const { return stripe_; }     // set by the constructor
  // Chunks whose payload failed its check so far (any thread).
  uint64_t payload_failures() const { return payload_failures_.load(std::memory_order_relaxed); }
  // Chunks this side asked the peer to send again, and chunks it sent again when the peer asked
  // (any thread).
  uint64_t resend_requests() const { return resend_requests_.load(std::memory_order_relaxed); }
  uint64_t resent_chunks() const { return resent_chunks_.load(std::memory_order_relaxed); }
  uint64_t copy_bytes_allocated() const {
    return copy_bytes_allocated_.load(std::memory_order_relaxed);
  }
  // How often one chunk is asked for again before its message fails.
  static constexpr int kMaxChunkResends = 3;
  // What the kernel may hold unsent per stream (TCP_NOTSENT_LOWAT): a control frame queued now
  // waits behind at most this and the chunk being written (at 20 Mbit/s, 0.4 s + 0.2 s; well
  // inside the failure timeout's 1.5 s floor), and on a fast link it is a fraction of a
  // millisecond of data, refilled on each write event.
  static constexpr int kUnsentBytes = 1 << 20;
  // A PING that finds more than this unsent in the kernel (or data in lowcomm's queue) is not
  // a round-trip sample: it measures the queue (check_alive).
  static constexpr int kUnsentSampleBytes = 16 << 10;

  // --- engine thread only ---
  void start();  // registers the streams with the engine
  void isend(uint64_t tag, const uint8_t* data, uint64_t len, std::shared_ptr<RequestState> req);
  // up_to: len is a capacity (Peer::irecv_upto), not the exact length. standing: posted for
  // the peer's life (Peer::irecv_standing), no sign that anything waits on the peer.
  void irecv(uint64_t tag, uint8_t* data, uint64_t len, bool up_to,
             std::shared_ptr<RequestState> req, bool standing = false);
  // Peer::cancel: withdraws a receive whose message has not begun to arrive into its buffer.
  bool cancel(const std::shared_ptr<RequestState>& req);
  // Reports to `w` (this peer's rank) when the next unclaimed message on `tag` has arrived:
  // now, if it already has (arrival_watch.h).
  void watch(uint64_t tag, std::shared_ptr<ArrivalWatch> w);
  // Completes `req` once nothing sent so far waits in a send queue or the emulator (Peer::flush).
  void flush(std::shared_ptr<RequestState> req);
  // Latches `why` (if nothing is latched yet) and fails everything pending; idempotent.
  // keep_arrived (the peer closed or reset): whole messages no irecv claimed yet stay receivable.
  // `orderly`: the peer closed every stream at a chunk boundary (its abort or destroy, whose
  // reason the layer above reads from its notice): logged as INFO, not as a WARN.
  void fail(Status why, bool keep_arrived = false, bool orderly = false);
  // A later failure is an agreed close: logged at INFO.
  void expect_close() { closing_ = true; }
  // fail(aborted) and release the sockets and timers; after it the engine holds no reference.
  void shutdown(Status why);

 private:
  struct InMsg {
    std::shared_ptr<RequestState> req;  // null until an irecv claims it
    std::string what;                   // "irecv tag T (N bytes)"
    uint8_t* user = nullptr;
    uint64_t posted_len = 0;
    bool up_to = false;       // posted_len is a capacity: any message up to it fits
    bool standing = false;    // Peer::irecv_standing: not awaited (liveness)
    bool has_header = false;  // at least one chunk header seen
    uint64_t msg_len = 0;
    uint64_t received = 0;
    std::map<uint64_t, uint64_t> claimed;  // [offset, end) of every chunk whose header came
    // Set iff the message arrived before its irecv (buffered, charged to the allowance) until
    // it completes; not zero-filled: the chunks cover it first.
    std::unique_ptr<uint8_t[]> buffer;
    bool discard = false;  // its irecv failed on the length: drop it when read
    Status corrupt;        // a chunk failed its integrity check too often: the message fails
    std::map<uint64_t, int> asked;  // chunk offset -> times asked again (re-sends)
    uint64_t resent = 0;            // chunks of it asked again
    // Emulated site model: when its last chunk has passed this rank's downlink (it completes
    // then).
    PaceClock::time_point ready_at{};
  };
  // Whole, intact, and not yet claimed by an irecv (buffered as unexpected).
  static bool arrived_unclaimed(const InMsg& m) {
    return !m.req && m.buffer && !m.discard && m.has_header && m.received == m.msg_len &&
           m.corrupt.is_ok();
  }
  // A chunk written on an unsealed stream, kept until the receiver ACKs it (re-sends).
  struct Retained {
    ChunkHeader fields;
    const uint8_t* data = nullptr;  // the user's buffer (borrowed) or copy
    std::unique_ptr<uint8_t[]> copy;
    SendOp* borrowed = nullptr;  // the isend whose buffer `data` points into, until it ends
    int resends = 0;             // times the receiver asked for it again (at most
                                 // kMaxChunkResends: it gives up after that many)
  };
  struct Stream {
    int index = 0;
    UniqueFd fd;
    PayloadSealer sealer;  // this stream's outgoing chunk checks
    PayloadOpener opener;  // and incoming
    uint64_t watch_id = 0;
    bool watching = false;
    bool want_write = false;
    std::deque<OutChunk> sendq;
    uint64_t queued_bytes = 0;
    // Control frames to send (ACKs and NACKs), ahead of data at chunk boundaries.
    std::deque<std::array<uint8_t, kChunkHeaderBytes>> ctrlq;
    size_t ctrl_written = 0;  // of ctrlq.front()
    // Re-sends, send side: data chunks written (numbered from 0) and the unacknowledged ones,
    // retained[i] being chunk retained_base + i.
    uint64_t chunks_written = 0;
    uint64_t retained_base = 0;
    std::deque<Retained> retained;
    // Receive side: data chunks finished (verified, or asked again) and the count last ACKed.
    uint64_t chunks_finished = 0;
    uint64_t chunks_acked = 0;
    bool ack_timer_armed = false;
    uint64_t ack_timer = 0;
    // Unshaped: the kernel's received-bytes count at the last read event (note_received).
    uint64_t kernel_received = 0;
    PaceClock::time_point kernel_received_at{};
    // receive state
    uint8_t header[kChunkHeaderBytes];
    size_t header_got = 0;
    std::shared_ptr<InMsg> cur;  // message whose payload is being read; null while in header
    uint8_t* dst = nullptr;
    uint64_t payload_left = 0;
    std::pair<uint64_t, uint64_t> cur_key{};
    uint32_t cur_chunk_len = 0;
    uint64_t cur_offset = 0;
  };
  using MsgKey = std::pair<uint64_t, uint64_t>;  // (tag, seq)

  void on_event(Stream& s, uint32_t events);
  void do_write(Stream& s);
  // Unshaped: records what the kernel received on s since the last read event in the engine's
  // down_meter (arrival_meter.h).
  void note_received(Stream& s);
  void do_read(Stream& s);
  void read_stream(Stream& s);
  Status on_header(Stream& s);
  // A control frame from the peer (ACK or NACK of chunks this side wrote on s).
  Status on_control(Stream& s, const ChunkHeader& h);
  // Queues a control frame on s and tries to write it.
  void send_control(Stream& s, uint64_t kind, uint64_t arg);
  void write_control(Stream& s, uint64_t kind, uint64_t arg);  // now, past any emulated link
  // After a read event: ACK the chunks finished since the last ACK, now if they are many (or
  // `now`), else from a short timer.
  void maybe_ack(Stream& s, bool now = false);
  // A buffer for a copy of a chunk of len bytes (chunk-sized and reused when pooled_copy, else
  // len bytes), and its return.
  bool pooled_copy(uint32_t len) const;
  std::unique_ptr<uint8_t[]> take_copy(uint32_t len);
  void give_copy(std::unique_ptr<uint8_t[]> b, uint32_t len);
  // A chunk fully written on s: keep it for a re-send (unsealed streams).
  void retain(Stream& s, OutChunk& c);
  // op's last chunk is written: copy what is still retained from its buffer.
  void detach_retained(const SendOp& op);
  void finish_payload(Stream& s);
  void try_complete(const MsgKey& key);
  void release_held(uint64_t key);  // a held message's downlink time has come
  // The message `key` has begun to arrive unclaimed: report it to the watches on its tag if no
  // earlier message on that tag is still unclaimed.
  void notify_watches(const MsgKey& key);

 public:
  void set_link(const WanLink& link);  // Peer::set_link, on the engine thread
  // Whether what this peer's sockets receive counts toward the rank's link rate (kernel
  // sockets; emulated links meter themselves): not for a peer on the same host.
  void set_metered(bool metered) { metered_ = metered; }

 private:
  // Whether a message of msg_len bytes fits m's posted receive.
  static bool fits(const InMsg& m, uint64_t msg_len) {
    return m.up_to ? msg_len <= m.posted_len : msg_len == m.posted_len;
  }
  // m's posted receive disagrees with its message's length: fail the receive, drop the message.
  void reject_length(InMsg& m, uint64_t tag, uint64_t msg_len);
  void enqueue(OutChunk chunk);
  // Writes the chunk's header and check for stream s (sealed: encrypts it into a copy).
  Status protect(Stream& s, OutChunk& c);
  // The current chunk's payload bytes just read (into `into`, n bytes): checked or decrypted.
  Status open_payload(Stream& s, uint8_t* into, size_t n);
  // Runs the emulated link's due departures and deliveries and arms its timer (link_ only).
  void run_link();
  // An emulated chunk has left the sender's end: copy its bytes (sealed: encrypt them).
  Status depart(OutChunk& c);
  // Completes the flush waiters when every send queue and the emulator are empty and every chunk
  // written on an unsealed stream has been acknowledged.
  void check_flushed();
  void update_write_interest(Stream& s);
  std::string stream_name(const Stream& s) const;
  // The stream window and stripe width for this peer's path (constructor).
  void plan_streams();
  // Liveness: whether an operation waits on this peer, and the timer's tick (ping or fail).
  bool awaited() const;
  void check_alive();
  void arm_alive_timer();

  ProgressEngine& engine_;
  PeerConfig config_;
  int remote_rank_;
  std::string remote_address_;
  std::string name_;
  std::vector<Stream> streams_;
  size_t ended_streams_ = 0;  // streams the remote side has closed (EOF at a chunk boundary)
  bool metered_ = true;       // set_metered
  Status remote_closed_;      // every stream ended: fail once the held messages completed
  int stripe_ = 1;            // unshaped sends use streams [0, stripe_)
  // The emulated link (LOWCOMM_WAN), null on a real one: the production path never enters it.
  std::unique_ptr<LinkEmulator> link_;
  std::set<uint64_t> control_timers_;  // emulated: PINGs and PONGs crossing the link
  uint64_t link_timer_ = 0;
  bool link_timer_armed_ = false;
  PaceClock::time_point link_timer_at_{};       // when the armed timer fires
  std::map<uint64_t, uint64_t> send_seq_;       // tag -> next seq to send
  std::map<uint64_t, uint64_t> recv_post_seq_;  // tag -> next seq an irecv claims
  std::map<MsgKey, std::shared_ptr<InMsg>> in_msgs_;
  // Complete messages not to be delivered before their ready_at (the emulated downlink).
  struct Held {
    std::shared_ptr<InMsg> msg;
    uint64_t timer = 0;
  };
  std::map<uint64_t, Held> held_;
  uint64_t held_seq_ = 0;
  uint64_t unexpected_bytes_ = 0;
  std::map<uint64_t, std::vector<std::shared_ptr<ArrivalWatch>>> watches_;  // by tag
  std::vector<std::shared_ptr<RequestState>> flush_waiters_;
  uint8_t sink_[64 << 10];  // where discarded payload is read to
  Status failure_;
  Status setup_;  // the payload guards' set-up (constructor); start() fails the peer with it
  std::atomic<uint64_t> payload_failures_{0};
  std::vector<std::unique_ptr<uint8_t[]>> spare_copies_;  // take_copy / give_copy
  std::atomic<uint64_t> resend_requests_{0};
  std::atomic<uint64_t> resent_chunks_{0};
  std::atomic<uint64_t> copy_bytes_allocated_{0};  // take_copy's allocations, in bytes
  bool shut_down_ = false;
  bool closing_ = false;
  // Liveness (config_.failure_timeout > 0; else never armed).
  FailureDetector alive_{std::chrono::milliseconds(0), std::chrono::milliseconds(0)};
  std::chrono::milliseconds ping_interval_{0};
  uint64_t alive_timer_ = 0;
  bool alive_timer_armed_ = false;
  FailureDetector::Clock::time_point alive_due_{};  // when the armed tick is due
  std::atomic<uint64_t> pings_sent_{0};

 public:
  uint64_t pings_sent() const { return pings_sent_.load(std::memory_order_relaxed); }
};

}  // namespace lowcomm::transport
