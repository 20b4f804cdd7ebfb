// Elastic collectives on the caller's thread (docs/membership.md, "A collective"): the view's
// communicator (built on a thread of its own), the commit-or-retry protocol every collective
// shares (run_collective), error feedback carried across views, and the three collectives.
#include "membership/elastic_impl.h"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <functional>

#include "core/log.h"
#include "membership/attempt.h"
#include "membership/elastic_util.h"

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

void ElasticImpl::start_build(uint64_t v) {
  UniqueId id;
  id.root_address = data_root_;
  id.secret = view_secret(v);
  int rank = static_cast<int>(std::find(view_.members.begin(), view_.members.end(), me_) -
                              view_.members.begin());
  int size = static_cast<int>(view_.members.size());
  auto build = std::make_shared<Build>();
  // Every member of the view answers heartbeats, so its mesh forms in a few RTTs. A build that
  // takes longer (a connection attempt lost in a partition that has healed, waiting out TCP's
  // SYN back-off, say) fails after four failure timeouts, at least 5 s, instead of the
  // operations' deadline (30 minutes by default): the view changes and the next build starts.
  CommOptions opts = options_.comm;
  opts.init_timeout = std::max<std::chrono::milliseconds>(
      std::chrono::duration_cast<std::chrono::milliseconds>(failure_floor_ * 4),
      std::chrono::seconds(5));
  std::thread([build, id, rank, size, opts] {
    auto c = Communicator::init(id, rank, size, opts);
    std::lock_guard<std::mutex> g(build->mu);
    build->comm = std::move(c);
    build->done = true;
    build->cv.notify_all();
  }).detach();
  build_ = std::move(build);
  build_view_ = v;
  build_started_ = Clock::now();
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
    if (!build_ || build_view_ != v) start_build(v);  // else begun at the commit (eagerly)
    auto build = build_;
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
    if (build_ == build) build_.reset();
    if (abandoned || view_.id != v) continue;  // the view changed meanwhile: build the next one
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

constexpr uint64_t kSwapChunk = 1 << 20;
constexpr uint64_t kStateThreadBytes = 1 << 20;

// Exchanges n bytes of a and b through a cache-resident buffer.
void swap_bytes(uint8_t* a, uint8_t* b, uint64_t n) {
  constexpr uint64_t kTmp = 64 << 10;
  alignas(64) uint8_t tmp[kTmp];
  for (uint64_t o = 0; o < n; o += kTmp) {
    uint64_t k = std::min(kTmp, n - o);
    std::memcpy(tmp, a + o, k);
    std::memcpy(a + o, b + o, k);
    std::memcpy(b + o, tmp, k);
  }
}

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
  o.in_place = send == recv;
  o.result_bytes = [&](const Attempt&) { return bytes; };
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
    return a.comm->all_reduce(in, out, count, dtype, data_op(a), options).wait();
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
  // Every member but the root stages the result: recv is untouched when the call aborts.
  o.in_place = root != me_;
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

Status ElasticImpl::run_collective(const Op& op) {
  Status last;
  for (int attempt = 0;; ++attempt) {
    Attempt a;
    a.number = attempt;
    bool take_snapshot = false;
    {
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
      take_snapshot = !fresh_.empty() && !a.fresh_me;
      if (a.fresh_me && a.state_bytes && a.sources.empty()) {
        // Every live member of the view is a joiner still without the state: nobody can
        // hand it over, and going on would make up a model.
        fence(Status(StatusCode::kAborted,
                     "view " + std::to_string(a.view) + " = " + id_list(a.members) +
                         ": no member holds the registered state (every live member is a "
                         "joiner still waiting for it); start the group again from a checkpoint"));
        return fence_;
      }
    }
    LOWCOMM_CHECK(op.prepare(a));
    const uint64_t bytes = op.result_bytes(a);
    // The registered state cannot change while the caller is in this call: its snapshot for
    // fresh members (the state every replica holds until this collective commits) and its hash
    // are taken beside the data collective, on a thread of their own when they are large.
    uint64_t hash = 0;
    auto state_work = [&, seq = a.seq, fresh_me = a.fresh_me, snap_bytes = a.state_bytes] {
      if (take_snapshot) {
        auto snap = std::make_shared<std::vector<uint8_t>>();
        snap->reserve(snap_bytes);
        for (auto& [n, d] : state_) {
          auto* p = static_cast<const uint8_t*>(d.first);
          snap->insert(snap->end(), p, p + d.second);
        }
        std::lock_guard<std::mutex> g(mu_);
        snapshot_ = std::move(snap);
        snapshot_seq_ = seq;
        serve_fetches();  // stripes asked for meanwhile go out now
      }
      if (!fresh_me) hash = registered_hash();
    };
    std::thread state_thread;
    struct JoinState {
      std::thread& t;
      ~JoinState() {
        if (t.joinable()) t.join();
      }
    } join_state{state_thread};
    if (a.state_bytes >= kStateThreadBytes)
      state_thread = std::thread(state_work);
    else
      state_work();
    void* recv = op.recv;
    void* out = recv;
    if (op.in_place) {
      // In place: the result lands in staging and is copied over the input once committed. Kept
      // between calls (allocating and faulting in a fresh buffer per call cost more than the copy).
      if (staging_bytes_ < bytes) {
        staging_ = std::make_unique_for_overwrite<uint8_t[]>(bytes);
        staging_bytes_ = bytes;
      }
      out = staging_.get();
    }
    std::vector<uint8_t> fetch_into;
    std::thread fetcher;
    Status fetch_status;
    if (a.fresh_me && a.state_bytes) {
      fetch_into.resize(a.state_bytes);
      fetcher = std::thread([&] { fetch_status = fetch_state(a, fetch_into); });
    }
    // A fresh member's fetch goes on while the group commits: its `done` does not wait for the
    // state, so the others stall only for the admission itself. It is joined before this
    // attempt's locals go (declared before the lock: the fetcher takes mu_ at its end).
    struct JoinFetcher {
      std::thread& t;
      ~JoinFetcher() {
        if (t.joinable()) t.join();
      }
    } join_fetcher{fetcher};
    Status s = op.run(a, out);
    if (state_thread.joinable()) state_thread.join();  // the hash goes with the done
    std::unique_lock<std::mutex> lk(mu_);
    if (s.is_ok() && view_.id == a.view && !changing_) {
      staged_ = a.seq;
      Message d = message(MsgType::kDone, a.seq);
      d.hash = hash;
      // The coordinator admits pending joiners at this commit: its done says so, and the
      // members wait for its kCommit naming the next view instead of committing on their own.
      if (view_.coordinator() == me_ && !pending_joiners_.empty()) d.text = "admit";
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
    // While the other members' dones are on their way, the result moves into place: swapped
    // with the input chunk by chunk, so the input stays whole (in staging) until the commit.
    // Once committed, the rest is a plain copy; if aborted, the swapped part is put back.
    uint64_t swapped = 0;
    if (out != recv && staged_ == a.seq) {
      auto* r8 = static_cast<uint8_t*>(recv);
      auto* o8 = static_cast<uint8_t*>(out);
      while (swapped < bytes && fence_.is_ok() && committed_ < a.seq && view_.id == a.view &&
             !changing_) {
        lk.unlock();
        uint64_t n = std::min<uint64_t>(kSwapChunk, bytes - swapped);
        swap_bytes(r8 + swapped, o8 + swapped, n);
        swapped += n;
        lk.lock();
      }
    }
    auto until = Clock::now() + change_timeout_ + failure_floor_ * 4;
    while (fence_.is_ok() && committed_ < a.seq && view_.id == a.view) {
      if (cv_.wait_until(lk, until) == std::cv_status::timeout) {
        fence(Status(StatusCode::kTimeout, op.name + " #" + std::to_string(a.seq) +
                                               ": neither committed nor aborted in time"));
      }
    }
    if (committed_ < a.seq && swapped) {
      lk.unlock();
      std::memcpy(recv, out, swapped);  // the input, untouched again
      lk.lock();
    }
    if (committed_ >= a.seq) {
      auto hashes = commit_hashes_;
      // Replica check, before the result reaches the caller: every contributing member's state
      // hash must agree. If not, every member returns kCorruptData with its input untouched.
      std::map<uint64_t, std::vector<uint32_t>> by_hash;
      for (auto& [id, h] : hashes)
        if (!(a.fresh_me && id == me_) && h) by_hash[h].push_back(id);
      if (!hashes.empty() && !by_hash.empty()) stats_.state_hash = by_hash.begin()->first;
      Status replicas;
      if (by_hash.size() > 1) {
        std::string t = "registered state differs between replicas after collective " +
                        std::to_string(a.seq) + ":";
        for (auto& [h, ids] : by_hash) t += " hash " + std::to_string(h) + " on " + id_list(ids);
        replicas = corrupt_data(t + "; inputs untouched");
      }
      lk.unlock();
      if (!replicas.is_ok()) {
        if (swapped) std::memcpy(recv, out, swapped);  // the input, whole again
      } else {
        if (out != recv)
          std::memcpy(static_cast<uint8_t*>(recv) + swapped, static_cast<uint8_t*>(out) + swapped,
                      bytes - swapped);
        op.finish(a);
      }
      if (a.fresh_me && a.state_bytes) {
        if (fetcher.joinable()) fetcher.join();
        uint64_t want = 0;
        for (auto& [id, h] : hashes)
          if (id != me_ && h) want = h;
        Status got = fetch_status.is_ok() ? install_state(fetch_into, want) : fetch_status;
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
      if (fence_.is_ok() && !changing_ && data_view_ != view_.id &&
          (!build_ || build_view_ != view_.id))
        start_build(view_.id);
      return replicas;
    }
    Status why = fence_;
    if (why.is_ok()) {
      Status w = wait_for_view_after(lk, a.view);
      if (!w.is_ok()) return w;
    } else {
      return why;
    }
    last =
        Status(StatusCode::kAborted, op.name + " #" + std::to_string(a.seq) + " aborted in view " +
                                         std::to_string(a.view) + " (" + change_reason_ +
                                         "); view " + std::to_string(view_.id) + " = " +
                                         id_list(view_.members) + "; inputs untouched, call again");
    if (attempt >= options_.retries) return last;
    ++stats_.retried;
  }
}

}  // namespace lowcomm
