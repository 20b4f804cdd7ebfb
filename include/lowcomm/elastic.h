#pragma once
// ElasticCommunicator: a group whose members may die, freeze, leave and join between
// collectives, with collectives that commit on every survivor or fail with inputs untouched.
//
//   auto ec = ElasticCommunicator::init(id, rank, nranks, opts);   // the founding members
//   Status s = ec->all_reduce(buf, buf, n, DType::kFloat32, ReduceOp::kAverage, {.codec = q4});
//   // s ok: every live member holds the same result. kAborted: a member failed; buf untouched,
//   // the group formed a new view of the survivors; call again (or set ElasticOptions::retries).
//
// The group lives through numbered views (docs/membership.md): the set of live members, each
// with a stable member id; a collective runs inside one view, on a Communicator built for that
// view (rank = position of the member id in the view). The view's coordinator is its lowest
// member id, and the next lowest takes over when it dies: no process is special. A new view
// needs a strict majority of the previous one; a minority fails its calls naming the partition.
// Failures are detected by the membership connections between members: a closed connection at
// once, a frozen member by heartbeats whose timeout adapts to the measured RTT.
//
// Thread safety: one thread calls the collectives (as with Communicator); view(), rank(),
// size(), member_id() and status() may be called from any thread.

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lowcomm/communicator.h"
#include "lowcomm/export.h"
#include "lowcomm/status.h"

namespace lowcomm {

struct ElasticOptions {
  CommOptions comm;  // the options of every view's Communicator
  // The membership listener's address (numeric host, port 0 allowed); "": the address that
  // routes to the founding id's root, or to the first seed of a joiner.
  std::string listen_address;
  std::chrono::milliseconds heartbeat_interval{100};
  // The least time without any message from a member before it is declared failed; the timeout
  // in use is max(this, 2 heartbeat intervals + 4 (srtt + 4 rttvar)) from that member's measured
  // heartbeat round trips. 0: LOWCOMM_FAILURE_TIMEOUT_MS, else 1500 ms.
  std::chrono::milliseconds failure_timeout{0};
  // How often a collective that failed because a member failed is run again, in the next view,
  // by the library itself (owner shares recomputed for the new size). 0: the call returns
  // kAborted and the caller decides.
  int retries = 0;
  // How long a call waits for a new view after a failure before it gives up; 0: 30 s.
  std::chrono::milliseconds view_change_timeout{0};
};

struct ElasticView {
  uint64_t id = 0;                // 0 for the founding view, +1 per change
  std::vector<uint32_t> members;  // member ids, ascending; rank in the view = index
  uint32_t coordinator() const { return members.empty() ? 0 : members.front(); }
  // False while a view change is in progress, and for good once the member is fenced: then this
  // is the last view it knew, and some of its members may be gone.
  bool current = true;
};

// Where a member stands: in its view, between views (a change in progress: calls wait for the
// next view), or out of the group for good (every call returns kFenced at once; rejoin).
enum class ElasticState { kLive, kChanging, kFenced };

struct ElasticStats {
  uint64_t committed = 0;     // collectives committed by this member
  uint64_t view_changes = 0;  // views this member went through after its first
  uint64_t retried = 0;       // collectives the library ran again after a view change
  uint64_t state_hash = 0;    // of the registered state, agreed with the last commit
  std::chrono::nanoseconds last_view_change{0};  // failure noticed -> new view applied
  // How long the caller waited for the current view's communicator (built from the view's
  // start; after an admission from its commit, overlapping the caller's work until then).
  std::chrono::nanoseconds last_view_setup{0};
  // A joiner: the registered state it fetched when admitted, and how long the stripes took from
  // the first request to the last byte, from how many members.
  uint64_t state_fetched_bytes = 0;
  std::chrono::nanoseconds state_fetch_time{0};
  int state_fetch_sources = 0;
  // A joiner: stripes asked again of another member because the one first asked failed (killed,
  // frozen past the failure timeout, cut off) before sending them.
  uint64_t state_stripes_reasked = 0;
  // Registered state this member handed to its links for joiners (stripes it served).
  uint64_t state_served_bytes = 0;
  // Collectives this member did not finish but another member had committed: the next view
  // committed them and this member fetched the result from a member that held it.
  uint64_t rolled_forward = 0;
};

class ElasticImpl;

class LOWCOMM_API ElasticCommunicator {
 public:
  // The founding members: every rank of [0, nranks) calls it with the same id (as
  // Communicator::init); member ids are the ranks.
  static Result<std::unique_ptr<ElasticCommunicator>> init(const UniqueId& id, int rank, int nranks,
                                                           const ElasticOptions& options = {});
  // A new member: enters through any live member listed in `seeds` (their member_address()),
  // authenticated with the group's id (its secret; the root address is not used). Returns once
  // the group has admitted it into a view, at the commit of the group's next collective; its
  // registered state is fetched from the members before its first collective returns.
  static Result<std::unique_ptr<ElasticCommunicator>> join(const UniqueId& id,
                                                           const std::vector<std::string>& seeds,
                                                           const ElasticOptions& options = {});
  // Tells the others this member leaves (they form a view without it at once) and closes.
  ~ElasticCommunicator();
  ElasticCommunicator(const ElasticCommunicator&) = delete;
  ElasticCommunicator& operator=(const ElasticCommunicator&) = delete;

