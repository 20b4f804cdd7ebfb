#include "core/params.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "lowcomm/env.h"

namespace lowcomm::params {
namespace {

constexpr double kBig = 4.6e18;  // beyond any count or size a variable takes

const std::vector<Param> kTable = {
    {"LOWCOMM_WAN", Kind::kText, "", 0, 0, "",
     "emulate this rank's link: bw=1gbit,rtt=80ms,... (docs/wan-emulation.md)"},
    {"LOWCOMM_SITES", Kind::kText, "the emulator's site= rules, else by host and round trip", 0, 0,
     "", "which ranks share a site: one label per rank (0,0,1,1) or flat"},
    {"LOWCOMM_SITE_RTT_MS", Kind::kNumber, "2", 1e-3, 1e6, "",
     "round trip under which ranks on separate hosts count as one site"},
    {"LOWCOMM_SHARES", Kind::kChoice, "auto across hosts, equal on one", 0, 0, "auto|equal",
     "owner shares of the flat all-reduce: from the measured rates, or equal"},
    {"LOWCOMM_SEGMENT_BYTES", Kind::kBytes, "4M", 4096, kBig, "",
     "the reduce algorithms' largest pipeline segment (every rank the same)"},
    {"LOWCOMM_SPARSE_SCHEDULE", Kind::kChoice, "auto", 0, 0, "auto|gather-all|owner",
     "a randk codec's all-reduce schedule"},
    {"LOWCOMM_INTRA_SITE", Kind::kChoice, "tcp", 0, 0, "tcp|ucx",
     "the transport between ranks of one site or host"},
    {"LOWCOMM_STREAMS", Kind::kInteger, "4 opened, as many striped as the path needs", 1, 64, "",
     "TCP streams per peer, all striped"},
    {"LOWCOMM_SOCKET_BUFFER", Kind::kBytes, "32M", 0, 1ull << 30, "",
     "socket buffer per stream (0: the kernel's autotuning)"},
    {"LOWCOMM_SOCKET_IFNAME", Kind::kText, "the route to the root", 0, 0, "",
     "interface(s) to listen on, as NCCL_SOCKET_IFNAME"},
    {"LOWCOMM_TIMEOUT_S", Kind::kNumber, "1800", 1e-3, 1e9, "",
     "deadline of init and of every operation, seconds"},
    {"LOWCOMM_UNEXPECTED_LIMIT", Kind::kBytes, "1G", 0, 1ull << 40, "",
     "per-peer buffer for messages that arrive before their receive"},
    {"LOWCOMM_CODEC", Kind::kText, "none", 0, 0, "",
     "the C API's and a torch group's all-reduce codec when a call names none"},
    {"LOWCOMM_CODEC_THRESHOLD", Kind::kBytes, "1M", 0, kBig, "",
     "a torch group compresses all-reduces of at least this many bytes"},
    {"LOWCOMM_ERROR_FEEDBACK", Kind::kChoice, "0", 0, 0, "0|1|address|order",
     "a torch group's error feedback: off, by address (1) or by call order"},
    {"LOWCOMM_DIRECT_BYTES", Kind::kBytes, "0", 0, kBig, "",
     "all-reduces of at most this many bytes take one hop (0: never)"},
    {"LOWCOMM_CODEC_THREADS", Kind::kInteger, "one per core", 0, 4096, "",
     "codec threads (0: one per core)"},
    {"LOWCOMM_ENCRYPT", Kind::kChoice, "0", 0, 0, "0|1|aes-256-gcm",
     "1: encrypt and authenticate every stream with AES-256-GCM"},
    {"LOWCOMM_PINNED_BYTES", Kind::kBytes, "4G", 0, kBig, "",
     "the most page-locked host memory CUDA-buffer calls stage through"},
    {"LOWCOMM_INLINE_BYTES", Kind::kBytes, "64K", 0, kBig, "",
     "collectives this small, called while nothing is pending, run on the caller's thread"},
    {"LOWCOMM_FAILURE_TIMEOUT_MS", Kind::kInteger, "1500", 0, 3.6e9, "",
     "the least silence before a peer an operation waits on is declared failed (0: off)"},
    {"LOWCOMM_ELASTIC_FAULT_CUT_AFTER_DONE", Kind::kInteger, "off", 0, kBig, "",
     "testing hook: keep the done of that elastic collective and freeze"},
    {"LOWCOMM_ELASTIC_FAULT_DROP_RESULT", Kind::kInteger, "off", 0, kBig, "",
     "testing hook: drop the finished result of that elastic collective"},
    {"LOWCOMM_ELASTIC_FAULT_DIE_AT_ADMIT", Kind::kChoice, "0", 0, 0, "0|1",
     "testing hook: 1: die before the data of a collective that admits a member"},
    {"LOWCOMM_ELASTIC_FAULT_COMMIT_ONLY_TO", Kind::kInteger, "off", 0, kBig, "",
     "testing hook: the coordinator's admission commit reaches that member only, then it dies"},
    {"LOWCOMM_DEBUG", Kind::kChoice, "WARN", 0, 0, "NONE|OFF|0|WARN|INFO|TRACE", "log level"},
    {"LOWCOMM_SECRET", Kind::kText, "", 0, 0, "", "NCCL plugin: the shared secret"},
    {"LOWCOMM_SECRET_FILE", Kind::kText, "", 0, 0, "",
     "NCCL plugin: a file (mode 600) holding the shared secret"},
    {"LOWCOMM_NCCL_COMPRESS", Kind::kText, "off", 0, 0, "",
     "NCCL plugin: lossless compression: off, lz4, zstd[:level] or auto"},
    {"LOWCOMM_NCCL_SHUFFLE", Kind::kChoice, "0", 0, 0, "0|1|2|4",
     "NCCL plugin: byte shuffle before compression, bytes per element"},
    {"LOWCOMM_NCCL_SPEED_MBPS", Kind::kNumber, "the emulated link's rate, else 10000", 1, 1e7, "",
     "NCCL plugin: the link speed NCCL's tuner is told"},
    {"LOWCOMM_NCCL_LATENCY_US", Kind::kNumber, "the emulated link's one-way delay, else 0", 0, 1e8,
     "", "NCCL plugin: the latency NCCL's tuner is told"},
    {"LOWCOMM_NCCL_EAGER_BYTES", Kind::kBytes, "two bandwidth-delay products, at least 16M", 0,
     kBig, "", "NCCL plugin: bytes a sender may send before the receive is posted"},
    {"LOWCOMM_HANDSHAKE_TIMEOUT_S", Kind::kNumber, "10", 0.1, 3600, "",
     "NCCL plugin: deadline of a connection's handshake, seconds"},
};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.12g", v);
  return buf;
}

Status malformed(const Param& p, const std::string& value, const std::string& expected) {
  return invalid_argument(std::string(p.name) + "='" + value + "': expected " + expected);
}

std::string range_text(const Param& p) {
  if (p.max >= kBig) return "at least " + number_text(p.min);
  return "from " + number_text(p.min) + " to " + number_text(p.max);
}

// A declared variable of kind `kind` and its raw value; nullopt when unset or empty.
struct Raw {
  const Param& param;
  std::optional<std::string> value;
};
Raw raw(std::string_view name, Kind kind) {
  const Param& p = find(name);
  if (p.kind != kind) {
    std::fprintf(stderr, "lowcomm: %s read as the wrong kind (params.cc)\n", p.name);
    std::abort();
  }
  const char* v = std::getenv(p.name);
  if (v == nullptr || *v == '\0') return {p, std::nullopt};
  return {p, std::string(v)};
}

}  // namespace

