// The view protocol (docs/membership.md, "Who decides", "The commit"): failures start a change,
// reports go to the coordinator, which decides the next view and what commits; collectives
// commit on every member's done; admissions; every message's handling. Membership thread, mu_ held.
#include "membership/elastic_impl.h"

#include <algorithm>
#include <csignal>
#include <random>
#include <utility>

#include "core/log.h"
#include "membership/elastic_util.h"

namespace lowcomm {

using membership::MemberAddress;
using membership::Message;
using membership::MsgType;

uint32_t ElasticImpl::coordinator_candidate() const {
  for (uint32_t id : view_.members)
    if (!failed_.count(id)) return id;
  return me_;
}

void ElasticImpl::lose(uint32_t id, const std::string& why) {
  if (auto it = slots_.find(id); it != slots_.end()) {
    it->second.peer->abort();
    slots_.erase(it);
  }
  if (!addresses_.count(id) || failed_.count(id) || !fence_.is_ok()) return;
  LOWCOMM_LOG(kWarn, "elastic member %u: %s", me_, why.c_str());
  failed_.insert(id);
  begin_change(why);
}

void ElasticImpl::fence(Status why) {
  if (!fence_.is_ok()) return;
  std::string text = why.message();
  if (why.code() != StatusCode::kAborted && why.code() != StatusCode::kFenced)
    text = std::string(status_code_name(why.code())) + ": " + text;
  if (stalled_for_.count() > 0)
    text += " (this member itself had stalled for " + std::to_string(stalled_for_.count()) +
            " ms before: frozen, suspended or starved of CPU, so the others may rightly have "
            "given up on it)";
  LOWCOMM_LOG(kWarn, "elastic member %u: fenced: %s", me_, text.c_str());
  fence_ = Status(StatusCode::kFenced, std::move(text));
  fenced_at_ = Clock::now();
  abort_async(data_);
  cv_.notify_all();
}

void ElasticImpl::begin_change(const std::string& why) {
  if (!fence_.is_ok()) return;
  if (!changing_) {
    changing_ = true;
    change_started_ = Clock::now();
    change_reason_ = why;
    reports_.clear();  // done_ stays: the report says whose done this member saw
    admission_ = false;
    own_done_.clear();
    abort_async(data_);  // the collective in flight fails now on this member
    cv_.notify_all();
  }
  Message c = message(MsgType::kChange);
  c.failed.assign(failed_.begin(), failed_.end());
  c.text = why;
  broadcast(c);
  report_to_coordinator();
}

void ElasticImpl::report_to_coordinator() {
  Message r = message(MsgType::kReport);
  r.committed = committed_;
  r.staged = staged_;
  r.failed.assign(failed_.begin(), failed_.end());          // what this member itself cannot reach
  for (auto& [id, h] : done_) r.hashes.push_back({id, h});  // dones of committed_+1 it saw
  uint32_t c = coordinator_candidate();
  if (c == me_) {
    reports_[me_] = r;
    try_decide();
  } else {
    send_to(c, r);
  }
}

namespace {

// The largest set of members, `me` among them, in which no member reported another as failed
// (a view's mesh needs every pair connected); ties go to the set of lowest ids. Exact up to 16
// candidates; above, greedily adds members with the fewest suspicions first.
std::vector<uint32_t> largest_connected(const std::vector<uint32_t>& reporters, uint32_t me,
                                        const std::function<bool(uint32_t, uint32_t)>& apart) {
  std::vector<uint32_t> cand;
  for (uint32_t id : reporters)
    if (id != me && !apart(id, me)) cand.push_back(id);
  std::vector<uint32_t> best;
  if (cand.size() <= 16) {
    const uint32_t n = static_cast<uint32_t>(cand.size());
    for (uint32_t mask = 0; mask < (1u << n); ++mask) {
      std::vector<uint32_t> set;
      bool ok = true;
      for (uint32_t i = 0; i < n && ok; ++i) {
        if (!(mask & (1u << i))) continue;
        for (uint32_t j : set) ok = ok && !apart(cand[i], j);
        set.push_back(cand[i]);
      }
      if (ok && (set.size() > best.size() || (set.size() == best.size() && set < best))) best = set;
    }
  } else {
    std::vector<std::pair<int, uint32_t>> order;
    for (uint32_t a : cand) {
      int k = 0;
      for (uint32_t b : cand) k += apart(a, b) ? 1 : 0;
      order.push_back({k, a});
    }
    std::sort(order.begin(), order.end());
    for (auto [k, a] : order) {
      bool ok = true;
      for (uint32_t b : best) ok = ok && !apart(a, b);
      if (ok) best.push_back(a);
    }
  }
  best.push_back(me);
  std::sort(best.begin(), best.end());
  return best;
}

}  // namespace

void ElasticImpl::try_decide() {
  if (!changing_ || coordinator_candidate() != me_ || !fence_.is_ok()) return;
  std::vector<uint32_t> reporters;
  for (uint32_t id : view_.members) {
    if (failed_.count(id)) continue;
    if (!reports_.count(id)) return;  // still waiting for a report (or for its failure)
    reporters.push_back(id);
  }
  // Failures one member reports are its own observation, not a verdict on everyone: a member
  // cut off for a while (or whose TCP is still backing off after a healed partition) suspects
  // members that the others reach well. The next view is the largest set of reporters that all
  // reach each other; a member outside it is evicted (it can rejoin).
  auto suspects = [&](uint32_t a, uint32_t b) {
    auto it = reports_.find(a);
    return it != reports_.end() && std::find(it->second.failed.begin(), it->second.failed.end(),
                                             b) != it->second.failed.end();
  };
  std::vector<uint32_t> live = largest_connected(
      reporters, me_, [&](uint32_t a, uint32_t b) { return suspects(a, b) || suspects(b, a); });
  // Commit what any member of the next view committed: a member commits a collective as soon
  // as its data completes there (and every member's start is in), so it holds the whole result,
  // every member's contribution included; the members of the next view that do not hold it
  // fetch it from those that do (rolling forward: docs/membership.md). A member outside the
  // next view that committed more is fenced (evicted or without a quorum): it must rejoin.
  // And the next collective commits too if every member of the next view holds it.
  uint64_t decision = 0;
  for (auto& [id, r] : reports_) decision = std::max(decision, r.committed);
  uint64_t next_decision = 0;
  for (uint32_t id : live) next_decision = std::max(next_decision, reports_[id].committed);
  std::set<uint32_t> holding;
  std::map<uint32_t, uint64_t> proof;  // member -> its done's hash, for decision + 1
  for (auto& [id, r] : reports_) {
    if (r.committed != decision) continue;
    if (r.staged == decision + 1) holding.insert(id);
    for (auto& [d, h] : r.hashes) {
      holding.insert(d);
      proof[d] = h;
    }
  }
  auto all_of_hold = [&](const std::vector<uint32_t>& ids) {
    return std::all_of(ids.begin(), ids.end(), [&](uint32_t id) { return holding.count(id) > 0; });
  };
  if (live.size() * 2 <= view_.members.size()) {
    // No quorum: this side decides nothing, but a collective every member of the view held
    // may have been committed by one of them (and the majority, if there is one, rolls it
    // forward): commit it here too, and say so to the others on this side.
    Message q = message(MsgType::kNoQuorum);
    if (all_of_hold(view_.members) && staged_ == decision + 1 && committed_ == decision) {
      q.committed = decision + 1;
      for (auto& [id, h] : proof) q.hashes.push_back({id, h});
      for (auto& [id, h] : proof) done_[id] = h;
      commit_on_proof(/*report=*/false);  // (this is the coordinator: no report to itself)
    }
    q.text = "no quorum: members " + id_list(live) + " reachable of view " +
             std::to_string(view_.id) + "'s " + id_list(view_.members) + ", " +
             std::to_string(view_.members.size() / 2 + 1) + " needed (" + change_reason_ +
             "); this side of the partition commits nothing";
    for (uint32_t id : live)
      if (id != me_) send_to(id, q);
    fence(Status(StatusCode::kAborted, q.text));
    return;
  }
  std::vector<std::pair<uint32_t, uint64_t>> decided_hashes;
  std::vector<uint32_t> holders;
  if (next_decision == decision && all_of_hold(live)) {
    ++decision;
    decided_hashes.assign(proof.begin(), proof.end());
    holders = live;
  } else {
    decision = next_decision;
    for (uint32_t id : live) {
      const Message& r = reports_[id];
      if (r.committed == decision || (r.committed + 1 == decision && r.staged == decision))
        holders.push_back(id);
    }
    if (committed_ == decision) decided_hashes = commit_hashes_;
  }
  auto root = open_data_root(view_.id + 1, live);
  if (!root) {
    fence(root.status());
    return;
  }
  Message v = message(MsgType::kNewView);
  v.view = view_.id + 1;
  v.committed = decision;
  v.next_id = next_id_;
  v.data_root = *root;
  v.hashes = decided_hashes;
  v.holders = holders;
  for (uint32_t id : live) v.members.push_back({id, addresses_[id]});
  for (uint32_t id : fresh_)
    if (std::find(live.begin(), live.end(), id) != live.end()) v.failed.push_back(id);
  // To every reporter: those left out learn at once that they were evicted.
  for (uint32_t id : reporters)
    if (id != me_) send_to(id, v);
  apply_view(v.view, v.members, v.data_root, v.committed, v.next_id, v.failed, v.hashes, v.holders);
}

void ElasticImpl::forward_join(const std::string& address) {
  if (view_.coordinator() != me_) {
    Message f = message(MsgType::kJoin);
    f.text = address;
    send_to(view_.coordinator(), f);
    return;
  }
  // At most once per address: a joiner may ask again through another member.
  for (const auto& j : pending_joiners_)
    if (j.address == address) return;
  for (const auto& [id, a] : addresses_)
    if (a == address) return;
  pending_joiners_.push_back({0, address});
  plan_admission();
}

void ElasticImpl::plan_admission() {
  if (view_.coordinator() != me_ || changing_ || !fence_.is_ok() || pending_joiners_.empty())
    return;
  // An admission in flight in this view (its start went out): the joiners that asked since
  // enter the view after it, named once that one is applied (apply_view).
  if (admit_plan_.view == view_.id && admit_plan_.seq != 0) return;
  // Named already for exactly these joiners (a plan tied to a collective is spent: its joiners
  // left the pending list at that start).
  if (admit_plan_.view == view_.id && admit_plan_.seq == 0 &&
      admit_plan_.members.size() == view_.members.size() + pending_joiners_.size()) {
    bool same = true;
    for (size_t k = 0; k < pending_joiners_.size(); ++k)
      same = same &&
             admit_plan_.members[view_.members.size() + k].address == pending_joiners_[k].address;
    if (same) return;
  }
  // Another joiner since the last plan: a new one (a new root; the builds of the last one are
  // abandoned). The joiners keep their ids: they are dealt from next_id_ in arrival order.
  std::vector<uint32_t> ids = view_.members;
  std::vector<uint32_t> joiners;
  for (uint32_t k = 0; k < pending_joiners_.size(); ++k) joiners.push_back(next_id_ + k);
  ids.insert(ids.end(), joiners.begin(), joiners.end());
  auto root = open_data_root(view_.id + 1, ids);
  if (!root) {
    LOWCOMM_LOG(kWarn, "elastic member %u: cannot name the view to admit joiners into yet: %s", me_,
                root.status().message().c_str());
    return;
  }
  Message p = message(MsgType::kAdmit);
  p.data_root = *root;
  for (uint32_t id : view_.members) p.members.push_back({id, addresses_[id]});
  for (size_t k = 0; k < pending_joiners_.size(); ++k)
    p.members.push_back({joiners[k], pending_joiners_[k].address});
  p.failed = joiners;
  p.next_id = next_id_ + static_cast<uint32_t>(joiners.size());
  if (!plan_nonce_) {
    std::random_device rd;
    plan_nonce_ = (uint64_t{rd()} << 32) | rd();  // not another coordinator's
  }
  p.hash = ++plan_nonce_;
  admit_plan_ = p;
  if (admit_waiting_since_ == Clock::time_point{}) admit_waiting_since_ = Clock::now();
  admit_ready_.clear();
  broadcast(p);
  for (auto& [tid, s] : joiner_slots_) send_to(tid, p);
  prepare_admission(p);
}

void ElasticImpl::on_ready(const Message& m) {
  if (view_.coordinator() != me_) {
    // A joiner's, through the seed it is connected to: on to the coordinator. (A member's goes
    // to the coordinator of its view directly; one that reaches a non-coordinator is stale.)
    if (m.from & 0x80000000u) send_to(view_.coordinator(), m);
    return;
  }
  if (m.hash != admit_plan_.hash || m.data_root != admit_plan_.data_root)
    return;  // built for a plan since replaced
  for (const auto& a : admit_plan_.members)
    if (a.id == m.next_id) admit_ready_.insert(a.id);
}

bool ElasticImpl::admission_ready() const {
  // Past the builds' own timeout a member that is not ready will not be: admit all the same.
  if (Clock::now() - admit_waiting_since_ >= build_timeout()) return true;
  for (const auto& a : admit_plan_.members)
    if (!admit_ready_.count(a.id)) return false;
  return true;
}

void ElasticImpl::prepare_admission(const Message& m) {
  std::vector<uint32_t> next;
  uint32_t self = me_;
  for (const auto& a : m.members) {
    next.push_back(a.id);
    if (a.address == listener_->address().to_string()) self = a.id;
  }
  if (me_ & 0x80000000u) {  // a joiner hears of its admission ahead (relayed)
    // Not an older plan arriving late (through another seed): it would replace the newer one.
    if (self != me_ && !(ahead_.build && m.view + 1 < ahead_.view)) {
      start_build(m.view + 1, next, m.data_root, self, /*ahead=*/true);
      if (m.type == MsgType::kAdmit && ahead_.is(m.view + 1, m.data_root)) ahead_.plan = m.hash;
    }
    return;
  }
  if (m.view != view_.id || m.from != view_.coordinator() || changing_ || m.members.empty()) return;
  // (next_id_ stays: it moves at the view's commit. A member that counted the named joiners
  // early would refuse a joiner that dials it before it applied the commit.)
  if (!fresh_.count(me_)) allocate_snapshot_ahead();  // the fresh members' next snapshot
  if (m.from != me_)
    for (auto& [tid, s] : joiner_slots_) send_to(tid, m);  // relay to joiners here
  start_build(m.view + 1, next, m.data_root, me_, /*ahead=*/true);
  if (m.type == MsgType::kAdmit) {
    plan_heard_ = m;
    if (ahead_.is(m.view + 1, m.data_root)) ahead_.plan = m.hash;
  }
}

void ElasticImpl::try_commit() {
  // Every member's done is in, this member's own among them (it holds the result): every
  // member holds it, so committing here agrees with any later view change (which commits what
  // any survivor committed). One one-way delay after the last member finished, where a commit
  // from the coordinator would take a round trip.
  if (staged_ != committed_ + 1 || done_.size() < view_.members.size()) return;
  for (uint32_t id : view_.members)
    if (!done_.count(id)) return;
  for (const auto& r : own_done_)
    if (!r.test()) return;  // the membership thread tries again on its next pass
  Message c = message(MsgType::kCommit, committed_ + 1);
  for (auto& [id, h] : done_) c.hashes.push_back({id, h});
  if (!admission_) {
    commit_hashes_ = c.hashes;
    commit_locally(c.seq);
    return;
  }
  if (view_.coordinator() != me_) return;  // its kCommit names the next view
  if (admit_plan_.view == view_.id && admit_plan_.seq == c.seq && !admit_plan_.members.empty()) {
    // Admission: the joiners enter the next view its start named at this commit, fresh until
    // they hold the registered state (fetched during their first collective).
    c.data_root = admit_plan_.data_root;
    c.members = admit_plan_.members;
    c.failed = admit_plan_.failed;
    c.next_id = admit_plan_.next_id;
  }
  if (fault_commit_only_to_ >= 0) {
    // The testing hook: the commit reaches one member only; this coordinator dies once that
    // member has applied it (its start in the next view proves it: on_start).
    fault_die_on_start_from_ = std::exchange(fault_commit_only_to_, -1);
    send_to(static_cast<uint32_t>(fault_die_on_start_from_), c);
    handle(c, me_);
    return;
  }
  broadcast(c);
  for (auto& [tid, s] : joiner_slots_) send_to(tid, c);
  handle(c, me_);
}

void ElasticImpl::commit_locally(uint64_t seq) {
  committed_ = seq;
  staged_ = membership::kNone;
  kept_seq_ = seq;  // held in results_[seq % 2] (every path here holds the result)
  kept_bytes_ = staged_bytes_;
  settled_ = {me_};
  for (auto& [id, h] : done_) settled_.insert(id);
  std::erase_if(starts_, [&](const auto& e) { return e.first.second <= seq; });
  std::erase_if(admit_starts_, [&](const auto& k) { return k.second <= seq; });
  done_.clear();
  admission_ = false;
  own_done_.clear();
  ++stats_.committed;
  cv_.notify_all();
  serve_fetches();  // stripes of this result asked for by a member rolling forward
}

void ElasticImpl::commit_on_proof(bool report) {
  // During a change too: every member holding the collective means any decision rolls it
  // forward (try_decide), so committing it now agrees with the next view; the report says so.
  if (staged_ != committed_ + 1) return;
  for (uint32_t id : view_.members)
    if (!done_.count(id)) return;
  commit_hashes_.clear();
  for (auto& [id, h] : done_) commit_hashes_.push_back({id, h});
  commit_locally(committed_ + 1);
  if (changing_ && report) report_to_coordinator();
}

// apply_view's first step: collective `committed`, which the view names as committed, is
// committed here, or rolls forward (the caller's thread fetches it), or this member, which
// does not hold it, is fenced (false: the view is not applied).
bool ElasticImpl::apply_committed(uint64_t view, uint64_t committed,
                                  const std::vector<std::pair<uint32_t, uint64_t>>& hashes,
                                  const std::vector<uint32_t>& holders) {
  std::vector<uint32_t> others_holding;
  for (uint32_t id : holders)
    if (id != me_) others_holding.push_back(id);
  roll_seq_ = membership::kNone;  // (a view that no longer commits it ends a roll in progress)
  if (committed > committed_) {
    if (staged_ == committed) {
      std::map<uint32_t, uint64_t> known(done_.begin(), done_.end());
      for (const auto& [id, h] : hashes) known[id] = h;
      commit_hashes_.assign(known.begin(), known.end());
      commit_locally(committed);
    } else if (committed == committed_ + 1 && !others_holding.empty() && !fresh_.count(me_) &&
               !(me_ & 0x80000000u)) {
      // Rolling forward: a member of this view committed it (its data completed there); this
      // member's did not. The caller's thread fetches the result from the holders and commits.
      roll_seq_ = committed;
      roll_from_ = others_holding;
      roll_hashes_ = hashes;
      // The decider did not hold it, so it has no hashes to pass on: the members' starts, which
      // this member has if it ran the collective to the end, serve the replica check as well.
      for (auto it = starts_.rbegin(); roll_hashes_.empty() && it != starts_.rend(); ++it)
        if (it->first.second == committed)
          roll_hashes_.assign(it->second.begin(), it->second.end());
    } else {
      fence(Status(StatusCode::kAborted, "view " + std::to_string(view) + " committed collective " +
                                             std::to_string(committed) +
                                             ", which this member does not hold; "
                                             "rejoin to fetch the state"));
      return false;
    }
  }
  return true;
}

void ElasticImpl::apply_view(uint64_t view, const std::vector<MemberAddress>& members,
                             const std::string& data_root, uint64_t committed, uint32_t next_id,
                             const std::vector<uint32_t>& fresh,
                             const std::vector<std::pair<uint32_t, uint64_t>>& hashes,
                             const std::vector<uint32_t>& holders) {
  if (!apply_committed(view, committed, hashes, holders)) return;
  staged_ = membership::kNone;
  bool in_view = false;
  std::map<uint32_t, std::string> addrs;
  std::vector<uint32_t> ids;
  for (const auto& a : members) {
    addrs[a.id] = a.address;
    ids.push_back(a.id);
    if (a.id == me_) in_view = true;
  }
  if (!in_view && !(me_ & 0x80000000u)) {
    fence(Status(StatusCode::kAborted, "evicted: view " + std::to_string(view) + " is " +
                                           id_list(ids) + " without this member " +
                                           std::to_string(me_) + "; rejoin as a new member"));
    return;
  }
  if (!in_view) return;  // a joiner that was not admitted by this view
  // Connections to members that left the view close; members new to it connect to us.
  for (auto it = slots_.begin(); it != slots_.end();) {
    if (!addrs.count(it->first)) {
      it->second.peer->abort();
      it = slots_.erase(it);
    } else {
      ++it;
    }
  }
  std::erase_if(serving_, [&](const auto& e) { return !addrs.count(e.first); });
  for (uint32_t id : ids)
    if (id != me_ && !slots_.count(id) && !addresses_.count(id)) awaited_[id] = Clock::now();
  auto started = change_started_;
  bool was_changing = changing_;
  view_.id = view;
  view_.members = ids;
  addresses_ = addrs;
  data_root_ = data_root;
  next_id_ = std::max(next_id_, next_id);
  fresh_ = std::set<uint32_t>(fresh.begin(), fresh.end());
  // Who holds collective committed_ (a member leaving waits until all do): the holders the
  // view names (a member rolling forward says so once it has the result), else everyone.
  settled_.clear();
  for (uint32_t id : holders.empty() ? ids : holders) settled_.insert(id);
  if (roll_seq_ == membership::kNone) settled_.insert(me_);
  std::erase_if(starts_, [&](const auto& e) { return e.first.first < view; });
  std::erase_if(admit_starts_, [&](const auto& k) { return k.first < view; });
  changing_ = false;
  failed_.clear();
  answered_stale_.clear();
  reports_.clear();
  done_.clear();
  admission_ = false;
  own_done_.clear();
  ++stats_.view_changes;
  if (was_changing) stats_.last_view_change = Clock::now() - started;
  abort_async(data_);  // the old view's communicator; the caller builds the next
  if (ahead_.is(view, data_root)) {
    // Built ahead: it is this view's build now (before a joiner still pending has the next
    // view named, which would put its own build in the slot ahead).
    discard_build(build_);
    build_ = std::move(ahead_);
    ahead_ = BuildSlot();
  } else if (ahead_.build) {
    discard_build(ahead_);  // named, not applied
  }
  // Joiners that entered here and are not in this view yet: their request may have died with
  // the previous coordinator.
  for (auto& [tid, address] : joiner_address_) {
    bool admitted = false;
    for (const auto& [mid, a] : addresses_) admitted = admitted || a == address;
    if (!admitted) forward_join(address);
  }
  LOWCOMM_LOG(kInfo, "elastic member %u: view %llu = %s (data root %s, committed %llu)", me_,
              static_cast<unsigned long long>(view), id_list(ids).c_str(), data_root.c_str(),
              static_cast<unsigned long long>(committed_));
  cv_.notify_all();
  // Members of this view that this member lost during the change, after its report went out
  // (the coordinator decided on the report it had): the view cannot work for this member, and
  // nothing would tell it so (no connection, no heartbeat). It reports them at once, so the
  // next view leaves out one side.
  if (me_ & 0x80000000u) return;
  std::vector<uint32_t> lost;
  for (uint32_t id : ids)
    if (id != me_ && !slots_.count(id) && !awaited_.count(id)) lost.push_back(id);
  for (uint32_t id : lost)
    lose(id, "member " + std::to_string(id) + " of view " + std::to_string(view) +
                 " was lost during the change that formed it");
  plan_admission();  // joiners still pending (this member coordinates the view)
}

void ElasticImpl::answer_stale(const Message& m) {
  // A member still in the view this one left (it missed the message that ended it: an
  // admission's commit, a new view, lost with a coordinator that died after sending it to
  // some) gets that message again, instead of waiting for reports nobody will send.
  if (m.view + 1 != view_.id ||
      last_transition_.view + (last_transition_.type == MsgType::kCommit ? 1 : 0) != view_.id)
    return;
  if (!slots_.count(m.from) || answered_stale_.count(m.from)) return;
  answered_stale_.insert(m.from);
  send_to(m.from, last_transition_);
}

// A member's done of the collective in flight (or of the one this member committed last).
void ElasticImpl::on_done(const Message& m) {
  if (m.view == view_.id && m.seq == committed_ && committed_ > 0) {
    settled_.insert(m.from);  // it holds what this member committed
    cv_.notify_all();
    return;
  }
  if (m.view != view_.id || m.seq != committed_ + 1) return;
  done_[m.from] = m.hash;
  if (changing_) {
    // Kept during a change too: a done that trailed the change (a member that committed
    // and left, or was cut off, right after) proves what the change must commit.
    commit_on_proof();
    return;
  }
  if (m.from == view_.coordinator() && m.text == "admit") admission_ = true;
  try_commit();
}

// The coordinator's commit: of the collective in flight, and with members, the next view.
void ElasticImpl::on_commit(const Message& m, uint32_t via) {
  // Changing: this member's report is out and the new view decides what commits. Except an
  // admission's commit naming the next view, for a collective this member holds, that no
  // other view can be decided against: the coordinator sent it once every member's done was
  // in, and the others apply it and move on (ignoring this view's reports), so a change begun
  // here gives way to it instead of stalling until the change timeout and fencing while the
  // group went on. No other view can be decided on this member's report when the commit
  // comes from the member the report went to (a change begun here just before it came), or
  // was relayed by that member (it applied the commit, so it decides nothing in this view:
  // answer_stale, after a coordinator that died having sent it to some members only), or when
  // this member is that decider itself and has not decided. (A commit from another member,
  // which a candidate this member does not report to decided, is ignored.) In the next view
  // this member starts the change again if its cause holds.
  const uint32_t decider = coordinator_candidate();
  const bool undecided = m.from == decider || (m.from == view_.coordinator() &&
                                               (via == decider || decider == me_) && via != me_);
  if (me_ & 0x80000000u) {
    // A joiner learns its admission from a relayed commit.
    if (m.members.empty()) return;
  } else if (m.view != view_.id ||
             (changing_ &&
              (m.members.empty() || (staged_ != m.seq && committed_ < m.seq) || !undecided))) {
    return;
  } else {
    if (m.seq > committed_) {
      if (staged_ != m.seq) {
        fence(Status(StatusCode::kInternal, "commit of collective " + std::to_string(m.seq) +
                                                " that this member does not hold"));
        return;
      }
      commit_locally(m.seq);
      commit_hashes_ = m.hashes;
    }
  }
  if (m.members.empty()) return;
  std::vector<uint32_t> reported_here;  // members waiting for this member's decision
  if (changing_ && decider == me_)
    for (const auto& [id, r] : reports_)
      if (id != me_ && id != via) reported_here.push_back(id);
  if (me_ & 0x80000000u) {
    for (const auto& a : m.members)
      if (a.address == listener_->address().to_string()) me_ = a.id;
    if (me_ & 0x80000000u) return;  // another joiner's admission
    committed_ = m.seq;
    stats_.committed = 0;
  } else if (m.from != me_) {
    for (auto& [tid, s] : joiner_slots_) send_to(tid, m);  // relay to joiners entering here
  }
  apply_view(m.view + 1, m.members, m.data_root, committed_, m.next_id, m.failed);
  if (view_.id == m.view + 1) {
    last_transition_ = m;  // relayed as its decider's (the acceptance rule above reads it)
    // The members that reported to this member in the view it left wait for its decision,
    // and send nothing more that answer_stale could answer: they get the commit now.
    for (uint32_t id : reported_here) {
      if (!slots_.count(id)) continue;
      answered_stale_.insert(id);
      send_to(id, m);
    }
  }
}

// A member started a collective (an admitting one names the view it admits into).
void ElasticImpl::on_start(const Message& m) {
  if (me_ & 0x80000000u) {
    // An admitting start names that view again (begun at its kAdmit: no second build).
    if (m.text == "admit" && !m.members.empty()) {
      prepare_admission(m);
      return;
    }
    // A joiner admitted together with another gets that one's start of their first collective
    // on their own connection, which can beat the commit admitting this joiner (relayed on the
    // seed's connection): kept, as a member keeps a start of a view it has not applied yet.
    // Dropped, this joiner's commit of that collective waited for it until the view-change
    // timeout (Membership.TwoJoinersAdmittedTogetherBothEnter, ~1 run in 8).
    if (starts_.size() >= 64) starts_.erase(starts_.begin());
    starts_[{m.view, m.seq}][m.from] = m.hash;
    cv_.notify_all();
    return;
  }
  if (fault_die_on_start_from_ >= 0 && m.from == fault_die_on_start_from_ && m.view == view_.id)
    ::raise(SIGKILL);  // the testing hook of try_commit
  // Kept for a later view too: a member that applied the next view first may start there
  // before this member has applied it.
  if (m.view < view_.id || (m.view == view_.id && m.seq <= committed_)) return;
  if (starts_.size() >= 64) starts_.erase(starts_.begin());  // bounded: members only
  starts_[{m.view, m.seq}][m.from] = m.hash;
  if (m.text == "admit") admit_starts_.insert({m.view, m.seq});
  if (m.text == "admit" && !m.members.empty()) prepare_admission(m);
  cv_.notify_all();
}

void ElasticImpl::handle(const Message& m, uint32_t via) {
  if (!fence_.is_ok()) return;
  switch (m.type) {
    case MsgType::kChange:
      // The view changes; what the sender could not reach is its own observation (it goes to
      // the coordinator in its report), not adopted here: a member that was cut off must not
      // make the others drop members they reach (docs/membership.md, "Who decides").
      if (m.view != view_.id) {
        answer_stale(m);
        return;
      }
      if (!changing_)
        begin_change("member " + std::to_string(m.from) + ": " + m.text);
      else
        report_to_coordinator();
      try_decide();
      return;
    case MsgType::kReport:
      if (m.view != view_.id) {
        answer_stale(m);
        return;
      }
      if (!changing_) begin_change("member " + std::to_string(m.from) + " started a view change");
      reports_[m.from] = m;
      try_decide();
      return;
    case MsgType::kNewView:
      if (m.view <= view_.id) return;
      apply_view(m.view, m.members, m.data_root, m.committed, m.next_id, m.failed, m.hashes,
                 m.holders);
      if (view_.id == m.view) {
        last_transition_ = m;
      }
      return;
    case MsgType::kDone:
      on_done(m);
      return;
    case MsgType::kCommit:
      on_commit(m, via);
      return;
    case MsgType::kNoQuorum:
      // It may carry the proof that every member of the view held the collective in flight
      // (some member may have committed it): commit it before going on.
      if (m.view == view_.id && m.committed == committed_ + 1) {
        for (const auto& [id, h] : m.hashes) done_[id] = h;
        commit_on_proof();
      }
      // The sender could not gather a majority around itself: its verdict on itself (it
      // fences). Another candidate may still reach one, so this member reports to the next;
      // when that is this member and it cannot either, it fences with its own no-quorum.
      lose(m.from, "member " + std::to_string(m.from) + " gave up coordinating: " + m.text);
      try_decide();
      return;
    case MsgType::kLeave:
      LOWCOMM_LOG(kInfo, "elastic member %u: member %u leaves the group", me_, m.from);
      // A leaver that committed the collective this member still waits on had every member's
      // done: commit it here before the departure starts a view change (its done may trail the
      // leave, which came on another connection).
      if (m.view == view_.id && m.seq == committed_ + 1) {
        for (const auto& [id, h] : m.hashes) done_[id] = h;
        commit_on_proof();
      }
      lose(m.from, "member " + std::to_string(m.from) + " left the group");
      return;
    case MsgType::kJoin:
      forward_join(m.text);
      return;
    case MsgType::kFetch:
      fetches_.push_back({via, m});
      serve_fetches();
      return;
    case MsgType::kReady:
      on_ready(m);
      return;
    case MsgType::kAdmit:
      // The view the coordinator will admit the pending joiners into: its members and joiners
      // build that view's communicator from now on, ahead of the commit that applies it (if a
      // failure aborts the admission instead, the build is abandoned: the view the change forms
      // has a root and a secret of its own).
      prepare_admission(m);
      return;
    case MsgType::kStart:
      on_start(m);
      return;
    case MsgType::kPing:
    case MsgType::kPong:
      return;
  }
}

}  // namespace lowcomm
