#include "plugin_options.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/params.h"
#include "transport/emulated_links.h"
#include "transport/pacer.h"

namespace lowcomm::nccl_net {
namespace {

// A kNumber variable (core/params.h), or `fallback` where it is unset.
Result<double> env_number(const char* name, double fallback) {
  auto v = params::number(name);
  if (!v) return v.status();
  return v->value_or(fallback);
}

Result<std::string> read_secret_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return invalid_argument("LOWCOMM_SECRET_FILE='" + path + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    return invalid_argument("LOWCOMM_SECRET_FILE='" + path + "': not a regular file");
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    return invalid_argument("LOWCOMM_SECRET_FILE='" + path +
                            "': readable by group or others; chmod 600 it");
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof())
    return invalid_argument("LOWCOMM_SECRET_FILE='" + path + "': cannot be read");
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.pop_back();
  if (text.empty()) return invalid_argument("LOWCOMM_SECRET_FILE='" + path + "': empty");
  return text;
}

}  // namespace

Result<PluginOptions> PluginOptions::from_env() {
  PluginOptions o;
  if (Status s = params::check_all(); !s) return s;
  std::string secret;
  const auto inline_secret = params::text("LOWCOMM_SECRET");
  const auto secret_file = params::text("LOWCOMM_SECRET_FILE");
  if (inline_secret && secret_file)
    return invalid_argument("LOWCOMM_SECRET and LOWCOMM_SECRET_FILE are both set; set one");
  if (secret_file) {
    auto s = read_secret_file(*secret_file);
    if (!s) return s.status();
    secret = *s;
    o.secret_source = "LOWCOMM_SECRET_FILE=" + *secret_file;
  } else if (inline_secret) {
    secret = *inline_secret;
    o.secret_source = "LOWCOMM_SECRET";
  } else {
    return invalid_argument(
        "no shared secret: set LOWCOMM_SECRET or LOWCOMM_SECRET_FILE (the same on every node; "
        "lowcomm authenticates every connection with it)");
  }
  auto peer = transport::PeerConfig::from_env(0, std::move(secret));
  if (!peer) return peer.status();
  o.peer = std::move(peer).value();
  if (const auto wan = params::text("LOWCOMM_WAN"); wan && wan->find(';') != std::string::npos)
    return invalid_argument("LOWCOMM_WAN='" + *wan +
                            "': the NCCL plugin takes one section (no per-rank rules: it does "
                            "not know ranks)");
  o.peer.site = transport::own_site_links(o.peer.wan);
  auto handshake = env_number("LOWCOMM_HANDSHAKE_TIMEOUT_S", 10.0);
  if (!handshake) return handshake.status();
  o.peer.handshake_timeout_s = *handshake;
  // A frozen or cut-off peer fails the requests waiting on it (docs/collectives.md, "Failure
  // semantics"), so NCCL sees an error instead of waiting for torch's watchdog; 0: off.
  auto failure = params::integer("LOWCOMM_FAILURE_TIMEOUT_MS");
  if (!failure) return failure.status();
  o.peer.failure_timeout = std::chrono::milliseconds(failure->value_or(1500));

  auto address = transport::select_listen_address();
  if (!address) return address.status();
  o.listen_address = *address;
  o.device_name = "lowcomm-" + o.listen_address.to_string();
  // Only the host part: the port is 0 here and would mislead.
  if (auto colon = o.device_name.rfind(':'); colon != std::string::npos)
    o.device_name.resize(colon);

  if (const auto c = params::text("LOWCOMM_NCCL_COMPRESS")) {
    o.compress_auto = *c == "auto";
    auto parsed = parse_lossless(o.compress_auto ? "zstd:1" : *c);
    if (!parsed)
      return invalid_argument(std::string("LOWCOMM_NCCL_COMPRESS: ") + parsed.status().message() +
                              " or auto");
    o.lossless = *parsed;
  }
  auto shuffle = params::choice("LOWCOMM_NCCL_SHUFFLE");  // 0, 1, 2 or 4 bytes per element
  if (!shuffle) return shuffle.status();
  o.lossless.shuffle = std::stoi(shuffle->value_or("0"));

  // What NCCL's tuner is told: the emulated link when there is one (its uplink rate and
  // one-way delay), else 10 Gbit/s and no extra latency, unless set explicitly.
  const double wan_mbps = o.peer.wan.bits_per_second / 1e6;
  auto speed = env_number("LOWCOMM_NCCL_SPEED_MBPS", wan_mbps > 0 ? wan_mbps : 10000.0);
  if (!speed) return speed.status();
  o.speed_mbps = std::max(1, static_cast<int>(std::lround(*speed)));
  auto latency = env_number("LOWCOMM_NCCL_LATENCY_US", o.peer.wan.one_way_delay_s * 1e6);
  if (!latency) return latency.status();
  o.latency_us = static_cast<float>(*latency);
  // Two bandwidth-delay products of the link NCCL is told about: a round trip's worth in
  // flight while the last round trip's receives are posted.
  const double bdp_bytes = o.speed_mbps * 1e6 / 8 * (2 * o.latency_us * 1e-6);
  o.eager_bytes = std::max<uint64_t>(16u << 20, static_cast<uint64_t>(2 * bdp_bytes));
  auto eager = params::bytes("LOWCOMM_NCCL_EAGER_BYTES");
  if (!eager) return eager.status();
  if (eager->has_value()) o.eager_bytes = **eager;
  if (o.eager_bytes > o.peer.max_unexpected_bytes)
    return invalid_argument("the eager window (" + std::to_string(o.eager_bytes) +
                            " bytes, LOWCOMM_NCCL_EAGER_BYTES) exceeds LOWCOMM_UNEXPECTED_LIMIT, "
                            "the receiver's allowance");
  return o;
}

std::string PluginOptions::describe() const {
  std::ostringstream o;
  o << "device " << device_name << ", listening on " << listen_address.to_string()
    << " (LOWCOMM_SOCKET_IFNAME); secret from " << secret_source << "; streams "
    << (peer.adapt_streams ? "adaptive up to " : "") << peer.streams
    << " (LOWCOMM_STREAMS); socket buffers "
    << (peer.socket_buffer_bytes ? std::to_string(peer.socket_buffer_bytes) + " B"
                                 : std::string("kernel autotuning"))
    << " (LOWCOMM_SOCKET_BUFFER); WAN emulation '"
    << (peer.wan.shaped() ? peer.wan.to_string() : std::string("off"))
    << "' (LOWCOMM_WAN); handshake timeout " << peer.handshake_timeout_s << " s; eager window "
    << eager_bytes << " B (LOWCOMM_NCCL_EAGER_BYTES); compression "
    << (compress_auto ? "auto " : "") << to_string(lossless)
    << " (LOWCOMM_NCCL_COMPRESS, LOWCOMM_NCCL_SHUFFLE); reported speed " << speed_mbps
    << " Mbit/s, latency " << latency_us
    << " us (LOWCOMM_NCCL_SPEED_MBPS, LOWCOMM_NCCL_LATENCY_US)";
  return o.str();
}

}  // namespace lowcomm::nccl_net
