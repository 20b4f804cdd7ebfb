// Elastic collectives on the caller's thread (docs/membership.md, "A collective"): the view's
// communicator (built on a thread of its own), the commit-or-retry protocol every collective
// shares (run_collective), error feedback carried across views, and the three collectives.
#include "membership/elastic_impl.h"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <functional>
#include <optional>

#include "core/log.h"
#include "membership/attempt.h"
#include "membership/elastic_util.h"
#include "membership/result_mover.h"

namespace lowcomm {

using membership::MemberAddress;
using membership::Message;
using membership::MsgType;

Status ElasticImpl::wait_for_view_after(std::unique_lock<std::mutex>& lk, uint64_t view) {
  auto until = Clock::now() + change_timeout_ + failure_floor_ * 4;
  while (fence_.is_ok() && (view_.id <= view || changing_)) {
    if (cv_.wait_until(lk, until) == std::cv_status::timeout)
      return Status(StatusCode::kTimeout,
                    "no new view formed within " + std::to_string(change_timeout_.count()) + " ms");
  }
  return fence_;
}

// Built on a thread of its own, so that a view change while it is being built (a member that
// never connects, a coordinator that dies) moves on to the next view at once instead of waiting
// for CommOptions::timeout (an abandoned build finishes, failing, on its own), and so that it
// can begin as soon as a view is known (at an admission's commit) and overlap the caller's
// work until its next collective.
struct ElasticImpl::Build {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  // Nobody will take the communicator: the build thread aborts it itself when it finishes
  // (discard_build).
  bool discarded = false;
  Result<std::unique_ptr<Communicator>> comm = Status();
};

void ElasticImpl::abort_async(const std::shared_ptr<Communicator>& c) {
  // Aborting tells the communicator's peers and lingers for their answers (up to 300 ms on an
  // idle one): never under mu_, which the membership thread needs for heartbeats and commits.
  // The destructor waits for these threads (they must not outlive the process's statics).
  if (!c) return;
  {
    std::lock_guard<std::mutex> g(aborts_->mu);
    ++aborts_->running;
  }
  std::thread([c, aborts = aborts_] {
    c->abort();
    std::lock_guard<std::mutex> g(aborts->mu);
    --aborts->running;
    aborts->cv.notify_all();
  }).detach();
}

void ElasticImpl::discard_build(BuildSlot& slot) {
  discard_build(slot.build);
  slot = BuildSlot();
}

void ElasticImpl::discard_build(const std::shared_ptr<Build>& build) {
  // Destroyed under mu_, a communicator the build finished would say goodbye to peers that
  // moved on too and wait for them, and the membership thread with it: no heartbeats for
  // seconds, members evicted as silent. Finished: aborted on a thread of its own; not yet: the
  // build thread aborts it when it finishes (whoever drops the last reference then holds no
  // communicator).
  if (!build) return;
  std::lock_guard<std::mutex> g(build->mu);
  build->discarded = true;
  if (build->done && build->comm)
    abort_async(std::shared_ptr<Communicator>(std::move(build->comm).value()));
  build->comm = Status(StatusCode::kAborted, "discarded");
}

void ElasticImpl::start_build(uint64_t v) {
  start_build(v, view_.members, data_root_, me_, /*ahead=*/false);
}

void ElasticImpl::start_build(uint64_t v, const std::vector<uint32_t>& members,
                              const std::string& root, uint32_t self, bool ahead) {
  // Begun already: at its commit, or by join(), or ahead (an admission named the view: it
  // becomes the current view's build). A view of the same id formed by a change instead has a
  // root of its own. The current view's build and one ahead go on side by side: an admission
  // may be named while the current view's communicator is still being built.
  if (build_.is(v, root)) return;
  if (ahead_.is(v, root)) {
    if (!ahead) {
      discard_build(build_);
      build_ = std::move(ahead_);
      ahead_ = BuildSlot();
    }
    return;
  }
  auto at = std::find(members.begin(), members.end(), self);
  if (at == members.end() || root.empty()) return;
  BuildSlot& slot = ahead ? ahead_ : build_;
  discard_build(slot);  // replaced: a newer admission's view, or the view a change formed
  UniqueId id;
  id.root_address = root;
  id.secret = view_secret(v, members);
  int rank = static_cast<int>(at - members.begin());
  int size = static_cast<int>(members.size());
  auto build = std::make_shared<Build>();
  // Every member of the view answers heartbeats, so its mesh forms in a few RTTs. A build that
  // takes longer (a connection attempt lost in a partition that has healed, waiting out TCP's
  // SYN back-off, say) fails after four failure timeouts, at least 5 s, instead of the
  // operations' deadline (30 minutes by default): the view changes and the next build starts.
  CommOptions opts = options_.comm;
  opts.init_timeout = build_timeout();
  std::thread([build, id, rank, size, opts] {
    auto c = Communicator::init(id, rank, size, opts);
    std::unique_lock<std::mutex> g(build->mu);
    build->done = true;
    build->cv.notify_all();
    if (!build->discarded) {
      build->comm = std::move(c);
      return;
    }
    g.unlock();
    if (c) (*c)->abort();  // discarded meanwhile: nobody takes it (destroyed here, not under mu_)
  }).detach();
  slot.build = std::move(build);
  slot.view = v;
  slot.root = root;
  slot.self = self;
  slot.plan = 0;
  slot.ready_sent = false;
}

std::chrono::milliseconds ElasticImpl::build_timeout() const {
  return std::max<std::chrono::milliseconds>(
      std::chrono::duration_cast<std::chrono::milliseconds>(failure_floor_ * 4),
      std::chrono::seconds(5));
}

void ElasticImpl::report_ready() {
  // The view an admission named is built here: the coordinator admits once every member of it
  // is (a joiner's kReady goes through its seed), so that the first collective there waits for
  // no connection. A build that failed is never reported: the coordinator admits after
  // build_timeout() all the same, and that view's first collective fails and changes the view.
  if (!ahead_.build || ahead_.ready_sent || !fence_.is_ok()) return;
  {
    std::lock_guard<std::mutex> g(ahead_.build->mu);
    if (!ahead_.build->done) return;
    if (!ahead_.build->comm.is_ok()) {
      ahead_.ready_sent = true;
      return;
    }
  }
  Message r = message(MsgType::kReady);
  r.data_root = ahead_.root;
  r.next_id = ahead_.self;
  r.hash = ahead_.plan;
  // Marked sent only once it went out: a joiner between seeds, or one admitted a moment ago
  // whose connection to the coordinator is not up yet, says it on a later pass.
  bool sent = false;
  if (me_ & 0x80000000u) {
    for (auto& [id, s] : slots_) sent = send_to(id, r).valid() || sent;  // its seeds
  } else if (view_.coordinator() == me_) {
    on_ready(r);
    sent = true;
  } else {
    sent = send_to(view_.coordinator(), r).valid();
  }
  ahead_.ready_sent = sent;
}

Status ElasticImpl::ensure_data_comm(std::unique_lock<std::mutex>& lk) {
  while (fence_.is_ok()) {
    if (changing_) {
      LOWCOMM_CHECK(wait_for_view_after(lk, view_.id));
      continue;
    }
    if (data_view_ == view_.id && data_) {
      Status ds = data_->status();
      if (ds.is_ok()) return Status::ok();
      begin_change("view " + std::to_string(view_.id) + "'s communicator failed: " + ds.message());
      continue;
    }
    uint64_t v = view_.id;
    start_build(v);  // unless begun at the commit (eagerly) or ahead
    auto build = build_.build;
    if (!build)
      return internal_error("view " + std::to_string(v) + " = " + id_list(view_.members) +
                            ": no communicator to build (member " + std::to_string(me_) +
                            " not in it, or no data root)");
    auto setup_started = Clock::now();  // the stall: begun at a commit, it may be done already
    abort_async(data_);                 // the previous view's: it lingers for its peers' notices
    data_.reset();
    lk.unlock();
    bool abandoned = false;
    for (;;) {
      {
        std::unique_lock<std::mutex> g(build->mu);
        if (build->cv.wait_for(g, std::chrono::milliseconds(20), [&] { return build->done; }))
          break;
      }
      std::lock_guard<std::mutex> g(mu_);
      if (view_.id != v || !fence_.is_ok()) {
        abandoned = true;
        break;
      }
    }
    lk.lock();
    if (build_.build == build) build_ = BuildSlot();
    if (abandoned || view_.id != v) {  // the view changed meanwhile: build the next one
      discard_build(build);
      continue;
    }
    Result<std::unique_ptr<Communicator>> comm = Status();
    {
      std::lock_guard<std::mutex> g(build->mu);
      comm = std::move(build->comm);
    }
    if (!comm) {
      begin_change("building view " + std::to_string(v) +
                   "'s communicator failed: " + comm.status().message());
      continue;
    }
    data_ = std::shared_ptr<Communicator>(std::move(comm).value());
    data_view_ = v;
    stats_.last_view_setup = Clock::now() - setup_started;
  }
  return fence_;
}

namespace {

constexpr uint64_t kStateThreadBytes = 1 << 20;
// Below this a result is copied into place at the commit: a thread of its own costs more.
constexpr uint64_t kMoverBytes = 1 << 20;

bool overlap(const void* a, uint64_t an, const void* b, uint64_t bn) {
  auto pa = reinterpret_cast<uintptr_t>(a);
  auto pb = reinterpret_cast<uintptr_t>(b);
  return an && bn && pa < pb + bn && pb < pa + an;
}

}  // namespace

// Error-feedback residuals belong to the member, not to a view's communicator: ef_carry_ holds
// them as of the last committed call that used them, and a communicator that does not hold
// exactly those (a new view's, or one an aborted attempt changed) gets them before the call.
// A member's first such call starts from what its communicator holds: nothing, so a joiner
// starts from zero residuals.
Status ElasticImpl::carry_error_feedback(const Attempt& a) {
  if (!ef_lost_.is_ok()) return ef_lost_;
  if (ef_carry_.empty()) {
    auto saved = a.comm->save_error_feedback();
    if (!saved)
      return Status(saved.status().code(),
                    "error feedback: reading view " + std::to_string(a.view) +
                        "'s communicator's residuals: " + saved.status().message());
    ef_carry_ = std::move(saved).value();
  } else if (ef_comm_.lock() != a.comm || a.number > 0) {
    Status r = a.comm->restore_error_feedback(ef_carry_.data(), ef_carry_.size());
    if (!r)
      return Status(r.code(), "error feedback: carrying the residuals into view " +
                                  std::to_string(a.view) + "'s communicator: " + r.message());
  }
  ef_comm_ = a.comm;
  return Status::ok();
}

void ElasticImpl::keep_error_feedback(const Attempt& a) {
  auto saved = a.comm->save_error_feedback();
  if (saved) {
    ef_carry_ = std::move(saved).value();
    return;
  }
  // The call committed, so it returns ok; the next one that uses error feedback says this.
  ef_lost_ = Status(saved.status().code(), "error feedback: the residuals after collective " +
                                               std::to_string(a.seq) + " could not be kept (" +
                                               saved.status().message() +
                                               "); this member's residuals are lost");
}

Status ElasticImpl::all_reduce(const void* send, void* recv, uint64_t count, DType dtype,
                               ReduceOp op, const AllReduceOptions& options) {
  if (options.on_result)
    return invalid_argument(
        "elastic all_reduce: AllReduceOptions::on_result is not taken (a part of the result is "
        "final only once the collective commits)");
  const uint64_t bytes = count * dtype_size(dtype);
  std::vector<uint8_t> zeros;
  const bool use_ef = !options.error_feedback_key.empty();
  auto data_op = [op](const Attempt& a) {
    return (a.contributors < a.size && op == ReduceOp::kAverage) ? ReduceOp::kSum : op;
  };
  Op o;
  o.name = "all_reduce";
  o.send = send;
  o.recv = recv;
  o.result_bytes = [&](const Attempt&) { return bytes; };
  o.reports_results = options.memory == MemoryKind::kHost;
  o.prepare = [&](const Attempt& a) -> Status {
    if (a.any_fresh && dtype != DType::kFloat32)
      return unsupported("a collective with a fresh joiner takes fp32 sum or average");
    if (use_ef) LOWCOMM_CHECK(carry_error_feedback(a));
    return Status::ok();
  };
  o.run = [&](const Attempt& a, void* out) {
    const void* in = send;
    if (a.fresh_me) {  // a fresh member contributes nothing
      zeros.assign(bytes, 0);
      in = zeros.data();
    }
    AllReduceOptions o2 = options;
    o2.on_result = a.on_result;
    return a.comm->all_reduce(in, out, count, dtype, data_op(a), o2).wait();
  };
  o.finish = [&](const Attempt& a) {
    if (use_ef) keep_error_feedback(a);
    if (data_op(a) == op) return;
    float scale = 1.0f / static_cast<float>(a.contributors);
    auto* f = static_cast<float*>(recv);
    for (uint64_t i = 0; i < count; ++i) f[i] *= scale;
  };
  Status st = run_collective(o);
  // A call that failed may have changed the communicator's residuals (an attempt's encode, or
  // a committed call refused by the replica check): the next call puts ef_carry_ back.
  if (use_ef && !st.is_ok()) ef_comm_.reset();
  return st;
}

Status ElasticImpl::broadcast(const void* send, void* recv, uint64_t count, DType dtype,
                              uint32_t root) {
  const uint64_t bytes = count * dtype_size(dtype);
  Op o;
  o.name = "broadcast";
  o.send = send;
  o.recv = recv;
  o.result_bytes = [&](const Attempt&) { return bytes; };
  o.prepare = [&](const Attempt& a) -> Status {
    if (std::find(a.members.begin(), a.members.end(), root) == a.members.end())
      return Status(StatusCode::kAborted, "broadcast: root member " + std::to_string(root) +
                                              " is not in view " + std::to_string(a.view) + " = " +
                                              id_list(a.members) + "; recv untouched");
    if (root == me_ && bytes && !send)
      return invalid_argument("broadcast: the root's send is null");
    return Status::ok();
  };
  o.run = [&](const Attempt& a, void* out) {
    int r =
        static_cast<int>(std::find(a.members.begin(), a.members.end(), root) - a.members.begin());
    return a.comm->broadcast(send, out, count, dtype, r).wait();
  };
  o.finish = [](const Attempt&) {};
  return run_collective(o);
}

Status ElasticImpl::all_gather(const void* send, void* recv, uint64_t send_count, DType dtype,
                               ElasticView* layout) {
  const uint64_t block = send_count * dtype_size(dtype);
  uint64_t capacity = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    capacity = block * view_.members.size();  // a retry's view is never larger
  }
  if (overlap(send, block, recv, capacity))
    return invalid_argument(
        "elastic all_gather: send and recv overlap (a member's block moves when a retry runs "
        "in a smaller view; gather out of place)");
  Op o;
  o.name = "all_gather";
  o.send = send;
  o.recv = recv;
  o.result_bytes = [&](const Attempt& a) { return block * a.size; };
  o.prepare = [&](const Attempt& a) -> Status {
    if (block * a.size > capacity)
      return internal_error("all_gather: view " + std::to_string(a.view) + " grew during a call");
    return Status::ok();
  };
  o.run = [&](const Attempt& a, void* out) {
    return a.comm->all_gather(send, out, send_count, dtype).wait();
  };
  o.finish = [&](const Attempt& a) {
    if (layout) *layout = ElasticView{a.view, a.members};
  };
  return run_collective(o);
}

