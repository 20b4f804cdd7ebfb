#pragma once
// CommImpl: the state behind Communicator: the mesh of peers, the control channel, the
// executor thread that runs operations in call order, and the failure latch.
//
// Threads: the transport's engine thread ("lc-eng-r<rank>") moves bytes; the executor thread
// ("lc-coll-r<rank>") runs one operation at a time (encode, reduce, decode, waits); user
// threads enqueue and wait on Work, except that a thread waiting (Work::wait) for a collective of
// at most inline_bytes_ input bytes that is next in the queue while nothing runs takes it and runs
// it itself (holding running_ meanwhile, so it is still one operation at a time, in call order).
//
// Control channel: at init every rank posts one receive of a fixed-size control message on
// tags::kControl from every peer, and sends at most one in its lifetime: an abort notice (this
// rank failed, with the reason) or a goodbye (this rank is destroying its communicator after
// finishing its operations). While an operation waits, it polls those receives: a notice from
// any peer fails it; a broken connection fails it when the operation needs that peer. A goodbye
// carries how many collectives the departing rank ran and how many point-to-point messages it
// sent to and received from this rank, so it fails the running operation only if the departed
// rank never took part in it (its data may still be on the wire: it closes its sockets only
// after everyone's goodbye). So a dead rank is noticed by every rank directly (its sockets
// close), and a rank that failed for any other reason tells everyone why.
//
// Statistics: run_one times each operation, summarizes its OpRun's counters against this rank's
// emulated links (collectives/op_stats.h) into its Work and last_stats_, and logs the summary
// of each collective at INFO (point-to-point operations at TRACE).
//
// Callbacks: an operation's completion callbacks (Work::on_complete: torch's futures, DDP hooks)
// run after the thread that ran it has given up the executor's place (running_), never inside
// it, so a callback that issues a collective and waits, or waits for a later operation, does not
// wait on itself: on the executor's thread such a wait runs the queue in order (drive) as the
// executor would; on a thread that ran a small collective inline, the executor or the waiter
// runs it as for any wait.
//
// Locking: mu_ guards queue_, running_, stop_, failure_, control_sent_, last_stats_ and the
// sequence and completion counters. Peers are thread-safe (transport). Only the thread that set
// running_ touches ef_, current_, finished_ and scratch_pool_ and runs OpRun.

#include <array>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "collectives/descriptor.h"
#include "collectives/ef_store.h"
#include "collectives/init_settings.h"
#include "collectives/op_context.h"
#include "collectives/op_stats.h"
#include "collectives/scratch_pool.h"
#include "collectives/work_state.h"
#include "core/deadline.h"
#include "lowcomm/communicator.h"
#include "rendezvous/bootstrap.h"
#include "topology/planner.h"
#include "transport/peer.h"
#include "transport/ucx_transport.h"

namespace lowcomm {
namespace collectives {
class OpRun;
class DeviceContext;
}  // namespace collectives

// A control message (abort notice, goodbye): room for a relayed reason (a peer's failure
// names the failure it heard of).
inline constexpr size_t kControlMessageBytes = 1024;

class CommImpl final : public collectives::OpContext {
 public:
  using Body = std::function<Status(collectives::OpRun&)>;

  static Result<std::unique_ptr<CommImpl>> create(const UniqueId& id, int rank, int nranks,
                                                  const CommOptions& options);
  ~CommImpl();

  int rank() const override { return rank_; }
  int size() const override { return nranks_; }
  const CommOptions& options() const override { return options_; }
  Deadline::Clock::duration timeout() const override { return timeout_; }
  uint64_t chunk_bytes() const override { return chunk_bytes_; }  // the transport's chunk size
  OpStats last_op_stats() const;

