#include "topology/shares.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace lowcomm::topology {

uint32_t SharePlan::hash() const {
  if (parts.empty()) return 0;
  uint32_t h = 2166136261u;
  for (uint32_t p : parts)
    for (int b = 0; b < 4; ++b) {
      h ^= (p >> (8 * b)) & 0xff;
      h *= 16777619u;
    }
  return h ? h : 1;
}

std::vector<Range> SharePlan::chunks(uint64_t n, int parts_count, uint64_t g) const {
  const uint64_t units = (n + g - 1) / g;
  const auto P = static_cast<uint64_t>(parts_count);
  if (parts.empty() || parts.size() != P || units < P) return owner_chunks(n, parts_count, g);
  // Each boundary at the plan's cumulative share of the granules, each chunk at least one.
  std::vector<Range> out(P);
  uint64_t cum = 0, prev = 0;
  for (uint64_t j = 0; j < P; ++j) {
    cum += parts[j];
    // units * cum / 2^20 without overflow (kShareUnits is 2^20; cum at most that).
    static_assert(kShareUnits == 1u << 20);
    uint64_t end =
        j + 1 == P ? units : (units >> 20) * cum + ((units & (kShareUnits - 1)) * cum >> 20);
    end = std::clamp<uint64_t>(end, prev + 1, units - (P - 1 - j));
    const uint64_t b = std::min(n, prev * g), e = std::min(n, end * g);
    out[j] = {b, e - b};
    prev = end;
  }
  return out;
}

std::string shares_to_string(const std::vector<double>& fractions) {
  if (fractions.empty()) return "equal";
  std::string s;
  for (double w : fractions) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%s%.3f", s.empty() ? "" : ",", w);
    s += buf;
  }
  return s;
}

std::string SharePlan::to_string() const {
  std::vector<double> fractions;
  for (uint32_t p : parts) fractions.push_back(static_cast<double>(p) / kShareUnits);
  return shares_to_string(fractions);
}

namespace {

// 2^(-1/1024) in Q63, from integers alone (bisection on m^1024 = 1/2), at compile time.
__extension__ using U128 = unsigned __int128;
constexpr uint64_t kQ63 = uint64_t{1} << 63;
constexpr uint64_t mul_q63(uint64_t a, uint64_t b) {
  return static_cast<uint64_t>((static_cast<U128>(a) * b) >> 63);
}
constexpr uint64_t step_down_q63() {
  uint64_t lo = kQ63 / 2, hi = kQ63 - 1;
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    uint64_t p = mid;
    for (int i = 0; i < 10; ++i) p = mul_q63(p, p);  // mid^1024
    (p < kQ63 / 2 ? lo : hi) = mid;
  }
  return hi;
}
constexpr uint64_t kStepDownQ63 = step_down_q63();

// What each rank can own if all must finish by T (per byte of the encoded tensor).
double capacity(const std::vector<double>& rates, double T, std::vector<double>* each) {
  const double k = static_cast<double>(rates.size()) - 2;
  const double cap = kMaxShareFactor / static_cast<double>(rates.size());
  double sum = 0;
  for (size_t i = 0; i < rates.size(); ++i) {
    const double c = std::clamp((T * rates[i] - 1) / k, 0.0, cap);
    if (each) (*each)[i] = c;
    sum += c;
  }
  return sum;
}

}  // namespace