// One attempt under way: what run_collective's phases share. Its members are destroyed in the
// order the attempt's locals were: the mover first (undone unless committed), then the fetcher
// and then the state thread, each joined before what it writes goes. It goes after
// run_collective's lock (the fetcher takes mu_ at its end).
struct ElasticImpl::Running {
  struct Joined {  // a thread, joined when it goes
    std::thread t;
    ~Joined() {
      if (t.joinable()) t.join();
    }
  };
  Attempt a;
  bool take_snapshot = false;         // this member snapshots the state for fresh members
  uint64_t bytes = 0;                 // the result's size
  std::shared_ptr<ResultBuffer> res;  // where the result lands: results_[a.seq % 2]
  uint64_t hash = 0;                  // this member's state hash, in its start and its done
  Joined state_thread;
  std::shared_ptr<membership::StateBuffer> fetch_into;
  Status fetch_status;
  Joined fetcher;
  std::optional<ResultMover> mover;
  bool rolled = false;  // the result was fetched from another member
};

Status ElasticImpl::run_collective(const Op& op) {
  Status last;
  for (int attempt = 0;; ++attempt) {
    Running r;
    Attempt& a = r.a;
    a.number = attempt;
    LOWCOMM_CHECK(begin_attempt(r));
    LOWCOMM_CHECK(op.prepare(a));
    r.bytes = op.result_bytes(a);
    r.res = result_slot(a.seq, r.bytes);
    start_state_work(r);
    start_state_fetch(r);
    Status s = run_data(op, r);
    std::unique_lock<std::mutex> lk(mu_);
    stage_result(op, r, std::move(s), lk);
    await_commit(op, a, lk);
    LOWCOMM_CHECK(roll_forward(r, lk));
    if (committed_ >= a.seq) return deliver(op, r, lk);
    Status why = fence_;
    if (!why.is_ok()) return why;
    last =
        Status(StatusCode::kAborted, op.name + " #" + std::to_string(a.seq) + " aborted in view " +
                                         std::to_string(a.view) + " (" + change_reason_ +
                                         "); view " + std::to_string(view_.id) + " = " +
                                         id_list(view_.members) + "; inputs untouched, call again");
    if (attempt >= options_.retries) return last;
    ++stats_.retried;
  }
}

