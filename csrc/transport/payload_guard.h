#pragma once
// The check on every chunk payload, one guard per stream and direction (chunk_header.h has the
// layout).
//
// Integrity (always on): the header carries XXH3-128 of the payload; the receiver hashes the
// bytes as they are read (cache-hot, in the same pass) and fails the message on a mismatch. It
// catches what TCP's 16-bit checksum lets through (corrupting NICs, middleboxes, memory), not an
// attacker: anyone on the path can recompute it.
//
// Sealed (PeerConfig::seal, LOWCOMM_ENCRYPT=1): AES-256-GCM. Each connection's stream has two
// keys of its own, one per direction, derived in the handshake from the communicator secret and
// both sides' fresh nonces (handshake.h), so no key is ever used on two streams or two
// connections. The 96-bit nonce is the record counter: 32 zero bits, then the 64-bit count of
// chunks sent on that stream in that direction, which both ends track; it is never sent, so a
// nonce never repeats under a key, and a chunk that is dropped, repeated, reordered, moved to
// another stream or altered fails its tag. The associated data is the chunk header [0, 48), so
// the header is authenticated too. The receiver decrypts in place as bytes arrive and verifies
// the tag when the chunk's last byte is in; a failure fails the whole connection (someone is
// tampering with it). Control frames (chunk_header.h; only PING and PONG on a sealed stream)
// are records of their own: no payload, the tag over their header, their nonces counted apart
// (first 32 bits 1, not 0), since they jump the data queue and so are written in another order
// than the chunks were sealed in; each kind of record is read back in the order it was written.
//
// Not thread-safe: each guard belongs to one stream on the engine thread.

#include <array>
#include <cstdint>
#include <memory>

#include "lowcomm/status.h"

namespace lowcomm::transport {

inline constexpr size_t kStreamKeyBytes = 32;

// What the handshake hands a stream: whether it is sealed and, if so, its two keys.
struct StreamKeys {
  bool sealed = false;
  std::array<uint8_t, kStreamKeyBytes> send{};  // this side -> peer
  std::array<uint8_t, kStreamKeyBytes> recv{};  // peer -> this side
};

// Send side.
class PayloadSealer {
 public:
  PayloadSealer();
  ~PayloadSealer();
  PayloadSealer(PayloadSealer&&) noexcept;
  PayloadSealer& operator=(PayloadSealer&&) noexcept;

  Status init(const StreamKeys& keys);  // once, before the first protect()
  bool sealed() const { return sealed_; }
  // header: bytes [0, 48) written (write_chunk_header, with kChunkFlagSealed iff sealed());
  // fills its check [48, 64). Integrity: hashes `in`; `out` is unused. Sealed: encrypts `len`
  // bytes of `in` into `out` (which may equal `in`) under the next record's nonce.
  Status protect(uint8_t* header, const uint8_t* in, uint8_t* out, size_t len);
  // A control frame's header (write_control_frame): sealed, its check becomes the tag over
  // [0, 48) under the next control nonce; else it stays zero.
  Status protect_control(uint8_t* header);

 private:
  struct Cipher;
  bool sealed_ = false;
  uint64_t records_ = 0;
  uint64_t control_records_ = 0;
  std::unique_ptr<Cipher> cipher_;
};

// Receive side: begin() with each validated header, update() with the payload bytes in order as
// they are read, then finish().
class PayloadOpener {
 public:
  PayloadOpener();
  ~PayloadOpener();
  PayloadOpener(PayloadOpener&&) noexcept;
  PayloadOpener& operator=(PayloadOpener&&) noexcept;

  Status init(const StreamKeys& keys);
  bool sealed() const { return sealed_; }
  Status begin(const uint8_t* header);
  // Integrity: hashes the bytes. Sealed: decrypts them in place.
  Status update(uint8_t* data, size_t len);
  // Whether the payload matches the header's check (sealed: the tag verifies).
  Result<bool> finish();
  // Whether a control frame's header is authentic (sealed: its tag verifies under the next
  // control nonce; unsealed: always). Only between chunks (not inside begin() .. finish()).
  Result<bool> open_control(const uint8_t* header);

 private:
  struct State;
  bool sealed_ = false;
  uint64_t records_ = 0;
  uint64_t control_records_ = 0;
  std::unique_ptr<State> state_;
};

}  // namespace lowcomm::transport