SharePlan plan_shares(const std::vector<double>& rates) {
  const size_t P = rates.size();
  if (P < 3) return {};
  for (double r : rates)
    if (!(r > 0) || !std::isfinite(r)) return {};
  // Rates relative to the fastest (the times are per byte of E; scale does not matter).
  const double top = *std::max_element(rates.begin(), rates.end());
  std::vector<double> r(P);
  for (size_t i = 0; i < P; ++i) r[i] = rates[i] / top;
  double lo = 0;  // no rank can finish before it has moved E
  for (double x : r) lo = std::max(lo, 1 / x);
  double hi = lo * static_cast<double>(P);  // every rank could own everything by then
  if (capacity(r, lo, nullptr) < 1) {
    for (int it = 0; it < 100 && hi - lo > 1e-12 * hi; ++it) {
      const double mid = (lo + hi) / 2;
      (capacity(r, mid, nullptr) >= 1 ? hi : lo) = mid;
    }
    lo = hi;
  }
  std::vector<double> c(P);
  const double sum = capacity(r, lo, &c);
  // Parts: floors of the scaled shares, at least one each, the rest by largest remainder
  // (ties to the lower rank): the same integers on every rank for the same rates.
  SharePlan plan;
  plan.parts.resize(P);
  std::vector<std::pair<double, size_t>> rem;
  uint64_t given = 0;
  for (size_t i = 0; i < P; ++i) {
    const double want = c[i] / sum * static_cast<double>(kShareUnits - P);
    const auto f = static_cast<uint32_t>(std::floor(want));
    plan.parts[i] = 1 + f;
    given += 1 + f;
    rem.emplace_back(want - f, i);
  }
  std::stable_sort(rem.begin(), rem.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t k = 0; given < kShareUnits; ++k, ++given) ++plan.parts[rem[k % P].second];
  return plan;
}

double predicted_time(const SharePlan& plan, const std::vector<double>& rates) {
  const size_t P = rates.size();
  double t = 0;
  for (size_t i = 0; i < P; ++i) {
    const double w = plan.parts.size() == P ? static_cast<double>(plan.parts[i]) / kShareUnits
                                            : 1.0 / static_cast<double>(P);
    t = std::max(t, (1 + (static_cast<double>(P) - 2) * w) / rates[i]);
  }
  return t;
}

void SharePlanner::measured(double bytes_per_second) {
  if (encode_rate(bytes_per_second) == 0) return;  // outside what is believed, NaN too
  recent_[next_++ % kRecent] = bytes_per_second;
  measurements_ = std::min(measurements_ + 1, kRecent);
  rate_ = *std::max_element(recent_.begin(), recent_.end());
}

double relative_rate(uint32_t steps) {
  uint64_t x = kQ63, b = kStepDownQ63;
  for (uint32_t e = steps & 1023; e != 0; e >>= 1) {
    if (e & 1) x = mul_q63(x, b);
    b = mul_q63(b, b);
  }
  return std::ldexp(static_cast<double>(x), -63 - static_cast<int>(steps >> 10));
}

std::vector<double> plan_rates(const std::vector<uint16_t>& codes) {
  const uint16_t top = codes.empty() ? 0 : *std::max_element(codes.begin(), codes.end());
  std::vector<double> r;
  for (uint16_t c : codes) r.push_back(relative_rate(static_cast<uint32_t>(top - c)));
  return r;
}

bool SharePlanner::observe(const std::vector<uint16_t>& codes) {
  if (codes.size() < 3) return false;
  for (uint16_t c : codes)
    if (c == 0) return false;
  // From the codes by integer arithmetic and IEEE's basic operations only (no libm, no
  // contraction: -ffp-contract=off), so every host makes the same plan from the same codes.
  const std::vector<double> rates = plan_rates(codes);
  SharePlan next = plan_shares(rates);
  if (predicted_time(SharePlan{}, rates) <= kPlanGain * predicted_time(next, rates)) next = {};
  if (next.parts == plan_.parts) return false;
  // To equal shares whenever they are faster; to a plan only for a clear gain.
  if (predicted_time(plan_, rates) <=
      (next.equal() ? 1.0 : kReplanGain) * predicted_time(next, rates))
    return false;
  plan_ = std::move(next);
  rates_.clear();
  for (uint16_t c : codes) rates_.push_back(decode_rate(c));  // for the log line only
  return true;
}

}  // namespace lowcomm::topology