// Takes the current view (its communicator built) for the attempt; non-ok: the call returns it.
Status ElasticImpl::begin_attempt(Running& r) {
  Attempt& a = r.a;
  std::unique_lock<std::mutex> lk(mu_);
  LOWCOMM_CHECK(ensure_data_comm(lk));
  a.view = view_.id;
  a.seq = committed_ + 1;
  a.comm = data_;
  a.members = view_.members;
  a.fresh_me = fresh_.count(me_) > 0;
  a.contributors = view_.members.size() - fresh_.size();
  a.any_fresh = !fresh_.empty();
  a.fresh = fresh_;
  a.size = view_.members.size();
  for (uint32_t id : view_.members)
    if (!fresh_.count(id) && id != me_) a.sources.push_back(id);
  for (auto& [n, d] : state_) a.state_bytes += d.second;
  r.take_snapshot = !fresh_.empty() && !a.fresh_me;
  if (a.fresh_me && a.state_bytes && a.sources.empty()) {
    // Every live member of the view is a joiner still without the state: nobody can
    // hand it over, and going on would make up a model.
    fence(Status(StatusCode::kAborted,
                 "view " + std::to_string(a.view) + " = " + id_list(a.members) +
                     ": no member holds the registered state (every live member is a "
                     "joiner still waiting for it); start the group again from a checkpoint"));
    return fence_;
  }
  return Status::ok();
}

