#pragma once
// ElasticImpl: the state behind ElasticCommunicator (docs/membership.md).
//
// Threads: the caller's thread runs collectives on the view's Communicator and waits for their
// commit; the membership thread ("lc-member") polls the membership connections every 0.5 ms:
// heartbeats and their timeouts, accepting members and joiners, and every message of the view
// protocol (it never blocks on the network; it may abort the view's Communicator). The
// transport's engine thread ("lc-eng-m<id>") moves the membership connections' bytes.
//
// Locking: mu_ guards everything below it; cv_ wakes the caller's thread when the view, the
// commit counter or the fence changes.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lowcomm/elastic.h"
#include "membership/message.h"
#include "membership/state_buffer.h"
#include "transport/failure_detector.h"
#include "transport/listener.h"
#include "transport/peer.h"

namespace lowcomm {

class ElasticImpl {
 public:
  using Clock = std::chrono::steady_clock;
  static Result<std::unique_ptr<ElasticImpl>> found(const UniqueId& id, int rank, int nranks,
                                                    const ElasticOptions& options);
  static Result<std::unique_ptr<ElasticImpl>> join(const UniqueId& id,
                                                   const std::vector<std::string>& seeds,
                                                   const ElasticOptions& options);
  ~ElasticImpl();

  uint32_t member_id() const { return me_; }
  std::string member_address() const { return listener_->address().to_string(); }
  ElasticView view() const;
  int rank() const;
  ElasticStats stats() const;
  Status status() const;
  ElasticState state() const;
  Status all_reduce(const void* send, void* recv, uint64_t count, DType dtype, ReduceOp op,
                    const AllReduceOptions& options);
  Status broadcast(const void* send, void* recv, uint64_t count, DType dtype, uint32_t root);
  Status all_gather(const void* send, void* recv, uint64_t send_count, DType dtype,
                    ElasticView* layout);
  Status register_state(const std::string& name, void* data, uint64_t bytes);
  Result<std::vector<uint8_t>> error_feedback_state() const {  // caller's thread
    if (!ef_lost_.is_ok()) return ef_lost_;
    return ef_carry_;
  }

 private:
  struct Slot {  // one membership connection
    std::vector<uint8_t> rx;
    transport::Request rx_req;
    transport::FailureDetector fd;
    Clock::time_point last_ping{};
    // Declared last, so destroyed first: ~Peer shuts the connection down (on its engine thread,
    // synchronously), which ends the receive posted into `rx` before `rx` is freed. In the
    // other order a slot erased without an abort() first (join() replacing the seed's
    // connection) freed `rx` while the engine could still be writing a message into it.
    std::unique_ptr<transport::Peer> peer;
    Slot(std::unique_ptr<transport::Peer> p, const ElasticOptions& o, std::chrono::milliseconds f)
        : fd(f, o.heartbeat_interval), peer(std::move(p)) {}
  };
  struct Outgoing {
    std::shared_ptr<const void> bytes;  // what the send reads, kept until it completes
    transport::Request req;
  };
  struct Attempt;     // one try of a collective (elastic_impl.cc)
  struct Op;          // what one kind of collective does in an attempt (elastic_impl.cc)
  struct Build;       // a view's communicator being built (elastic_impl.cc)
  struct Ahead;       // a snapshot buffer being allocated (state_transfer.cc)
  struct BuildSlot {  // a view's communicator being built, the view and its root
    std::shared_ptr<Build> build;
    uint64_t view = ~0ull;
    std::string root;
    uint32_t self = 0;        // this member's id in that view
    uint64_t plan = 0;        // built ahead: the nonce of the kAdmit that named the view
    bool ready_sent = false;  // built ahead: its kReady went out (or it failed: none will)
    bool is(uint64_t v, const std::string& r) const { return build && view == v && root == r; }
  };
  // One attempt under way, shared by run_collective's phases (elastic_collectives.cc); one
  // fetch under way, shared by fetch's steps (state_transfer.cc); a collective's result (below).
  struct Running;
  struct Fetching;
  struct ResultBuffer;