  uint32_t member_id() const;
  std::string member_address() const;  // where joiners can reach this member
  ElasticView view() const;
  int rank() const;  // in the current view
  int size() const;
  ElasticStats stats() const;
  // ok, or why this member can take no further part (evicted, no quorum, left): kFenced.
  Status status() const;
  ElasticState state() const;

  // recv = op over the view's members of send, as Communicator::all_reduce. Blocks until the
  // result is committed on every member of the view (ok), or the view lost a member: then
  // kAborted naming the failure and the new view, send and recv untouched when send == recv
  // (out of place, recv's contents are unspecified), error-feedback state as it was before the
  // call; ElasticOptions::retries runs it again first. kFenced: this member is out of the group
  // for good (evicted, no quorum), on this and every later call, at once: rejoin. kCorruptData:
  // the replicas' registered state differs (the call committed everywhere, but every member
  // returns this with its input untouched).
  Status all_reduce(const void* send, void* recv, uint64_t count, DType dtype, ReduceOp op,
                    const AllReduceOptions& options = {});
  // recv = the send of member `root` (a member id: ranks move between views), on every member.
  // Commits everywhere, or fails with recv untouched on every member but the root (whose recv is
  // its send); a retry runs in the next view only if the root is in it, else kAborted naming it.
  Status broadcast(const void* send, void* recv, uint64_t count, DType dtype, uint32_t root);
  // recv = every member's send_count elements, block i from the i-th member of the view the call
  // committed in (*layout, when given: that view's id and members). recv holds send_count *
  // size() elements as of the call (a retry runs in a smaller view); send and recv must not
  // overlap (a member's block moves when the view changes). Out of place, an aborted call leaves
  // recv unspecified.
  Status all_gather(const void* send, void* recv, uint64_t send_count, DType dtype,
                    ElasticView* layout = nullptr);

  // Named state (parameters, outer optimizer state, the step counter) that every replica holds
  // alike and that changes only between collectives. Each collective checks that the hash
  // (XXH3-64 over the names and bytes, in name order) is equal on every member and fails with
  // kCorruptData naming the members that differ otherwise. A joiner fetches it from several
  // members at once, in stripes, and verifies the hash.
  Status register_state(const std::string& name, void* data, uint64_t bytes);

  // This member's error-feedback residuals as of its last committed all-reduce that used them,
  // in Communicator::save_error_feedback's form (empty before the first). They are the
  // member's, not a view's: carried into every new view's communicator (a joiner starts from
  // zero). Call between collectives (for a checkpoint, say).
  Result<std::vector<uint8_t>> error_feedback_state() const;

 private:
  explicit ElasticCommunicator(std::unique_ptr<ElasticImpl> impl);
  std::unique_ptr<ElasticImpl> impl_;
};

}  // namespace lowcomm
