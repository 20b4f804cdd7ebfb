#pragma once
// OpRun: what an algorithm sees while its operation runs on the executor thread: the peers,
// the operation's descriptor and deadline, scratch memory, and waits that never hang.
//
// Buffers: every buffer a request may touch must outlive the request. Algorithms take scratch
// memory from scratch(), owned by the OpRun, which the executor destroys only after every
// request of the operation has completed (on failure, after the communicator has aborted every
// peer, which completes them all). User buffers are handed back (the Work completes) at the
// same point.
//
// Waits: wait() waits for one request in slices of a few milliseconds; between slices it checks
// the operation's deadline and OpContext::check_health (abort, a peer's failure notice, a
// broken or departed peer this operation needs), so a wait returns within a slice of the first
// of those.
//
// Descriptors: a collective posts its descriptor exchange (post_descriptors), posts its payload
// receives and sends its payload on payload_tag() at once, and calls check_descriptors() before
// it uses any received byte (decodes, forwards, or reports success), so the exchange costs no
// extra one-way delay. A failed wait while the check is pending reports a mismatch among the
// descriptors that did arrive, if there is one, in preference to its own error: the mismatch
// is the cause, the transport error its echo.
//
// Statistics: isend and irecv count the bytes they hand to the transport (per peer, on the
// wire: chunk headers included), wait() the time it blocks; the algorithms time their codec
// calls into counters() (collectives/op_stats.h). The executor summarizes them into the Work's
// OpStats when the operation completes.

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "collectives/descriptor.h"
#include "collectives/op_context.h"
#include "collectives/op_stats.h"
#include "collectives/scratch_pool.h"
#include "core/deadline.h"
#include "topology/partition.h"
#include "transport/request.h"

namespace lowcomm::collectives {

class OpRun {
 public:
  OpRun(OpContext& comm, const OpDescriptor& desc, std::vector<int> peers, Deadline deadline);
  ~OpRun();  // returns the scratch blocks to the communicator's pool
  OpRun(const OpRun&) = delete;
  OpRun& operator=(const OpRun&) = delete;

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  const OpDescriptor& desc() const { return desc_; }
  const std::vector<int>& peers() const { return peers_; }
  CpuOptions cpu() const { return CpuOptions{comm_.options().codec_threads, true}; }
  uint64_t segment_bytes() const { return *comm_.options().segment_bytes; }  // set at init
  ErrorFeedbackStore& ef() { return comm_.ef(); }

  // 8-byte aligned scratch memory living as long as this OpRun; not zeroed (reused across
  // operations through the communicator's ScratchPool).
  uint8_t* scratch(uint64_t bytes);

  // `uncompressed_len`: the payload this message replaces in the uncompressed algorithm
  // (statistics only); unset: len.
  transport::Request isend(int peer, uint64_t tag, const void* data, uint64_t len,
                           std::optional<uint64_t> uncompressed_len = std::nullopt);
  transport::Request irecv(int peer, uint64_t tag, void* data, uint64_t len);
  Status wait(const transport::Request& r);
  // Waits for every request issued so far (the end of a successful operation).
  Status wait_all();

  // Collectives: sends our descriptor to every peer and posts the receives of theirs; no wait.
  Status post_descriptors();
  // Waits for every peer's descriptor and checks it against ours; the first call does the work,
  // later ones return its answer. wait_all() calls it too, so no operation succeeds unchecked.
  Status check_descriptors();
  // Both: the barrier.
  Status exchange_descriptors();
  // The transport tag of this operation's payload on `channel` (tags::payload): operations of
  // another shape never match our receives.
  uint64_t payload_tag(uint64_t channel) const;
  // Point-to-point: the sender's descriptor to `peer`.
  Status send_descriptor(int peer, uint64_t tag);
  // Decodes the descriptor `peer` sent (kDescriptorBytes at `bytes`) and checks it is `expected`.
  Status check_descriptor(int peer, const uint8_t* bytes, const OpDescriptor& expected);

  // The owner chunks of a flat all-reduce of n elements in granules of g: the communicator's
  // share plan where the descriptor names it (shares.h), else equal (owner_chunks).
  std::vector<Range> share_chunks(uint64_t n, uint64_t g) const;
  // After a successful check of an all-reduce's descriptors: the report each rank sent
  // (OpDescriptor::report, op_report.h), by rank; 0 for this rank and for ranks not in it.
  std::vector<uint32_t> reports() const;
  // Any-source receives: the first peer (of peers()) whose next unclaimed message on `tag` has
  // begun to arrive; waits as wait() does (deadline, health), claims nothing.
  Result<int> wait_arrival(uint64_t tag);
  // Point-to-point receives: the per (peer, tag) number the next receive from `peer` expects in
  // the sender's descriptor (receives are numbered in the order they run: the transport's order).
  uint64_t take_recv_seq(int peer, uint64_t tag) { return comm_.take_recv_seq(peer, tag); }
  // The rank a receive took its message from (Work::source).
  void set_source(int peer) { source_ = peer; }
  int source() const { return source_; }

  // What the operation has done so far; the algorithms add their encode and decode times.
  OpCounters& counters() { return counters_; }
  const OpCounters& counters() const { return counters_; }
  // Adds the re-sent chunks of the receives issued since the last tally to the counters (the
  // executor calls it before summarizing; wait_all() before it forgets its requests).
  void tally_resends();

 private:
  // A send counted on the wire only (descriptors are not payload).
  transport::Request isend_wire(int peer, uint64_t tag, const void* data, uint64_t len);
  Status wait_one(const transport::Request& r);
  // A mismatch among the peers' descriptors that have arrived, else `failure`.
  Status explain(Status failure);
  // kTimeout naming the ranks that never started the operation (their descriptors are missing),
  // else the rank `r` waits on.
  Status deadline_error(const transport::Request& r) const;

  OpContext& comm_;
  OpDescriptor desc_;
  std::vector<int> peers_;
  Deadline deadline_;
  std::vector<ScratchPool::Block> scratch_;
  std::vector<transport::Request> issued_;
  std::vector<int> issued_peer_;  // the peer of issued_[i]
  size_t tallied_ = 0;            // issued_[0, tallied_) counted by tally_resends()
  uint64_t shape_hash_ = 0;
  // The descriptor exchange: theirs land at desc_in_ + kDescriptorBytes * peer.
  uint8_t* desc_in_ = nullptr;
  std::vector<std::pair<int, transport::Request>> desc_recvs_;
  bool desc_pending_ = false;  // posted, not yet checked
  bool desc_checked_ = false;
  Status desc_result_;
  OpCounters counters_;
  int source_ = -1;
};

}  // namespace lowcomm::collectives
