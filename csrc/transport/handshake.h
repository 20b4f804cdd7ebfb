#pragma once
// StreamHandshake: the set-up of one TCP stream as a resumable state machine. advance() does
// only non-blocking I/O and returns as soon as the socket would block; call it again when the
// socket is ready (poll_events() says for what). Nothing here blocks or spawns threads.
//
// Protocol (all integers little-endian; docs/transport.md):
//   client -> server  Hello      magic "LCH1", u16 version (5), u16 stream index, u16 streams,
//                                u16 flags, u32 client rank, u64 connection id, 32-byte nonce Nc
//   server -> client  Challenge  magic "LCS1", u32 server rank, 32-byte nonce Ns, u16 flags,
//                                u16 zero, u32 zero,
//                                32-byte MACs = HMAC-SHA256(secret, "lowcomm server" | Hello |
//                                               Challenge bytes [0, 48))
//   client -> server  Proof      32-byte MACc = HMAC-SHA256(secret, "lowcomm client" | Hello |
//                                               Challenge)
// Each side proves knowledge of the secret over both nonces, so neither a replayed transcript
// nor a reflected MAC (the labels differ) passes, and the secret itself never crosses the wire.
// Any mismatch fails the handshake; the caller closes the socket and logs it.
//
// The client is done once its proof is sent, and may send data right behind it: a stream costs
// the client two round trips (connect, hello/challenge) before its first data byte, not three.
// The server reads nothing past the proof before it has checked it, so no data from a client
// that cannot prove the secret is ever read. A server that rejects the proof closes the
// connection, and the client learns it as that close on the data path, without the reason: a
// client whose challenge check passed holds the right secret, so only a forged or corrupted
// proof is rejected there (until version 4 the server answered an Accept, "LCOK", first).
//
// Flags bit 0 says the side seals its streams (LOWCOMM_ENCRYPT, payload_guard.h). Both sides
// must agree: the server answers a mismatched hello with its own flags, so both ends fail with
// an error that says which side has encryption on, and no data flows. Sealed, each side then
// derives the stream's two AES-256-GCM keys with HKDF-SHA256 (key: the secret; salt: Nc | Ns;
// info: "lowcomm v2 client to server" or "... server to client"): fresh per stream and per
// connection, never sent.

#include <poll.h>

#include <array>
#include <cstdint>
#include <string>

#include "core/deadline.h"
#include "core/unique_fd.h"
#include "lowcomm/status.h"
#include "transport/payload_guard.h"
#include "transport/stream_socket.h"

namespace lowcomm::transport {

inline constexpr size_t kHelloBytes = 56;
inline constexpr size_t kChallengeBytes = 80;
inline constexpr size_t kProofBytes = 32;

struct HelloInfo {
  uint32_t rank = 0;           // the client's rank
  uint16_t stream_index = 0;   // which of the connection's streams this is
  uint16_t streams = 0;        // how many streams the connection has
  uint64_t connection_id = 0;  // groups the streams of one connect attempt
  bool seal = false;           // the client seals its streams (flags bit 0)
};

class StreamHandshake {
 public:
  enum class Role { kClient, kServer };
  enum class State {
    kConnecting,     // client: non-blocking connect() in progress
    kSendHello,      // client
    kRecvHello,      // server
    kSendChallenge,  // server
    kRecvChallenge,  // client
    kSendProof,      // client
    kRecvProof,      // server
    kDone,
    kFailed,
  };

  // Client: fd has a connect() in progress (or completed); hello describes this stream.
  static StreamHandshake client(UniqueFd fd, std::string peer_name, const std::string& secret,
                                HelloInfo hello, Deadline deadline);
  // Server: fd was just accepted.
  static StreamHandshake server(UniqueFd fd, std::string peer_name, const std::string& secret,
                                uint32_t local_rank, bool seal, Deadline deadline);

  // Advances as far as the socket allows. Returns ok while in progress or when done; the error
  // (and state kFailed) when the peer failed authentication, broke the protocol, closed, or the
  // deadline passed.
  Status advance();
  State state() const { return state_; }
  bool done() const { return state_ == State::kDone; }
  bool failed() const { return state_ == State::kFailed; }
  short poll_events() const;  // POLLIN or POLLOUT for the current state
  int fd() const { return fd_.get(); }
  UniqueFd release_fd() { return std::move(fd_); }
  // After done(): the socket and its keys, for Peer::attach.
  StreamSocket release() { return StreamSocket{std::move(fd_), keys_}; }
  const std::string& peer_name() const { return peer_name_; }
  const Deadline& deadline() const { return deadline_; }
  // After done(): the client's hello (server side) and the server's rank (client side).
  const HelloInfo& hello() const { return hello_; }
  uint32_t server_rank() const { return server_rank_; }
  // After done(): the stream's payload keys (payload_guard.h); sealed is false unless both
  // sides seal.
  const StreamKeys& keys() const { return keys_; }
  // Client, after a failure: the server never said a word (the connect was refused, or the
  // connect, the hello or the wait for the challenge failed by timeout or reset before any
  // challenge byte arrived; a clean close after our hello is a rejection, not silence).
  // Then nobody is serving the port yet -- e.g. a root that opened its socket when it made the
  // id but has not reached init -- and the connect may be retried; an authentication failure
  // is never retried.
  bool server_silent() const { return server_silent_; }

 private:
  StreamHandshake(Role role, UniqueFd fd, std::string peer_name, const std::string& secret,
                  Deadline deadline);
  Status fail(Status s);
  // Writes out_[out_done_, out_len_); returns ok with *complete=false when it would block.
  Status write_pending(bool* complete);
  // Reads until in_done_ == want; same contract.
  Status read_exact(size_t want, bool* complete);
  // The flags mismatch message, from this side's point of view.
  std::string seal_mismatch(bool remote_seals) const;
  Status derive_keys();
  // The steps between messages (advance): the client's connect finished (*done false: not
  // yet); a whole hello read, checked, and the challenge built; a whole challenge read,
  // checked, and the proof built; a whole proof read and checked. An error fails the handshake.
  Status connected(bool* done);
  Status take_hello();
  Status take_challenge();
  Status take_proof();

  Role role_;
  State state_;
  bool server_silent_ = false;
  UniqueFd fd_;
  std::string peer_name_;
  std::string secret_;
  Deadline deadline_;
  HelloInfo hello_;
  uint32_t local_rank_ = 0;
  uint32_t server_rank_ = 0;
  bool seal_ = false;
  bool seal_mismatch_ = false;  // server: fail once the challenge (with our flags) is out
  StreamKeys keys_;
  std::array<uint8_t, kHelloBytes> hello_bytes_{};
  std::array<uint8_t, kChallengeBytes> challenge_bytes_{};
  std::array<uint8_t, kChallengeBytes> out_{};
  size_t out_len_ = 0, out_done_ = 0;
  std::array<uint8_t, kChallengeBytes> in_{};
  size_t in_done_ = 0;
};

}  // namespace lowcomm::transport
