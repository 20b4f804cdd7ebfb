#include "transport/peer_config.h"

#include <cerrno>
#include <cstdlib>
#include <string>

namespace lowcomm::transport {

Result<uint64_t> parse_byte_size(std::string_view text, uint64_t max) {
  std::string t(text);
  char* end = nullptr;
  errno = 0;
  unsigned long long n = std::strtoull(t.c_str(), &end, 10);
  if (t.empty() || end == t.c_str() || errno != 0 || t[0] == '-')
    return invalid_argument("expected a byte count such as 33554432, 32M or 0");
  unsigned long long scale = 1;
  std::string_view suffix(end);
  if (suffix == "K" || suffix == "k")
    scale = 1ull << 10;
  else if (suffix == "M" || suffix == "m")
    scale = 1ull << 20;
  else if (suffix == "G" || suffix == "g")
    scale = 1ull << 30;
  else if (!suffix.empty())
    return invalid_argument("unknown suffix '" + std::string(suffix) + "' (K, M or G)");
  if (n > max / scale) return invalid_argument("more than " + std::to_string(max >> 20) + " MiB");
  return static_cast<uint64_t>(n * scale);
}

Result<int> parse_buffer_bytes(std::string_view text) {
  auto n = parse_byte_size(text, uint64_t{1} << 30);
  if (!n) return n.status();
  return static_cast<int>(*n);
}

Result<PeerConfig> PeerConfig::from_env(int local_rank, std::string secret) {
  PeerConfig c;
  c.local_rank = local_rank;
  c.secret = std::move(secret);
  if (const char* env = std::getenv("LOWCOMM_STREAMS")) {
    char* end = nullptr;
    long n = std::strtol(env, &end, 10);
    if (*env == '\0' || *end != '\0' || n < 1 || n > kMaxStreams) {
      return invalid_argument("LOWCOMM_STREAMS='" + std::string(env) + "': expected 1 to " +
                              std::to_string(kMaxStreams));
    }
    c.streams = static_cast<int>(n);
    c.adapt_streams = false;
  }
  if (const char* env = std::getenv("LOWCOMM_SOCKET_BUFFER")) {
    auto bytes = parse_buffer_bytes(env);
    if (!bytes)
      return invalid_argument("LOWCOMM_SOCKET_BUFFER='" + std::string(env) +
                              "': " + bytes.status().message());
    c.socket_buffer_bytes = *bytes;
  }
  if (const char* env = std::getenv("LOWCOMM_UNEXPECTED_LIMIT")) {
    auto bytes = parse_byte_size(env, uint64_t{1} << 40);
    if (!bytes)
      return invalid_argument("LOWCOMM_UNEXPECTED_LIMIT='" + std::string(env) +
                              "': " + bytes.status().message());
    c.max_unexpected_bytes = *bytes;
  }
  if (const char* env = std::getenv("LOWCOMM_ENCRYPT")) {
    const std::string v(env);
    if (v == "1" || v == "aes-256-gcm") {
      c.seal = true;
    } else if (v != "0" && !v.empty()) {
      return invalid_argument("LOWCOMM_ENCRYPT='" + v + "': expected 0 or 1 (aes-256-gcm)");
    }
  }
  auto wan = wan_from_env();
  if (!wan) return wan.status();
  c.wan = *wan;
  return c;
}

}  // namespace lowcomm::transport
