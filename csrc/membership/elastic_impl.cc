#include "membership/elastic_impl.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "collectives/root_socket.h"
#include "core/log.h"
#include "transport/connector.h"
#include "transport/little_endian.h"
#include "transport/pacer.h"

namespace lowcomm {

using membership::MemberAddress;
using membership::Message;
using membership::MsgType;

namespace {

std::string id_list(const std::vector<uint32_t>& ids) {
  std::string s = "{";
  for (uint32_t id : ids) s += (s.size() > 1 ? "," : "") + std::to_string(id);
  return s + "}";
}
std::string id_list(const std::set<uint32_t>& ids) {
  return id_list(std::vector<uint32_t>(ids.begin(), ids.end()));
}

std::chrono::milliseconds env_ms(const char* name, std::chrono::milliseconds fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (*end != '\0' || x <= 0) return fallback;
  return std::chrono::milliseconds(x);
}

// The local address this host uses to reach `remote` (a UDP connect sends nothing).
Result<transport::SocketAddress> route_to(const std::string& remote) {
  auto r = transport::SocketAddress::parse(remote);
  if (!r) return r.status();
  int fd = ::socket(r->family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status(StatusCode::kSystem, "socket: route lookup");
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  bool ok = ::connect(fd, r->sockaddr_ptr(), r->length()) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  ::close(fd);
  if (!ok) return Status(StatusCode::kSystem, "route lookup to " + remote + " failed");
  auto a = transport::SocketAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&local), len);
  if (a) a.value().set_port(0);
  return a;
}

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

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Set-up

Status ElasticImpl::start(const UniqueId& id) {
  options_.comm.timeout =
      options_.comm.timeout.count() ? options_.comm.timeout : std::chrono::minutes(30);
  failure_floor_ = options_.failure_timeout.count()
                       ? options_.failure_timeout
                       : env_ms("LOWCOMM_FAILURE_TIMEOUT_MS", std::chrono::milliseconds(1500));
  change_timeout_ = options_.view_change_timeout.count() ? options_.view_change_timeout
                                                         : std::chrono::milliseconds(30000);
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
  if (options_.comm.encrypt >= 0) cfg.value().seal = options_.comm.encrypt > 0;
  // One stream; the socket buffers (the window) of a data stream, since a joiner's state
  // stripes come over these connections (1 MiB windows held a 50 ms path to 168 Mbit/s each).
  // Emulated site links (LOWCOMM_WAN): one uplink and downlink shared by all of this member's
  // membership connections, as by its data connections (not with them: a separate site).
  cfg.value().streams = 1;
  if (cfg.value().wan.shaped() && cfg.value().wan.model == transport::WanModel::kSite) {
    cfg.value().site = std::make_shared<transport::SiteLinks>();
    cfg.value().site->down.bits_per_second = cfg.value().wan.down_bits_per_second;
  }
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
  auto bind = options.listen_address.empty()
                  ? route_to(id.root_address)
                  : transport::SocketAddress::parse(options.listen_address);
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
  Deadline deadline = Deadline::after(e->options_.comm.timeout);
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
  auto bind = options.listen_address.empty()
                  ? route_to(seeds.front())
                  : transport::SocketAddress::parse(options.listen_address);
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
  cfg.value().local_rank = static_cast<int>(e->me_);
  auto members = e->addresses_;
  lk.unlock();
  Deadline deadline = Deadline::after(e->change_timeout_);
  for (const auto& [id2, a] : members) {
    // As among the founders, the higher id connects to the lower: joiners admitted by the same
    // commit (ids above this one's) connect here. Before, both of a pair dialled each other and
    // each side's accept replaced (and closed) its own dialled connection, which the other read
    // as the member failing: a view change, one of them evicted.
    if (id2 >= e->me_) continue;
    auto addr = transport::SocketAddress::parse(a);
    if (!addr) return addr.status();
    auto peer = transport::connect_peer(e->engine_, *addr, *cfg, deadline);
    if (!peer) return peer.status();
    std::lock_guard<std::mutex> g(e->mu_);
    e->slots_.erase(id2);
    e->slots_.try_emplace(id2, std::move(peer).value(), e->options_, e->failure_floor_);
    e->awaited_.erase(id2);
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
    std::lock_guard<std::mutex> lk(mu_);
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
    for (auto& [id, s] : slots_) s.peer->abort();
    for (auto& [id, s] : joiner_slots_) s.peer->abort();
  }
  if (data) data->abort();
  std::unique_lock<std::mutex> g(aborts_->mu);
  aborts_->cv.wait_for(g, std::chrono::seconds(5), [&] { return aborts_->running == 0; });
}

// ---------------------------------------------------------------------------------------------
// Accessors

ElasticView ElasticImpl::view() const {
  std::lock_guard<std::mutex> lk(mu_);
  ElasticView v = view_;
  v.current = fence_.is_ok() && !changing_;
  return v;
}
int ElasticImpl::rank() const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = std::find(view_.members.begin(), view_.members.end(), me_);
  return it == view_.members.end() ? -1 : static_cast<int>(it - view_.members.begin());
}
ElasticStats ElasticImpl::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}
Status ElasticImpl::status() const {
  std::lock_guard<std::mutex> lk(mu_);
  return fence_;
}

