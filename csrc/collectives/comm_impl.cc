#include "collectives/comm_impl.h"
#include "collectives/device_op.h"

#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "collectives/intra_site.h"
#include "collectives/op_run.h"
#include "collectives/tags.h"
#include "core/little_endian.h"
#include "core/log.h"
#include "core/params.h"
#include "lowcomm/codec.h"
#include "rendezvous/bootstrap.h"
#include "transport/pacer.h"
#include "transport/peer_config.h"

namespace lowcomm {
namespace {

using collectives::OpDescriptor;
using collectives::OpKind;
using collectives::OpRun;

constexpr uint32_t kControlMagic = 0x3158434Cu;  // "LCX1"
constexpr uint32_t kControlAbort = 1;
constexpr uint32_t kControlGoodbye = 2;
// Control message: u32 magic, u32 type, u32 text length, then (goodbye) three u64 counts:
// collectives run, point-to-point messages sent to the receiver, received from it; then text.
constexpr size_t kControlTextOffset = 12 + 24;
constexpr size_t kControlTextMax = kControlMessageBytes - kControlTextOffset;

// How long a failing rank waits for its notices to reach the kernel before closing.
constexpr auto kNoticeWait = std::chrono::milliseconds(500);
constexpr auto kNoticeLinger = std::chrono::milliseconds(300);
// abort() closes at once, as ncclCommAbort does: its notices go out with what the sockets take
// in this long (a frozen peer's full buffers take nothing), and it does not linger. torchft
// aborts its group at every quorum change, with a frozen replica among the peers.
constexpr auto kAbortNoticeWait = std::chrono::milliseconds(20);

topology::OpShape shape_of(const OpDescriptor& d) {
  topology::OpShape shape;
  shape.bytes = d.count * dtype_size(d.dtype);
  shape.sparse = d.codec && d.codec->sparse();
  shape.keep = shape.sparse ? d.codec->keep : 0;
  shape.auto_schedule = d.auto_schedule;
  return shape;
}
}  // namespace

Result<std::unique_ptr<CommImpl>> CommImpl::create(const UniqueId& id, int rank, int nranks,
                                                   const CommOptions& options) {
  auto settings = collectives::read_init_settings(id, rank, nranks, options);
  if (!settings) return settings.status();
  collectives::InitSettings& s = settings.value();
  std::unique_ptr<CommImpl> c(new CommImpl());
  c->rank_ = rank;
  c->nranks_ = nranks;
  c->options_ = s.options;
  c->timeout_ = options.timeout && options.timeout->count() > 0
                    ? Deadline::Clock::duration(*options.timeout)
                    : default_timeout();
  Deadline deadline = options.init_timeout && options.init_timeout->count() > 0
                          ? Deadline::after(Deadline::Clock::duration(*options.init_timeout))
                          : Deadline::after(c->timeout_);
  const uint32_t hello_flags = s.want_ucx ? rendezvous::kRankAsksForUcx : 0;
  auto mesh = rendezvous::bootstrap_mesh(id, rank, nranks, options, hello_flags, s.peer, deadline);
  // Every rank of the site opened its clocks before bootstrapping: the names can go.
  s.emulated.release_names();
  auto in_init = [&](const Status& e) {
    return Status(e.code(), "init rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                                ": " + e.message());
  };
  if (!mesh) return in_init(mesh.status());
  c->engine_ = std::move(mesh.value().engine);
  c->peers_ = std::move(mesh.value().peers);
  c->chunk_bytes_ = s.peer.chunk_bytes;
  const rendezvous::BootstrapTable& table = mesh.value().table;
  // Each rank's host, from the root's address table (the same on every rank); empty without one.
  std::vector<std::string> hosts;
  if (table.addresses.size() == static_cast<size_t>(nranks))
    for (const std::string& a : table.addresses) hosts.push_back(a.substr(0, a.rfind(':')));
  if (Status e = c->plan_links(s, hosts, deadline); !e) return in_init(e);
  if (Status e = c->open_intra_site(s, table, hosts, deadline); !e) return in_init(e);
  if (c->sites().sites() > 1)
    LOWCOMM_LOG(kInfo, "rank %d: sites %s%s", rank, c->sites().to_string().c_str(),
                c->sites().two_level()
                    ? " (fp32 all-reduces of 1 MiB or more run in two levels)"
                    : " (flat: two levels need equal sites of two or more ranks)");
  c->inline_bytes_ = *s.options.inline_bytes;
  c->pinned_limit_ = s.pinned_limit;
  c->gate_->comm = c.get();
  c->control_ = std::vector<Control>(nranks);
  c->p2p_sent_.assign(static_cast<size_t>(nranks), 0);
  c->p2p_received_.assign(static_cast<size_t>(nranks), 0);
  for (int r = 0; r < nranks; ++r)
    if (r != rank)
      c->control_[r].in_req = c->peers_[r]->irecv_standing(
          collectives::tags::kControl, c->control_[r].in.data(), c->control_[r].in.size());
  CommImpl* self = c.get();
  c->executor_ = std::thread([self] {
    std::string name = "lc-coll-r" + std::to_string(self->rank_);
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    self->executor_main();
  });
  LOWCOMM_LOG(kInfo, "rank %d of %d: communicator ready", rank, nranks);
  return c;
}

Status CommImpl::plan_links(const collectives::InitSettings& s,
                            const std::vector<std::string>& hosts, Deadline deadline) {
  links_.assign(static_cast<size_t>(nranks_), s.own);
  if (s.wan.has_pair_rules()) {
    for (int r = 0; r < nranks_; ++r) {
      if (r == rank_) continue;
      auto got = s.emulated.link_to(s.wan, rank_, r);
      if (!got) return invalid_argument("wan: " + got.status().message());
      peers_[r]->set_link(*got);
      links_[static_cast<size_t>(r)] = *got;
    }
  }
  // The kernel sees the real path; an emulated link's delay is added to its round trips (each
  // way, as both ends of an emulated pair delay what they send).
  std::vector<double> emulated_rtt(static_cast<size_t>(nranks_), 0.0);
  for (int r = 0; r < nranks_; ++r)
    emulated_rtt[static_cast<size_t>(r)] = 2 * links_[static_cast<size_t>(r)].one_way_delay_s;
  planner_.configure(s.planner);
  return planner_.discover(hosts, emulated_rtt, peers_, deadline);
}

Status CommImpl::open_intra_site(const collectives::InitSettings& s,
                                 const rendezvous::BootstrapTable& table,
                                 const std::vector<std::string>& hosts, Deadline deadline) {
  // The transport inside the site (intra_site.h): the ranks of this rank's site, else of its
  // host.
  const int rank = rank_;
  collectives::IntraSiteRequest intra;
  intra.want_ucx = s.want_ucx;
  intra.sealed = s.peer.seal;
  for (int r = 0; r < nranks_; ++r) {
    const auto i = static_cast<size_t>(r);
    intra.asks_for_ucx.push_back(i < table.flags.size() &&
                                 (table.flags[i] & rendezvous::kRankAsksForUcx) != 0);
    intra.emulated.push_back(r != rank && links_[i].shaped());
    const bool same_host = !hosts.empty() && hosts[i] == hosts[static_cast<size_t>(rank)];
    const topology::SitePlan& sites = planner_.sites();
    const bool together = sites.sites() > 1
                              ? sites.site_of[i] == sites.site_of[static_cast<size_t>(rank)]
                              : same_host;
    if (r != rank && together) intra.partners.push_back(r);
    intra.same_host.push_back(same_host);
  }
  auto site = collectives::connect_intra_site(peers_, rank, intra, deadline);
  if (!site) return site.status();
  ucx_ = std::move(site.value().ucx);
  over_ucx_ = std::move(site.value().over_ucx);
  return Status::ok();
}

Result<collectives::DeviceContext*> CommImpl::device_context() {
  std::lock_guard<std::mutex> lock(device_mu_);
  if (device_) return device_.get();
  device::Runtime* rt = device::runtime();
  if (rt == nullptr)
    return unsupported(std::string("CUDA buffers need a device runtime: ") + device::why_none());
  device_ = std::make_unique<collectives::DeviceContext>(*rt, pinned_limit_);
  return device_.get();
}

CommImpl::~CommImpl() {
  {
    // No waiter may run an operation from now on (it would outlive us): wait out one that is.
    std::lock_guard<std::recursive_mutex> hold(gate_->mu);
    gate_->comm = nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (!executor_.joinable()) return;  // init failed: the mesh closed itself
  executor_.join();                   // runs what was queued first
  bool failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed = !failure_.is_ok();
  }
  if (!failed) {
    for (auto& p : peers_)
      if (p) p->expect_close();
    goodbye();
  }
  for (auto& p : peers_)
    if (p) p->abort();
  ucx_.reset();
  peers_.clear();  // closes every socket; the engine joins when the last peer lets go of it
  engine_.reset();
}

void CommImpl::goodbye() {
  send_control(kControlGoodbye, "rank " + std::to_string(rank_) + " destroyed its communicator",
               std::chrono::duration_cast<std::chrono::milliseconds>(timeout_));
  // Closing before a peer has read everything we sent would fail its last operation (it sees
  // one stream end before another's data), so wait until every peer has said goodbye too or is
  // gone.
  Deadline d = Deadline::after(timeout_);
  for (int r = 0; r < nranks_; ++r)
    if (r != rank_ && control_[r].in_req.wait(d).code() == StatusCode::kTimeout)
      LOWCOMM_LOG(
          kWarn,
          "rank %d: rank %d did not destroy its communicator within the timeout; closing anyway",
          rank_, r);
}

// Sequence numbers are assigned and the operation queued in one critical section, so the
// executor runs operations in sequence order even when threads submit concurrently.
Work CommImpl::enqueue_locked(Op op) {
  // Callbacks run once the operation's thread has left the executor's place (run_exclusive); a
  // wait runs the operation here where it may (run_queued).
  op.work->hold_callbacks();
  std::weak_ptr<StealGate> gate = gate_;
  op.work->set_run_here([gate, small = op.small](WorkState* w) {
    if (auto g = gate.lock()) {
      std::lock_guard<std::recursive_mutex> hold(g->mu);  // the communicator outlives this call
      if (g->comm) g->comm->run_queued(w, small);
    }
  });
  Work w(op.work);
  queue_.push_back(std::move(op));
  cv_.notify_all();
  return w;
}

Work CommImpl::enqueue(Op op) {
  std::lock_guard<std::mutex> lock(mu_);
  return enqueue_locked(std::move(op));
}

Work CommImpl::submit_collective(OpDescriptor desc, Body body) {
  Op op;
  desc.nranks = static_cast<uint32_t>(nranks_);
  for (int r = 0; r < nranks_; ++r)
    if (r != rank_) op.peers.push_back(r);
  op.body = std::move(body);
  std::unique_lock<std::mutex> lock(mu_);
  desc.seq = next_seq_++;
  op.work = std::make_shared<WorkState>(desc.seq, collectives::identity_stats(desc));
  op.desc = desc;
  // A small collective may run on the thread that waits for it (run_queued): no hand-off to the
  // executor and back on the critical path. Only collectives: every rank calls them in the same
  // order, so the waiter running one cannot hold up another rank; and only from Work::wait(),
  // so an asynchronous call still returns at once and the executor runs it if nobody waits.
  op.small = desc.count * dtype_size(desc.dtype) <= inline_bytes_;
  return enqueue_locked(std::move(op));
}

void CommImpl::run_queued(WorkState* w, bool small) {
  if (t_executor_ == this) {
    drive(w);
    return;
  }
  if (!small) return;
  Op op;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (running_ || stop_ || t_running_ == this || queue_.empty() || queue_.front().work.get() != w)
      return;  // started already, or behind other operations: the executor runs it
    op = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
  }
  run_exclusive(op);
}

void CommImpl::drive(WorkState* w) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!w->done()) {
    if (running_) {  // a caller runs a small collective inline: w may be it, or after it
      cv_.wait(lock, [&] { return !running_ || w->done(); });
      continue;
    }
    // Nothing queued and w not done: it is not ours to run (another communicator's).
    if (queue_.empty()) return;
    Op op = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    lock.unlock();
    run_exclusive(op);
    lock.lock();
  }
}

