#include "transport/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>
#include <sys/socket.h>

#include <cstring>

#include "core/little_endian.h"
#include "core/sys_check.h"

namespace lowcomm::transport {
namespace {

constexpr uint32_t kHelloMagic = 0x3148434Cu;      // "LCH1"
constexpr uint32_t kChallengeMagic = 0x3153434Cu;  // "LCS1"
// 3: control frames (re-sends); 4: PING/PONG (liveness); 5: no Accept message (handshake.h).
constexpr uint16_t kProtocolVersion = 5;
constexpr uint16_t kFlagSeal = 1;
constexpr size_t kChallengeSigned = 48;  // bytes of the challenge its MAC covers
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
constexpr char kServerLabel[] = "lowcomm server";
constexpr char kClientLabel[] = "lowcomm client";

// HMAC-SHA256(secret, label | a | b).
Status hmac3(const std::string& secret, const char* label, const uint8_t* a, size_t a_len,
             const uint8_t* b, size_t b_len, uint8_t out[kMacBytes]) {
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (!mac) return internal_error("OpenSSL: HMAC unavailable");
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                         OSSL_PARAM_construct_end()};
  size_t out_len = 0;
  bool ok =
      ctx &&
      EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(secret.data()), secret.size(),
                   params) == 1 &&
      EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(label), std::strlen(label)) == 1 &&
      EVP_MAC_update(ctx, a, a_len) == 1 && EVP_MAC_update(ctx, b, b_len) == 1 &&
      EVP_MAC_final(ctx, out, &out_len, kMacBytes) == 1 && out_len == kMacBytes;
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  return ok ? Status::ok() : internal_error("OpenSSL: HMAC-SHA256 failed");
}

// HKDF-SHA256(key = secret, salt, info) -> out.
Status hkdf(const std::string& secret, const uint8_t* salt, size_t salt_len, const char* info,
            uint8_t* out, size_t out_len) {
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  if (!kdf) return internal_error("OpenSSL: HKDF unavailable");
  EVP_KDF_CTX* ctx = EVP_KDF_CTX_new(kdf);
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string("digest", digest, 0),
      OSSL_PARAM_construct_octet_string("key", const_cast<char*>(secret.data()), secret.size()),
      OSSL_PARAM_construct_octet_string("salt", const_cast<uint8_t*>(salt), salt_len),
      OSSL_PARAM_construct_octet_string("info", const_cast<char*>(info), std::strlen(info)),
      OSSL_PARAM_construct_end()};
  bool ok = ctx && EVP_KDF_derive(ctx, out, out_len, params) == 1;
  EVP_KDF_CTX_free(ctx);
  EVP_KDF_free(kdf);
  return ok ? Status::ok() : internal_error("OpenSSL: HKDF-SHA256 failed");
}

}  // namespace

StreamHandshake::StreamHandshake(Role role, UniqueFd fd, std::string peer_name,
                                 const std::string& secret, Deadline deadline)
    : role_(role),
      state_(role == Role::kClient ? State::kConnecting : State::kRecvHello),
      fd_(std::move(fd)),
      peer_name_(std::move(peer_name)),
      secret_(secret),
      deadline_(deadline.resolve()) {}

StreamHandshake StreamHandshake::client(UniqueFd fd, std::string peer_name,
                                        const std::string& secret, HelloInfo hello,
                                        Deadline deadline) {
  StreamHandshake h(Role::kClient, std::move(fd), std::move(peer_name), secret, deadline);
  h.hello_ = hello;
  h.seal_ = hello.seal;
  uint8_t* p = h.hello_bytes_.data();
  store_le32(p, kHelloMagic);
  store_le16(p + 4, kProtocolVersion);
  store_le16(p + 6, hello.stream_index);
  store_le16(p + 8, hello.streams);
  store_le16(p + 10, hello.seal ? kFlagSeal : 0);
  store_le32(p + 12, hello.rank);
  store_le64(p + 16, hello.connection_id);
  if (RAND_bytes(p + 24, static_cast<int>(kNonceBytes)) != 1) {
    h.state_ = State::kFailed;
  }
  return h;
}

StreamHandshake StreamHandshake::server(UniqueFd fd, std::string peer_name,
                                        const std::string& secret, uint32_t local_rank, bool seal,
                                        Deadline deadline) {
  StreamHandshake h(Role::kServer, std::move(fd), std::move(peer_name), secret, deadline);
  h.local_rank_ = local_rank;
  h.seal_ = seal;
  return h;
}

short StreamHandshake::poll_events() const {
  switch (state_) {
    case State::kConnecting:
    case State::kSendHello:
    case State::kSendChallenge:
    case State::kSendProof:
      return POLLOUT;
    default:
      return POLLIN;
  }
}