  ElasticImpl() = default;
  Status start(const UniqueId& id);  // engine, listener; not the thread
  // The membership connections' settings (found and join alike).
  Result<transport::PeerConfig> membership_config(const UniqueId& id, int rank) const;
  void loop();
  // --- membership thread, mu_ held ---
  void poll_slot(uint32_t id, Slot& s, Clock::time_point now);
  void accept_pending();
  void handle(const membership::Message& m, uint32_t via);
  // handle()'s longer cases (view_protocol.cc).
  void on_done(const membership::Message& m);
  void on_commit(const membership::Message& m, uint32_t via);
  void on_start(const membership::Message& m);
  void lose(uint32_t id, const std::string& why);
  void begin_change(const std::string& why);
  void report_to_coordinator();
  void try_decide();
  void commit_locally(uint64_t seq);
  // Commits collective committed_+1 if this member holds it and has every member's done (its
  // own, theirs, or a leaver's or no-quorum proof), even during a change.
  void commit_on_proof(bool report = true);
  void try_commit();  // commits collective committed_+1 once every member's done is in
  void forward_join(const std::string& address);  // to the coordinator, or pending if this is it
  // Coordinator: names the view it will admit the pending joiners into (kAdmit), so that
  // members and joiners build its communicator before the admitting collective.
  void plan_admission();
  bool admission_ready() const;  // coordinator: every member of admit_plan_ built its view
  void report_ready();           // a kReady once the view built ahead is built here
  void on_ready(const membership::Message& m);  // coordinator: a member or joiner is ready
  std::chrono::milliseconds build_timeout() const;
  // A kAdmit, or an admitting kStart: build the view it names (and, a member, allocate the
  // snapshot the joiners will fetch), and relay it to the joiners connected here.
  void prepare_admission(const membership::Message& m);
  // A change or report from the view this member just left: the message that ended it, again.
  void answer_stale(const membership::Message& m);
  // A member's membership connection came up during a view change (a joiner's dial, or its
  // accept here): what it missed while there was none, this member's kChange and, if it
  // decides, this member's report, goes now.
  void caught_up(uint32_t id);
  // `hashes`: the members' state hashes of collective `committed` as far as the decider knows
  // them (merged with the dones this member saw), for the replica check and a joiner's install.
  void apply_view(uint64_t view, const std::vector<membership::MemberAddress>& members,
                  const std::string& data_root, uint64_t committed, uint32_t next_id,
                  const std::vector<uint32_t>& fresh,
                  const std::vector<std::pair<uint32_t, uint64_t>>& hashes = {},
                  const std::vector<uint32_t>& holders = {});
  bool apply_committed(uint64_t view, uint64_t committed,
                       const std::vector<std::pair<uint32_t, uint64_t>>& hashes,
                       const std::vector<uint32_t>& holders);  // apply_view's first step
  void fence(Status why);
  transport::Request send_to(uint32_t to, const membership::Message& m);
  void broadcast(const membership::Message& m);
  void serve_fetches();
  void announce_start(uint64_t view, uint64_t seq, uint64_t hash);  // kStart to every member
  uint32_t coordinator_candidate() const;
  membership::Message message(membership::MsgType t, uint64_t seq = 0) const;
  // The coordinator opens view's root socket (its members: `members`, in rank order).
  Result<std::string> open_data_root(uint64_t view, const std::vector<uint32_t>& members);
  // --- caller's thread ---
  Status ensure_data_comm(std::unique_lock<std::mutex>& lk);
  // mu_ held: begins building the current view's communicator, or view `view` of `members`
  // (rank order) through `root` as member `self` (ahead of its commit: an admission names
  // it), unless that build is under way already.
  void start_build(uint64_t view);
  void start_build(uint64_t view, const std::vector<uint32_t>& members, const std::string& root,
                   uint32_t self, bool ahead);
  // mu_ held: drops a build (a communicator it finished is aborted on a thread of its own).
  void discard_build(BuildSlot& slot);
  void discard_build(const std::shared_ptr<Build>& build);
  void abort_async(const std::shared_ptr<Communicator>& c);  // on a thread: it lingers
  Status wait_for_view_after(std::unique_lock<std::mutex>& lk, uint64_t view);
  // Runs `op` in the current view until it commits, fails for good, or runs out of retries:
  // the commit protocol every elastic collective shares.
  Status run_collective(const Op& op);
  // run_collective's phases, in order (elastic_collectives.cc). A Status that is not ok from
  // begin_attempt or roll_forward ends the call with it; deliver's is the call's.
  Status begin_attempt(Running& r);  // the current view, its communicator built
  std::shared_ptr<ResultBuffer> result_slot(uint64_t seq, uint64_t bytes);
  void start_state_work(Running& r);   // the state's hash (and snapshot), this member's start
  void start_state_fetch(Running& r);  // a fresh member: the registered state, on a thread
  Status run_data(const Op& op, Running& r);  // the data collective, into r.res
  // mu_ held (lk): the rest of the attempt, on the caller's thread.
  void stage_result(const Op& op, Running& r, Status s, std::unique_lock<std::mutex>& lk);
  void await_commit(const Op& op, const Attempt& a, std::unique_lock<std::mutex>& lk);
  Status roll_forward(Running& r, std::unique_lock<std::mutex>& lk);
  Status deliver(const Op& op, Running& r, std::unique_lock<std::mutex>& lk);
  Status check_replicas(const Attempt& a, const std::vector<std::pair<uint32_t, uint64_t>>& hashes);
  uint64_t registered_hash() const { return membership::state_hash(state_); }
  // mu_ held: an admission was announced; allocate the snapshot it will take, on a thread.
  void allocate_snapshot_ahead();
  // The snapshot buffer for `bytes` of state: the one allocated ahead (waiting for it), or a
  // new one. Any thread, mu_ not held.
  Result<std::shared_ptr<membership::StateBuffer>> snapshot_buffer(uint64_t bytes);
  Status carry_error_feedback(const Attempt& a);  // before an attempt that uses error feedback
  void keep_error_feedback(const Attempt& a);     // after its commit
  // Fetches `n` bytes from `sources` in stripes: the registered state of collective a.seq's
  // snapshot (a fresh member), or the result of collective a.seq (`result`: rolling forward).
  Status fetch(const Attempt& a, const std::vector<uint32_t>& sources, bool result, uint8_t* into,
               uint64_t n);
  // fetch's steps (state_transfer.cc). mu_ held: asks for the stripes neither held nor in
  // flight; or first checks that the fetch may go on.
  Status ask_stripes(Fetching& f);
  Status fetch_progress(Fetching& f, Clock::time_point deadline);
  bool collect_stripes(Fetching& f, transport::Request& pending);  // whether all are in
  void end_stripes(Fetching& f);  // mu_ not held: no receive of the fetch left posted
  // The registered state, from `bytes` (its size), checked against the group's hash.
  Status install_state(const uint8_t* bytes, uint64_t expected_hash);
  // The secret of view's communicator: the group's, keyed with the view and its members.
  std::array<uint8_t, UniqueId::kSecretBytes> view_secret(
      uint64_t view, const std::vector<uint32_t>& members) const;