void CommImpl::run_exclusive(Op& op) {
  const CommImpl* outer = t_running_;
  t_running_ = this;
  current_ = &op;
  run_one(op);
  finished_.push_back(op.work);
  current_ = nullptr;
  t_running_ = outer;
  std::vector<std::shared_ptr<WorkState>> finished;
  finished.swap(finished_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
  }
  cv_.notify_all();
  // Outside the executor's place: a callback may call a collective and wait for it, or wait for
  // a later operation (on the executor thread, drive() runs them).
  for (auto& w : finished) w->release_callbacks();
}

Work CommImpl::submit_p2p(OpDescriptor desc, int peer, Body body) {
  const bool is_send = desc.kind == OpKind::kSend;
  Op op;
  desc.nranks = static_cast<uint32_t>(nranks_);
  op.peers = {peer};
  op.body = std::move(body);
  std::lock_guard<std::mutex> lock(mu_);
  desc.seq = p2p_seq_[{peer, desc.user_tag, is_send}]++;
  op.p2p_index =
      is_send ? p2p_sent_[static_cast<size_t>(peer)]++ : p2p_received_[static_cast<size_t>(peer)]++;
  op.work = std::make_shared<WorkState>(desc.seq, collectives::identity_stats(desc));
  op.desc = desc;
  return enqueue_locked(std::move(op));
}

