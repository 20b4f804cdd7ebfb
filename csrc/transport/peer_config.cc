#include "transport/peer_config.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "core/params.h"

namespace lowcomm::transport {

Result<uint64_t> parse_byte_size(std::string_view text, uint64_t max) {
  auto n = params::parse_bytes(text);
  if (!n)
    return invalid_argument("expected a byte count such as 33554432, 32M or 0: " +
                            n.status().message());
  if (*n > max) return invalid_argument("more than " + std::to_string(max >> 20) + " MiB");
  return *n;
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
  static_assert(kMaxStreams == 64, "LOWCOMM_STREAMS' range in core/params.cc");
  auto streams = params::integer("LOWCOMM_STREAMS");
  if (!streams) return streams.status();
  if (streams->has_value()) {
    c.streams = static_cast<int>(**streams);
    c.adapt_streams = false;
  }
  auto buffer = params::bytes("LOWCOMM_SOCKET_BUFFER");
  if (!buffer) return buffer.status();
  if (buffer->has_value()) c.socket_buffer_bytes = static_cast<int>(**buffer);
  auto unexpected = params::bytes("LOWCOMM_UNEXPECTED_LIMIT");
  if (!unexpected) return unexpected.status();
  if (unexpected->has_value()) c.max_unexpected_bytes = **unexpected;
  auto encrypt = params::choice("LOWCOMM_ENCRYPT");
  if (!encrypt) return encrypt.status();
  if (encrypt->has_value()) c.seal = **encrypt != "0";
  auto wan = wan_from_env();
  if (!wan) return wan.status();
  c.wan = *wan;
  return c;
}

}  // namespace lowcomm::transport