  ElasticOptions options_;
  std::chrono::milliseconds failure_floor_{1500};
  std::chrono::milliseconds change_timeout_{30000};
  // Fault injection for tests (docs/membership.md, "Testing hooks"): the collective whose done
  // this member keeps to itself before it freezes (SIGSTOP); 0: none.
  uint64_t fault_cut_after_done_ = 0;
  // ...and the collective whose finished result this member drops once every other member has
  // committed it (they started the next one), as if its data collective had failed; 0: none.
  uint64_t fault_drop_result_ = 0;
  // ...and whether this member dies (SIGKILL) before its data of an admitting collective.
  bool fault_die_at_admit_ = false;
  // ...and the member that alone gets this coordinator's admission kCommit, after which this
  // member dies (SIGKILL) as soon as that member's start in the next view arrives; -1: none.
  int64_t fault_commit_only_to_ = -1;
  int64_t fault_die_on_start_from_ = -1;
  std::array<uint8_t, UniqueId::kSecretBytes> secret_{};
  uint32_t me_ = 0;
  std::shared_ptr<transport::ProgressEngine> engine_;
  std::unique_ptr<transport::Listener> listener_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  struct Aborts {  // communicators being aborted on threads of their own (abort_async)
    std::mutex mu;
    std::condition_variable cv;
    int running = 0;
  };
  std::shared_ptr<Aborts> aborts_ = std::make_shared<Aborts>();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  ElasticView view_;
  std::map<uint32_t, std::string> addresses_;       // member id -> membership address, this view
  std::map<uint32_t, Slot> slots_;                  // membership connections to members
  std::map<uint32_t, Slot> joiner_slots_;           // not yet admitted joiners, by temporary id
  std::map<uint32_t, std::string> joiner_address_;  // their membership addresses
  std::map<uint32_t, Clock::time_point> awaited_;   // members of the view not connected yet
  std::deque<Outgoing> outbox_;
  std::shared_ptr<Communicator> data_;  // the view's communicator; null until built
  std::string data_root_;               // its root address (the coordinator opened it)
  uint64_t data_view_ = ~0ull;          // the view data_ belongs to
  BuildSlot build_;  // the current view's (begun at its commit, by join(), or when first needed)
  BuildSlot ahead_;  // the view an admission names, built before the commit that applies it
  Status fence_;     // non-ok (kFenced): this member takes no further part
  // The last stall of the membership thread longer than half the failure timeout (0: none).
  std::chrono::milliseconds stalled_for_{0};
  Clock::time_point fenced_at_{};
  bool changing_ = false;
  Clock::time_point change_started_{};
  std::string change_reason_;
  std::set<uint32_t> failed_;                        // members of view_ known failed
  std::map<uint32_t, membership::Message> reports_;  // coordinator: reports in this change
  // The message that moved this member into the current view (an admission's kCommit names
  // view+1 of its `view`; a kNewView its own), sent again to members still in the old one.
  membership::Message last_transition_;
  std::set<uint32_t> answered_stale_;    // members it was sent to, in this view
  uint64_t committed_ = 0;               // collectives committed
  uint64_t staged_ = membership::kNone;  // collective whose result this member holds
  uint64_t staged_bytes_ = 0;            // its size in results_[staged_ % 2]
  // Member -> state hash, from the `done`s of collective committed_+1 in this view: every member
  // sends its done to every member, and each commits on its own once all are in, unless the
  // coordinator's done announced an admission (then its kCommit decides, as for a change).
  std::map<uint32_t, uint64_t> done_;
  bool admission_ = false;  // the coordinator's done of committed_+1 announced an admission
  // This member's own done, still being written: it commits only once its done has left (a
  // member killed right after its commit must not have withheld the done the others need).
  std::vector<transport::Request> own_done_;
  std::vector<std::pair<uint32_t, uint64_t>> commit_hashes_;  // with the last commit
  // (view, collective) -> member -> its state hash, from the kStarts: every member announces
  // each collective as it starts it, with its registered state's hash, so that the replica check
  // has every hash when the collective's data completes here. Kept for later views too (a
  // member that moved on first starts there before this one applies the view).
  std::map<std::pair<uint64_t, uint64_t>, std::map<uint32_t, uint64_t>> starts_;
  std::set<std::pair<uint64_t, uint64_t>> admit_starts_;  // the coordinator's said "admit"
  std::pair<uint64_t, uint64_t> admit_at_{~0ull, ~0ull};  // coordinator: admits at this one
  // Coordinator: the view it will admit the pending joiners into (members with the joiners'
  // ids, its data root), as its kAdmit named it; its admitting kStart and kCommit name it again.
  membership::Message admit_plan_;
  // Coordinator: the members of admit_plan_'s view (joiners included, by their ids there) whose
  // communicator of it is built (kReady). It admits once all are, so the first collective of
  // the new view waits for no connection, or once the first joiner still pending has waited
  // build_timeout() (as if they were: a build that failed fails that collective, and the view
  // changes; joiners arriving faster than a build cannot put the admission off for longer).
  Clock::time_point admit_waiting_since_{};
  std::set<uint32_t> admit_ready_;
  uint64_t plan_nonce_ = 0;  // kAdmit's hash: which plan a kReady is for
  // Every member: the last kAdmit it heard in this view, sent to a joiner that asks (again)
  // through it once it was named (it may have missed the relay, entering through another seed).
  membership::Message plan_heard_;
  // Members whose done of collective committed_ arrived (in this view): a member leaving waits
  // until all are in, so that every member holds what it returned as committed.
  std::set<uint32_t> settled_;
  // Rolling forward: the next view committed collective roll_seq_, which this member did not
  // finish; it fetches the result from roll_from_ (members that hold it) before it commits.
  uint64_t roll_seq_ = membership::kNone;
  std::vector<uint32_t> roll_from_;
  std::vector<std::pair<uint32_t, uint64_t>> roll_hashes_;
  uint32_t next_id_ = 0;                                    // the next joiner's member id
  std::vector<membership::MemberAddress> pending_joiners_;  // coordinator: to admit at a commit
  std::set<uint32_t> fresh_;           // members admitted but not yet holding the registered state
  membership::RegisteredState state_;  // registered, by name
  // Registered state as served to fresh members: taken when a collective starts in a view with
  // fresh members (the state then is what every replica holds until that collective commits).
  std::shared_ptr<membership::StateBuffer> snapshot_;
  std::shared_ptr<Ahead> snapshot_ahead_;      // allocated when an admission is named, taken at it
  uint64_t snapshot_seq_ = membership::kNone;  // the collective it was taken for
  std::deque<std::pair<uint32_t, membership::Message>> fetches_;  // stripes not yet sent
  uint32_t fetch_batch_ = 0;  // a joiner: the last state_tag batch it asked for
  std::map<uint32_t, std::deque<transport::Request>> serving_;  // stripe sends on the link
  static constexpr size_t kServeDepth = 2;
  ElasticStats stats_;
  // Results: collective s is received into results_[s % 2], then copied into the caller's
  // buffer once committed, and kept there until collective s + 1 commits here (then every
  // member of the view holds s), to be served to a member that lacks it (rolling forward).
  // kept_seq_: the committed collective whose result is kept (kept_bytes_ of it).
  // Not value-initialised: a 64 MiB memset on the collective's path (a pass over memory the
  // collective writes anyway) cost every first use of a slot, a retry after a failure included.
  struct ResultBuffer {
    std::unique_ptr<uint8_t[]> bytes;
    uint64_t size = 0;
    uint8_t* data() const { return bytes.get(); }
  };
  std::shared_ptr<ResultBuffer> results_[2];
  // Caller's thread: what a ResultMover's moved parts replaced in recv, until the commit.
  std::unique_ptr<uint8_t[]> backup_;
  uint64_t backup_bytes_ = 0;
  uint64_t kept_seq_ = membership::kNone;
  uint64_t kept_bytes_ = 0;
  // Caller's thread: error-feedback residuals as of the last committed call that used them
  // (Communicator::save_error_feedback's form; empty before the first), the communicator that
  // holds exactly them, and why they were lost if they were.
  std::vector<uint8_t> ef_carry_;
  std::weak_ptr<Communicator> ef_comm_;
  Status ef_lost_;
};

}  // namespace lowcomm
