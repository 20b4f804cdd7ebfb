#include "transport/payload_guard.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <xxhash.h>

#include <cstring>
#include <limits>

#include "core/little_endian.h"
#include "transport/chunk_header.h"

namespace lowcomm::transport {
namespace {

constexpr size_t kNonceBytes = 12;
constexpr size_t kAadBytes = kChunkCheckOffset;  // header [0, 48)

struct CtxFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using CtxPtr = std::unique_ptr<EVP_CIPHER_CTX, CtxFree>;

// Chunk records and control frames count in nonce spaces of their own (the first 32 bits):
// control frames jump the data queue, so they are written in another order than the chunks
// were sealed in, and each space is read back in the order it was written.
constexpr uint32_t kChunkNonces = 0;
constexpr uint32_t kControlNonces = 1;

void nonce_for(uint32_t space, uint64_t record, uint8_t out[kNonceBytes]) {
  store_le32(out, space);
  store_le64(out + 4, record);
}

void store_xxh128(const XXH128_hash_t& h, uint8_t* out) {
  store_le64(out, h.low64);
  store_le64(out + 8, h.high64);
}

Status crypto_error(const char* what) {
  return internal_error(std::string("OpenSSL: ") + what + " failed");
}

// Checked narrowing for OpenSSL's int lengths; chunks are far below 2 GiB.
int as_int(size_t n) {
  return n > static_cast<size_t>(std::numeric_limits<int>::max()) ? -1 : static_cast<int>(n);
}

// One sealed record: the next nonce of `space` (counted in *records), the header [0, 48) as
// associated data, `len` bytes of `in` encrypted into `out`, the tag into `check`.
Status seal_record(EVP_CIPHER_CTX* c, uint32_t space, uint64_t* records, const uint8_t* header,
                   const uint8_t* in, uint8_t* out, size_t len, uint8_t* check) {
  if (*records == std::numeric_limits<uint64_t>::max())
    return internal_error("AES-256-GCM record counter exhausted on this stream");
  uint8_t nonce[kNonceBytes];
  nonce_for(space, (*records)++, nonce);
  int n = 0;
  if (EVP_EncryptInit_ex(c, nullptr, nullptr, nullptr, nonce) != 1 ||
      EVP_EncryptUpdate(c, nullptr, &n, header, as_int(kAadBytes)) != 1)
    return crypto_error("AES-256-GCM encrypt (nonce, header)");
  if (len > 0 && (as_int(len) < 0 || EVP_EncryptUpdate(c, out, &n, in, as_int(len)) != 1 ||
                  static_cast<size_t>(n) != len))
    return crypto_error("AES-256-GCM encrypt (payload)");
  uint8_t tail[16];  // GCM writes nothing at the end; OpenSSL still wants a buffer
  if (EVP_EncryptFinal_ex(c, tail, &n) != 1 ||
      EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kChunkCheckBytes), check) != 1)
    return crypto_error("AES-256-GCM encrypt (tag)");
  return Status::ok();
}

}  // namespace

struct PayloadSealer::Cipher {
  CtxPtr ctx;
};

PayloadSealer::PayloadSealer() = default;
PayloadSealer::~PayloadSealer() = default;
PayloadSealer::PayloadSealer(PayloadSealer&&) noexcept = default;
PayloadSealer& PayloadSealer::operator=(PayloadSealer&&) noexcept = default;

Status PayloadSealer::init(const StreamKeys& keys) {
  sealed_ = keys.sealed;
  records_ = 0;
  if (!sealed_) return Status::ok();
  cipher_ = std::make_unique<Cipher>();
  cipher_->ctx.reset(EVP_CIPHER_CTX_new());
  if (!cipher_->ctx || EVP_EncryptInit_ex(cipher_->ctx.get(), EVP_aes_256_gcm(), nullptr,
                                          keys.send.data(), nullptr) != 1)
    return crypto_error("AES-256-GCM encrypt set-up");
  return Status::ok();
}

Status PayloadSealer::protect(uint8_t* header, const uint8_t* in, uint8_t* out, size_t len) {
  uint8_t* check = header + kChunkCheckOffset;
  if (!sealed_) {
    store_xxh128(XXH3_128bits(in, len), check);
    return Status::ok();
  }
  return seal_record(cipher_->ctx.get(), kChunkNonces, &records_, header, in, out, len, check);
}

Status PayloadSealer::protect_control(uint8_t* header) {
  uint8_t* check = header + kChunkCheckOffset;
  if (!sealed_) {
    std::memset(check, 0, kChunkCheckBytes);
    return Status::ok();
  }
  return seal_record(cipher_->ctx.get(), kControlNonces, &control_records_, header, nullptr,
                     nullptr, 0, check);
}