Work CommImpl::submit_recv_any(OpDescriptor desc, Body body) {
  Op op;
  desc.nranks = static_cast<uint32_t>(nranks_);
  desc.root = -1;
  for (int r = 0; r < nranks_; ++r)
    if (r != rank_) op.peers.push_back(r);
  op.body = std::move(body);
  op.any_source = true;
  std::lock_guard<std::mutex> lock(mu_);
  desc.seq = any_source_seq_++;
  op.work = std::make_shared<WorkState>(desc.seq, collectives::identity_stats(desc));
  op.desc = desc;
  return enqueue_locked(std::move(op));
}

void CommImpl::run_overtaking_sends() {
  while (true) {
    Op send;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failure_.is_ok()) return;
      auto it = queue_.begin();
      for (; it != queue_.end(); ++it) {
        const bool p2p =
            !it->local && (it->desc.kind == OpKind::kSend || it->desc.kind == OpKind::kRecv);
        if (!p2p) return;
        if (it->desc.kind == OpKind::kSend) break;
      }
      if (it == queue_.end()) return;
      send = std::move(*it);
      queue_.erase(it);
    }
    const Op* outer = current_;
    current_ = &send;
    run_one(send);
    finished_.push_back(send.work);
    current_ = outer;
  }
}

uint64_t CommImpl::take_recv_seq(int peer, uint64_t tag) {
  if (current_ && current_->any_source) {
    std::lock_guard<std::mutex> lock(mu_);
    ++p2p_received_[static_cast<size_t>(peer)];
  }
  return recv_run_seq_[{peer, tag}]++;
}