ElasticState ElasticImpl::state() const {
  std::lock_guard<std::mutex> lk(mu_);
  return !fence_.is_ok() ? ElasticState::kFenced
         : changing_     ? ElasticState::kChanging
                         : ElasticState::kLive;
}

Message ElasticImpl::message(MsgType t, uint64_t seq) const {
  Message m;
  m.type = t;
  m.from = me_;
  m.view = view_.id;
  m.seq = seq;
  return m;
}

std::array<uint8_t, UniqueId::kSecretBytes> ElasticImpl::view_secret(uint64_t view) const {
  // Each view's communicator has its own secret, HMAC-SHA256(group secret, "lowcomm view" ||
  // view): a member fenced out of an older view cannot enter a newer view's mesh.
  uint8_t msg[20] = {'l', 'o', 'w', 'c', 'o', 'm', 'm', ' ', 'v', 'i', 'e', 'w'};
  transport::store_le64(msg + 12, view);
  std::array<uint8_t, UniqueId::kSecretBytes> out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()), msg, sizeof(msg), out.data(),
       &len);
  return out;
}

Result<std::string> ElasticImpl::open_data_root(uint64_t view) {
  // The coordinator opens the next view's root socket now, so its address is ours when sent.
  std::string host = listener_->address().to_string();
  host = host.substr(0, host.rfind(':'));
  auto id = create_unique_id(host);
  if (!id) return id.status();
  UniqueFd fd = collectives::take_root_socket(id->to_string());
  UniqueId keyed = *id;
  keyed.secret = view_secret(view);
  collectives::register_root_socket(keyed.to_string(), std::move(fd));
  return id->root_address;
}

// ---------------------------------------------------------------------------------------------
// The membership thread