  // Queues a collective (desc.seq assigned here) over every peer.
  Work submit_collective(collectives::OpDescriptor desc, Body body);
  // Queues a point-to-point operation (desc.kind kSend or kRecv) with `peer`; desc.seq is the
  // per (peer, tag, direction) message number.
  Work submit_p2p(collectives::OpDescriptor desc, int peer, Body body);
  // Queues a receive from any peer (desc.kind kRecv, desc.root -1); desc.seq counts the
  // any-source receives on the tag.
  Work submit_recv_any(collectives::OpDescriptor desc, Body body);
  // Queues a local operation (EF save/restore) ordered with the others; never fails the group.
  Work submit_local(std::function<Status()> fn);

  // Fails the communicator, tells the peers, drops queued operations, and returns once the
  // running operation (if any) has let go of the user's buffers.
  void abort();
  Status status() const;

  // --- for OpRun (collectives::OpContext), on the executor thread ---
  transport::Peer& peer(int r) override { return *peers_[r]; }
  // Whether collective payloads to/from rank r travel over UCX (intra_site.h), and the UCX
  // transport when any do.
  bool over_ucx(int r) const override { return ucx_ && over_ucx_[static_cast<size_t>(r)]; }
  transport::UcxTransport& ucx() override { return *ucx_; }
  collectives::ErrorFeedbackStore& ef() override { return ef_; }
  // The device side of CUDA-buffer calls (collectives/device_op.h), made at the first one;
  // kUnsupported naming why when the process has no device runtime. Any thread.
  Result<collectives::DeviceContext*> device_context();
  // Whether this thread is this communicator's executor (else: a caller running an operation
  // inline, whose current device an operation on CUDA buffers gives back).
  bool on_executor() const { return t_executor_ == this; }
  // How operations cross the links (topology/planner.h): call-time schedules and the site map
  // from any thread; the rest on the executor.
  const topology::Planner& planner() const { return planner_; }
  const topology::SitePlan& sites() const { return planner_.sites(); }
  // The owner shares of flat all-reduces: the plan the running operation's descriptor names.
  const topology::SharePlan& share_plan() const override { return planner_.share_plan(); }
  collectives::ScratchPool& scratch_pool() override { return scratch_pool_; }
  // ok, or why the running operation (involving `involved` peers) must stop now.
  Status check_health(const std::vector<int>& involved) override;
  // The sender's per (peer, tag) number the next receive from `peer` matches; counts the
  // receive (goodbye's totals include any-source receives once their sender is known).
  uint64_t take_recv_seq(int peer, uint64_t tag) override;
  // While a receive waits: runs the sends queued behind it that have only point-to-point
  // operations ahead of them, in queue order (a send may overtake receives, as an eager send
  // does in MPI, never a collective or a local operation, which may write its buffer). So
  // "irecv from p; isend to p" on both sides cannot deadlock on the one executor.
  void run_overtaking_sends() override;

 private:
  // Init's steps once the mesh is up (create): each peer's emulated link, the planner's
  // discovery (the site map, the owner shares' mode and metering), then the transport inside
  // the site.
  Status plan_links(const collectives::InitSettings& s, const std::vector<std::string>& hosts,
                    Deadline deadline);
  Status open_intra_site(const collectives::InitSettings& s,
                         const rendezvous::BootstrapTable& table,
                         const std::vector<std::string>& hosts, Deadline deadline);
  struct Op {
    collectives::OpDescriptor desc;
    std::vector<int> peers;
    Body body;
    std::function<Status()> local;
    std::shared_ptr<WorkState> work;
    uint64_t p2p_index = 0;   // point-to-point ops with this peer in this direction before it
    bool any_source = false;  // a receive from any peer: its sender is known once it runs
    bool small = false;       // a collective of at most inline_bytes_: a waiter may run it
  };
  // What a goodbye says: the departed rank's totals, to this rank.
  struct Departure {
    uint64_t collectives = 0;
    uint64_t sent_to_us = 0;
    uint64_t received_from_us = 0;
  };
  static Departure parse_departure(const uint8_t* m);
  // Whether the running operation still expects something from departed rank r.
  bool needs_departed(int r, const Departure& d) const;
  struct Control {
    std::array<uint8_t, kControlMessageBytes> in{};
    transport::Request in_req;
    std::array<uint8_t, kControlMessageBytes> out{};
    transport::Request out_req;
  };