// The buffer collective `seq`'s result (`bytes`) lands in: results_[seq % 2], replaced unless
// free and large enough.
std::shared_ptr<ElasticImpl::ResultBuffer> ElasticImpl::result_slot(uint64_t seq, uint64_t bytes) {
  // The result lands in results_[seq % 2], never in recv: an attempt that aborts leaves recv
  // untouched, and once committed the result stays there until the next collective commits,
  // for a member of the next view that lacks it (rolling forward). A buffer still on a link
  // (a stripe served from it) is left to that send.
  std::lock_guard<std::mutex> g(mu_);
  auto& slot = results_[seq % 2];
  if (!slot || slot.use_count() > 1 || slot->size < bytes) {
    slot = std::make_shared<ResultBuffer>();
    slot->bytes = std::make_unique_for_overwrite<uint8_t[]>(bytes);
    slot->size = bytes;
  }
  return slot;
}

// Hashes the registered state (snapshotting it for fresh members) and announces the start:
// on a thread of its own (r.state_thread) when the state is large, else here.
void ElasticImpl::start_state_work(Running& r) {
  const Attempt& a = r.a;
  // The registered state cannot change while the caller is in this call: its snapshot for
  // fresh members (the state every replica holds until this collective commits) and its hash
  // are taken beside the data collective, on a thread of their own when they are large. The
  // hash goes to every member in this member's start, so that each has every member's hash by
  // the time its data completes.
  auto state_work = [this, &hash = r.hash, &take_snapshot = r.take_snapshot, seq = a.seq,
                     view = a.view, fresh_me = a.fresh_me, snap_bytes = a.state_bytes] {
    // The start first: a fresh member commits once every start is in, and on its link from
    // this member the start would otherwise queue behind the state stripes served below.
    // With fresh members, the snapshot is taken in the same pass as the hash, into a buffer
    // allocated ahead (at the start that announced their admission).
    std::shared_ptr<membership::StateBuffer> snap;
    if (take_snapshot) {
      auto buffer = snapshot_buffer(snap_bytes);
      if (buffer)
        snap = std::move(buffer).value();
      else
        LOWCOMM_LOG(kWarn, "elastic member %u: no snapshot for the fresh members: %s", me_,
                    buffer.status().message().c_str());
    }
    if (snap)
      hash = membership::copy_state(state_, snap->data());
    else if (!fresh_me)
      hash = registered_hash();
    std::lock_guard<std::mutex> g(mu_);
    announce_start(view, seq, hash);
    if (snap) {
      snapshot_ = std::move(snap);
      snapshot_seq_ = seq;
      serve_fetches();  // stripes asked for meanwhile go out now
    }
  };
  if (a.state_bytes >= kStateThreadBytes)
    r.state_thread.t = std::thread(state_work);
  else
    state_work();
}