Work CommImpl::submit_local(std::function<Status()> fn) {
  Op op;
  op.local = std::move(fn);
  op.work = std::make_shared<WorkState>(0);
  return enqueue(std::move(op));
}

void CommImpl::executor_main() {
  t_executor_ = this;
  while (true) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Not while a caller runs a small collective inline (running_ without the executor).
      cv_.wait(lock, [&] { return (stop_ || !queue_.empty()) && !running_; });
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    run_exclusive(op);
  }
}

void CommImpl::run_one(Op& op) {
  if (op.local) {
    op.work->complete(op.local());
    return;
  }
  const auto start = collectives::StatsClock::now();
  // An all-reduce whose schedule is left to us: flat or two levels (sparse: owner or
  // gather-all), from what each took, the same choice on every rank. Then what the ranks agree
  // on and, where the operation carries one, this rank's report (topology/planner.h).
  const topology::OpShape shape = shape_of(op.desc);
  if (op.desc.auto_schedule) op.desc.algorithm = planner_.pick(shape);
  const bool reports = op.desc.carries_report();
  const topology::Agreement mine = planner_.agreement(shape, op.desc.algorithm, reports);
  collectives::stamp_agreement(op.desc, mine.sites_hash, mine.shares_hash, mine.report.pack());
  const auto measure_from = transport::PaceClock::now();
  std::string what = op.desc.to_string();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.is_ok()) {
      // The first failure's code, as lowcomm.h promises (NCCL: the async error sticks).
      last_stats_ = collectives::identity_stats(op.desc);
      op.work->complete(Status(failure_.code(),
                               what + ": the communicator failed earlier: " + failure_.message()),
                        last_stats_);
      return;
    }
  }
  Status s;
  OpStats stats;
  int source = -1;
  {
    OpRun run(*this, op.desc, op.peers, Deadline::after(timeout_));
    s = op.body(run);
    if (s.is_ok()) s = run.wait_all();
    if (!s) {
      s = Status(s.code(), "rank " + std::to_string(rank_) + ": " + what + ": " + s.message());
      // Before `run` frees its scratch and the Work returns the user's buffers: every request
      // must be finished, which aborting the peers guarantees (a UCX site's once its teardown
      // has let go of every buffer, which may be another thread's abort's).
      fail(s, s.code() != StatusCode::kAborted);
      if (ucx_) ucx_->wait_released();
    }
    source = run.source();
    run.tally_resends();
    stats = collectives::summarize(op.desc, run.counters(), collectives::StatsClock::now() - start,
                                   links_);
    if (op.desc.kind == OpKind::kAllReduce)
      stats.schedule = topology::schedule_name(op.desc.algorithm, shape.sparse);
    if (mine.rated) {
      for (uint32_t p : planner_.share_plan().parts)
        stats.shares.push_back(static_cast<double>(p) / topology::kShareUnits);
      stats.rate_estimate = topology::decode_rate(mine.report.rate);
    }
    if (reports && s.is_ok()) {
      // Arrivals at the downlink (kernel sockets and emulated links); departures from the
      // emulated uplink (a kernel socket takes bytes long before they leave: not measured).
      planner_.learn(shape, op.desc.algorithm, mine, run.reports(),
                     std::chrono::duration<double>(stats.wall).count(), [&] {
                       return std::max(engine_->down_meter().peak_rate(measure_from),
                                       engine_->up_meter().peak_rate(measure_from));
                     });
    }
  }
  collectives::log_stats(rank_, op.desc, stats, s);
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_stats_ = stats;
  }
  op.work->complete(s, std::move(stats), source);
}

