// ElasticImpl's set-up (docs/membership.md): the founders' view 0 and the membership mesh, a
// joiner's entry through a seed until admitted, and the leave at destruction.
#include "membership/elastic_impl.h"

#include <openssl/rand.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/log.h"
#include "core/params.h"
#include "membership/elastic_util.h"
#include "rendezvous/listen_address.h"
#include "transport/connector.h"
#include "transport/emulated_links.h"

namespace lowcomm {

using membership::MemberAddress;
using membership::Message;
using membership::MsgType;

namespace {

// One connection attempt: a refused or unreachable seed fails at once (connect_peer retries
// refusals until its deadline, for ranks whose listener is not up yet; a seed's is).
Result<std::unique_ptr<transport::Peer>> connect_once(
    std::shared_ptr<transport::ProgressEngine> engine, const transport::SocketAddress& addr,
    const transport::PeerConfig& cfg, Deadline deadline) {
  auto op = transport::ConnectOp::start(std::move(engine), addr, cfg);
  if (!op) return op.status();
  for (;;) {
    auto done = (*op)->test();
    if (!done) return done.status();
    if (*done) return (*op)->take_peer();
    if (deadline.expired())
      return Status(StatusCode::kTimeout, "connecting to " + addr.to_string() + " timed out");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

Status ElasticImpl::start(const UniqueId& id) {
  if (options_.comm.timeout.value_or(std::chrono::milliseconds(0)).count() <= 0)
    options_.comm.timeout = std::chrono::minutes(30);
  // A frozen or cut-off member is the membership heartbeats' to find (it is evicted, and the
  // view's communicator aborted): the views' communicators do not fail on a silent peer of
  // their own accord.
  options_.comm.failure_timeout = std::chrono::milliseconds(0);  // off
  if (Status s = params::check_all(); !s) return s;
  // The membership's failure floor: the option, else the variable where positive, else 1.5 s.
  auto floor_ms = params::integer("LOWCOMM_FAILURE_TIMEOUT_MS");
  failure_floor_ = options_.failure_timeout.count() ? options_.failure_timeout
                   : floor_ms.is_ok() && floor_ms->value_or(0) > 0
                       ? std::chrono::milliseconds(**floor_ms)
                       : std::chrono::milliseconds(1500);
  change_timeout_ = options_.view_change_timeout.count() ? options_.view_change_timeout
                                                         : std::chrono::milliseconds(30000);
  auto cut = params::integer("LOWCOMM_ELASTIC_FAULT_CUT_AFTER_DONE");
  if (cut.is_ok() && cut->has_value()) fault_cut_after_done_ = static_cast<uint64_t>(**cut);
  auto drop = params::integer("LOWCOMM_ELASTIC_FAULT_DROP_RESULT");
  if (drop.is_ok() && drop->has_value()) fault_drop_result_ = static_cast<uint64_t>(**drop);
  auto die = params::choice("LOWCOMM_ELASTIC_FAULT_DIE_AT_ADMIT");
  fault_die_at_admit_ = die.is_ok() && die->value_or("0") == "1";
  auto only = params::integer("LOWCOMM_ELASTIC_FAULT_COMMIT_ONLY_TO");
  if (only.is_ok() && only->has_value() && **only >= 0) fault_commit_only_to_ = **only;
  if (options_.heartbeat_interval.count() <= 0)
    return invalid_argument("ElasticOptions::heartbeat_interval must be positive");
  if (options_.retries < 0) return invalid_argument("ElasticOptions::retries must be >= 0");
  secret_ = id.secret;
  auto engine = transport::ProgressEngine::create("lc-eng-m" + std::to_string(me_));
  if (!engine) return engine.status();
  engine_ = *engine;
  return Status::ok();
}

Result<transport::PeerConfig> ElasticImpl::membership_config(const UniqueId& id, int rank) const {
  auto cfg = transport::PeerConfig::from_env(
      rank, std::string(reinterpret_cast<const char*>(id.secret.data()), id.secret.size()));
  if (!cfg) return cfg.status();
  // Sealed as the data connections are (CommOptions::encrypt, else LOWCOMM_ENCRYPT): a
  // joiner's state stripes (the model) cross these connections.
  if (options_.comm.encrypt) cfg.value().seal = *options_.comm.encrypt;
  // One stream; the socket buffers (the window) of a data stream, since a joiner's state
  // stripes come over these connections (a fixed small window caps a long path's rate).
  // Emulated site links (LOWCOMM_WAN): one uplink and downlink shared by all of this member's
  // membership connections, as by its data connections (not with them: a separate site).
  cfg.value().streams = 1;
  cfg.value().site = transport::own_site_links(cfg.value().wan);
  return cfg;
}

Result<std::unique_ptr<ElasticImpl>> ElasticImpl::found(const UniqueId& id, int rank, int nranks,
                                                        const ElasticOptions& options) {
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return invalid_argument("ElasticCommunicator::init: rank " + std::to_string(rank) +
                            " outside [0, " + std::to_string(nranks) + ")");
  std::unique_ptr<ElasticImpl> e(new ElasticImpl());
  e->options_ = options;
  e->me_ = static_cast<uint32_t>(rank);
  LOWCOMM_CHECK(e->start(id));
  // View 0's communicator is the founding id's: it carries the membership addresses.
  auto comm = Communicator::init(id, rank, nranks, e->options_.comm);
  if (!comm) return comm.status();
  std::shared_ptr<Communicator> data(std::move(comm).value());
  auto cfg = e->membership_config(id, rank);
  if (!cfg) return cfg.status();
  auto bind = rendezvous::listen_address_for(options.listen_address, id.root_address);
  if (!bind) return bind.status();
  auto listener = transport::Listener::create(e->engine_, *cfg, *bind);
  if (!listener) return listener.status();
  e->listener_ = std::move(listener).value();
  // Everyone's membership address, through view 0's all-gather (fixed 64-byte fields).
  constexpr size_t kAddr = 64;
  std::string mine = e->listener_->address().to_string();
  if (mine.size() >= kAddr) return internal_error("membership address too long: " + mine);
  std::vector<char> all(kAddr * static_cast<size_t>(nranks), 0);
  std::vector<char> own(kAddr, 0);
  std::memcpy(own.data(), mine.data(), mine.size());
  LOWCOMM_CHECK(data->all_gather(own.data(), all.data(), kAddr, DType::kUInt8).wait());
  // The higher id connects to the lower; the lower accepts.
  Deadline deadline = Deadline::after(*e->options_.comm.timeout);  // set by start()
  for (int r = 0; r < nranks; ++r) {
    std::string a(all.data() + kAddr * static_cast<size_t>(r));
    e->addresses_[static_cast<uint32_t>(r)] = a;
    e->view_.members.push_back(static_cast<uint32_t>(r));
    if (r >= rank) continue;
    auto addr = transport::SocketAddress::parse(a);
    if (!addr) return addr.status();
    auto peer = transport::connect_peer(e->engine_, *addr, *cfg, deadline);
    if (!peer) return peer.status();
    auto [it, _] = e->slots_.try_emplace(static_cast<uint32_t>(r), std::move(peer).value(),
                                         e->options_, e->failure_floor_);
    (void)it;
  }
  while (static_cast<int>(e->slots_.size()) < nranks - 1) {
    auto peer = e->listener_->accept(deadline);
    if (!peer) return peer.status();
    uint32_t from = static_cast<uint32_t>((*peer)->remote_rank());
    if (from <= e->me_ || from >= static_cast<uint32_t>(nranks) || e->slots_.count(from))
      return corrupt_data("membership connection from unexpected member " + std::to_string(from));
    e->slots_.try_emplace(from, std::move(peer).value(), e->options_, e->failure_floor_);
  }
  e->next_id_ = static_cast<uint32_t>(nranks);
  e->data_ = std::move(data);
  e->data_view_ = 0;
  e->thread_ = std::thread([p = e.get()] { p->loop(); });
  LOWCOMM_LOG(kInfo, "elastic member %u: view 0 of %d members, membership address %s", e->me_,
              nranks, mine.c_str());
  return e;
}

Result<std::unique_ptr<ElasticImpl>> ElasticImpl::join(const UniqueId& id,
                                                       const std::vector<std::string>& seeds,
                                                       const ElasticOptions& options) {
  if (seeds.empty()) return invalid_argument("ElasticCommunicator::join: no seed addresses");
  std::unique_ptr<ElasticImpl> e(new ElasticImpl());
  e->options_ = options;
  uint32_t temp = 0;
  if (RAND_bytes(reinterpret_cast<uint8_t*>(&temp), sizeof(temp)) != 1)
    return internal_error("RAND_bytes failed");
  temp |= 0x80000000u;  // joiners' temporary ids; member ids stay below 2^31
  e->me_ = temp;
  LOWCOMM_CHECK(e->start(id));
  auto cfg = e->membership_config(id, static_cast<int>(temp));
  if (!cfg) return cfg.status();
  auto bind = rendezvous::listen_address_for(options.listen_address, seeds.front());
  if (!bind) return bind.status();
  auto listener = transport::Listener::create(e->engine_, *cfg, *bind);
  if (!listener) return listener.status();
  e->listener_ = std::move(listener).value();
  // Enter through the first seed that answers. A seed that goes away before this joiner is
  // admitted (it died, or was evicted) is replaced by the next one, in a cycle, until admitted.
  size_t next_seed = 0;
  std::string errors;
  auto enter = [&]() -> bool {  // mu_ not held
    for (size_t tried = 0; tried < seeds.size(); ++tried) {
      const std::string& seed = seeds[next_seed++ % seeds.size()];
      auto addr = transport::SocketAddress::parse(seed);
      if (!addr) {
        errors += "; " + seed + ": " + addr.status().message();
        continue;
      }
      auto peer = connect_once(e->engine_, *addr, *cfg, Deadline::after(std::chrono::seconds(5)));
      if (!peer) {
        errors += "; " + seed + ": " + peer.status().message();
        continue;
      }
      uint32_t via = static_cast<uint32_t>((*peer)->remote_rank());
      std::lock_guard<std::mutex> lk(e->mu_);
      e->slots_.erase(via);
      e->slots_.try_emplace(via, std::move(peer).value(), e->options_, e->failure_floor_);
      Message m = e->message(MsgType::kJoin);
      m.text = e->listener_->address().to_string();
      e->send_to(via, m);
      return true;
    }
    return false;
  };
  if (!enter())
    return Status(StatusCode::kRemoteError,
                  "ElasticCommunicator::join: no seed accepted the connection" + errors);
  e->thread_ = std::thread([p = e.get()] { p->loop(); });
  // Admitted when a commit names this member's address; then connect to every member.
  std::unique_lock<std::mutex> lk(e->mu_);
  auto until = Clock::now() + e->change_timeout_;
  while (e->me_ == temp && e->fence_.is_ok()) {
    if (Clock::now() >= until) {
      return Status(StatusCode::kTimeout,
                    "ElasticCommunicator::join: not admitted within " +
                        std::to_string(e->change_timeout_.count()) +
                        " ms (the group admits joiners when it commits a collective)");
    }
    e->cv_.wait_for(lk, std::chrono::milliseconds(50));
    if (e->me_ == temp && e->slots_.empty()) {  // the seed's connection closed
      lk.unlock();
      LOWCOMM_LOG(kInfo, "elastic joiner: seed gone before admission; trying the next");
      bool ok = enter();
      if (!ok) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      lk.lock();
    }
  }
  if (!e->fence_.is_ok()) return e->fence_;
  // The view's communicator rendezvouses through its data root on a thread of its own, while
  // this one connects to the members (both a few round trips: in parallel, not one after the
  // other, so the members' first collective with this joiner waits less).
  if (!e->changing_) e->start_build(e->view_.id);
  cfg.value().local_rank = static_cast<int>(e->me_);
  auto members = e->addresses_;
  lk.unlock();
  // As among the founders, the higher id connects to the lower: joiners admitted by the same
  // commit (ids above this one's) connect here. Before, both of a pair dialled each other and
  // each side's accept replaced (and closed) its own dialled connection, which the other read
  // as the member failing: a view change, one of them evicted. To every member at once.
  std::vector<std::pair<uint32_t, std::string>> dial;
  for (const auto& [id2, a] : members)
    if (id2 < e->me_) dial.emplace_back(id2, a);
  // Each connection is the member's as soon as it is up (a member waits for it no longer
  // than twice the failure timeout, like the awaited joiner on its side). Admitted, this joiner
  // is a member: a member it cannot reach (one that died after the commit admitting it went
  // out) is a member lost, which a view change settles, not a join that failed. A member's
  // listener is up since it entered: a refusal fails the dial at once (connect_once). A joiner
  // admitted by the same commit refuses a member it has not heard of until it applies the
  // commit too: dials to those retry (connect_peer). Either gives up after as long as the
  // members wait for a joiner's connection.
  Deadline dial_deadline = Deadline::after(std::min(e->change_timeout_, e->failure_floor_ * 2));
  std::set<uint32_t> fellows;
  {
    std::lock_guard<std::mutex> g(e->mu_);
    fellows = e->fresh_;
  }
  {
    std::vector<std::thread> dialers;
    for (size_t i = 0; i < dial.size(); ++i)
      dialers.emplace_back([&, i] {
        const uint32_t id2 = dial[i].first;
        auto addr = transport::SocketAddress::parse(dial[i].second);
        Status why = addr.status();
        std::unique_ptr<transport::Peer> peer;
        if (addr) {
          auto dialed = fellows.count(id2)
                            ? transport::connect_peer(e->engine_, *addr, *cfg, dial_deadline)
                            : connect_once(e->engine_, *addr, *cfg, dial_deadline);
          if (dialed)
            peer = std::move(dialed).value();
          else
            why = dialed.status();
        }
        std::lock_guard<std::mutex> g(e->mu_);
        e->awaited_.erase(id2);
        if (!peer) {
          e->lose(id2, "member " + std::to_string(id2) +
                           " of the view this member was admitted into is unreachable: " +
                           why.message());
          return;
        }
        e->slots_.erase(id2);
        e->slots_.try_emplace(id2, std::move(peer), e->options_, e->failure_floor_);
        e->caught_up(id2);
      });
    for (auto& t : dialers) t.join();
  }
  {
    std::lock_guard<std::mutex> g(e->mu_);
    if (e->fence_.is_ok() && !e->changing_) e->start_build(e->view_.id);
  }
  LOWCOMM_LOG(kInfo, "elastic member %u: joined view %llu", e->me_,
              static_cast<unsigned long long>(e->view_.id));
  return e;
}

ElasticImpl::~ElasticImpl() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    // A member commits a collective when its own data completes, and another member may not
    // have finished it yet: it leaves only once every member holds what it committed (their
    // dones are in, or a view change settled it), so that its departure cannot leave the others
    // without a member to roll forward from. One one-way delay after the last member finished.
    cv_.wait_until(lk, Clock::now() + change_timeout_, [&] {
      if (!fence_.is_ok() || committed_ == 0 || slots_.empty()) return true;
      if (changing_) return false;
      for (uint32_t id : view_.members)
        if (!settled_.count(id)) return false;
      return true;
    });
    if (fence_.is_ok() && !slots_.empty()) {
      Message bye = message(MsgType::kLeave, committed_);  // what it committed, with hashes
      bye.hashes = commit_hashes_;
      broadcast(bye);
      for (auto& [id, s] : slots_)
        (void)s.peer->flush().wait(Deadline::after(std::chrono::seconds(1)));
    }
    fence_ = Status(StatusCode::kFenced, "this member left the group");
  }
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  std::shared_ptr<Communicator> data;
  {
    std::lock_guard<std::mutex> lk(mu_);
    data = std::move(data_);
    discard_build(build_);  // a communicator built and never used is aborted, not waited on
    discard_build(ahead_);
    for (auto& [id, s] : slots_) s.peer->abort();
    for (auto& [id, s] : joiner_slots_) s.peer->abort();
  }
  if (data) data->abort();
  std::unique_lock<std::mutex> g(aborts_->mu);
  aborts_->cv.wait_for(g, std::chrono::seconds(5), [&] { return aborts_->running == 0; });
}

}  // namespace lowcomm
