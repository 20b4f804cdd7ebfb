#include "transport/peer.h"

#include "core/log.h"
#include "transport/path_model.h"
#include "transport/peer_core.h"

namespace lowcomm::transport {

Result<std::unique_ptr<Peer>> Peer::attach(std::shared_ptr<ProgressEngine> engine,
                                           std::vector<StreamSocket> streams, int remote_rank,
                                           std::string remote_address, const PeerConfig& config) {
  if (!engine) return invalid_argument("Peer::attach: no progress engine");
  if (streams.empty()) return invalid_argument("Peer::attach: no streams");
  std::unique_ptr<Peer> p(new Peer());
  p->buffers_ = granted_socket_buffers(streams[0].fd.get());
  for (const StreamSocket& s : streams) {
    const double rtt = kernel_min_rtt_seconds(s.fd.get());
    if (rtt > 0 && (p->setup_rtt_s_ == 0 || rtt < p->setup_rtt_s_)) p->setup_rtt_s_ = rtt;
  }
  p->streams_ = static_cast<int>(streams.size());
  p->engine_ = std::move(engine);
  p->remote_rank_ = remote_rank;
  p->remote_address_ = remote_address;
  p->core_ = std::make_shared<PeerCore>(*p->engine_, std::move(streams), remote_rank,
                                        std::move(remote_address), config);
  p->name_ = p->core_->name();
  auto core = p->core_;
  p->engine_->post([core] { core->start(); });
  LOWCOMM_LOG(kInfo, "%s: %d streams, socket buffers send %d recv %d bytes (asked %d), wan %s",
              p->name_.c_str(), p->streams_, p->buffers_.send, p->buffers_.recv,
              config.socket_buffer_bytes, config.wan.to_string().c_str());
  return p;
}

Peer::~Peer() {
  if (!core_) return;
  auto core = core_;
  engine_->run_sync(
      [core] { core->shutdown(Status(StatusCode::kAborted, "the peer object was destroyed")); });
}

Request Peer::isend(uint64_t tag, const void* data, uint64_t len) {
  auto state = std::make_shared<RequestState>();
  auto core = core_;
  auto* bytes = static_cast<const uint8_t*>(data);
  engine_->post([core, tag, bytes, len, state] { core->isend(tag, bytes, len, state); });
  return Request(state);
}

Request Peer::irecv(uint64_t tag, void* data, uint64_t len) {
  auto state = std::make_shared<RequestState>();
  auto core = core_;
  auto* bytes = static_cast<uint8_t*>(data);
  engine_->post([core, tag, bytes, len, state] { core->irecv(tag, bytes, len, false, state); });
  return Request(state);
}

Request Peer::irecv_standing(uint64_t tag, void* data, uint64_t len) {
  auto state = std::make_shared<RequestState>();
  auto core = core_;
  auto* bytes = static_cast<uint8_t*>(data);
  engine_->post([core, tag, bytes, len, state] {
    core->irecv(tag, bytes, len, false, state, /*standing=*/true);
  });
  return Request(state);
}

Request Peer::irecv_upto(uint64_t tag, void* data, uint64_t capacity) {
  auto state = std::make_shared<RequestState>();
  auto core = core_;
  auto* bytes = static_cast<uint8_t*>(data);
  engine_->post(
      [core, tag, bytes, capacity, state] { core->irecv(tag, bytes, capacity, true, state); });
  return Request(state);
}

bool Peer::cancel(const Request& recv) {
  if (!recv.state_) return true;
  bool gone = false;
  auto core = core_;
  engine_->run_sync([&] { gone = core->cancel(recv.state_); });
  return gone;
}

Request Peer::flush() {
  auto state = std::make_shared<RequestState>();
  auto core = core_;
  engine_->post([core, state] { core->flush(state); });
  return Request(state);
}

void Peer::watch_arrival(uint64_t tag, std::shared_ptr<ArrivalWatch> w) {
  auto core = core_;
  engine_->post([core, tag, w = std::move(w)]() mutable { core->watch(tag, std::move(w)); });
}

Status Peer::send(uint64_t tag, const void* data, uint64_t len, Deadline deadline) {
  Request r = isend(tag, data, len);
  Status s = r.wait(deadline);
  if (s.code() == StatusCode::kTimeout) {
    abort();
    return Status(StatusCode::kTimeout, "send tag " + std::to_string(tag) + " to " + name_ +
                                            ": deadline passed; the peer was aborted");
  }
  return s;
}

Status Peer::recv(uint64_t tag, void* data, uint64_t len, Deadline deadline) {
  Request r = irecv(tag, data, len);
  Status s = r.wait(deadline);
  if (s.code() == StatusCode::kTimeout) {
    abort();
    return Status(StatusCode::kTimeout, "recv tag " + std::to_string(tag) + " from " + name_ +
                                            ": deadline passed; the peer was aborted");
  }
  return s;
}

int Peer::stripe_streams() const {
  return core_->stripe_streams();
}

void Peer::expect_close() {
  auto core = core_;
  engine_->post([core] { core->expect_close(); });
}

void Peer::set_link(const WanLink& link) {
  auto core = core_;
  engine_->post([core, link] { core->set_link(link); });
}

void Peer::set_metered(bool metered) {
  auto core = core_;
  engine_->post([core, metered] { core->set_metered(metered); });
}

void Peer::abort() {
  auto core = core_;
  engine_->run_sync([core] { core->fail(Status(StatusCode::kAborted, "aborted by the user")); });
}

uint64_t Peer::payload_failures() const {
  return core_ ? core_->payload_failures() : 0;
}

uint64_t Peer::resend_requests() const {
  return core_ ? core_->resend_requests() : 0;
}

uint64_t Peer::resent_chunks() const {
  return core_ ? core_->resent_chunks() : 0;
}

uint64_t Peer::copy_bytes_allocated() const {
  return core_ ? core_->copy_bytes_allocated() : 0;
}

}  // namespace lowcomm::transport
