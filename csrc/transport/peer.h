#pragma once
// Peer: N authenticated TCP streams to one remote rank, and asynchronous tagged messages over
// them. Created by connect (connector.h) or accept (listener.h), never directly by users.
//
//   Request r = peer->isend(tag, buf, len);   // buf must stay valid until r completes
//   Request q = peer->irecv(tag, out, len);   // out is written directly (no copy) as data arrives
//   Status s = r.wait(Deadline::after(5s));
//
// Messages on one tag match in order: the k-th isend on tag T meets the k-th irecv on tag T;
// different tags are independent. A receive's length must equal the message's length exactly;
// a mismatch fails that request (it means the two sides disagree on the protocol); irecv_upto
// takes any message up to its capacity.
//
// Thread safety: every method may be called from any thread. Operations are handed to the
// engine thread in call order. Failures stick: after the first error every outstanding and
// later request fails with a status naming the peer (rank and address) and the operation,
// except that after the peer's close or reset a message that had arrived whole before it is
// still received by a later irecv (docs/transport.md).
// abort() fails everything and returns once no user buffer is referenced any more. The
// destructor aborts, closes every socket, and does not return while the engine uses this peer.

#include <memory>
#include <string>

#include "transport/arrival_watch.h"
#include "transport/peer_config.h"
#include "transport/progress_engine.h"
#include "transport/request.h"
#include "transport/socket_options.h"
#include "transport/stream_socket.h"

namespace lowcomm::transport {

class PeerCore;

class Peer {
 public:
  // Takes ownership of authenticated, non-blocking stream sockets and their payload keys
  // (stream order matters: both sides must list them in the same order).
  static Result<std::unique_ptr<Peer>> attach(std::shared_ptr<ProgressEngine> engine,
                                              std::vector<StreamSocket> streams, int remote_rank,
                                              std::string remote_address, const PeerConfig& config);
  ~Peer();
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  Request isend(uint64_t tag, const void* data, uint64_t len);
  Request irecv(uint64_t tag, void* data, uint64_t len);
  // A receive that takes the next message on `tag` if it is at most `capacity` bytes (a larger
  // one fails this receive as irecv's length mismatch does); Request::received_bytes() says how
  // long it was. For protocols where the receiver knows only a bound (NCCL's).
  Request irecv_upto(uint64_t tag, void* data, uint64_t capacity);
  // A standing receive (irecv otherwise): one posted for the communicator's life on a channel
  // the peer writes only when it has news (the control channel). It says nothing about
  // whether an operation waits on the peer, so on its own it never makes the peer pinged or
  // failed as frozen (liveness, peer_core.h): a peer paused while only standing receives are
  // posted is no one's concern.
  Request irecv_standing(uint64_t tag, void* data, uint64_t len);
  // Withdraws a receive that has not begun to write its buffer: it completes with kAborted
  // ("cancelled") and its message, whenever it comes, is read and dropped (it still takes its
  // place in the tag's order, so later receives on the tag match as before). Returns true once
  // the request no longer references its buffer (also when it had completed already); false
  // when its message is arriving into the buffer: wait for the request, or abort the peer.
  bool cancel(const Request& recv);
  // Any-source receives: reports this peer's rank to `w` when the next message on `tag` that no
  // irecv has claimed has begun to arrive (arrival_watch.h). Claims nothing.
  void watch_arrival(uint64_t tag, std::shared_ptr<ArrivalWatch> w);
  // Blocking conveniences: isend/irecv then wait(deadline); on kTimeout they abort the peer
  // (the buffer must not stay in use after a blocking call returns).
  Status send(uint64_t tag, const void* data, uint64_t len, Deadline deadline = {});
  Status recv(uint64_t tag, void* data, uint64_t len, Deadline deadline = {});

  // Completes once every message sent before the call has been handed to the kernel in full
  // (shaped: has also left the emulated link's queue) and, on unsealed streams, the peer has
  // acknowledged every chunk (so none can still be asked for again: peer_core.h, "Re-sends"),
  // so closing the sockets then loses nothing. Fails if the peer fails first.
  Request flush();

  // Fails every outstanding and future request with kAborted; returns after the engine thread
  // has let go of every user buffer. Idempotent.
  void abort();

  // The owner is closing the connection by agreement (both sides said goodbye): the peer's end
  // of the connection is no longer news, so it is logged at INFO instead of WARN.
  void expect_close();

  // The emulated link to this peer from now on (a per-pair rule of LOWCOMM_WAN, known once the
  // peer's rank is): messages sent after the call are paced over it, on the same site links.
  void set_link(const WanLink& link);
  // Whether this peer's received bytes count toward the rank's measured link rate
  // (ArrivalMeter; default yes): not for a peer on the same host, whose bytes never cross a link.
  void set_metered(bool metered);

  int remote_rank() const { return remote_rank_; }
  const std::string& remote_address() const { return remote_address_; }
  const std::string& name() const { return name_; }  // "peer rank R (addr)"
  int streams() const { return streams_; }
  // How many of them a message is striped over (path_model.h).
  int stripe_streams() const;
  // Chunks received from this peer whose payload failed its check (payload_guard.h); of them,
  // those this side asked the peer to send again; and the chunks this side sent again because
  // the peer asked (peer_core.h, "Re-sends").
  uint64_t payload_failures() const;
  uint64_t resend_requests() const;
  uint64_t resent_chunks() const;
  // Bytes this side allocated for copies of chunks it keeps (for re-sends, sealing, the
  // emulated link): a chunk's copy is its own size below half a chunk, else a reused
  // chunk-sized buffer.
  uint64_t copy_bytes_allocated() const;
  // The socket buffers the kernel granted on stream 0 (what was asked: config.socket_buffer_bytes).
  SocketBufferSizes socket_buffers() const { return buffers_; }
  // The lowest round trip the kernel measured on this peer's streams while they were set up
  // (the SYN exchange and the handshake's messages; path_model.h), seconds; 0 if unknown. The
  // real path only: an emulated link's delay (set_link) is not in it.
  double setup_rtt_seconds() const { return setup_rtt_s_; }

 private:
  Peer() = default;
  std::shared_ptr<ProgressEngine> engine_;
  std::shared_ptr<PeerCore> core_;
  int remote_rank_ = -1;
  std::string remote_address_;
  std::string name_;
  int streams_ = 0;
  SocketBufferSizes buffers_;
  double setup_rtt_s_ = 0;
};

}  // namespace lowcomm::transport
