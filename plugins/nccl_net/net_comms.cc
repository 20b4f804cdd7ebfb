#include "net_comms.h"

#include <climits>
#include <cstring>

#include "plugin_log.h"
#include "transport/little_endian.h"

namespace lowcomm::nccl_net {
namespace {

constexpr uint32_t kPreambleMagic = 0x504e434cu;  // "LCNP"
constexpr uint16_t kPreambleVersion = 1;

// How long closing a send comm waits for its last bytes to leave before it gives up.
constexpr double kCloseDrainSeconds = 30.0;

}  // namespace

// ---- DataComm ----

DataComm::DataComm(std::shared_ptr<NetShared> shared, std::unique_ptr<transport::Peer> peer)
    : shared_(std::move(shared)), peer_(std::move(peer)) {
  for (auto& r : requests_) r.comm = this;
  // Either end closing is how NCCL tears down: the transport logs it at INFO. A failure that
  // hurts a request is reported by test() with a WARN.
  peer_->expect_close();
}

DataComm::~DataComm() {
  // Requests still in flight fail; no buffer of NCCL's is touched after this returns.
  peer_->abort();
}

NetRequest* DataComm::take_request() {
  for (auto& r : requests_) {
    if (!r.in_use) {
      r.in_use = true;
      return &r;
    }
  }
  return nullptr;
}

Status DataComm::test(NetRequest& r, bool* done, size_t* bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!r.in_use) return internal_error("test() on a request that is not in flight");
  Status s = progress(r);
  *done = !s.is_ok() || (r.transfer.valid() && r.transfer.test());
  if (!*done) return Status::ok();
  if (s.is_ok()) s = r.transfer.status();
  if (s.is_ok()) s = finish(r, bytes);
  r.in_use = false;
  r.posted = false;
  r.transfer = {};
  r.user = nullptr;
  return s;
}

// ---- SendComm ----

std::unique_ptr<SendComm> SendComm::start(std::shared_ptr<NetShared> shared,
                                          std::unique_ptr<transport::Peer> peer) {
  std::unique_ptr<SendComm> c(new SendComm(std::move(shared), std::move(peer)));
  transport::store_le32(c->preamble_.data(), kPreambleMagic);
  transport::store_le16(c->preamble_.data() + 4, kPreambleVersion);
  c->preamble_[6] = c->framed_ ? 1 : 0;
  c->preamble_sent_ = c->peer_->isend(kPreambleTag, c->preamble_.data(), c->preamble_.size());
  for (int i = 0; i < kCreditWindow; ++i)
    c->credit_recvs_.push_back(c->peer_->irecv(kCreditTag, nullptr, 0));
  return c;
}

SendComm::~SendComm() {
  // NCCL may close as soon as its last send tested done, which for a shaped link means "left
  // the sender", not "written": let the transport write everything out first, or the peer
  // would lose the tail of the last message.
  Status s = peer_->flush().wait(Deadline::after_seconds(kCloseDrainSeconds));
  if (!s.is_ok() && s.code() != StatusCode::kAborted)
    NET_INFO(abi::kLogNet, "close send comm to %s: %s", name().c_str(), s.to_string().c_str());
}

Status SendComm::isend(void* data, size_t size, NetRequest** request) {
  std::lock_guard<std::mutex> lock(mu_);
  *request = nullptr;
  if (size > static_cast<size_t>(INT_MAX))
    return invalid_argument("isend of " + std::to_string(size) +
                            " bytes: more than test() can report (INT_MAX)");
  if (size > 0 && data == nullptr) return invalid_argument("isend: null buffer");
  NetRequest* r = take_request();
  if (!r) return Status::ok();
  r->user = data;
  r->size = size;
  r->framed = false;
  r->posted = false;
  waiting_.push_back(r);
  *request = r;
  (void)progress(*r);  // a failure is reported by test()
  return Status::ok();
}

