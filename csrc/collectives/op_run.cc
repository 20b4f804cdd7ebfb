#include "collectives/op_run.h"

#include <algorithm>
#include <chrono>

#include "collectives/tags.h"

namespace lowcomm::collectives {
namespace {

// How often a wait looks at the deadline and the peers' health: short enough that a failure
// anywhere reaches every rank well within a second, long enough to cost nothing.
constexpr auto kWaitSlice = std::chrono::milliseconds(20);

}  // namespace

OpRun::~OpRun() {
  for (auto& b : scratch_) comm_.scratch_pool().give(std::move(b));
}

uint8_t* OpRun::scratch(uint64_t bytes) {
  scratch_.push_back(comm_.scratch_pool().take(bytes));
  return reinterpret_cast<uint8_t*>(scratch_.back().mem.get());
}

transport::Request OpRun::isend(int peer, uint64_t tag, const void* data, uint64_t len) {
  issued_.push_back(comm_.peer(peer).isend(tag, data, len));
  return issued_.back();
}

transport::Request OpRun::irecv(int peer, uint64_t tag, void* data, uint64_t len) {
  issued_.push_back(comm_.peer(peer).irecv(tag, data, len));
  return issued_.back();
}

Status OpRun::wait(const transport::Request& r) {
  while (true) {
    auto now = Deadline::Clock::now();
    auto slice = std::min<Deadline::Clock::duration>(kWaitSlice, deadline_.remaining(now));
    (void)r.wait(Deadline::after(slice, now));
    if (r.test()) {
      Status s = r.status();
      if (s.is_ok()) return s;
      // A broken connection is often the echo of a peer's failure: prefer its own account.
      Status why = comm_.check_health(peers_);
      return why.is_ok() || why.code() == StatusCode::kAborted ? s : why;
    }
    LOWCOMM_CHECK(comm_.check_health(peers_));
    if (deadline_.expired()) {
      double s = std::chrono::duration<double>(comm_.timeout()).count();
      return Status(StatusCode::kTimeout,
                    "deadline passed (timeout " + std::to_string(s) + " s) waiting for peers " +
                        [&] {
                          std::string list;
                          for (int p : peers_) list += (list.empty() ? "rank " : ", rank ") + std::to_string(p);
                          return list;
                        }());
    }
  }
}

Status OpRun::wait_all() {
  for (const auto& r : issued_) LOWCOMM_CHECK(wait(r));
  issued_.clear();
  return Status::ok();
}

Status OpRun::check_descriptor(int peer, const uint8_t* bytes, const OpDescriptor& expected) {
  auto theirs = OpDescriptor::decode(bytes, comm_.peer(peer).name());
  if (!theirs) return theirs.status();
  if (same_operation(*theirs, expected)) return Status::ok();
  return invalid_argument("mismatched operations: this rank (" + std::to_string(rank()) +
                          ") called " + expected.to_string() + " but rank " + std::to_string(peer) +
                          " called " + theirs->to_string());
}

Status OpRun::exchange_descriptors() {
  auto mine = desc_.encode();
  uint8_t* out = scratch(kDescriptorBytes);
  std::copy(mine.begin(), mine.end(), out);
  std::vector<std::pair<int, transport::Request>> recvs;
  uint8_t* in = scratch(kDescriptorBytes * static_cast<uint64_t>(size()));
  for (int p : peers_) {
    isend(p, tags::kDescriptor, out, kDescriptorBytes);
    recvs.emplace_back(p, irecv(p, tags::kDescriptor, in + kDescriptorBytes * p, kDescriptorBytes));
  }
  for (auto& [p, r] : recvs) {
    LOWCOMM_CHECK(wait(r));
    LOWCOMM_CHECK(check_descriptor(p, in + kDescriptorBytes * p, desc_));
  }
  return Status::ok();
}

Status OpRun::send_descriptor(int peer, uint64_t tag) {
  auto mine = desc_.encode();
  uint8_t* out = scratch(kDescriptorBytes);
  std::copy(mine.begin(), mine.end(), out);
  isend(peer, tag, out, kDescriptorBytes);
  return Status::ok();
}

Status OpRun::expect_descriptor(int peer, uint64_t tag, const OpDescriptor& expected) {
  uint8_t* in = scratch(kDescriptorBytes);
  LOWCOMM_CHECK(wait(irecv(peer, tag, in, kDescriptorBytes)));
  return check_descriptor(peer, in, expected);
}

}  // namespace lowcomm::collectives
