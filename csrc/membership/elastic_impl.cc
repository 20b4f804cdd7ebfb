// ElasticImpl: accessors, and the membership thread (docs/membership.md): it polls the membership
// connections, answers heartbeats, accepts members and joiners, and runs the view protocol
// (view_protocol.cc) on what arrives.
#include "membership/elastic_impl.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cstring>

#include "core/little_endian.h"
#include "core/log.h"
#include "membership/elastic_util.h"
#include "rendezvous/root_socket.h"

namespace lowcomm {

using membership::MemberAddress;
using membership::Message;
using membership::MsgType;

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

std::array<uint8_t, UniqueId::kSecretBytes> ElasticImpl::view_secret(
    uint64_t view, const std::vector<uint32_t>& members) const {
  // Each view's communicator has its own secret, HMAC-SHA256(group secret, "lowcomm view" ||
  // view || its members): a member fenced out of an older view cannot enter a newer view's
  // mesh, and a build begun ahead for an admission that a failure aborted cannot enter the mesh
  // of the view the change formed instead (the same view id, other members).
  std::vector<uint8_t> msg = {'l', 'o', 'w', 'c', 'o', 'm', 'm', ' ', 'v', 'i', 'e', 'w'};
  msg.resize(20 + 4 * members.size());
  lowcomm::store_le64(msg.data() + 12, view);
  for (size_t i = 0; i < members.size(); ++i)
    lowcomm::store_le32(msg.data() + 20 + 4 * i, members[i]);
  std::array<uint8_t, UniqueId::kSecretBytes> out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()), msg.data(), msg.size(),
       out.data(), &len);
  return out;
}

Result<std::string> ElasticImpl::open_data_root(uint64_t view,
                                                const std::vector<uint32_t>& members) {
  // The coordinator opens the next view's root socket now, so its address is ours when sent.
  std::string host = listener_->address().to_string();
  host = host.substr(0, host.rfind(':'));
  auto id = create_unique_id(host);
  if (!id) return id.status();
  UniqueFd fd = rendezvous::take_root_socket(id->to_string());
  UniqueId keyed = *id;
  keyed.secret = view_secret(view, members);
  rendezvous::register_root_socket(keyed.to_string(), std::move(fd));
  return id->root_address;
}

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
          } else if (m && m->type == MsgType::kReady && fence_.is_ok()) {
            on_ready(*m);  // its communicator of the view it will be admitted into is built
          } else if (m && m->type == MsgType::kJoin && fence_.is_ok()) {
            // Forwarded to the coordinator, which admits it at its next commit; forwarded again
            // to the next coordinator after every view change until it is admitted.
            joiner_address_[id] = m->text;
            forward_join(m->text);
            // Named already (it asked before, through a seed that has gone since): the relay
            // of that plan went to its old seed, so it hears it here, and builds.
            if (plan_heard_.view == view_.id && !plan_heard_.members.empty())
              for (const auto& a : plan_heard_.members)
                if (a.address == m->text) send_to(id, plan_heard_);
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
      report_ready();
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
    if (!(from & 0x80000000u)) caught_up(from);
  }
}

void ElasticImpl::caught_up(uint32_t id) {
  if (!changing_ || !fence_.is_ok() || failed_.count(id)) return;
  Message c = message(MsgType::kChange);
  c.failed.assign(failed_.begin(), failed_.end());
  c.text = change_reason_;
  send_to(id, c);
  if (coordinator_candidate() == id) report_to_coordinator();
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

}  // namespace lowcomm