Status SendComm::progress(NetRequest& r) {
  while (failure_.is_ok() && !credit_recvs_.empty() && credit_recvs_.front().test()) {
    Status s = credit_recvs_.front().status();
    credit_recvs_.pop_front();
    if (!s.is_ok()) {
      failure_ = Status(s.code(), "waiting for the receiver of " + name() + ": " + s.message());
      break;
    }
    credit_recvs_.push_back(peer_->irecv(kCreditTag, nullptr, 0));
    if (!unmatched_.empty()) {  // the credit of a message already sent eagerly
      unmatched_bytes_ -= unmatched_.front();
      unmatched_.pop_front();
    } else {
      ++credits_;
    }
  }
  const uint64_t eager = shared_->options().eager_bytes;
  while (!waiting_.empty()) {
    NetRequest& next = *waiting_.front();
    if (credits_ > 0) {
      --credits_;
    } else if (unmatched_.empty() || unmatched_bytes_ + next.size <= eager) {
      // Ahead of its credit; the first one always goes, whatever its size, so a message larger
      // than the window is not held back for good.
      unmatched_.push_back(next.size);
      unmatched_bytes_ += next.size;
    } else {
      break;
    }
    post(next);
    waiting_.pop_front();
  }
  if (!r.posted && !failure_.is_ok()) {
    std::erase(waiting_, &r);
    return failure_;
  }
  return Status::ok();
}

void SendComm::post(NetRequest& r) {
  r.posted = true;
  r.transfer = peer_->isend(kDataTag, r.user, r.size);
}

Status SendComm::finish(NetRequest& r, size_t* bytes) {
  *bytes = r.size;
  return Status::ok();
}

// ---- RecvComm ----

Status RecvComm::irecv(void* data, size_t size, NetRequest** request) {
  std::lock_guard<std::mutex> lock(mu_);
  *request = nullptr;
  if (size > 0 && data == nullptr) return invalid_argument("irecv: null buffer");
  NetRequest* r = take_request();
  if (!r) return Status::ok();
  r->user = data;
  r->size = size;
  r->framed = framed_;
  r->transfer = peer_->irecv_upto(kDataTag, data, std::min<size_t>(size, INT_MAX));
  // The receive is in place: the sender may send one more message (its completion is of no
  // interest; a failure shows in the receives).
  (void)peer_->isend(kCreditTag, nullptr, 0);
  *request = r;
  return Status::ok();
}

Status RecvComm::finish(NetRequest& r, size_t* bytes) {
  *bytes = r.transfer.received_bytes();
  return Status::ok();
}

// ---- ListenComm ----

Result<std::unique_ptr<ListenComm>> ListenComm::create(std::shared_ptr<NetShared> shared) {
  auto listener = transport::Listener::create(shared->engine(), shared->options().peer,
                                              shared->options().listen_address);
  if (!listener) return listener.status();
  std::unique_ptr<ListenComm> c(new ListenComm());
  c->shared_ = std::move(shared);
  c->listener_ = std::move(listener).value();
  return c;
}

Result<std::unique_ptr<RecvComm>> ListenComm::accept() {
  if (!pending_) {
    auto peer = listener_->test_accept();
    if (!peer) return peer.status();
    if (!*peer) {
      // Refused connections (a wrong secret, most likely) and nobody else: give up after the
      // handshake timeout instead of letting NCCL wait forever.
      const uint64_t rejected = listener_->rejected_connections();
      if (rejected > rejected_seen_ && refused_deadline_.is_none()) {
        rejected_seen_ = rejected;
        refused_deadline_ = Deadline::after_seconds(shared_->options().peer.handshake_timeout_s);
      }
      if (!refused_deadline_.is_none() && refused_deadline_.expired())
        return Status(StatusCode::kRemoteError,
                      "accept on " + listener_->address().to_string() + ": " +
                          std::to_string(rejected_seen_) +
                          " connection(s) refused (authentication failed or protocol broken: "
                          "is LOWCOMM_SECRET the same on both nodes?) and none accepted");
      return std::unique_ptr<RecvComm>();
    }
    pending_ = std::move(peer).value();
    preamble_recv_ = pending_->irecv(kPreambleTag, preamble_.data(), preamble_.size());
  }
  if (!preamble_recv_.test()) return std::unique_ptr<RecvComm>();
  std::unique_ptr<transport::Peer> peer = std::move(pending_);
  Status s = preamble_recv_.status();
  if (!s.is_ok()) return Status(s.code(), "accept: reading the preamble: " + s.message());
  if (transport::load_le32(preamble_.data()) != kPreambleMagic)
    return Status(StatusCode::kCorruptData,
                  "accept from " + peer->name() + ": not a lowcomm NCCL plugin connection");
  if (uint16_t v = transport::load_le16(preamble_.data() + 4); v != kPreambleVersion)
    return Status(StatusCode::kCorruptData,
                  "accept from " + peer->name() + ": plugin protocol version " + std::to_string(v) +
                      ", this side speaks " + std::to_string(kPreambleVersion));
  const bool framed = preamble_[6] != 0;
  return std::make_unique<RecvComm>(shared_, std::move(peer), framed);
}

}  // namespace lowcomm::nccl_net