  CommImpl() = default;
  Work enqueue(Op op);
  void executor_main();
  void run_one(Op& op);
  // Runs op on this thread (the executor, or a caller running a small collective inline) with
  // running_ already set by the caller under mu_; clears it and wakes the waiters.
  void run_exclusive(Op& op);
  // Work::wait() of a queued operation (before it waits): on this communicator's executor thread
  // (a completion callback), drive(w); elsewhere, a small collective runs here if it is next in
  // the queue and nothing runs.
  void run_queued(WorkState* w, bool small);
  // The executor thread waits, inside a completion callback, for w: it runs the queue in order,
  // as executor_main would, until w is complete (or is not this communicator's to run).
  void drive(WorkState* w);
  // What a waiting thread reaches the communicator through; nulled (under mu) by the destructor.
  struct StealGate {
    // Recursive: a callback released on a thread that holds it may wait on another operation.
    std::recursive_mutex mu;
    CommImpl* comm = nullptr;
  };
  std::shared_ptr<StealGate> gate_ = std::make_shared<StealGate>();
  // Latches `why` as the communicator's failure; the first time, tells the peers and aborts
  // every connection (no request references any buffer afterwards).
  void fail(const Status& why, bool notify);
  void send_control(uint32_t type, const std::string& text, std::chrono::milliseconds wait);
  Work enqueue_locked(Op op);  // under mu_
  void goodbye();

  int rank_ = 0;
  int nranks_ = 0;
  CommOptions options_;
  Deadline::Clock::duration timeout_{};
  uint64_t chunk_bytes_ = 0;
  std::vector<transport::WanLink> links_;  // by rank: this rank's emulated link to each peer
  topology::Planner planner_;
  std::shared_ptr<transport::ProgressEngine> engine_;
  std::vector<std::unique_ptr<transport::Peer>> peers_;  // by rank; null at rank_
  std::vector<Control> control_;                         // by rank
  std::unique_ptr<transport::UcxTransport> ucx_;         // null: every peer on TCP
  std::vector<char> over_ucx_;                           // by rank
  std::mutex device_mu_;
  std::unique_ptr<collectives::DeviceContext> device_;  // before ef_: its residuals use it
  uint64_t pinned_limit_ = 0;                           // LOWCOMM_PINNED_BYTES
  collectives::ErrorFeedbackStore ef_;
  collectives::ScratchPool scratch_pool_;  // executor thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool running_ = false;  // an operation is inside run_one (on the executor or inline)
  // The thread that runs an operation (running_): the executor, or a thread waiting for a small
  // collective (CommOptions::inline_bytes), which then acts as the executor until it returns.
  const Op* current_ = nullptr;
  uint64_t inline_bytes_ = 0;  // collectives up to this many input bytes may run inline
  // Which communicator's operation this thread is running (nested: a completion callback).
  static inline thread_local const CommImpl* t_running_ = nullptr;
  // The communicator whose executor this thread is (executor_main).
  static inline thread_local const CommImpl* t_executor_ = nullptr;
  // Operations completed by the thread holding the executor's place whose callbacks wait for it
  // to give the place up (run_exclusive); only that thread touches it.
  std::vector<std::shared_ptr<WorkState>> finished_;
  bool stop_ = false;
  Status failure_;
  bool control_sent_ = false;
  OpStats last_stats_;
  uint64_t next_seq_ = 0;
  std::map<std::tuple<int, uint64_t, bool>, uint64_t> p2p_seq_;
  std::vector<uint64_t> p2p_sent_, p2p_received_;  // by peer: point-to-point ops submitted
  uint64_t any_source_seq_ = 0;                    // any-source receives submitted
  std::map<std::pair<int, uint64_t>, uint64_t> recv_run_seq_;  // executor: receives run
  std::thread executor_;
};

}  // namespace lowcomm