// A fresh member: fetches the registered state into r.fetch_into on a thread (r.fetcher).
void ElasticImpl::start_state_fetch(Running& r) {
  // Allocated and faulted in on the fetcher's thread, not on the way to this member's data
  // collective, which the others wait for (a zero-fill there delays the group's first round
  // with a joiner); faulted in before the stripes are asked for, so that their receives do not
  // take the page faults (measured: docs/membership.md, the joiner's state fetch).
  // A fresh member's fetch goes on while the group commits: its `done` does not wait for the
  // state, so the others stall only for the admission itself. It is joined before this
  // attempt's locals go (after run_collective's lock: the fetcher takes mu_ at its end).
  if (!r.a.fresh_me || !r.a.state_bytes) return;
  r.fetcher.t =
      std::thread([this, &a = r.a, &fetch_into = r.fetch_into, &fetch_status = r.fetch_status] {
        auto into = membership::StateBuffer::allocate(a.state_bytes);
        if (!into) {
          fetch_status = into.status();
          return;
        }
        fetch_into = std::move(into).value();
        fetch_status = fetch(a, a.sources, /*result=*/false, fetch_into->data(), a.state_bytes);
      });
}

// Runs the attempt's data collective into r.res (a mover taking final parts into recv), then
// waits for the state work; its status.
Status ElasticImpl::run_data(const Op& op, Running& r) {
  Attempt& a = r.a;
  // Parts of the result that are final move into recv while the rest arrives (what they
  // replace kept until the commit): the copy into recv is then off the success path.
  if (op.reports_results && r.bytes >= kMoverBytes) {
    if (backup_bytes_ < r.bytes) {
      backup_ = std::make_unique_for_overwrite<uint8_t[]>(r.bytes);
      backup_bytes_ = r.bytes;
    }
    r.mover.emplace(r.res->data(), static_cast<uint8_t*>(op.recv), backup_.get(), r.bytes);
    a.on_result = r.mover->hook();
  }
  if (fault_die_at_admit_) {
    // The testing hook: this member dies before its data of a collective whose coordinator's
    // start announced an admission (so the collective cannot complete anywhere).
    std::unique_lock<std::mutex> lk(mu_);
    const auto key = std::make_pair(a.view, a.seq);
    cv_.wait_for(lk, change_timeout_, [&] {
      auto it = starts_.find(key);
      return !fence_.is_ok() || view_.id != a.view || changing_ ||
             (it != starts_.end() && it->second.count(view_.coordinator()));
    });
    if (admit_starts_.count(key)) ::raise(SIGKILL);
  }
  Status s = op.run(a, r.res->data());
  if (r.state_thread.t.joinable()) r.state_thread.t.join();  // the hash goes with the done
  return s;
}