Status StreamHandshake::fail(Status s) {
  // Silent: a timeout or reset before any challenge byte. A clean close is an answer (the
  // server read our hello and rejected it, e.g. another protocol version): not silent.
  bool early = state_ == State::kConnecting || state_ == State::kSendHello ||
               (state_ == State::kRecvChallenge && in_done_ == 0);
  bool closed = s.code() == StatusCode::kRemoteError;
  server_silent_ = role_ == Role::kClient && early && !closed;
  state_ = State::kFailed;
  return Status(s.code(), "handshake with " + peer_name_ + ": " + s.message());
}

std::string StreamHandshake::seal_mismatch(bool remote_seals) const {
  return std::string("the peer has encryption ") + (remote_seals ? "on" : "off") +
         " and this side has it " + (seal_ ? "on" : "off") +
         "; every rank must set LOWCOMM_ENCRYPT alike";
}

Status StreamHandshake::derive_keys() {
  keys_ = StreamKeys{};
  if (!seal_) return Status::ok();
  uint8_t salt[2 * kNonceBytes];
  std::memcpy(salt, hello_bytes_.data() + 24, kNonceBytes);
  std::memcpy(salt + kNonceBytes, challenge_bytes_.data() + 8, kNonceBytes);
  std::array<uint8_t, kStreamKeyBytes> c2s, s2c;
  Status a =
      hkdf(secret_, salt, sizeof(salt), "lowcomm v2 client to server", c2s.data(), c2s.size());
  if (!a) return a;
  Status b =
      hkdf(secret_, salt, sizeof(salt), "lowcomm v2 server to client", s2c.data(), s2c.size());
  if (!b) return b;
  keys_.sealed = true;
  keys_.send = role_ == Role::kClient ? c2s : s2c;
  keys_.recv = role_ == Role::kClient ? s2c : c2s;
  OPENSSL_cleanse(salt, sizeof(salt));
  return Status::ok();
}

Status StreamHandshake::write_pending(bool* complete) {
  while (out_done_ < out_len_) {
    long n = LOWCOMM_SYS_RETRY(
        ::send(fd_.get(), out_.data() + out_done_, out_len_ - out_done_, MSG_NOSIGNAL));
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        *complete = false;
        return Status::ok();
      }
      return sys_error("send", peer_name_, errno);
    }
    out_done_ += static_cast<size_t>(n);
  }
  *complete = true;
  return Status::ok();
}

Status StreamHandshake::read_exact(size_t want, bool* complete) {
  // Never read past `want`: bytes after the handshake belong to the data path.
  while (in_done_ < want) {
    long n = LOWCOMM_SYS_RETRY(::recv(fd_.get(), in_.data() + in_done_, want - in_done_, 0));
    if (n == 0) return Status(StatusCode::kRemoteError, "connection closed during handshake");
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        *complete = false;
        return Status::ok();
      }
      return sys_error("recv", peer_name_, errno);
    }
    in_done_ += static_cast<size_t>(n);
  }
  *complete = true;
  return Status::ok();
}

Status StreamHandshake::connected(bool* done) {
  *done = false;
  pollfd p{fd_.get(), POLLOUT, 0};
  int r = static_cast<int>(LOWCOMM_SYS_RETRY(::poll(&p, 1, 0)));
  if (r < 0) return sys_error("poll", peer_name_, errno);
  if (r == 0) return Status::ok();
  int err = 0;
  socklen_t len = sizeof(err);
  if (::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) return sys_error("connect", peer_name_, err);
  *done = true;
  return Status::ok();
}

Status StreamHandshake::take_hello() {
  std::memcpy(hello_bytes_.data(), in_.data(), kHelloBytes);
  const uint8_t* p = hello_bytes_.data();
  if (load_le32(p) != kHelloMagic) return corrupt_data("not a lowcomm client (bad hello magic)");
  if (load_le16(p + 4) != kProtocolVersion)
    return corrupt_data("protocol version " + std::to_string(load_le16(p + 4)) +
                        ", this build speaks " + std::to_string(kProtocolVersion));
  hello_.stream_index = load_le16(p + 6);
  hello_.streams = load_le16(p + 8);
  hello_.rank = load_le32(p + 12);
  hello_.connection_id = load_le64(p + 16);
  const uint16_t flags = load_le16(p + 10);
  if ((flags & ~kFlagSeal) != 0)
    return corrupt_data("hello has unknown flags " + std::to_string(flags));
  hello_.seal = (flags & kFlagSeal) != 0;
  seal_mismatch_ = hello_.seal != seal_;
  // Build the challenge: magic, rank, nonce, flags, then the MAC over hello and those.
  uint8_t* c = challenge_bytes_.data();
  store_le32(c, kChallengeMagic);
  store_le32(c + 4, local_rank_);
  if (RAND_bytes(c + 8, static_cast<int>(kNonceBytes)) != 1)
    return internal_error("OpenSSL RAND_bytes failed");
  store_le16(c + 40, seal_ ? kFlagSeal : 0);
  store_le16(c + 42, 0);
  store_le32(c + 44, 0);
  Status m = hmac3(secret_, kServerLabel, hello_bytes_.data(), kHelloBytes, c, kChallengeSigned,
                   c + kChallengeSigned);
  if (!m) return m;
  std::memcpy(out_.data(), c, kChallengeBytes);
  out_len_ = kChallengeBytes;
  out_done_ = 0;
  return Status::ok();
}

