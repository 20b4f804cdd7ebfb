#include "transport/peer_config.h"

#include <cstdlib>

namespace lowcomm::transport {

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
  }
  auto wan = wan_from_env();
  if (!wan) return wan.status();
  c.wan = *wan;
  return c;
}

}  // namespace lowcomm::transport
