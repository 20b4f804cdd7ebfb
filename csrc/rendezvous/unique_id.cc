// UniqueId: its two serialised forms and create_unique_id().
//
// Opaque layout (128 bytes, little-endian): "LCID", u16 version 1, u16 address length, the
// 32-byte secret, the numeric address text (at most 80 bytes, zero padded), 4 reserved zero
// bytes, u32 FNV-1a of bytes [0, 124). The checksum catches an id mangled in transit (a
// truncated environment variable) before it becomes a confusing connection failure.

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/socket.h>

#include <cstring>
#include <map>
#include <mutex>

#include "core/fnv1a.h"
#include "core/little_endian.h"
#include "core/sys_check.h"
#include "lowcomm/communicator.h"
#include "rendezvous/root_socket.h"
#include "transport/socket_address.h"
#include "transport/socket_options.h"

namespace lowcomm {
namespace {

using lowcomm::load_le16;
using lowcomm::load_le32;
using lowcomm::store_le16;
using lowcomm::store_le32;

constexpr uint32_t kIdMagic = 0x4449434Cu;  // "LCID"
constexpr uint16_t kIdVersion = 1;
constexpr size_t kAddressOffset = 8 + UniqueId::kSecretBytes;
constexpr size_t kMaxAddressBytes = 80;
constexpr size_t kChecksumOffset = UniqueId::kOpaqueBytes - 4;
static_assert(kAddressOffset + kMaxAddressBytes + 4 == kChecksumOffset);
constexpr const char* kTextPrefix = "lowcomm1:";

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::mutex g_root_mu;
std::map<std::string, UniqueFd>& root_sockets() {          // guarded by g_root_mu
  static auto* m = new std::map<std::string, UniqueFd>();  // never destroyed: safe at exit
  return *m;
}

}  // namespace

std::array<uint8_t, UniqueId::kOpaqueBytes> UniqueId::to_bytes() const {
  std::array<uint8_t, kOpaqueBytes> b{};
  store_le32(b.data(), kIdMagic);
  store_le16(b.data() + 4, kIdVersion);
  size_t len = std::min(root_address.size(), kMaxAddressBytes);
  store_le16(b.data() + 6, static_cast<uint16_t>(len));
  std::memcpy(b.data() + 8, secret.data(), kSecretBytes);
  std::memcpy(b.data() + kAddressOffset, root_address.data(), len);
  store_le32(b.data() + kChecksumOffset, fnv1a32(b.data(), kChecksumOffset));
  return b;
}

Result<UniqueId> UniqueId::from_bytes(const void* bytes, size_t len) {
  if (len != kOpaqueBytes)
    return invalid_argument("unique id: expected " + std::to_string(kOpaqueBytes) + " bytes, got " +
                            std::to_string(len));
  const auto* b = static_cast<const uint8_t*>(bytes);
  if (load_le32(b) != kIdMagic) return invalid_argument("unique id: bad magic (not a lowcomm id)");
  if (load_le16(b + 4) != kIdVersion)
    return invalid_argument("unique id: version " + std::to_string(load_le16(b + 4)) +
                            ", this build reads version 1");
  if (load_le32(b + kChecksumOffset) != fnv1a32(b, kChecksumOffset))
    return invalid_argument("unique id: checksum mismatch (the id was damaged in transit)");
  size_t alen = load_le16(b + 6);
  if (alen == 0 || alen > kMaxAddressBytes)
    return invalid_argument("unique id: bad address length");
  UniqueId id;
  std::memcpy(id.secret.data(), b + 8, kSecretBytes);
  id.root_address.assign(reinterpret_cast<const char*>(b + kAddressOffset), alen);
  auto addr = transport::SocketAddress::parse(id.root_address);
  if (!addr) return invalid_argument("unique id: " + addr.status().message());
  return id;
}

std::string UniqueId::to_string() const {
  static const char* kHex = "0123456789abcdef";
  std::string s = kTextPrefix + root_address + "/";
  for (uint8_t v : secret) {
    s.push_back(kHex[v >> 4]);
    s.push_back(kHex[v & 15]);
  }
  return s;
}

Result<UniqueId> UniqueId::parse(std::string_view text) {
  auto bad = [&](const std::string& why) {
    // Never echo the text: it holds the secret.
    return invalid_argument("unique id string: " + why +
                            " (expected lowcomm1:<address:port>/<64 hex digits>)");
  };
  if (text.substr(0, std::strlen(kTextPrefix)) != kTextPrefix)
    return bad("missing 'lowcomm1:' prefix");
  text.remove_prefix(std::strlen(kTextPrefix));
  size_t slash = text.rfind('/');
  if (slash == std::string_view::npos) return bad("no '/' before the secret");
  std::string_view hex = text.substr(slash + 1);
  if (hex.size() != 2 * kSecretBytes) return bad("the secret is not 64 hex digits");
  UniqueId id;
  for (size_t i = 0; i < kSecretBytes; ++i) {
    int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return bad("the secret has a non-hex digit");
    id.secret[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  id.root_address = std::string(text.substr(0, slash));
  if (id.root_address.size() > kMaxAddressBytes) return bad("address too long");
  auto addr = transport::SocketAddress::parse(id.root_address);
  if (!addr) return bad(addr.status().message());
  return id;
}

Result<UniqueId> create_unique_id(std::string_view bind) {
  transport::SocketAddress addr;
  if (bind.empty()) {
    auto chosen = transport::select_listen_address();
    if (!chosen) return chosen.status();
    addr = *chosen;
  } else {
    auto parsed = transport::SocketAddress::parse(bind);
    if (!parsed) {
      // A bare host: port 0, chosen by the kernel below.
      std::string with_port = bind.find(':') != std::string_view::npos && bind.front() != '['
                                  ? "[" + std::string(bind) + "]:0"
                                  : std::string(bind) + ":0";
      parsed = transport::SocketAddress::parse(with_port);
      if (!parsed)
        return invalid_argument("create_unique_id: bad bind address '" + std::string(bind) + "'");
    }
    addr = *parsed;
  }
  auto fd = transport::make_tcp_socket(addr);
  if (!fd) return fd.status();
  int one = 1;
  ::setsockopt(fd->get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  transport::request_socket_buffers(fd->get(), 32 << 20);
  std::string who = "root address " + addr.to_string();
  LOWCOMM_CHECK_SYS(::bind(fd->get(), addr.sockaddr_ptr(), addr.length()), who);
  LOWCOMM_CHECK_SYS(::listen(fd->get(), SOMAXCONN), who);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  LOWCOMM_CHECK_SYS(::getsockname(fd->get(), reinterpret_cast<sockaddr*>(&bound), &len), who);
  auto actual = transport::SocketAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&bound), len);
  if (!actual) return actual.status();
  UniqueId id;
  id.root_address = actual->to_string();
  if (RAND_bytes(id.secret.data(), static_cast<int>(id.secret.size())) != 1)
    return internal_error("create_unique_id: OpenSSL RAND_bytes failed");
  rendezvous::register_root_socket(id.to_string(), std::move(fd).value());
  return id;
}

UniqueId derive_unique_id(const UniqueId& id, std::string_view context) {
  UniqueId out = id;
  unsigned int len = 0;
  HMAC(EVP_sha256(), id.secret.data(), static_cast<int>(id.secret.size()),
       reinterpret_cast<const unsigned char*>(context.data()), context.size(), out.secret.data(),
       &len);
  UniqueFd kept = rendezvous::take_root_socket(id.to_string());
  if (kept) rendezvous::register_root_socket(out.to_string(), std::move(kept));
  return out;
}

namespace rendezvous {

void register_root_socket(const std::string& id_text, UniqueFd fd) {
  std::lock_guard<std::mutex> lock(g_root_mu);
  root_sockets()[id_text] = std::move(fd);
}

UniqueFd take_root_socket(const std::string& id_text) {
  std::lock_guard<std::mutex> lock(g_root_mu);
  auto it = root_sockets().find(id_text);
  if (it == root_sockets().end()) return UniqueFd();
  UniqueFd fd = std::move(it->second);
  root_sockets().erase(it);
  return fd;
}

}  // namespace rendezvous
}  // namespace lowcomm