Status StreamHandshake::take_challenge() {
  std::memcpy(challenge_bytes_.data(), in_.data(), kChallengeBytes);
  const uint8_t* c = challenge_bytes_.data();
  if (load_le32(c) != kChallengeMagic)
    return corrupt_data("not a lowcomm server (bad challenge magic)");
  uint8_t expect[kMacBytes];
  Status m =
      hmac3(secret_, kServerLabel, hello_bytes_.data(), kHelloBytes, c, kChallengeSigned, expect);
  if (!m) return m;
  if (CRYPTO_memcmp(expect, c + kChallengeSigned, kMacBytes) != 0)
    return Status(StatusCode::kRemoteError,
                  "server failed authentication (wrong communicator secret?)");
  const uint16_t flags = load_le16(c + 40);
  if ((flags & ~kFlagSeal) != 0 || load_le16(c + 42) != 0 || load_le32(c + 44) != 0)
    return corrupt_data("challenge has unknown flags or reserved fields set");
  if (((flags & kFlagSeal) != 0) != seal_)
    return Status(StatusCode::kInvalidArgument, seal_mismatch((flags & kFlagSeal) != 0));
  server_rank_ = load_le32(c + 4);
  Status p = hmac3(secret_, kClientLabel, hello_bytes_.data(), kHelloBytes, c, kChallengeBytes,
                   out_.data());
  if (!p) return p;
  out_len_ = kProofBytes;
  out_done_ = 0;
  return Status::ok();
}

Status StreamHandshake::take_proof() {
  uint8_t expect[kMacBytes];
  Status m = hmac3(secret_, kClientLabel, hello_bytes_.data(), kHelloBytes, challenge_bytes_.data(),
                   kChallengeBytes, expect);
  if (!m) return m;
  if (CRYPTO_memcmp(expect, in_.data(), kMacBytes) != 0)
    return Status(StatusCode::kRemoteError,
                  "client failed authentication (wrong communicator secret?)");
  return derive_keys();
}

Status StreamHandshake::advance() {
  bool complete = false;
  // Each state does its I/O and returns while the socket would block; a message complete, the
  // take_* step checks it and prepares the answer.
  while (true) {
    if (state_ != State::kDone && state_ != State::kFailed && deadline_.expired())
      return fail(Status(StatusCode::kTimeout, "not completed before its deadline"));
    Status s;
    State next = state_;
    switch (state_) {
      case State::kConnecting:
        s = connected(&complete);
        if (s && complete) {
          std::memcpy(out_.data(), hello_bytes_.data(), kHelloBytes);
          out_len_ = kHelloBytes;
          out_done_ = 0;
        }
        next = State::kSendHello;
        break;
      case State::kSendHello:
        s = write_pending(&complete);
        if (s && complete) in_done_ = 0;
        next = State::kRecvChallenge;
        break;
      case State::kRecvHello:
        s = read_exact(kHelloBytes, &complete);
        if (s && complete) s = take_hello();
        next = State::kSendChallenge;
        break;
      case State::kSendChallenge:
        s = write_pending(&complete);
        // The client learns the mismatch from our flags; we learned it from its hello.
        if (s && complete && seal_mismatch_)
          s = Status(StatusCode::kInvalidArgument, seal_mismatch(hello_.seal));
        if (s && complete) in_done_ = 0;
        next = State::kRecvProof;
        break;
      case State::kRecvChallenge:
        s = read_exact(kChallengeBytes, &complete);
        if (s && complete) s = take_challenge();
        next = State::kSendProof;
        break;
      case State::kSendProof:
        s = write_pending(&complete);
        // Done: the server proved the secret in its challenge, and a server that rejects this
        // proof closes the connection, which the data path reports (handshake.h).
        if (s && complete) s = derive_keys();
        next = State::kDone;
        break;
      case State::kRecvProof:
        s = read_exact(kProofBytes, &complete);
        if (s && complete) s = take_proof();
        next = State::kDone;
        break;
      case State::kDone:
        return Status::ok();
      case State::kFailed:
        return Status(StatusCode::kInternal, "handshake with " + peer_name_ + " already failed");
    }
    if (!s) return fail(s);
    if (!complete) return Status::ok();
    state_ = next;
  }
}

}  // namespace lowcomm::transport
