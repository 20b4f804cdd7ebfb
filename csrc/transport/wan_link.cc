#include "transport/wan_link.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "core/params.h"

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

namespace {

// Applies one section's key=value list to `link`; `allowed` lists the keys this kind of section
// takes. Each key at most once per section.
Status apply_keys(std::string_view text, const std::vector<std::string>& allowed, WanLink& link) {
  std::vector<std::string> seen;
  text = trim(text);
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
    bool known = false;
    std::string names;
    for (const auto& k : allowed) {
      known = known || k == key;
      names += (names.empty() ? "" : ", ") + k;
    }
    if (!known)
      return invalid_argument("LOWCOMM_WAN: unknown key '" + key + "' here (known: " + names + ")");
    // rtt and delay are one quantity; bw and up/down overlap.
    std::string slot = key == "rtt" ? "delay" : key;
    for (const auto& k : seen)
      if (k == slot || (slot == "bw" && (k == "up" || k == "down")) ||
          (k == "bw" && (slot == "up" || slot == "down")))
        return invalid_argument("LOWCOMM_WAN: '" + key + "' given twice (or with bw)");
    seen.push_back(slot);
    if (key == "model") {
      std::string m = lower(trim(value));
      if (m == "site") {
        link.model = WanModel::kSite;
      } else if (m == "pair") {
        link.model = WanModel::kPair;
      } else {
        return invalid_argument("LOWCOMM_WAN: model must be site or pair, not '" + m + "'");
      }
      continue;
    }
    if (key == "frame") {
      std::string v(trim(value));
      char* end = nullptr;
      double b = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !std::isfinite(b) || b < 0 || b > 1e4)
        return invalid_argument(
            "LOWCOMM_WAN: frame= takes bytes per segment (e.g. 66 or 0), not '" + v + "'");
      link.frame_bytes = b;
      continue;
    }
    if (key == "loss") {
      std::string v(trim(value));
      char* end = nullptr;
      double pct = std::strtod(v.c_str(), &end);
      if (v.empty() || end == v.c_str() || std::string(end) != "%" || !std::isfinite(pct) ||
          pct < 0 || pct >= 100)
        return invalid_argument(
            "LOWCOMM_WAN: loss= takes a percentage of segments in [0%, 100%) (e.g. loss=1%), "
            "not '" +
            v + "'");
      link.loss = pct / 100.0;
      continue;
    }
    const bool rate = key == "bw" || key == "up" || key == "down";
    auto q = parse_quantity(key, value, rate);
    if (!q) return q.status();
    if (key == "bw") link.bits_per_second = link.down_bits_per_second = *q;
    if (key == "up") link.bits_per_second = *q;
    if (key == "down") link.down_bits_per_second = *q;
    if (key == "rtt") link.one_way_delay_s = *q / 2.0;
    if (key == "delay") link.one_way_delay_s = *q;
    if (key == "jitter") link.jitter_s = *q;
  }
  return Status::ok();
}

const std::vector<std::string> kDefaultKeys = {"bw",     "up",   "down",  "rtt",  "delay",
                                               "jitter", "loss", "model", "frame"};
const std::vector<std::string> kRankKeys = {"bw", "up", "down"};
const std::vector<std::string> kPairKeys = {"bw", "rtt", "delay", "jitter", "loss"};

Result<WanPlan::RankRange> parse_ranks(std::string_view text) {
  text = trim(text);
  auto dash = text.find('-');
  auto number = [](std::string_view t) -> int {
    t = trim(t);
    if (t.empty() || t.size() > 6) return -1;
    int v = 0;
    for (char c : t) {
      if (c < '0' || c > '9') return -1;
      v = v * 10 + (c - '0');
    }
    return v;
  };
  WanPlan::RankRange r;
  r.first = number(text.substr(0, dash));
  r.last = dash == std::string_view::npos ? r.first : number(text.substr(dash + 1));
  if (r.first < 0 || r.last < r.first)
    return invalid_argument("LOWCOMM_WAN: '" + std::string(text) +
                            "' is not a rank or a range A-B of ranks");
  return r;
}

}  // namespace

Result<WanLink> parse_wan(std::string_view text) {
  WanLink link;
  if (text.find(';') != std::string_view::npos)
    return invalid_argument("LOWCOMM_WAN: per-rank sections (';') need parse_wan_plan");
  LOWCOMM_CHECK(apply_keys(text, kDefaultKeys, link));
  if (link.model == WanModel::kPair && link.down_bits_per_second != link.bits_per_second)
    return invalid_argument("LOWCOMM_WAN: up= and down= are site-model keys; model=pair takes bw=");
  if (link.model == WanModel::kPair) link.down_bits_per_second = 0;  // the sender's link only
  return link;
}