const std::vector<Param>& table() {
  return kTable;
}

const Param& find(std::string_view name) {
  for (const Param& p : kTable)
    if (name == p.name) return p;
  std::fprintf(stderr, "lowcomm: %.*s is not declared in csrc/core/params.cc\n",
               static_cast<int>(name.size()), name.data());
  std::abort();
}

std::optional<std::string> text(std::string_view name) {
  return raw(name, Kind::kText).value;
}

Result<std::optional<std::string>> choice(std::string_view name) {
  const auto [p, v] = raw(name, Kind::kChoice);
  if (!v) return std::optional<std::string>();
  const std::string want = lower(*v);
  std::string_view all(p.choices);
  std::string listed;
  while (!all.empty()) {
    const size_t bar = all.find('|');
    const std::string_view one = all.substr(0, bar);
    if (lower(one) == want) return std::optional<std::string>(std::string(one));
    listed += (listed.empty() ? "" : ", ") + std::string(one);
    all = bar == std::string_view::npos ? std::string_view() : all.substr(bar + 1);
  }
  return malformed(p, *v, "one of " + listed);
}

Result<std::optional<int64_t>> integer(std::string_view name) {
  const auto [p, v] = raw(name, Kind::kInteger);
  if (!v) return std::optional<int64_t>();
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (end == v->c_str() || *end != '\0' || errno == ERANGE || static_cast<double>(x) < p.min ||
      static_cast<double>(x) > p.max)
    return malformed(p, *v, "a whole number " + range_text(p));
  return std::optional<int64_t>(x);
}