// mu_ held: the data collective's outcome `s`: the result staged and this member's done sent
// to every member, or the view changed.
void ElasticImpl::stage_result(const Op& op, Running& r, Status s,
                               std::unique_lock<std::mutex>& lk) {
  const Attempt& a = r.a;
  if (s.is_ok() && fault_drop_result_ == a.seq && view_.id == a.view) {
    // The testing hook: this member drops its finished result once every other member has
    // committed the collective (each started the next one here), as if its data had failed.
    fault_drop_result_ = 0;
    const auto next = std::make_pair(a.view, a.seq + 1);
    cv_.wait_for(lk, change_timeout_, [&] {
      auto it = starts_.find(next);
      return !fence_.is_ok() || view_.id != a.view || changing_ ||
             (it != starts_.end() && it->second.size() + 1 >= a.members.size());
    });
    s = Status(StatusCode::kAborted, "LOWCOMM_ELASTIC_FAULT_DROP_RESULT dropped the result");
  }
  if (s.is_ok() && view_.id == a.view && !changing_) {
    staged_ = a.seq;
    staged_bytes_ = r.bytes;
    Message d = message(MsgType::kDone, a.seq);
    d.hash = r.hash;
    // The coordinator admits pending joiners at this commit (its start said so): its done says
    // it too, and the members wait for its kCommit naming the next view.
    if (admit_at_ == std::make_pair(a.view, a.seq)) d.text = "admit";
    own_done_.clear();
    // The testing hook: this member is cut off between its done and the commit (its done
    // reaches nobody, then the whole process freezes until the test continues it).
    const bool cut = fault_cut_after_done_ == a.seq;
    for (uint32_t id : view_.members)
      if (id != me_ && !cut) own_done_.push_back(send_to(id, d));
    handle(d, me_);
    if (cut) {
      lk.unlock();
      ::raise(SIGSTOP);
      lk.lock();
    }
  } else if (!s.is_ok() && view_.id == a.view) {
    begin_change(op.name + " #" + std::to_string(a.seq) + " failed on member " +
                 std::to_string(me_) + ": " + s.message());
  }
}

