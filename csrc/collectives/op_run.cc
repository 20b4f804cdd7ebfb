#include "collectives/op_run.h"

#include <algorithm>
#include <chrono>

#include "collectives/tags.h"
#include "core/fnv1a.h"

namespace lowcomm::collectives {
namespace {

// How often a wait looks at the deadline and the peers' health: short enough that a failure
// anywhere reaches every rank well within a second, long enough to cost nothing.
constexpr auto kWaitSlice = std::chrono::milliseconds(20);
constexpr auto kRecvSlice = std::chrono::milliseconds(1);

// FNV-1a 64 of the descriptor less its sequence number, folded so every byte reaches the low
// bits that tags::payload keeps.
uint64_t shape_hash(const OpDescriptor& desc) {
  OpDescriptor d = desc.agreed();
  d.seq = 0;
  auto bytes = d.encode();
  uint64_t h = fnv1a64(bytes.data(), 60);  // not the checksum
  return h ^ (h >> 16) ^ (h >> 32) ^ (h >> 48);
}

}  // namespace

OpRun::OpRun(OpContext& comm, const OpDescriptor& desc, std::vector<int> peers, Deadline deadline)
    : comm_(comm),
      desc_(desc),
      peers_(std::move(peers)),
      deadline_(deadline),
      shape_hash_(shape_hash(desc)) {
  counters_.wire.resize(static_cast<size_t>(comm.size()));
}

OpRun::~OpRun() {
  for (auto& b : scratch_) comm_.scratch_pool().give(std::move(b));
}

uint8_t* OpRun::scratch(uint64_t bytes) {
  scratch_.push_back(comm_.scratch_pool().take(bytes));
  return reinterpret_cast<uint8_t*>(scratch_.back().mem.get());
}

transport::Request OpRun::isend(int peer, uint64_t tag, const void* data, uint64_t len,
                                std::optional<uint64_t> uncompressed_len) {
  counters_.payload_sent += len;
  counters_.uncompressed_sent += uncompressed_len.value_or(len);
  return isend_wire(peer, tag, data, len);
}

// Collective payloads to a rank of this site travel over UCX where the pair agreed on it
// (intra_site.h); everything else over the peer's TCP streams. A UCX message has no chunk
// headers: it counts its length.
transport::Request OpRun::isend_wire(int peer, uint64_t tag, const void* data, uint64_t len) {
  if (comm_.over_ucx(peer) && tags::is_payload(tag)) {
    counters_.wire[static_cast<size_t>(peer)].sent += len;
    counters_.ucx_sent += len;
    issued_.push_back(comm_.ucx().isend(peer, tags::payload_bits(tag), data, len));
  } else {
    counters_.wire[static_cast<size_t>(peer)].sent += wire_bytes(len, comm_.chunk_bytes());
    issued_.push_back(comm_.peer(peer).isend(tag, data, len));
  }
  issued_peer_.push_back(peer);
  return issued_.back();
}

transport::Request OpRun::irecv(int peer, uint64_t tag, void* data, uint64_t len) {
  if (comm_.over_ucx(peer) && tags::is_payload(tag)) {
    counters_.wire[static_cast<size_t>(peer)].received += len;
    issued_.push_back(comm_.ucx().irecv(peer, tags::payload_bits(tag), data, len));
  } else {
    counters_.wire[static_cast<size_t>(peer)].received += wire_bytes(len, comm_.chunk_bytes());
    issued_.push_back(comm_.peer(peer).irecv(tag, data, len));
  }
  issued_peer_.push_back(peer);
  return issued_.back();
}

Status OpRun::wait(const transport::Request& r) {
  Status s;
  {
    ScopedTimer t(counters_.wait);
    s = wait_one(r);
  }
  return s.is_ok() ? s : explain(std::move(s));
}

Status OpRun::explain(Status failure) {
  if (!desc_pending_) return failure;
  for (auto& [p, r] : desc_recvs_) {
    if (!r.test() || !r.status().is_ok()) continue;
    Status s = check_descriptor(p, desc_in_ + kDescriptorBytes * static_cast<uint64_t>(p), desc_);
    if (!s) return s;
  }
  return failure;
}

Status OpRun::wait_one(const transport::Request& r) {
  // A receive looks for sends queued behind it every millisecond (OpContext::run_overtaking_sends).
  const bool receive = desc_.kind == OpKind::kRecv;
  while (true) {
    if (receive) comm_.run_overtaking_sends();
    auto now = Deadline::Clock::now();
    auto slice = std::min<Deadline::Clock::duration>(receive ? kRecvSlice : kWaitSlice,
                                                     deadline_.remaining(now));
    (void)r.wait(Deadline::after(slice, now));
    if (r.test()) {
      Status s = r.status();
      if (s.is_ok()) return s;
      // A broken connection is often the echo of a peer's failure: prefer its own account.
      Status why = comm_.check_health(peers_);
      return why.is_ok() || why.code() == StatusCode::kAborted ? s : why;
    }
    LOWCOMM_CHECK(comm_.check_health(peers_));
    if (deadline_.expired()) return deadline_error(r);
  }
}

Result<int> OpRun::wait_arrival(uint64_t tag) {
  auto watch = std::make_shared<transport::ArrivalWatch>();
  for (int p : peers_) comm_.peer(p).watch_arrival(tag, watch);
  LOWCOMM_CHECK(wait(watch->request()));
  return watch->first();
}

Status OpRun::deadline_error(const transport::Request& r) const {
  const double t = std::chrono::duration<double>(comm_.timeout()).count();
  std::string head = "deadline passed (timeout " + std::to_string(t) + " s): ";
  auto names = [](const std::vector<int>& ranks) {
    std::string list;
    for (int p : ranks) list += (list.empty() ? "rank " : ", rank ") + std::to_string(p);
    return list;
  };
  // A peer whose descriptor never came has not called this operation (or is stuck before it);
  // the others have, and are waiting like us.
  std::vector<int> absent;
  for (const auto& [p, req] : desc_recvs_)
    if (!req.test()) absent.push_back(p);
  if (!absent.empty()) {
    return Status(StatusCode::kTimeout,
                  head + names(absent) + (absent.size() == 1 ? " has" : " have") +
                      " not started this operation (no descriptor arrived); the other ranks did");
  }
  std::vector<int> on;
  for (size_t i = 0; i < issued_.size(); ++i)
    if (issued_[i] == r) on.push_back(issued_peer_[i]);
  // The one request waited on that this run did not issue is an any-source arrival watch.
  return Status(StatusCode::kTimeout,
                head + (on.empty() ? std::string("no rank sent a message on this tag")
                                   : "waiting for data from " + names(on)));
}

Status OpRun::wait_all() {
  if (desc_pending_) LOWCOMM_CHECK(check_descriptors());
  for (const auto& r : issued_) LOWCOMM_CHECK(wait(r));
  tally_resends();
  issued_.clear();
  issued_peer_.clear();
  tallied_ = 0;
  return Status::ok();
}

void OpRun::tally_resends() {
  for (; tallied_ < issued_.size(); ++tallied_)
    counters_.wire[static_cast<size_t>(issued_peer_[tallied_])].resent +=
        issued_[tallied_].resent_chunks();
}

Status OpRun::check_descriptor(int peer, const uint8_t* bytes, const OpDescriptor& expected) {
  auto theirs = OpDescriptor::decode(bytes, comm_.peer(peer).name());
  if (!theirs) return theirs.status();
  if (same_operation(*theirs, expected)) return Status::ok();
  return invalid_argument("mismatched operations: this rank (" + std::to_string(rank()) +
                          ") called " + expected.to_string() + " but rank " + std::to_string(peer) +
                          " called " + theirs->to_string());
}

Status OpRun::post_descriptors() {
  if (desc_pending_ || desc_checked_) return internal_error("descriptors posted twice");
  auto mine = desc_.encode();
  uint8_t* out = scratch(kDescriptorBytes);
  std::copy(mine.begin(), mine.end(), out);
  desc_in_ = scratch(kDescriptorBytes * static_cast<uint64_t>(size()));
  for (int p : peers_) {
    isend_wire(p, tags::kDescriptor, out, kDescriptorBytes);
    desc_recvs_.emplace_back(
        p, irecv(p, tags::kDescriptor, desc_in_ + kDescriptorBytes * static_cast<uint64_t>(p),
                 kDescriptorBytes));
  }
  desc_pending_ = true;
  return Status::ok();
}

Status OpRun::check_descriptors() {
  if (desc_checked_) return desc_result_;
  if (!desc_pending_) return internal_error("descriptors checked before they were posted");
  desc_result_ = [&]() -> Status {
    for (auto& [p, r] : desc_recvs_) {
      LOWCOMM_CHECK(wait(r));  // explain()s a failure by the descriptors already here
      LOWCOMM_CHECK(
          check_descriptor(p, desc_in_ + kDescriptorBytes * static_cast<uint64_t>(p), desc_));
    }
    return Status::ok();
  }();
  desc_pending_ = false;
  desc_checked_ = true;
  return desc_result_;
}

std::vector<Range> OpRun::share_chunks(uint64_t n, uint64_t g) const {
  const SharePlan& plan = comm_.share_plan();
  if (desc_.carries_report() && desc_.algorithm == Algorithm::kDefault && desc_.agree_hash != 0 &&
      desc_.agree_hash == plan.hash())
    return plan.chunks(n, size(), g);
  return owner_chunks(n, size(), g);
}

std::vector<uint32_t> OpRun::reports() const {
  std::vector<uint32_t> codes(static_cast<size_t>(size()), 0);
  if (!desc_checked_ || !desc_result_.is_ok()) return codes;
  for (const auto& [p, r] : desc_recvs_) {
    auto d = OpDescriptor::decode(desc_in_ + kDescriptorBytes * static_cast<uint64_t>(p), "");
    if (d) codes[static_cast<size_t>(p)] = d->report;
  }
  return codes;
}

Status OpRun::exchange_descriptors() {
  LOWCOMM_CHECK(post_descriptors());
  return check_descriptors();
}

uint64_t OpRun::payload_tag(uint64_t channel) const {
  return tags::payload(channel, shape_hash_);
}

Status OpRun::send_descriptor(int peer, uint64_t tag) {
  auto mine = desc_.encode();
  uint8_t* out = scratch(kDescriptorBytes);
  std::copy(mine.begin(), mine.end(), out);
  isend_wire(peer, tag, out, kDescriptorBytes);
  return Status::ok();
}

}  // namespace lowcomm::collectives