namespace {

// Whether the key=value list names `key`.
bool has_key(std::string_view keys, std::string_view key) {
  while (!keys.empty()) {
    auto comma = keys.find(',');
    std::string_view kv = trim(keys.substr(0, comma));
    if (lower(trim(kv.substr(0, kv.find('=')))) == key) return true;
    if (comma == std::string_view::npos) break;
    keys = keys.substr(comma + 1);
  }
  return false;
}

// "@FILE": the file's sections, one per line or ';'-separated, '#' comments dropped.
Result<std::string> read_spec_file(std::string_view path) {
  std::ifstream f{std::string(path)};
  if (!f)
    return invalid_argument("LOWCOMM_WAN: cannot read the spec file '" + std::string(path) + "'");
  std::string out, line;
  while (std::getline(f, line)) {
    line = line.substr(0, line.find('#'));
    if (trim(line).empty()) continue;
    if (!out.empty()) out += ';';
    out += std::string(trim(line));
  }
  if (out.empty())
    return invalid_argument("LOWCOMM_WAN: the spec file '" + std::string(path) + "' is empty");
  return out;
}

}  // namespace

Result<WanPlan> parse_wan_plan(std::string_view text) {
  text = trim(text);
  if (!text.empty() && text.front() == '@') {
    auto file = read_spec_file(trim(text.substr(1)));
    if (!file) return file.status();
    return parse_wan_plan(*file);
  }
  WanPlan plan;
  text = trim(text);
  auto semi = text.find(';');
  plan.defaults = std::string(trim(text.substr(0, semi)));
  auto base = parse_wan(plan.defaults);
  if (!base) return base.status();
  while (semi != std::string_view::npos) {
    text = text.substr(semi + 1);
    semi = text.find(';');
    std::string_view section = trim(text.substr(0, semi));
    if (section.empty()) continue;
    auto colon = section.find(':');
    auto eq = section.find('=');
    if (colon == std::string_view::npos || eq == std::string_view::npos || eq > colon)
      return invalid_argument("LOWCOMM_WAN: section '" + std::string(section) +
                              "' is not rank=<ranks>:<keys>, site=<ranks>:<keys> or "
                              "pair=<ranks>/<ranks>:<keys>");
    std::string kind = lower(trim(section.substr(0, eq)));
    std::string_view sel = section.substr(eq + 1, colon - eq - 1);
    WanPlan::Rule rule;
    rule.keys = std::string(section.substr(colon + 1));
    WanLink probe = *base;
    if (kind == "site") {
      auto r = parse_ranks(sel);
      if (!r) return r.status();
      rule.a = *r;
      rule.site = true;
      LOWCOMM_CHECK(apply_keys(rule.keys, kRankKeys, probe));
      if (base->model == WanModel::kPair)
        return invalid_argument("LOWCOMM_WAN: site= sections need the site model, not model=pair");
      for (const auto& other : plan.rules)
        if (other.site && other.a.first <= rule.a.last && rule.a.first <= other.a.last)
          return invalid_argument("LOWCOMM_WAN: site " + std::string(trim(sel)) +
                                  " overlaps site " + std::to_string(other.a.first) + "-" +
                                  std::to_string(other.a.last) +
                                  " (a rank is in at most one site)");
    } else if (kind == "rank") {
      auto r = parse_ranks(sel);
      if (!r) return r.status();
      rule.a = *r;
      LOWCOMM_CHECK(apply_keys(rule.keys, kRankKeys, probe));
      if (base->model == WanModel::kPair)
        return invalid_argument(
            "LOWCOMM_WAN: rank= sections set site rates; with model=pair "
            "use pair= sections");
    } else if (kind == "pair") {
      auto slash = sel.find('/');
      if (slash == std::string_view::npos)
        return invalid_argument("LOWCOMM_WAN: pair selector '" + std::string(sel) +
                                "' is not <ranks>/<ranks>");
      auto a = parse_ranks(sel.substr(0, slash));
      if (!a) return a.status();
      auto b = parse_ranks(sel.substr(slash + 1));
      if (!b) return b.status();
      rule.a = *a;
      rule.b = *b;
      rule.pair = true;
      LOWCOMM_CHECK(apply_keys(rule.keys, kPairKeys, probe));
      rule.path = base->model == WanModel::kSite && has_key(rule.keys, "bw");
      if (rule.path && rule.a.first <= rule.b.last && rule.b.first <= rule.a.last)
        return invalid_argument("LOWCOMM_WAN: pair " + std::string(trim(sel)) +
                                ": a path (bw= in the site model) must join two sets that do not "
                                "overlap");
    } else {
      return invalid_argument("LOWCOMM_WAN: unknown section kind '" + kind +
                              "' (expected rank=, site= or pair=)");
    }
    plan.rules.push_back(std::move(rule));
  }
  return plan;
}