void ElasticImpl::loop() {
  auto last_pass = Clock::now();
  while (!stop_) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto now = Clock::now();
      if (now - last_pass > failure_floor_ / 2) {
        // This thread did not run for a while (the process was stopped, suspended or starved):
        // the silence it would now read into the others' heartbeats is its own. Hear from them
        // afresh (what they sent meanwhile, an eviction say, is read below), and say so if this
        // member is then fenced.
        stalled_for_ = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_pass);
        LOWCOMM_LOG(kWarn, "elastic member %u: stalled for %lld ms (frozen or starved)", me_,
                    static_cast<long long>(stalled_for_.count()));
        for (auto& [id, sl] : slots_) sl.fd.heard(now);
      }
      last_pass = now;
      accept_pending();
      std::vector<uint32_t> ids;
      for (auto& [id, s] : slots_) ids.push_back(id);
      for (uint32_t id : ids) {
        auto it = slots_.find(id);
        if (it != slots_.end()) poll_slot(id, it->second, now);
      }
      ids.clear();
      for (auto& [id, s] : joiner_slots_) ids.push_back(id);
      for (uint32_t id : ids) {
        auto it = joiner_slots_.find(id);
        if (it == joiner_slots_.end()) continue;
        Slot& s = it->second;
        while (s.rx_req.valid() && s.rx_req.test()) {
          if (!s.rx_req.status().is_ok()) {
            s.peer->abort();
            joiner_slots_.erase(it);
            joiner_address_.erase(id);
            break;
          }
          auto m = membership::decode(s.rx.data(), s.rx_req.received_bytes(), s.peer->name());
          if (m && m->type == MsgType::kPing) {
            Message pong = message(MsgType::kPong);
            pong.time_ns = m->time_ns;
            send_to(id, pong);
          } else if (m && m->type == MsgType::kJoin && fence_.is_ok()) {
            // Forwarded to the coordinator, which admits it at its next commit; forwarded again
            // to the next coordinator after every view change until it is admitted.
            joiner_address_[id] = m->text;
            forward_join(m->text);
          }
          s.rx_req = s.peer->irecv_upto(membership::kTag, s.rx.data(), s.rx.size());
        }
      }
      for (auto it = awaited_.begin(); it != awaited_.end();) {
        if (now - it->second > failure_floor_ * 2) {
          uint32_t id = it->first;
          it = awaited_.erase(it);
          lose(id, "member " + std::to_string(id) + " never connected to this member");
        } else {
          ++it;
        }
      }
      // Every done may be in while this member's own is still being written.
      if (!changing_ && fence_.is_ok() && staged_ == committed_ + 1 && !own_done_.empty())
        try_commit();
      if (changing_ && fence_.is_ok() && now - change_started_ > change_timeout_) {
        std::set<uint32_t> missing;
        for (uint32_t id : view_.members)
          if (!failed_.count(id) && !reports_.count(id)) missing.insert(id);
        fence(Status(StatusCode::kTimeout,
                     "view change from view " + std::to_string(view_.id) + " did not finish in " +
                         std::to_string(change_timeout_.count()) + " ms (" + change_reason_ +
                         "); no report from " + id_list(missing)));
      }
      // A fenced member takes no further part: once its last messages had time to leave, its
      // connections close, so the others see it gone at once instead of by heartbeat timeout.
      if (!fence_.is_ok() && !(slots_.empty() && joiner_slots_.empty()) &&
          now - fenced_at_ > std::chrono::milliseconds(200)) {
        for (auto& [id, sl] : slots_) sl.peer->abort();
        for (auto& [id, sl] : joiner_slots_) sl.peer->abort();  // they try another seed
        slots_.clear();
        joiner_slots_.clear();
        joiner_address_.clear();
      }
      serve_fetches();
      while (!outbox_.empty() && outbox_.front().req.test()) outbox_.pop_front();
      if (outbox_.size() > 4096) {
        std::erase_if(outbox_, [](const Outgoing& o) { return o.req.test(); });
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

void ElasticImpl::accept_pending() {
  for (;;) {
    auto peer = listener_->test_accept();
    if (!peer || !*peer) return;
    uint32_t from = static_cast<uint32_t>((*peer)->remote_rank());
    auto& map = (from & 0x80000000u) ? joiner_slots_ : slots_;
    if (!(from & 0x80000000u) && addresses_.count(from) == 0 && from < next_id_) {
      LOWCOMM_LOG(kWarn,
                  "elastic member %u: refusing a membership connection from member %u, "
                  "not in view %llu",
                  me_, from, static_cast<unsigned long long>(view_.id));
      (*peer)->abort();
      continue;
    }
    if (auto old = map.find(from); old != map.end()) {
      old->second.peer->abort();
      map.erase(old);
    }
    auto [it, _] = map.try_emplace(from, std::move(peer).value(), options_, failure_floor_);
    it->second.rx.resize(membership::kMaxMessageBytes);
    it->second.rx_req =
        it->second.peer->irecv_upto(membership::kTag, it->second.rx.data(), it->second.rx.size());
    it->second.fd.heard(Clock::now());
    awaited_.erase(from);
  }
}

void ElasticImpl::poll_slot(uint32_t id, Slot& s, Clock::time_point now) {
  if (!s.rx_req.valid()) {
    s.rx.resize(membership::kMaxMessageBytes);
    s.rx_req = s.peer->irecv_upto(membership::kTag, s.rx.data(), s.rx.size());
    s.fd.heard(now);
  }
  while (s.rx_req.test()) {
    Status st = s.rx_req.status();
    if (!st.is_ok()) {
      lose(id,
           "membership connection to member " + std::to_string(id) + " failed: " + st.message());
      return;  // s is gone
    }
    s.fd.heard(Clock::now());
    auto m = membership::decode(s.rx.data(), s.rx_req.received_bytes(), s.peer->name());
    s.rx_req = s.peer->irecv_upto(membership::kTag, s.rx.data(), s.rx.size());
    if (!m) {
      LOWCOMM_LOG(kWarn, "elastic member %u: %s", me_, m.status().message().c_str());
      continue;
    }
    if (m->type == MsgType::kPing) {
      Message pong = message(MsgType::kPong);
      pong.time_ns = m->time_ns;
      send_to(id, pong);
    } else if (m->type == MsgType::kPong) {
      s.fd.rtt_sample(std::chrono::nanoseconds(steady_ns() - static_cast<int64_t>(m->time_ns)));
    } else {
      handle(*m, id);
      if (!slots_.count(id)) return;  // the message removed the slot (a leave)
    }
  }
  if (now - s.last_ping >= options_.heartbeat_interval) {
    Message ping = message(MsgType::kPing);
    ping.time_ns = static_cast<uint64_t>(steady_ns());
    send_to(id, ping);
    s.last_ping = now;
  }
  if (s.fd.expired(now) && addresses_.count(id)) {
    auto ms = [](std::chrono::nanoseconds d) {
      return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
    };
    lose(id, "member " + std::to_string(id) + " silent for " + ms(s.fd.silent_for(now)) +
                 " ms (timeout " + ms(s.fd.timeout()) + " ms, heartbeat srtt " + ms(s.fd.srtt()) +
                 " ms): frozen or cut off");
  }
}

transport::Request ElasticImpl::send_to(uint32_t to, const Message& m) {
  Slot* s = nullptr;
  if (auto it = slots_.find(to); it != slots_.end()) s = &it->second;
  if (auto it = joiner_slots_.find(to); !s && it != joiner_slots_.end()) s = &it->second;
  if (!s) return {};
  auto bytes = std::make_shared<std::vector<uint8_t>>(membership::encode(m));
  transport::Request r = s->peer->isend(membership::kTag, bytes->data(), bytes->size());
  outbox_.push_back({std::move(bytes), r});
  return r;
}

void ElasticImpl::broadcast(const Message& m) {
  for (uint32_t id : view_.members)
    if (id != me_ && !failed_.count(id)) send_to(id, m);
}

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
  // Commit what anyone committed: a member commits only once every member's done is in, so
  // every member of the view holds the result. And roll forward: the next collective commits if
  // every member of the next view holds it (its data collective completed there, so each holds
  // the whole result, the failed members' contributions included): nobody must abort what a
  // member that committed and then died, left or was cut off returned as done.
  uint64_t decision = 0;
  for (auto& [id, r] : reports_) decision = std::max(decision, r.committed);
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
  if (all_of_hold(live)) ++decision;
  auto root = open_data_root(view_.id + 1);
  if (!root) {
    fence(root.status());
    return;
  }
  Message v = message(MsgType::kNewView);
  v.view = view_.id + 1;
  v.committed = decision;
  v.next_id = next_id_;
  v.data_root = *root;
  for (uint32_t id : live) v.members.push_back({id, addresses_[id]});
  for (uint32_t id : fresh_)
    if (std::find(live.begin(), live.end(), id) != live.end()) v.failed.push_back(id);
  // To every reporter: those left out learn at once that they were evicted.
  for (uint32_t id : reporters)
    if (id != me_) send_to(id, v);
  apply_view(v.view, v.members, v.data_root, v.committed, v.next_id, v.failed);
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
  if (!pending_joiners_.empty()) {
    // Admission: the joiners enter the next view at this commit, fresh until they hold the
    // registered state (fetched during their first collective).
    auto root = open_data_root(view_.id + 1);
    if (root) {
      c.data_root = *root;
      for (uint32_t id : view_.members) c.members.push_back({id, addresses_[id]});
      for (auto& j : pending_joiners_) {
        c.members.push_back({next_id_, j.address});
        c.failed.push_back(next_id_++);
      }
      c.next_id = next_id_;
    }
    pending_joiners_.clear();
  }
  broadcast(c);
  for (auto& [tid, s] : joiner_slots_) send_to(tid, c);
  handle(c, me_);
}