OpStats CommImpl::last_op_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_stats_;
}

Status CommImpl::check_health(const std::vector<int>& involved) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.is_ok()) return failure_;
  }
  // Two passes: a peer's own account of why it failed beats the broken connection it leaves
  // behind (which another peer may show first).
  Status broken;
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_ || !control_[r].in_req.test()) continue;
    bool needed = std::find(involved.begin(), involved.end(), r) != involved.end();
    Status s = control_[r].in_req.status();
    if (!s) {
      if (needed && broken.is_ok()) broken = s;  // the transport names the peer and what broke
      continue;
    }
    const uint8_t* m = control_[r].in.data();
    if (lowcomm::load_le32(m) != kControlMagic)
      return corrupt_data("rank " + std::to_string(r) + " sent a malformed control message");
    uint32_t type = lowcomm::load_le32(m + 4);
    uint32_t len = std::min<uint32_t>(lowcomm::load_le32(m + 8), kControlTextMax);
    std::string text(reinterpret_cast<const char*>(m + kControlTextOffset), len);
    if (type == kControlAbort)
      return Status(StatusCode::kRemoteError, "rank " + std::to_string(r) + " failed: " + text);
    // A goodbye: the rank finished every operation it was given, this one included if it took
    // part, and keeps its sockets open until everyone's goodbye, so its data still arrives.
    if (needed && broken.is_ok() && needs_departed(r, parse_departure(m)))
      broken = Status(StatusCode::kRemoteError,
                      "rank " + std::to_string(r) +
                          " has left without taking part (it destroyed its communicator)");
  }
  return broken;
}

CommImpl::Departure CommImpl::parse_departure(const uint8_t* m) {
  Departure d;
  d.collectives = lowcomm::load_le64(m + 12);
  d.sent_to_us = lowcomm::load_le64(m + 20);
  d.received_from_us = lowcomm::load_le64(m + 28);
  return d;
}