// mu_ held: waits until collective a.seq commits here, the view changes, or this member is
// fenced (fencing it when none comes in time).
void ElasticImpl::await_commit(const Op& op, const Attempt& a, std::unique_lock<std::mutex>& lk) {
  // The commit: this member holds the whole result (every member's contribution is in it),
  // so it commits as soon as every member's start (with its state hash) is in, without
  // waiting for the others' dones: a member of the next view that lacks it after a failure
  // fetches it from one that holds it (try_decide, apply_view). Unless the coordinator admits
  // joiners here: then its kCommit, sent once every member's done is in, names the next view.
  const auto key = std::make_pair(a.view, a.seq);
  auto until = Clock::now() + change_timeout_ + failure_floor_ * 4;
  while (fence_.is_ok() && committed_ < a.seq && view_.id == a.view) {
    if (staged_ == a.seq && !changing_ && !admit_starts_.count(key)) {
      auto it = starts_.find(key);
      if (it != starts_.end() && it->second.size() >= a.members.size()) {
        commit_hashes_.assign(it->second.begin(), it->second.end());
        commit_locally(a.seq);
        break;
      }
    }
    if (cv_.wait_until(lk, until) == std::cv_status::timeout) {
      fence(Status(StatusCode::kTimeout, op.name + " #" + std::to_string(a.seq) +
                                             ": neither committed nor aborted in time"));
    }
  }
}

// mu_ held: not committed in the attempt's view: waits for the next view, and if it committed
// the collective, fetches the result from the members holding it and commits (r.rolled).
// Non-ok: run_collective returns it.
Status ElasticImpl::roll_forward(Running& r, std::unique_lock<std::mutex>& lk) {
  const Attempt& a = r.a;
  if (committed_ < a.seq && fence_.is_ok()) {
    Status w = wait_for_view_after(lk, a.view);
    if (!w.is_ok()) return w;
    if (roll_seq_ == a.seq && committed_ + 1 == a.seq) {
      // Rolling forward: the new view committed it, and this member's data did not complete.
      auto from = roll_from_;
      lk.unlock();
      if (r.mover) r.mover->stop();  // the fetch writes where the mover reads
      Status got = fetch(a, from, /*result=*/true, r.res->data(), r.bytes);
      lk.lock();
      if (got.is_ok() && roll_seq_ == a.seq && fence_.is_ok()) {
        roll_seq_ = membership::kNone;
        staged_bytes_ = r.bytes;
        commit_hashes_ = roll_hashes_;
        auto holders = settled_;  // the view named them; commit_locally starts afresh
        commit_locally(a.seq);
        settled_.insert(holders.begin(), holders.end());
        r.rolled = true;
        ++stats_.rolled_forward;
        broadcast(message(MsgType::kDone, a.seq));  // it holds it now (a leaver waits for it)
      } else if (roll_seq_ == a.seq && fence_.is_ok()) {
        fence(Status(StatusCode::kAborted, "view " + std::to_string(view_.id) +
                                               " committed collective " + std::to_string(a.seq) +
                                               ", which this member did not finish, and " +
                                               got.message() + "; rejoin as a new member"));
      }
    }
  }
  return Status::ok();
}