void ElasticImpl::commit_locally(uint64_t seq) {
  committed_ = seq;
  staged_ = membership::kNone;
  done_.clear();
  admission_ = false;
  own_done_.clear();
  ++stats_.committed;
  cv_.notify_all();
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

void ElasticImpl::apply_view(uint64_t view, const std::vector<MemberAddress>& members,
                             const std::string& data_root, uint64_t committed, uint32_t next_id,
                             const std::vector<uint32_t>& fresh) {
  if (committed > committed_) {
    if (staged_ == committed) {
      commit_locally(committed);
    } else {
      fence(Status(StatusCode::kAborted, "view " + std::to_string(view) + " committed collective " +
                                             std::to_string(committed) +
                                             ", which this member does not hold; "
                                             "rejoin to fetch the state"));
      return;
    }
  }
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
}

void ElasticImpl::answer_stale(const Message& m) {
  // A member still in the view this one left (it missed the message that ended it: an
  // admission's commit, a new view, lost with a coordinator that died after sending it to
  // some) gets that message again, instead of waiting for reports nobody will send.
  if (m.view + 1 != view_.id || last_transition_.view + (last_transition_.type ==
                                                         MsgType::kCommit ? 1 : 0) != view_.id)
    return;
  if (!slots_.count(m.from) || answered_stale_.count(m.from)) return;
  answered_stale_.insert(m.from);
  send_to(m.from, last_transition_);
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
      apply_view(m.view, m.members, m.data_root, m.committed, m.next_id, m.failed);
      if (view_.id == m.view) {
        last_transition_ = m;
        last_transition_.from = me_;
      }
      return;
    case MsgType::kDone:
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
      return;
    case MsgType::kCommit: {
      if (me_ & 0x80000000u) {
        // A joiner learns its admission from a relayed commit.
        if (m.members.empty()) return;
      } else if (m.view != view_.id ||
                 (changing_ && (m.members.empty() || (staged_ != m.seq && committed_ < m.seq)))) {
        // Changing: this member's report is out and the new view decides what commits. Except
        // an admission's commit naming the next view, for a collective this member holds: the
        // coordinator sent it once every member's done was in, and the others apply it and
        // move on (ignoring this view's reports), so a change begun here just before it came
        // must give way to it, or stall until the change timeout and fence while the group
        // went on. (In the next view this member starts the change again if its cause holds.)
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
        last_transition_ = m;
        last_transition_.from = me_;  // relayed as this member's
      }
      return;
    }
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
    case MsgType::kPing:
    case MsgType::kPong:
      return;
  }
}

