#include "topology/planner.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "core/log.h"
#include "topology/rtt_matrix.h"

namespace lowcomm::topology {

void Planner::configure(const PlannerSettings& s) {
  given_ = s;
  sites_ = s.sites;
}

Status Planner::discover(const std::vector<std::string>& hosts,
                         const std::vector<double>& emulated_rtt,
                         const std::vector<std::unique_ptr<transport::Peer>>& peers,
                         Deadline deadline) {
  const PlannerSettings& s = given_;
  // Without a map, the ranks of one host are one site (every rank draws the same map).
  const bool probe_rtt = !s.sites_given && sites_.sites() == 0 && sites_from_hosts(hosts);
  // Owner shares (shares.h): the option, LOWCOMM_SHARES, else auto across hosts or an emulated
  // WAN, unless a site holds several ranks: they share one WAN link, which per-rank rates
  // cannot see (each rank alone reads the whole link), and shares planned from them starve the
  // site (measured: docs/sites.md, "Owner shares with sites"). Two levels are the schedule for
  // sites.
  if (!s.shares.empty()) {
    shares_auto_ = s.shares == "auto";
  } else {
    shares_auto_ =
        (s.emulated_wan || std::set<std::string>(hosts.begin(), hosts.end()).size() > 1) &&
        !sites_.shares_a_link();
  }
  // What a kernel socket receives is sampled for the rank's rate only where the rate is used,
  // and not from a peer on this rank's host (its bytes never cross a link).
  auto same_host = [&](int r) {
    return !hosts.empty() &&
           hosts[static_cast<size_t>(r)] == hosts[static_cast<size_t>(given_.rank)];
  };
  for (int r = 0; r < given_.nranks; ++r)
    if (r != given_.rank && (!shares_auto_ || same_host(r))) peers[r]->set_metered(false);
  if (!probe_rtt) return Status::ok();
  if (Status e = sites_from_round_trips(emulated_rtt, peers, deadline); !e) return e;
  if (s.shares.empty() && sites_.shares_a_link()) {
    shares_auto_ = false;  // as above; nothing reads the rates then
    for (int r = 0; r < given_.nranks; ++r)
      if (r != given_.rank) peers[r]->set_metered(false);
  }
  return Status::ok();
}

bool Planner::sites_from_hosts(const std::vector<std::string>& hosts) {
  if (hosts.empty()) return false;
  std::map<std::string, int> host_label;
  std::vector<int> labels;
  for (const std::string& h : hosts)
    labels.push_back(host_label.try_emplace(h, static_cast<int>(host_label.size())).first->second);
  SitePlan by_host = plan_from_labels(labels);
  if (by_host.sites() > 1 && by_host.sites() < given_.nranks) {
    sites_ = std::move(by_host);
    return false;
  }
  return by_host.sites() == given_.nranks && given_.nranks >= 4;
}

Status Planner::sites_from_round_trips(const std::vector<double>& emulated_rtt,
                                       const std::vector<std::unique_ptr<transport::Peer>>& peers,
                                       Deadline deadline) {
  // Every rank on a host of its own: group them by round-trip time (rtt_matrix.h). The same
  // matrix on every rank, so the same map.
  auto rtt = measure_rtt_matrix(peers, given_.rank, emulated_rtt, deadline);
  if (!rtt) return rtt.status();
  sites_ = plan_from_rtt(*rtt, given_.site_rtt_s);
  if (log_enabled(LogLevel::kInfo)) {
    std::string row;
    for (double t : (*rtt)[static_cast<size_t>(given_.rank)]) {
      char ms[24];
      std::snprintf(ms, sizeof ms, "%s%.2f", row.empty() ? "" : ",", t * 1e3);
      row += ms;
    }
    LOWCOMM_LOG(kInfo, "rank %d: round trips (ms) %s: sites from those under %.2f ms: %s",
                given_.rank, row.c_str(), given_.site_rtt_s * 1e3,
                sites_.sites() > 1 ? sites_.to_string().c_str() : "flat");
  }
  return Status::ok();
}

Result<ScheduleChoice> Planner::all_reduce(const AllReduceCall& c) const {
  using Schedule = AllReduceOptions::Schedule;
  using Sparse = AllReduceOptions::SparseSchedule;
  const bool sparse = c.codec && c.codec->sparse();
  if (sparse && c.schedule == Schedule::kTwoLevel)
    return invalid_argument("all_reduce: schedule two-level takes dense codecs; sparse " +
                            to_string(*c.codec) + " runs gather-all (one-hop)");
  const bool one_hop =
      sparse || (given_.nranks > 1 && c.count * dtype_size(c.dtype) <= given_.direct_bytes);
  ScheduleChoice out;
  out.algorithm = one_hop ? Algorithm::kOneHop : Algorithm::kDefault;
  if (sparse) {
    // Random-k: gather-all or the owner reduction over the shared positions (docs/sparse.md).
    if (c.sparse_schedule == Sparse::kOwner && !c.positions_shareable)
      return invalid_argument(
          "all_reduce: sparse_schedule owner takes a randk codec on an fp32 sum or average (" +
          to_string(*c.codec) + ", " + std::string(dtype_name(c.dtype)) + ", " +
          reduce_op_name(c.op) +
          "); topk's positions differ by rank, so its messages are gathered");
    const Sparse s = c.sparse_schedule == Sparse::kAuto ? given_.sparse_default : c.sparse_schedule;
    if (c.positions_shareable && s == Sparse::kOwner) {
      out.algorithm = Algorithm::kDefault;
    } else if (c.positions_shareable && s == Sparse::kAuto && given_.nranks >= 3) {
      // Two ranks send the same bytes either way, and gather-all is one delay and one
      // quantization fewer; from three, the faster of the two for this size (both tried first).
      out.algorithm = Algorithm::kDefault;  // or gather-all: pick() chooses
      out.auto_schedule = true;
    }
  } else if (c.schedule == Schedule::kTwoLevel) {
    if (!can_two_level(sites_, c.count, c.dtype, c.op, c.codec))
      return invalid_argument(
          "all_reduce: schedule two-level needs sites of equal size (two ranks or more each; this "
          "communicator has " +
          sites_.to_string() + ") and an fp32 sum or average of at least one scale group per rank");
    out.algorithm = Algorithm::kTwoLevel;
  } else if (c.schedule == Schedule::kAuto && !one_hop &&
             use_two_level(sites_, c.count, c.dtype, c.op, c.codec)) {
    out.algorithm = Algorithm::kTwoLevel;  // or flat: pick() chooses
    out.auto_schedule = true;
  }
  return out;
}

Algorithm Planner::reduce_scatter(uint64_t count, DType dtype, ReduceOp op,
                                  const std::optional<CodecSpec>& codec) const {
  return use_two_level(sites_, count, dtype, op, codec) ? Algorithm::kTwoLevel
                                                        : Algorithm::kDefault;
}

Algorithm Planner::gather(uint64_t bytes) const {
  return use_two_level_gather(sites_, bytes) ? Algorithm::kTwoLevel : Algorithm::kDefault;
}

Algorithm Planner::pick(const OpShape& shape) {
  return schedule_.pick(
      SchedulePicker::size_class(shape.bytes, shape.sparse, shape.sparse ? shape.keep : 0));
}

Agreement Planner::agreement(const OpShape& shape, Algorithm algorithm, bool reports) const {
  Agreement a;
  a.sites_hash = sites_.hash;
  a.shares_hash = shares_auto_ ? shares_.plan().hash() : 0;
  a.report.rate = shares_auto_ ? shares_.own_code() : 0;
  a.report.time = encode_time(last_report_seconds_);
  // A sparse all-reduce's traffic is too small to measure a link by.
  a.rated = reports && algorithm == Algorithm::kDefault && shares_auto_ && !shape.sparse;
  return a;
}

void Planner::learn(const OpShape& shape, Algorithm algorithm, const Agreement& mine,
                    std::vector<uint32_t> reports, double seconds,
                    const std::function<double()>& measured_rate) {
  reports[static_cast<size_t>(given_.rank)] = mine.report.pack();
  learn_times(reports, shape, algorithm, seconds);
  if (mine.rated) learn_rates(reports, shape.bytes >= kTwoLevelMinBytes, measured_rate);
}

void Planner::learn_times(const std::vector<uint32_t>& reports, const OpShape& shape,
                          Algorithm algorithm, double seconds) {
  // Every rank's time of the previous reporting call: the slowest is that call's time.
  double slowest = 0;
  for (uint32_t r : reports) {
    const double t = decode_time(OpReport::unpack(r).time);
    if (t == 0) {
      slowest = 0;
      break;
    }
    slowest = std::max(slowest, t);
  }
  if (last_report_seconds_ >= 0 && slowest > 0 && last_report_class_ >= 0) {
    const int cls = last_report_class_;
    const Algorithm before = schedule_.pick_would(cls);
    schedule_.record(cls, last_report_algorithm_, slowest);
    const Algorithm after = schedule_.pick_would(cls);
    if (before != after && SchedulePicker::sparse_class(cls))
      LOWCOMM_LOG(kInfo,
                  "rank %d: sparse all-reduces of about %llu bytes now run %s (owner %.4f s, "
                  "gather-all %.4f s)",
                  given_.rank, 1ull << SchedulePicker::bytes_class(cls),
                  after == Algorithm::kOneHop ? "gather-all" : "owner", schedule_.times(cls).flat,
                  schedule_.times(cls).two);
    else if (before != after && sites_.two_level())
      LOWCOMM_LOG(
          kInfo,
          "rank %d: all-reduces of about %llu bytes now run %s (flat %.4f s, two levels %.4f s)",
          given_.rank, 1ull << cls, after == Algorithm::kTwoLevel ? "in two levels" : "flat",
          schedule_.times(cls).flat, schedule_.times(cls).two);
  }
  // A sparse call's time counts only where auto chose its schedule: a top-k call, or a randk
  // call with the schedule named, says nothing of what auto's candidates take.
  last_report_class_ =
      shape.sparse && !shape.auto_schedule
          ? -1
          : SchedulePicker::size_class(shape.bytes, shape.sparse, shape.sparse ? shape.keep : 0);
  last_report_algorithm_ = algorithm;
  last_report_seconds_ = seconds;
}

void Planner::learn_rates(const std::vector<uint32_t>& reports, bool large,
                          const std::function<double()>& measured_rate) {
  if (large) shares_.measured(measured_rate());
  std::vector<uint16_t> codes;
  for (uint32_t r : reports) codes.push_back(OpReport::unpack(r).rate);
  if (!shares_.observe(codes)) return;
  std::string rates;
  for (double r : shares_.rates())
    rates += (rates.empty() ? "" : ",") + std::to_string(static_cast<long long>(r * 8 / 1e6));
  LOWCOMM_LOG(kInfo, "rank %d: owner shares re-planned from rates [%s] Mbit/s: %s", given_.rank,
              rates.c_str(), shares_.plan().to_string().c_str());
}

}  // namespace lowcomm::topology