// mu_ held: collective a.seq committed: the replica check, then the result into recv and, a
// fresh member, the fetched state installed. What the call returns.
Status ElasticImpl::deliver(const Op& op, Running& r, std::unique_lock<std::mutex>& lk) {
  const Attempt& a = r.a;
  auto hashes = commit_hashes_;
  Status replicas = check_replicas(a, hashes);
  lk.unlock();
  if (replicas.is_ok()) {
    if (r.mover)
      r.mover->commit(/*from_scratch=*/r.rolled);
    else if (r.bytes)
      std::memcpy(op.recv, r.res->data(), r.bytes);
    op.finish(a);
  } else if (r.mover) {
    r.mover->undo();
  }
  if (a.fresh_me && a.state_bytes) {
    if (r.fetcher.t.joinable()) r.fetcher.t.join();
    uint64_t want = 0;
    for (auto& [id, h] : hashes)
      if (id != me_ && h) want = h;
    Status got =
        r.fetch_status.is_ok() ? install_state(r.fetch_into->data(), want) : r.fetch_status;
    if (!got.is_ok()) {
      // The group committed with this member in it; without the state it must not go on.
      std::lock_guard<std::mutex> g(mu_);
      fence(Status(StatusCode::kAborted, "admitted, but fetching the group's state failed (" +
                                             got.message() + "); rejoin as a new member"));
      return fence_;
    }
  }
  lk.lock();
  for (uint32_t id : a.fresh) fresh_.erase(id);  // they hold the state now
  // An admission's commit named the next view: build its communicator now, while the
  // caller does its inner steps, not at its next collective.
  if (fence_.is_ok() && !changing_ && data_view_ != view_.id) start_build(view_.id);
  return replicas;
}

// mu_ held: the replica check of a committed collective, before the result reaches the
// caller: every contributing member's state hash in `hashes` must agree.
Status ElasticImpl::check_replicas(const Attempt& a,
                                   const std::vector<std::pair<uint32_t, uint64_t>>& hashes) {
  // If not, every member returns kCorruptData with its input untouched.
  std::map<uint64_t, std::vector<uint32_t>> by_hash;
  for (auto& [id, h] : hashes)
    if (!(a.fresh_me && id == me_) && h) by_hash[h].push_back(id);
  if (!hashes.empty() && !by_hash.empty()) stats_.state_hash = by_hash.begin()->first;
  Status replicas;
  if (by_hash.size() > 1) {
    std::string t =
        "registered state differs between replicas after collective " + std::to_string(a.seq) + ":";
    for (auto& [h, ids] : by_hash) t += " hash " + std::to_string(h) + " on " + id_list(ids);
    replicas = corrupt_data(t + "; inputs untouched");
  }
  return replicas;
}

void ElasticImpl::announce_start(uint64_t view, uint64_t seq, uint64_t hash) {
  if (!fence_.is_ok() || view_.id != view || changing_) return;  // the change decides it
  Message st = message(MsgType::kStart, seq);
  st.hash = hash;
  // The coordinator decides here whether this collective admits the joiners pending now (its
  // done and kCommit follow); the members learn it before their data completes. Its start
  // names the view its kAdmit named (the joiners' ids, the data root), whose communicator the
  // members and the joiners have been building since: it admits once all of them have built
  // it (kReady), so that the new view's first collective waits for no connection.
  if (view_.coordinator() == me_ && !pending_joiners_.empty()) {
    plan_admission();  // (named already, unless opening its root failed then)
    // Not while this view has fresh members: a fresh member may still be fetching the snapshot
    // of its first collective after that collective commits everywhere, and the snapshot for
    // the next joiners (taken at the first collective of their view) replaces it on every
    // source; its stripes then went unserved until its fetch timed out and it was fenced.
    if (admit_plan_.view == view && admit_plan_.seq == 0 && !admit_plan_.members.empty() &&
        fresh_.empty() && admission_ready()) {
      admit_at_ = {view, seq};
      st.text = "admit";
      st.data_root = admit_plan_.data_root;
      st.members = admit_plan_.members;
      st.failed = admit_plan_.failed;  // fresh until they hold the registered state
      st.next_id = admit_plan_.next_id;
      next_id_ = admit_plan_.next_id;
      admit_plan_.seq = seq;
      admit_waiting_since_ = {};
      pending_joiners_.clear();
    }
  }
  broadcast(st);
  if (!st.members.empty())
    for (auto& [tid, s] : joiner_slots_) send_to(tid, st);
  handle(st, me_);
}

}  // namespace lowcomm