void ElasticImpl::serve_fetches() {
  // At most kServeDepth stripes per fresh member not yet gone out on the link: the uplink stays
  // busy, and a member's done (to every member, on the same link) queues behind at most that
  // much state, not behind the whole stripe set.
  // A member's stripes go out in the order it asked for them (its receives match in order): a
  // member found full stays skipped for the rest of this pass, even if a send completes.
  std::set<uint32_t> full;
  for (auto it = fetches_.begin(); it != fetches_.end();) {
    auto& [to, m] = *it;
    if (!snapshot_ || snapshot_seq_ < m.seq || full.count(to)) {
      ++it;  // not taken yet (its collective has not started here), or its member is full
      continue;
    }
    auto slot = slots_.find(to);
    if (snapshot_seq_ != m.seq || slot == slots_.end() || m.hash > snapshot_->size() ||
        m.length > snapshot_->size() - m.hash) {
      it = fetches_.erase(it);  // a stale or malformed request: the fetcher times out or retries
      continue;
    }
    auto& q = serving_[to];
    while (!q.empty() && q.front().test()) q.pop_front();
    if (q.size() >= kServeDepth) {
      full.insert(to);
      ++it;
      continue;
    }
    transport::Request r = slot->second.peer->isend(m.tag, snapshot_->data() + m.hash, m.length);
    stats_.state_served_bytes += m.length;
    outbox_.push_back({snapshot_, r});
    q.push_back(std::move(r));
    it = fetches_.erase(it);
  }
}

// ---------------------------------------------------------------------------------------------
// The caller's thread

Status ElasticImpl::register_state(const std::string& name, void* data, uint64_t bytes) {
  if (name.empty() || (!data && bytes))
    return invalid_argument("register_state: empty name or null data");
  std::lock_guard<std::mutex> lk(mu_);
  state_[name] = {data, bytes};
  return Status::ok();
}