Result<std::optional<uint64_t>> bytes(std::string_view name) {
  const auto [p, v] = raw(name, Kind::kBytes);
  if (!v) return std::optional<uint64_t>();
  auto n = parse_bytes(*v);
  if (!n) return malformed(p, *v, "a byte count such as 4096 or 4M (" + n.status().message() + ")");
  if (static_cast<double>(*n) < p.min || static_cast<double>(*n) > p.max)
    return malformed(p, *v, "a byte count " + range_text(p));
  return std::optional<uint64_t>(*n);
}

Result<std::optional<double>> number(std::string_view name) {
  const auto [p, v] = raw(name, Kind::kNumber);
  if (!v) return std::optional<double>();
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v->c_str(), &end);
  if (end == v->c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(x) || x < p.min ||
      x > p.max)
    return malformed(p, *v, "a number " + range_text(p));
  return std::optional<double>(x);
}

Result<uint64_t> parse_bytes(std::string_view text) {
  size_t i = 0;
  uint64_t n = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    const auto d = static_cast<uint64_t>(text[i] - '0');
    if (n > (UINT64_MAX - d) / 10) return invalid_argument("too large");
    n = n * 10 + d;
    ++i;
  }
  if (i == 0) return invalid_argument("no digits");
  std::string suffix = lower(text.substr(i));
  int shift = 0;
  if (!suffix.empty() && std::string_view("kmgt").find(suffix[0]) != std::string_view::npos) {
    shift = 10 * (1 + static_cast<int>(std::string_view("kmgt").find(suffix[0])));
    suffix.erase(0, 1);
    if (suffix == "ib") suffix.clear();
  }
  if (suffix == "b") suffix.clear();
  if (!suffix.empty())
    return invalid_argument("unknown suffix '" + std::string(text.substr(i)) + "' (K, M, G or T)");
  if (shift > 0 && n > (UINT64_MAX >> shift)) return invalid_argument("too large");
  return n << shift;
}

Status check_all() {
  for (const Param& p : kTable) {
    Status s;
    switch (p.kind) {
      case Kind::kText:
        break;
      case Kind::kChoice:
        s = choice(p.name).status();
        break;
      case Kind::kInteger:
        s = integer(p.name).status();
        break;
      case Kind::kBytes:
        s = bytes(p.name).status();
        break;
      case Kind::kNumber:
        s = number(p.name).status();
        break;
    }
    if (!s) return s;
  }
  return Status();
}

std::string describe() {
  std::string out;
  for (const Param& p : kTable) {
    const char* v = std::getenv(p.name);
    const bool set = v != nullptr && *v != '\0';
    const bool secret = std::string_view(p.name) == "LOWCOMM_SECRET";
    std::string value = !set ? std::string("(default: ") + (*p.fallback ? p.fallback : "none") + ")"
                        : secret ? std::string("(set, not shown)")
                                 : std::string(v);
    char line[512];
    std::snprintf(line, sizeof(line), "%-38s %-30s %s\n", p.name, value.c_str(), p.doc);
    out += line;
  }
  return out;
}

}  // namespace lowcomm::params

namespace lowcomm {

Result<std::optional<std::string>> env_value(std::string_view name) {
  const params::Param* p = nullptr;
  for (const params::Param& q : params::table())
    if (name == q.name) p = &q;
  if (p == nullptr)
    return invalid_argument(std::string(name) + " is not a lowcomm environment variable");
  switch (p->kind) {
    case params::Kind::kText:
      return params::text(name);
    case params::Kind::kChoice:
      return params::choice(name);
    case params::Kind::kBytes: {
      auto v = params::bytes(name);
      if (!v) return v.status();
      if (!v->has_value()) return std::optional<std::string>();
      return std::optional<std::string>(std::to_string(**v));
    }
    case params::Kind::kInteger: {
      auto v = params::integer(name);
      if (!v) return v.status();
      if (!v->has_value()) return std::optional<std::string>();
      return std::optional<std::string>(std::to_string(**v));
    }
    case params::Kind::kNumber: {
      auto v = params::number(name);
      if (!v) return v.status();
      if (!v->has_value()) return std::optional<std::string>();
      return std::optional<std::string>(params::number_text(**v));
    }
  }
  return std::optional<std::string>();
}

std::string env_describe() {
  return params::describe();
}

}  // namespace lowcomm