int WanPlan::site_of(int rank) const {
  int index = 0;
  for (const Rule& r : rules) {
    if (!r.site) continue;
    if (r.a.contains(rank)) return index;
    ++index;
  }
  return -1;
}

std::vector<int> WanPlan::site_labels(int nranks) const {
  std::vector<int> labels;
  for (int r = 0; r < nranks; ++r) {
    const int s = site_of(r);
    labels.push_back(s >= 0 ? s : 1000000 + r);  // outside every site= rule: a site alone
  }
  return labels;
}

int WanPlan::site_size(int rank, int nranks) const {
  int s = site_of(rank);
  if (s < 0) return 1;
  int n = 0;
  for (int r = 0; r < nranks; ++r) n += site_of(r) == s ? 1 : 0;
  return n;
}

Result<WanLink> WanPlan::link(int me, int peer) const {
  auto parsed = parse_wan(defaults);
  if (!parsed) return parsed.status();
  WanLink l = *parsed;
  if (peer >= 0 && site_of(me) >= 0 && site_of(me) == site_of(peer)) {
    WanLink local;  // the site's own network: unshaped, off the site's access link
    local.local = true;
    return local;
  }
  for (const Rule& r : rules) {
    bool applies = r.pair ? peer >= 0 && ((r.a.contains(me) && r.b.contains(peer)) ||
                                          (r.a.contains(peer) && r.b.contains(me)))
                          : r.a.contains(me);
    if (applies) LOWCOMM_CHECK(apply_keys(r.keys, r.pair ? kPairKeys : kRankKeys, l));
  }
  if (l.model == WanModel::kPair) l.down_bits_per_second = 0;
  // A path to the peer: its rate (the last path rule that applies), on its own link.
  for (size_t i = 0; i < rules.size(); ++i) {
    const Rule& r = rules[i];
    if (!r.path || peer < 0) continue;
    const bool forward = r.a.contains(me) && r.b.contains(peer);
    if (!forward && !(r.b.contains(me) && r.a.contains(peer))) continue;
    WanLink p;
    LOWCOMM_CHECK(apply_keys(r.keys, kPairKeys, p));
    l.bits_per_second = p.bits_per_second;
    l.down_bits_per_second = 0;
    l.path = static_cast<int>(2 * i + (forward ? 0 : 1));
  }
  return l;
}

std::vector<int> WanPlan::paths_from(int me) const {
  std::vector<int> out;
  for (size_t i = 0; i < rules.size(); ++i) {
    if (!rules[i].path) continue;
    if (rules[i].a.contains(me)) out.push_back(static_cast<int>(2 * i));
    if (rules[i].b.contains(me)) out.push_back(static_cast<int>(2 * i + 1));
  }
  return out;
}

bool WanPlan::has_pair_rules() const {
  for (const Rule& r : rules)
    if (r.pair || r.site) return true;
  return false;
}

Result<WanLink> wan_from_env() {
  const auto env = params::text("LOWCOMM_WAN");
  if (!env) return WanLink{};
  auto plan = parse_wan_plan(*env);
  if (!plan) return Status(plan.status().code(), plan.status().message());
  return parse_wan(plan->defaults);
}

std::string WanLink::to_string() const {
  char buf[192];
  if (model == WanModel::kPair) {
    std::snprintf(buf, sizeof(buf), "model=pair,bw=%.6gbit,rtt=%.6gms,jitter=%.6gms,frame=%.6g",
                  bits_per_second, one_way_delay_s * 2e3, jitter_s * 1e3, frame_bytes);
  } else {
    std::snprintf(buf, sizeof(buf), "up=%.6gbit,down=%.6gbit,rtt=%.6gms,jitter=%.6gms,frame=%.6g",
                  bits_per_second, down_bits_per_second, one_way_delay_s * 2e3, jitter_s * 1e3,
                  frame_bytes);
  }
  std::string out = buf;
  if (loss > 0) {
    std::snprintf(buf, sizeof(buf), ",loss=%.6g%%", loss * 100.0);
    out += buf;
  }
  return out;
}

}  // namespace lowcomm::transport