uint64_t ElasticImpl::registered_hash() const {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  for (const auto& [name, d] : state_) {
    uint64_t len = d.second;
    XXH3_64bits_update(st, name.data(), name.size() + 1);
    XXH3_64bits_update(st, &len, sizeof(len));
    XXH3_64bits_update(st, d.first, d.second);
  }
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

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

Status ElasticImpl::install_state(const std::vector<uint8_t>& bytes, uint64_t expected_hash) {
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t off = 0;
  for (auto& [name, d] : state_) {
    std::memcpy(d.first, bytes.data() + off, d.second);
    off += d.second;
  }
  uint64_t h = registered_hash();
  if (h != expected_hash)
    return corrupt_data("fetched state hash " + std::to_string(h) + " != the group's " +
                        std::to_string(expected_hash));
  stats_.state_hash = h;
  return Status::ok();
}

struct ElasticImpl::Attempt {
  uint64_t view = 0;
  uint64_t seq = 0;
  std::shared_ptr<Communicator> comm;
  std::vector<uint32_t> members;  // of the view, ascending: rank = index
  bool fresh_me = false;          // this member is fresh: contributes nothing, fetches the state
  uint64_t contributors = 0;      // members contributing (the view less its fresh members)
  std::vector<uint32_t> sources;
  uint64_t state_bytes = 0;
  bool any_fresh = false;
  std::set<uint32_t> fresh;
  size_t size = 0;
  int number = 0;  // 0 for the first try of the call
};

// One kind of collective, as run_collective drives it: the protocol around it (views, the
// commit, staging, retries, the state of fresh members, the replica check) is the same for all.
struct ElasticImpl::Op {
  std::string name;  // "all_reduce", in messages
  const void* send = nullptr;
  void* recv = nullptr;
  // recv is also an input (in place): the result is staged and moved into recv at the commit,
  // so that an aborted attempt leaves it untouched.
  bool in_place = false;
  // Before the attempt's data collective: refuse the call for good (a non-ok status is returned
  // as it is), or prepare per-attempt state (error feedback). The result's size in recv.
  std::function<Status(const Attempt&)> prepare;
  std::function<uint64_t(const Attempt&)> result_bytes;
  // The attempt's data collective on a.comm, into `out` (recv, or staging when in place).
  std::function<Status(const Attempt&, void* out)> run;
  // After the commit, on recv (an average over fewer contributors than members).
  std::function<void(const Attempt&)> finish;
};

Status ElasticImpl::fetch_state(const Attempt& a, std::vector<uint8_t>& into) {
  // Stripes of 256 KiB dealt round-robin over the sources, all requested at once (each source
  // keeps only a few on its link at a time: serve_fetches). A source that fails before sending
  // its stripes (killed, frozen past the failure timeout: its connection is aborted) has them
  // asked again of the others, which hold the same snapshot. Every receive this call posts into
  // `into` has finished or been cancelled when it returns, whatever happened: a later fetch
  // never meets a stale receive (each batch has a tag of its own), and `into` may go with the
  // attempt.
  constexpr uint64_t kStripe = 256 << 10;
  struct Stripe {
    uint64_t off = 0;
    uint64_t len = 0;
    uint32_t src = 0;
    transport::Request req;  // invalid: not asked yet, or to be asked again
    bool have = false;
  };
  std::vector<Stripe> stripes;
  for (uint64_t off = 0; off < into.size(); off += kStripe) {
    Stripe st;
    st.off = off;
    st.len = std::min<uint64_t>(kStripe, into.size() - off);
    st.src = ~0u;
    stripes.push_back(std::move(st));
  }
  const auto started = Clock::now();
  std::set<uint32_t> live(a.sources.begin(), a.sources.end());
  std::set<uint32_t> used;
  uint64_t reasked = 0;
  // mu_ held. Asks for every stripe neither held nor in flight, dealt over the live sources, one
  // transport tag per source per round.
  auto ask = [&]() -> Status {
    std::erase_if(live, [&](uint32_t id) { return !slots_.count(id) || failed_.count(id); });
    std::vector<Stripe*> todo;
    for (auto& st : stripes)
      if (!st.have && !st.req.valid()) todo.push_back(&st);
    if (todo.empty()) return Status::ok();
    if (live.empty())
      return Status(StatusCode::kAborted,
                    "fetching the registered state: no member holding it is left (asked " +
                        id_list(a.sources) + ")");
    std::map<uint32_t, uint64_t> tags;
    for (uint32_t src : live) tags[src] = membership::state_tag(++fetch_batch_);
    auto next = live.begin();
    for (Stripe* st : todo) {
      if (next == live.end()) next = live.begin();
      const uint32_t src = *next++;
      if (st->src != ~0u) ++reasked;  // its first source failed
      used.insert(src);
      st->src = src;
      st->req = slots_.at(src).peer->irecv(tags[src], into.data() + st->off, st->len);
      Message f = message(MsgType::kFetch, a.seq);
      f.hash = st->off;
      f.length = st->len;
      f.tag = tags[src];
      send_to(src, f);
    }
    return Status::ok();
  };
  // mu_ held. Withdraws every receive still posted; returns those already arriving into `into`
  // (they finish, or fail when their source is declared failed and its connection aborted).
  auto cancel = [&]() {
    std::vector<Stripe*> arriving;
    for (auto& st : stripes) {
      if (!st.req.valid() || st.req.test()) continue;
      auto slot = slots_.find(st.src);
      // No slot: lose() aborted its peer, which finished every request before returning.
      if (slot != slots_.end() && !slot->second.peer->cancel(st.req)) arriving.push_back(&st);
    }
    return arriving;
  };
  Status why;
  {
    std::lock_guard<std::mutex> lk(mu_);
    why = ask();
  }
  const auto deadline = started + change_timeout_;
  while (why.is_ok()) {
    transport::Request pending;
    for (auto& st : stripes) {
      if (st.have || !st.req.valid() || !st.req.test()) {
        if (!st.have && st.req.valid() && !pending.valid()) pending = st.req;
        continue;
      }
      if (st.req.status().is_ok()) {
        st.have = true;
      } else {
        LOWCOMM_LOG(kInfo, "elastic member %u: state stripe at %llu from member %u: %s", me_,
                    static_cast<unsigned long long>(st.off), st.src,
                    st.req.status().message().c_str());
        st.req = transport::Request();  // ask another member
      }
    }
    bool all = std::all_of(stripes.begin(), stripes.end(), [](const Stripe& st) { return st.have; });
    if (all) break;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!fence_.is_ok()) {
        why = fence_;
      } else if (committed_ < a.seq && (view_.id != a.view || changing_)) {
        // The attempt is aborting: its retry fetches afresh.
        why = Status(StatusCode::kAborted, "fetching the registered state: collective " +
                                               std::to_string(a.seq) + " aborted in view " +
                                               std::to_string(a.view));
      } else if (Clock::now() > deadline) {
        why = Status(StatusCode::kTimeout,
                     "fetching the registered state: not complete within " +
                         std::to_string(change_timeout_.count()) + " ms");
      } else {
        why = ask();
      }
    }
    if (why.is_ok() && pending.valid()) (void)pending.wait(Deadline::after(std::chrono::milliseconds(10)));
  }
  {
    std::vector<Stripe*> arriving;
    {
      std::lock_guard<std::mutex> lk(mu_);
      arriving = cancel();
    }
    // A stripe arriving is a source still sending: it ends, or its source is declared failed
    // (the failure detector) and its connection aborted, which finishes the receive. Past the
    // bound (a fenced member no longer watches), the connection is aborted here.
    const auto bound = Clock::now() + change_timeout_ + failure_floor_ * 4;
    for (Stripe* st : arriving) {
      if (st->req.wait(Deadline::at(bound)).code() != StatusCode::kTimeout) continue;
      std::lock_guard<std::mutex> lk(mu_);
      if (auto slot = slots_.find(st->src); slot != slots_.end()) slot->second.peer->abort();
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  stats_.state_stripes_reasked += reasked;
  if (!why.is_ok()) return why;
  stats_.state_fetched_bytes = into.size();
  stats_.state_fetch_time = Clock::now() - started;
  stats_.state_fetch_sources = static_cast<int>(used.size());
  return Status::ok();
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
  ef_lost_ = Status(saved.status().code(),
                    "error feedback: the residuals after collective " + std::to_string(a.seq) +
                        " could not be kept (" + saved.status().message() +
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
      for (uint32_t id : view_.members)
        if (id != me_) own_done_.push_back(send_to(id, d));
      handle(d, me_);
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
