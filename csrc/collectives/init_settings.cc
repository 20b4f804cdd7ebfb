#include "collectives/init_settings.h"

#include <algorithm>
#include <chrono>
#include <tuple>
#include <utility>

#include "core/params.h"

namespace lowcomm::collectives {
namespace {

// CommOptions::failure_timeout's default (an elastic group's failure floor too).
constexpr auto kDefaultFailureTimeout = std::chrono::milliseconds(1500);

Status init_error(const Status& s) {
  return Status(s.code(), "init: " + s.message());
}

// A byte count from the environment variable `name` (core/params.h), or `fallback` where it is
// unset.
Result<uint64_t> env_byte_count(const char* name, uint64_t fallback) {
  auto v = params::bytes(name);
  if (!v) return init_error(v.status());
  return v->value_or(fallback);
}

// `given` when not empty, else the choice variable `name` (its value checked by the table);
// refused unless one of `allowed` (or "").
Result<std::string> choose(const std::string& given, const char* name, const char* option,
                           std::initializer_list<const char*> allowed) {
  auto env = params::choice(name);
  if (!env) return init_error(env.status());
  const std::string v = !given.empty() ? given : env->value_or("");
  if (v.empty()) return v;
  std::string list;
  for (const char* a : allowed) {
    if (v == a) return v;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  return invalid_argument(std::string("init: ") + (given.empty() ? name : option) +
                          " must be one of " + list + ", got '" + v + "'");
}

// The transport's configuration: LOWCOMM_STREAMS and the rest (PeerConfig::from_env), where the
// options do not say otherwise.
Result<transport::PeerConfig> peer_config(const UniqueId& id, int rank, const CommOptions& o) {
  std::string secret(reinterpret_cast<const char*>(id.secret.data()), id.secret.size());
  auto cfg = transport::PeerConfig::from_env(rank, secret);
  if (!cfg) return cfg.status();
  transport::PeerConfig c = std::move(cfg).value();
  if (o.streams) {
    if (*o.streams < 1 || *o.streams > transport::kMaxStreams)
      return invalid_argument("init: streams must be 1 to " +
                              std::to_string(transport::kMaxStreams) + ", got " +
                              std::to_string(*o.streams));
    c.streams = *o.streams;
    c.adapt_streams = false;
  }
  if (o.socket_buffer_bytes) {
    if (*o.socket_buffer_bytes < 0 || *o.socket_buffer_bytes > (1 << 30))
      return invalid_argument("init: socket_buffer_bytes must be 0 (autotuning) to 1 GiB, got " +
                              std::to_string(*o.socket_buffer_bytes));
    c.socket_buffer_bytes = *o.socket_buffer_bytes;  // 0: kernel autotuning
  }
  if (o.encrypt) c.seal = *o.encrypt;
  if (o.failure_timeout) {
    c.failure_timeout = std::max(*o.failure_timeout, std::chrono::milliseconds(0));
  } else {
    auto ms = params::integer("LOWCOMM_FAILURE_TIMEOUT_MS");  // checked by read_init_settings
    c.failure_timeout =
        ms.is_ok() && ms->has_value() ? std::chrono::milliseconds(**ms) : kDefaultFailureTimeout;
  }
  return c;
}

}  // namespace

Result<InitSettings> read_init_settings(const UniqueId& id, int rank, int nranks,
                                        const CommOptions& given) {
  if (nranks < 1)
    return invalid_argument("init: nranks must be at least 1, got " + std::to_string(nranks));
  if (rank < 0 || rank >= nranks)
    return invalid_argument("init: rank " + std::to_string(rank) + " is outside [0, " +
                            std::to_string(nranks) + ")");
  if (given.segment_bytes && *given.segment_bytes < 4096)
    return invalid_argument("init: segment_bytes must be at least 4096");
  // Every LOWCOMM_* variable that is set must parse, used here or not (a typo'd value of one
  // read lazily elsewhere, like LOWCOMM_TIMEOUT_S, would otherwise be a silent default).
  if (Status s = params::check_all(); !s) return init_error(s);
  InitSettings s;
  s.options = given;
  CommOptions& o = s.options;
  for (auto [field, name, fallback] :
       {std::tuple{&o.segment_bytes, "LOWCOMM_SEGMENT_BYTES", uint64_t{4} << 20},
        std::tuple{&o.direct_bytes, "LOWCOMM_DIRECT_BYTES", uint64_t{0}},
        std::tuple{&o.inline_bytes, "LOWCOMM_INLINE_BYTES", uint64_t{64} << 10}}) {
    if (field->has_value()) continue;
    auto v = env_byte_count(name, fallback);
    if (!v) return v.status();
    *field = *v;
  }
  auto pinned = env_byte_count("LOWCOMM_PINNED_BYTES", uint64_t{4} << 30);
  if (!pinned) return pinned.status();
  s.pinned_limit = *pinned;
  auto cfg = peer_config(id, rank, given);
  if (!cfg) return cfg.status();
  s.peer = std::move(cfg).value();

  // The emulated WAN: this rank's link (shared by all its peers, site model) and its clocks;
  // each peer's link from the per-pair rules once the mesh is up.
  const std::string wan_text =
      !given.wan.empty() ? given.wan : params::text("LOWCOMM_WAN").value_or("");
  auto plan = transport::parse_wan_plan(wan_text);
  if (!plan)
    return invalid_argument(std::string("init: ") +
                            (given.wan.empty() ? "LOWCOMM_WAN: " : "wan option: ") +
                            plan.status().message());
  s.wan = std::move(plan).value();
  auto own = s.wan.link(rank, -1);
  if (!own) return invalid_argument("init: wan: " + own.status().message());
  s.own = *own;
  s.peer.wan = s.own;
  auto opened = transport::EmulatedLinks::open(s.wan, s.own, rank, nranks, id.root_address);
  if (!opened) return opened.status();
  s.emulated = std::move(opened).value();
  s.peer.site = s.emulated.site();

  // Sites (topology/sites.h): the option, LOWCOMM_SITES, the emulator's site= rules, flat.
  topology::PlannerSettings& p = s.planner;
  p.rank = rank;
  p.nranks = nranks;
  p.emulated_wan = !wan_text.empty();
  const std::string sites_text =
      !given.sites.empty() ? given.sites : params::text("LOWCOMM_SITES").value_or("");
  p.sites_given = !sites_text.empty();
  if (p.sites_given) {
    auto parsed = topology::parse_sites(sites_text, nranks);
    if (!parsed)
      return invalid_argument(std::string("init: ") +
                              (given.sites.empty() ? "LOWCOMM_SITES: " : "sites option: ") +
                              parsed.status().message());
    p.sites = std::move(parsed).value();
  } else {
    p.sites = topology::plan_from_groups(s.wan.site_labels(nranks));
  }
  auto site_ms = params::number("LOWCOMM_SITE_RTT_MS");
  if (!site_ms) return init_error(site_ms.status());
  if (site_ms->has_value()) p.site_rtt_s = **site_ms * 1e-3;
  auto shares = choose(given.shares, "LOWCOMM_SHARES", "shares option", {"auto", "equal"});
  if (!shares) return shares.status();
  p.shares = *shares;
  auto sparse = choose(given.sparse_schedule, "LOWCOMM_SPARSE_SCHEDULE", "sparse_schedule option",
                       {"auto", "gather-all", "owner"});
  if (!sparse) return sparse.status();
  o.sparse_schedule = sparse->empty() ? "auto" : *sparse;
  p.sparse_default = o.sparse_schedule == "owner" ? AllReduceOptions::SparseSchedule::kOwner
                     : o.sparse_schedule == "gather-all"
                         ? AllReduceOptions::SparseSchedule::kGatherAll
                         : AllReduceOptions::SparseSchedule::kAuto;
  p.direct_bytes = *o.direct_bytes;
  auto intra = choose(given.intra_site, "LOWCOMM_INTRA_SITE", "intra_site option", {"tcp", "ucx"});
  if (!intra) return intra.status();
  s.want_ucx = *intra == "ucx";
  return s;
}

}  // namespace lowcomm::collectives
