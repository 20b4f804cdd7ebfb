#pragma once
// Planner: where a communicator decides how its operations cross the links, in one place.
//
//   init       discover(): the site map (given, from the emulator's site= rules, from the
//              hosts, or from the round trips measured at init: rtt_matrix.h), whether owner
//              shares follow measured rates (shares.h), and which peers' traffic is metered
//              for those rates.
//   call time  all_reduce(), reduce_scatter(), gather(): the schedule a call runs (flat, one
//              hop, two levels), or that the run-time picker chooses (auto).
//   run time   before an operation (on the executor, in operation order): pick() the schedule
//              of an auto call (schedule_picker.h) and agreement(): what the descriptor carries
//              for the ranks to agree on (the site map's hash, the owner shares' hash) and this
//              rank's report (op_report.h); after it, learn() from every rank's report: the
//              slowest time of the previous reporting call for the picker, and the rates for
//              the owner shares, which every rank re-plans alike (shares.h).
//   algorithms share_plan(): the owner chunks of the flat reduction; sites(): the two-level
//              schedules' columns.
//
// Every rank holds the same inputs at the same point (the same map at init, the same reports
// after each operation), so every rank decides the same without a message of its own; the
// descriptor check (collectives/descriptor.h) fails an operation on ranks that did not.
//
// Threads: discover() runs at init; the call-time functions and sites() read what init left
// (any thread); pick(), agreement(), learn() and share_plan() run on the executor only.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "lowcomm/codec.h"
#include "lowcomm/communicator.h"
#include "lowcomm/status.h"
#include "topology/op_report.h"
#include "topology/schedule.h"
#include "topology/schedule_picker.h"
#include "topology/shares.h"
#include "topology/sites.h"
#include "transport/peer.h"

namespace lowcomm::topology {

// What init settled before the mesh was up (collectives/init_settings.h).
struct PlannerSettings {
  int rank = 0;
  int nranks = 0;
  SitePlan sites;             // given, or from the emulator's site= rules; flat otherwise
  bool sites_given = false;   // by CommOptions::sites or LOWCOMM_SITES
  std::string shares;         // "auto", "equal" or "" (decided from the hosts)
  bool emulated_wan = false;  // LOWCOMM_WAN is set
  double site_rtt_s = kSiteRttSeconds;
  uint64_t direct_bytes = 0;  // CommOptions::direct_bytes: one hop at or below this size
  AllReduceOptions::SparseSchedule sparse_default = AllReduceOptions::SparseSchedule::kAuto;
};

// An all-reduce as the caller asked for it (Communicator::all_reduce, its arguments checked).
struct AllReduceCall {
  uint64_t count = 0;
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  std::optional<CodecSpec> codec;
  AllReduceOptions::Schedule schedule = AllReduceOptions::Schedule::kAuto;
  AllReduceOptions::SparseSchedule sparse_schedule = AllReduceOptions::SparseSchedule::kAuto;
  bool positions_shareable = false;  // a randk fp32 sum or average (can_share_positions)
};

struct ScheduleChoice {
  Algorithm algorithm = Algorithm::kDefault;
  bool auto_schedule = false;  // the picker chooses when the call runs (pick())
};

// An operation as the run-time planning sees it.
struct OpShape {
  uint64_t bytes = 0;  // its input: count x the dtype's size
  bool sparse = false;
  uint32_t keep = 0;  // a sparse codec's K
  bool auto_schedule = false;
};

// What the planner puts in one operation's descriptor (collectives::stamp_agreement).
struct Agreement {
  uint64_t sites_hash = 0;   // SitePlan::hash
  uint32_t shares_hash = 0;  // the owner shares in use (0: equal)
  OpReport report;           // this rank's
  bool rated = false;        // this operation measures the rank's link rate (learn())
};

class Planner {
 public:
  // Init, before any peer is known: what the options and the emulator settled (the call-time
  // functions answer from this alone).
  void configure(const PlannerSettings& s);
  // Init, once the mesh is up (configure() first): `hosts` by rank (empty: unknown),
  // `emulated_rtt` the emulated round trip to each peer (seconds), the peers to meter or not.
  // Fails with the round-trip exchange's error.
  Status discover(const std::vector<std::string>& hosts, const std::vector<double>& emulated_rtt,
                  const std::vector<std::unique_ptr<transport::Peer>>& peers, Deadline deadline);

  const SitePlan& sites() const { return sites_; }
  bool shares_follow_rates() const { return shares_auto_; }

  // --- call time ---
  // The schedule of an all-reduce, or why the call cannot have the one it names.
  Result<ScheduleChoice> all_reduce(const AllReduceCall& c) const;
  // Reduce-scatter of `count` elements in all (every rank's part): two levels or flat.
  Algorithm reduce_scatter(uint64_t count, DType dtype, ReduceOp op,
                           const std::optional<CodecSpec>& codec) const;
  // An all-gather's result or a broadcast's tensor of `bytes`: two levels or flat.
  Algorithm gather(uint64_t bytes) const;

  // --- run time, on the executor ---
  // The schedule of an auto call (shape.auto_schedule) for this run.
  Algorithm pick(const OpShape& shape);
  // What the descriptor of an operation running `algorithm` carries; `reports`: it carries a
  // report (OpDescriptor::carries_report()).
  Agreement agreement(const OpShape& shape, Algorithm algorithm, bool reports) const;
  // After a reporting operation that succeeded in `seconds`: every rank's report by rank (this
  // rank's from `mine`), and, for a rated one, this rank's link rate read from the meters since
  // it began (called only when the operation was large enough to fill the link).
  void learn(const OpShape& shape, Algorithm algorithm, const Agreement& mine,
             std::vector<uint32_t> reports, double seconds,
             const std::function<double()>& measured_rate);
  // The owner shares of flat all-reduces (equal unless they follow the rates).
  const SharePlan& share_plan() const { return shares_.plan(); }

 private:
  // The site map from the hosts: several ranks on some host make the hosts the sites; every
  // rank on a host of its own asks for the round trips (returns true).
  bool sites_from_hosts(const std::vector<std::string>& hosts);
  Status sites_from_round_trips(const std::vector<double>& emulated_rtt,
                                const std::vector<std::unique_ptr<transport::Peer>>& peers,
                                Deadline deadline);
  void learn_times(const std::vector<uint32_t>& reports, const OpShape& shape, Algorithm algorithm,
                   double seconds);
  void learn_rates(const std::vector<uint32_t>& reports, bool large,
                   const std::function<double()>& measured_rate);

  PlannerSettings given_;  // configure()'s
  SitePlan sites_;         // given_.sites, refined by discover()
  bool shares_auto_ = false;
  SharePlanner shares_;
  SchedulePicker schedule_;
  // This rank's previous reporting all-reduce: its size class (-1: not auto's to learn from),
  // schedule and time, reported in the next one.
  int last_report_class_ = 0;
  Algorithm last_report_algorithm_ = Algorithm::kDefault;
  double last_report_seconds_ = -1;  // < 0: no reporting call yet
};

}  // namespace lowcomm::topology
