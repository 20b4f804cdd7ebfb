#include "transport/wan_link.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace lowcomm::transport {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits "<number><unit>" and returns number * scale(unit); `kind` names the quantity in errors.
Result<double> parse_quantity(std::string_view key, std::string_view value, bool is_rate) {
  std::string v = lower(trim(value));
  const char* begin = v.c_str();
  char* end = nullptr;
  double number = std::strtod(begin, &end);
  if (end == begin) {
    return invalid_argument("LOWCOMM_WAN: '" + std::string(key) + "=" + std::string(value) +
                            "' does not start with a number");
  }
  std::string unit(end);
  if (!std::isfinite(number) || number < 0) {
    return invalid_argument("LOWCOMM_WAN: '" + std::string(key) +
                            "' must be a finite non-negative number, got '" + std::string(value) +
                            "'");
  }
  struct Unit {
    const char* name;
    double scale;
  };
  static constexpr Unit kRates[] = {{"bit", 1.0}, {"kbit", 1e3}, {"mbit", 1e6}, {"gbit", 1e9},
                                    {"bps", 1.0}, {"kbps", 1e3}, {"mbps", 1e6}, {"gbps", 1e9}};
  static constexpr Unit kTimes[] = {{"s", 1.0}, {"ms", 1e-3}, {"us", 1e-6}};
  if (is_rate) {
    if (unit.empty() && number == 0) return 0.0;  // "bw=0": unlimited
    for (const auto& u : kRates)
      if (unit == u.name) return number * u.scale;
    return invalid_argument("LOWCOMM_WAN: unknown bandwidth unit '" + unit + "' in '" +
                            std::string(key) + "=" + std::string(value) +
                            "' (use bit, kbit, mbit, gbit, kbps, mbps or gbps)");
  }
  if (unit.empty() && number == 0) return 0.0;
  for (const auto& u : kTimes)
    if (unit == u.name) return number * u.scale;
  return invalid_argument("LOWCOMM_WAN: unknown time unit '" + unit + "' in '" + std::string(key) +
                          "=" + std::string(value) + "' (use s, ms or us)");
}

}  // namespace

Result<WanLink> parse_wan(std::string_view text) {
  WanLink link;
  bool seen_bw = false, seen_delay = false, seen_jitter = false;
  text = trim(text);
  if (text.empty()) return link;
  while (!text.empty()) {
    auto comma = text.find(',');
    std::string_view item = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (item.empty()) return invalid_argument("LOWCOMM_WAN: empty item (stray comma?)");
    auto eq = item.find('=');
    if (eq == std::string_view::npos) {
      return invalid_argument("LOWCOMM_WAN: '" + std::string(item) +
                              "' is not key=value (expected e.g. bw=1gbit,rtt=80ms)");
    }
    std::string key = lower(trim(item.substr(0, eq)));
    std::string_view value = item.substr(eq + 1);
    bool* seen = nullptr;
    if (key == "bw") {
      seen = &seen_bw;
    } else if (key == "rtt" || key == "delay") {
      seen = &seen_delay;
    } else if (key == "jitter") {
      seen = &seen_jitter;
    } else {
      return invalid_argument("LOWCOMM_WAN: unknown key '" + key +
                              "' (known: bw, rtt, delay, jitter)");
    }
    if (*seen) return invalid_argument("LOWCOMM_WAN: '" + key + "' given twice");
    *seen = true;
    auto q = parse_quantity(key, value, key == "bw");
    if (!q) return q.status();
    if (key == "bw") link.bits_per_second = *q;
    if (key == "rtt") link.one_way_delay_s = *q / 2.0;
    if (key == "delay") link.one_way_delay_s = *q;
    if (key == "jitter") link.jitter_s = *q;
  }
  return link;
}

Result<WanLink> wan_from_env() {
  const char* env = std::getenv("LOWCOMM_WAN");
  if (!env) return WanLink{};
  return parse_wan(env);
}

std::string WanLink::to_string() const {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "bw=%.6gbit,rtt=%.6gms,jitter=%.6gms", bits_per_second,
                one_way_delay_s * 2e3, jitter_s * 1e3);
  return buf;
}

}  // namespace lowcomm::transport
