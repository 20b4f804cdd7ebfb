#pragma once
// Owner shares that follow the links. The flat owner reduction (owner_reduce.cc) gives rank i a
// share w_i of the tensor; for a tensor that encodes to E bytes, rank i then receives (and
// sends) about E (1 + (P - 2) w_i) bytes: every other rank's contribution to its share, and
// every other owner's result. With equal shares the slowest rank sets the time; sized to the
// ranks' rates r_i, every rank finishes together or the slow ones own nothing:
//   T(w) = max_i E (1 + (P - 2) w_i) / r_i,   and the least T over shares summing to 1 is
//   found by bisection on T: at a finishing time T rank i can own
//   c_i(T) = clamp((T r_i / E - 1) / (P - 2), 0, 2 / P), and T is the least with sum c_i(T) >= 1
//   (never below max_i E / r_i: a rank that owns nothing still sends and receives E).
// The shares are c_i(T) / sum c(T), in parts of kShareUnits, every rank at least one part.
//
// The rates come from the traffic itself (transport/arrival_meter.h: the link's peak
// throughput during each large flat all-reduce, the higher of the last two), and every rank sends
// its own in the descriptor of the next flat all-reduce (op_report.h: in the low half of the tag).
// After an operation every rank holds the same P numbers and re-plans from them with the same code,
// so the ranks agree without a message of their own; the plan's hash rides in the high half of the
// tag and is checked like the rest of the descriptor.
//
// The rates are measurements, and noisy ones (the first most: TCP is still opening its
// windows), the least-time plan follows every difference, and the model is only a model: on
// equal links such plans measured slower than equal shares (docs/sites.md, "Shares that follow
// the links"). So a rank's rate counts only from its
// kRecent-th measurement on, a plan must be predicted kPlanGain faster than equal shares
// (otherwise the rates are equal within what the meter can tell, and so are the shares), a plan
// replaces another only when predicted kReplanGain faster, and a plan returns to equal shares
// as soon as equal shares are predicted faster than it.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "topology/op_report.h"
#include "topology/partition.h"

namespace lowcomm::topology {

inline constexpr uint32_t kShareUnits = 1u << 20;
// No rank owns more than kMaxShareFactor / P of the tensor: an owner's scratch for its
// contributions grows with its share ((P - 1) x its chunk), and a rank far faster than the rest
// gains little beyond it.
inline constexpr double kMaxShareFactor = 2.0;
inline constexpr double kPlanGain = 1.25;
inline constexpr double kReplanGain = 1.10;

// Shares in parts of kShareUnits; empty: equal shares.
struct SharePlan {
  std::vector<uint32_t> parts;
  bool equal() const { return parts.empty(); }
  // 32-bit hash of the parts (0 for equal shares): what the descriptor carries.
  uint32_t hash() const;
  // Owner chunks of n elements in granules of g; equal chunks (owner_chunks) when the plan is
  // equal, its size is not `parts`, or n has fewer granules than ranks.
  std::vector<Range> chunks(uint64_t n, int parts_count, uint64_t g) const;
  std::string to_string() const;  // "0.322,0.322,0.322,0.034" or "equal"
};

// Shares as fractions ("0.333,0.333,0.333,0.000"), or "equal" for none: the plan, the stats
// (OpStats::shares) and the bench print them alike.
std::string shares_to_string(const std::vector<double>& fractions);

// The least-finishing-time shares for rates r (bytes/s, all > 0); equal for P < 3.
SharePlan plan_shares(const std::vector<double>& rates);
// T(w) / E: the modelled finishing time per byte of the encoded tensor.
double predicted_time(const SharePlan& plan, const std::vector<double>& rates);

// The rates a plan is made from: code c's rate relative to the fastest of `codes`,
// 2^((c - max) / 1024) (op_report.h's code steps), computed from integers alone (a Q63 power)
// and not by libm's exp2, whose last bit may differ between hosts: a plan one host computes one
// part differently fails the group at its descriptor check. relative_rate(k) = 2^(-k/1024).
double relative_rate(uint32_t steps);
std::vector<double> plan_rates(const std::vector<uint16_t>& codes);

// One rank's view of the shares: its own rate and the plan every rank holds.
class SharePlanner {
 public:
  // What this rank measured during a flat all-reduce (outside [kMinRate, kMaxRate], NaN
  // included: not believed, ignored).
  void measured(double bytes_per_second);
  // The code of this rank's rate, for its next descriptor; 0 (unknown) until kRecent
  // measurements.
  uint16_t own_code() const { return measurements_ < kRecent ? 0 : encode_rate(rate_); }
  double rate() const { return rate_; }
  // Every rank's code from one operation's descriptors (by rank): re-plans with hysteresis (the
  // header's comment); returns whether the plan changed. Any unknown code keeps the current
  // plan.
  bool observe(const std::vector<uint16_t>& codes);
  const SharePlan& plan() const { return plan_; }
  const std::vector<double>& rates() const { return rates_; }  // bytes/s, for logs

  // The rate is the highest of the last kRecent measurements: a peak can only under-read the
  // link (an operation that never fills it shows less, the first one most of all, while TCP
  // opens its windows), so the recent maximum is the estimate, and a link that slows down is
  // seen after kRecent operations.
  static constexpr size_t kRecent = 2;

 private:
  std::array<double, kRecent> recent_{};
  size_t next_ = 0;
  size_t measurements_ = 0;  // believed ones, saturating at kRecent
  double rate_ = 0;
  SharePlan plan_;
  std::vector<double> rates_;  // the rates the current plan was made from
};

}  // namespace lowcomm::topology