struct PayloadOpener::State {
  CtxPtr ctx;                   // sealed
  XXH3_state_t* xxh = nullptr;  // integrity
  uint8_t expect[kChunkCheckBytes];
  ~State() { XXH3_freeState(xxh); }
};

PayloadOpener::PayloadOpener() = default;
PayloadOpener::~PayloadOpener() = default;
PayloadOpener::PayloadOpener(PayloadOpener&&) noexcept = default;
PayloadOpener& PayloadOpener::operator=(PayloadOpener&&) noexcept = default;

Status PayloadOpener::init(const StreamKeys& keys) {
  sealed_ = keys.sealed;
  records_ = 0;
  state_ = std::make_unique<State>();
  if (!sealed_) {
    state_->xxh = XXH3_createState();
    return state_->xxh ? Status::ok() : internal_error("XXH3_createState: out of memory");
  }
  state_->ctx.reset(EVP_CIPHER_CTX_new());
  if (!state_->ctx || EVP_DecryptInit_ex(state_->ctx.get(), EVP_aes_256_gcm(), nullptr,
                                         keys.recv.data(), nullptr) != 1)
    return crypto_error("AES-256-GCM decrypt set-up");
  return Status::ok();
}

Status PayloadOpener::begin(const uint8_t* header) {
  std::memcpy(state_->expect, header + kChunkCheckOffset, kChunkCheckBytes);
  if (!sealed_) {
    return XXH3_128bits_reset(state_->xxh) == XXH_OK ? Status::ok()
                                                     : internal_error("XXH3 reset failed");
  }
  if (records_ == std::numeric_limits<uint64_t>::max())
    return internal_error("AES-256-GCM record counter exhausted on this stream");
  uint8_t nonce[kNonceBytes];
  nonce_for(kChunkNonces, records_++, nonce);
  EVP_CIPHER_CTX* c = state_->ctx.get();
  int n = 0;
  if (EVP_DecryptInit_ex(c, nullptr, nullptr, nullptr, nonce) != 1 ||
      EVP_DecryptUpdate(c, nullptr, &n, header, as_int(kAadBytes)) != 1)
    return crypto_error("AES-256-GCM decrypt (nonce, header)");
  return Status::ok();
}

Status PayloadOpener::update(uint8_t* data, size_t len) {
  if (len == 0) return Status::ok();
  if (!sealed_) {
    return XXH3_128bits_update(state_->xxh, data, len) == XXH_OK
               ? Status::ok()
               : internal_error("XXH3 update failed");
  }
  int n = 0;
  if (as_int(len) < 0 || EVP_DecryptUpdate(state_->ctx.get(), data, &n, data, as_int(len)) != 1 ||
      static_cast<size_t>(n) != len)
    return crypto_error("AES-256-GCM decrypt (payload)");
  return Status::ok();
}

Result<bool> PayloadOpener::open_control(const uint8_t* header) {
  if (!sealed_) return true;
  if (control_records_ == std::numeric_limits<uint64_t>::max())
    return internal_error("AES-256-GCM control-frame counter exhausted on this stream");
  uint8_t nonce[kNonceBytes];
  nonce_for(kControlNonces, control_records_++, nonce);
  uint8_t tag[kChunkCheckBytes];
  std::memcpy(tag, header + kChunkCheckOffset, kChunkCheckBytes);
  EVP_CIPHER_CTX* c = state_->ctx.get();
  int n = 0;
  if (EVP_DecryptInit_ex(c, nullptr, nullptr, nullptr, nonce) != 1 ||
      EVP_DecryptUpdate(c, nullptr, &n, header, as_int(kAadBytes)) != 1 ||
      EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, static_cast<int>(kChunkCheckBytes), tag) != 1)
    return crypto_error("AES-256-GCM open (control frame)");
  uint8_t tail[16];
  return EVP_DecryptFinal_ex(c, tail, &n) == 1;
}

Result<bool> PayloadOpener::finish() {
  if (!sealed_) {
    uint8_t got[kChunkCheckBytes];
    store_xxh128(XXH3_128bits_digest(state_->xxh), got);
    return std::memcmp(got, state_->expect, kChunkCheckBytes) == 0;
  }
  EVP_CIPHER_CTX* c = state_->ctx.get();
  if (EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, static_cast<int>(kChunkCheckBytes),
                          state_->expect) != 1)
    return crypto_error("AES-256-GCM decrypt (tag)");
  uint8_t tail[16];
  int n = 0;
  return EVP_DecryptFinal_ex(c, tail, &n) == 1;
}

}  // namespace lowcomm::transport