bool CommImpl::needs_departed(int r, const Departure& d) const {
  const Op* op = current_;
  if (!op) return true;
  const bool p2p = op->desc.kind == OpKind::kSend || op->desc.kind == OpKind::kRecv;
  if (!p2p) return op->desc.seq >= d.collectives;
  // Any-source: another peer may still send; the deadline bounds the wait.
  if (op->any_source || op->peers.empty() || op->peers[0] != r) return false;
  // Counted over all tags: a message on another tag keeps this one waiting, to the deadline.
  return op->desc.kind == OpKind::kSend ? op->p2p_index >= d.received_from_us
                                        : op->p2p_index >= d.sent_to_us;
}

void CommImpl::send_control(uint32_t type, const std::string& text,
                            std::chrono::milliseconds wait) {
  uint64_t collectives = 0;
  std::vector<uint64_t> sent_to, received_from;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (control_sent_) return;
    control_sent_ = true;
    collectives = next_seq_;
    sent_to = p2p_sent_;
    received_from = p2p_received_;
  }
  size_t len = std::min(text.size(), kControlTextMax);
  std::vector<transport::Request> sent;
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_) continue;
    uint8_t* m = control_[r].out.data();
    lowcomm::store_le32(m, kControlMagic);
    lowcomm::store_le32(m + 4, type);
    lowcomm::store_le32(m + 8, static_cast<uint32_t>(len));
    lowcomm::store_le64(m + 12, collectives);
    lowcomm::store_le64(m + 20, sent_to[static_cast<size_t>(r)]);
    lowcomm::store_le64(m + 28, received_from[static_cast<size_t>(r)]);
    std::memcpy(m + kControlTextOffset, text.data(), len);
    control_[r].out_req = peers_[r]->isend(collectives::tags::kControl, m, control_[r].out.size());
    sent.push_back(control_[r].out_req);
  }
  Deadline d = Deadline::after(wait);
  for (auto& s : sent) (void)s.wait(d);
}

void CommImpl::fail(const Status& why, bool notify) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.is_ok()) {
      // Already failed (abort() or an earlier operation): the peers are being aborted.
    } else {
      failure_ = why;
    }
  }
  if (why.code() == StatusCode::kAborted) {
    LOWCOMM_LOG(kInfo, "%s", why.to_string().c_str());  // asked for
  } else {
    LOWCOMM_LOG(kWarn, "%s", why.to_string().c_str());
  }
  if (notify && why.code() == StatusCode::kAborted) {
    send_control(kControlAbort, why.message(), kAbortNoticeWait);  // asked for: no linger
  } else if (notify) {
    send_control(kControlAbort, why.message(), kNoticeWait);
    // Linger briefly before closing: a peer whose engine sees our connections end before it
    // has read the notice (the notice and the end travel on different streams) would only
    // learn "connection closed". A peer in an operation answers at once (its own notice or
    // its close completes our control receive); an idle one costs this wait.
    Deadline d = Deadline::after(kNoticeLinger);
    for (int r = 0; r < nranks_; ++r)
      if (r != rank_) (void)control_[r].in_req.wait(d);
  }
  for (auto& p : peers_)
    if (p) p->abort();
  if (ucx_) ucx_->abort(why);
}

void CommImpl::abort() {
  fail(Status(StatusCode::kAborted, "rank " + std::to_string(rank_) + " aborted its communicator"),
       true);
  // Local bookkeeping queued (error-feedback residuals saved, restored, listed, dropped) still
  // runs: it touches no peer, and a caller carrying the residuals into a new communicator needs
  // them from the one aborted.
  std::deque<Op> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::deque<Op> kept;
    for (auto& op : queue_) (op.local ? kept : dropped).push_back(std::move(op));
    queue_.swap(kept);
  }
  for (auto& op : dropped) {
    op.work->complete(
        Status(StatusCode::kAborted, op.desc.to_string() + ": the communicator was aborted"));
    op.work->release_callbacks();
  }
  // The running operation sees the failure at its next wait (its requests were all completed
  // by the peers' abort); only then are the user's buffers free.
  // Not from inside the running operation.
  if (executor_.joinable() && t_running_ != this) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !running_; });
  }
}

Status CommImpl::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

}  // namespace lowcomm
