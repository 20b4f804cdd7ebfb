#include "net_comms.h"

#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "core/little_endian.h"
#include "plugin_log.h"

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

SendComm::SendComm(std::shared_ptr<NetShared> shared, std::unique_ptr<transport::Peer> peer)
    : DataComm(std::move(shared), std::move(peer)),
      policy_(shared_->options().lossless, shared_->options().compress_auto,
              shared_->options().speed_mbps * 1e6 / 8) {
  framed_ = policy_.framed();
}

std::unique_ptr<SendComm> SendComm::start(std::shared_ptr<NetShared> shared,
                                          std::unique_ptr<transport::Peer> peer) {
  std::unique_ptr<SendComm> c(new SendComm(std::move(shared), std::move(peer)));
  lowcomm::store_le32(c->preamble_.data(), kPreambleMagic);
  lowcomm::store_le16(c->preamble_.data() + 4, kPreambleVersion);
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
  const Deadline deadline = Deadline::after_seconds(kCloseDrainSeconds);
  Status s = peer_->flush().wait(deadline);
  if (!s.is_ok() && s.code() != StatusCode::kAborted)
    NET_INFO(abi::kLogNet, "close send comm to %s: %s", name().c_str(), s.to_string().c_str());
  // Messages sent ahead of their credits: the receiver's credits for them are still coming.
  // Closing with them unread would make the kernel answer with a reset, which can destroy the
  // last messages before the receiver has read them; wait until they are in (or failed).
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      absorb_credits();
      if (!s.is_ok() || unmatched_.empty() || !failure_.is_ok() || deadline.expired()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (framed_ && policy_.wire_bytes() > 0)
    NET_INFO(abi::kLogNet, "send comm to %s: %llu bytes sent as %llu (ratio %.3f)", name().c_str(),
             static_cast<unsigned long long>(policy_.raw_bytes()),
             static_cast<unsigned long long>(policy_.wire_bytes()),
             static_cast<double>(policy_.raw_bytes()) / static_cast<double>(policy_.wire_bytes()));
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
  r->framed = framed_;
  r->posted = false;
  r->wire = data;
  r->wire_bytes = size;
  if (framed_) {
    Status s = encode(*r);
    if (!s.is_ok()) {
      r->in_use = false;
      *request = nullptr;
      return s;
    }
  }
  waiting_.push_back(r);
  *request = r;
  (void)progress(*r);  // a failure is reported by test()
  return Status::ok();
}

Status SendComm::progress(NetRequest& r) {
  absorb_credits();
  if (!r.posted && !failure_.is_ok()) {
    std::erase(waiting_, &r);
    return failure_;
  }
  return Status::ok();
}

void SendComm::absorb_credits() {
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
    } else if (unmatched_.empty() || unmatched_bytes_ + next.wire_bytes <= eager) {
      // Ahead of its credit; the first one always goes, whatever its size, so a message larger
      // than the window is not held back for good.
      unmatched_.push_back(next.wire_bytes);
      unmatched_bytes_ += next.wire_bytes;
    } else {
      break;
    }
    post(next);
    waiting_.pop_front();
  }
}

void SendComm::post(NetRequest& r) {
  r.posted = true;
  r.transfer = peer_->isend(kDataTag, r.wire, r.wire_bytes);
}

Status SendComm::encode(NetRequest& r) {
  const LosslessConfig c = policy_.choose(r.size);
  r.staging.resize(lossless_bound(r.size));
  const auto t0 = std::chrono::steady_clock::now();
  auto k = lossless_encode(c, r.user, r.size, r.staging.data(), r.staging.size());
  if (!k)
    return Status(k.status().code(), "compressing for " + name() + ": " + k.status().message());
  if (c.method != LosslessMethod::kNone)
    policy_.observe(r.size, *k,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  policy_.count(r.size, *k);
  r.wire = r.staging.data();
  r.wire_bytes = *k;
  return Status::ok();
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
  const size_t capacity = std::min<size_t>(size, INT_MAX);
  if (framed_) {
    r->staging.resize(lossless_bound(capacity));
    r->transfer = peer_->irecv_upto(kDataTag, r->staging.data(), r->staging.size());
  } else {
    r->transfer = peer_->irecv_upto(kDataTag, data, capacity);
  }
  // The receive is in place: the sender may send one more message (its completion is of no
  // interest; a failure shows in the receives).
  (void)peer_->isend(kCreditTag, nullptr, 0);
  *request = r;
  return Status::ok();
}

Status RecvComm::finish(NetRequest& r, size_t* bytes) {
  const size_t received = r.transfer.received_bytes();
  if (!r.framed) {
    *bytes = received;
    return Status::ok();
  }
  auto raw = lossless_decode(r.staging.data(), received, r.user, std::min<size_t>(r.size, INT_MAX));
  if (!raw)
    return Status(raw.status().code(), "message from " + name() + ": " + raw.status().message());
  raw_bytes_ += *raw;
  wire_bytes_ += received;
  *bytes = *raw;
  return Status::ok();
}

RecvComm::~RecvComm() {
  if (framed_ && wire_bytes_ > 0)
    NET_INFO(abi::kLogNet, "recv comm from %s: %llu bytes received as %llu", name().c_str(),
             static_cast<unsigned long long>(raw_bytes_),
             static_cast<unsigned long long>(wire_bytes_));
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
  if (lowcomm::load_le32(preamble_.data()) != kPreambleMagic)
    return Status(StatusCode::kCorruptData,
                  "accept from " + peer->name() + ": not a lowcomm NCCL plugin connection");
  if (uint16_t v = lowcomm::load_le16(preamble_.data() + 4); v != kPreambleVersion)
    return Status(StatusCode::kCorruptData,
                  "accept from " + peer->name() + ": plugin protocol version " + std::to_string(v) +
                      ", this side speaks " + std::to_string(kPreambleVersion));
  const bool framed = preamble_[6] != 0;
  return std::make_unique<RecvComm>(shared_, std::move(peer), framed);
}

}  // namespace lowcomm::nccl_net
