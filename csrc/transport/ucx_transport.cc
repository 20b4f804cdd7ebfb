// UcxTransport over UCP 1.13 (ucx_transport.h has the contract). Everything that touches the worker
// runs on the progress thread: operations arrive through queue_, completions come back through
// UCP's callbacks inside ucp_worker_progress, and finished operations are freed at the end of each
// turn of the loop (a callback may finish one while another callback's caller still holds it).
//
// The first failure tears the whole site down (teardown()): unmatched receives are cancelled,
// the live partners' endpoints flushed, every endpoint closed by force (UCX then completes its
// other requests with an error), and once no request is left in UCX the worker is destroyed;
// only then do the failed requests complete. After ucp_worker_destroy no UCX code runs for this
// site and its connections are closed, so nothing can still read or write a buffer whose request
// has completed (a request that failed earlier, from a callback's error or a digest that did not
// match, is held until then). A request UCX never completes (10 s) no longer hands its buffer back
// while UCX holds it: the worker is destroyed under it first.

#include "transport/ucx_transport.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/log.h"

namespace lowcomm::transport {
namespace {

constexpr uint64_t kDigestBit = uint64_t{1} << 63;
constexpr int kRankShift = 24;
constexpr size_t kDigestBytes = 16;
constexpr int kProgressBurst = 64;  // worker progress calls between looks at the queue
// How long a teardown waits for UCX to complete the requests of closed endpoints.
constexpr auto kTeardownWait = std::chrono::seconds(10);
// How long a teardown lets the live partners' endpoints send what they hold before closing
// them by force (teardown()).
constexpr auto kFlushWait = std::chrono::seconds(1);

Status ucx_error(const std::string& what, ucs_status_t s) {
  return Status(StatusCode::kSystem, what + ": " + ucs_status_string(s));
}

std::array<uint8_t, kDigestBytes> digest_of(const void* data, uint64_t len) {
  const XXH128_hash_t h = XXH3_128bits(data, len);
  std::array<uint8_t, kDigestBytes> out{};
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  std::memcpy(out.data(), c.digest, kDigestBytes);
  return out;
}

}  // namespace

struct UcxTransport::Impl {
  struct Op;
  // One UCP request of an operation: the message (0) or its digest (1).
  struct Half {
    Op* op = nullptr;
    int index = 0;
    void* request = nullptr;  // in flight; null once done
    bool done = false;        // its callback ran (possibly inside the _nbx call itself)
  };
  struct Op {
    enum Kind { kSend, kRecv, kConnect, kAbort } kind = kSend;
    Impl* owner = nullptr;
    int rank = -1;
    uint64_t tag = 0;
    void* data = nullptr;
    uint64_t len = 0;
    std::shared_ptr<RequestState> state;
    std::array<uint8_t, kDigestBytes> digest{};  // send: ours; receive: what arrived
    std::array<Half, 2> half;
    int pending = 0;
    uint64_t received = 0;
    uint64_t ticket = 0;  // kAbort
    Status error;         // the first half's failure, or the message's own (length, digest)
    std::string address;  // kConnect
    bool checked = true;  // kConnect
    Status abort_why;     // kAbort
  };
  struct Partner {
    ucp_ep_h ep = nullptr;  // destroyed with the worker
    bool checked = true;    // messages carry their digest
    bool failed = false;    // UCX reported the endpoint failed (on_ep_error)
    // In flight, and failed ones (pending 0) waiting for teardown() to complete them.
    std::map<Op*, std::unique_ptr<Op>> ops;
  };

  int rank = -1;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::string address;
  int epoll_fd = -1;
  int wake_fd = -1;  // eventfd: a queued operation
  std::thread thread;

  std::mutex mu;  // guards queue, stop, abort_asked, abort_done
  std::condition_variable cv;
  std::deque<std::unique_ptr<Op>> queue;
  bool stop = false;
  uint64_t abort_asked = 0;  // aborts posted (tickets)
  uint64_t abort_done = 0;   // the highest ticket whose abort has let go of every buffer
  std::atomic<uint64_t> closed_with_sends{0};  // teardowns that closed with sends pending

  // Progress thread only.
  std::map<int, Partner> partners;
  // The first failure (an abort, a partner's, a message's): every outstanding and later
  // operation fails with it. Set inside UCP's callbacks too; teardown() follows on the loop.
  Status aborted;
  bool arm_failed = false;                    // ucp_worker_arm failed once: poll on a short timeout
  std::vector<std::unique_ptr<Op>> finished;  // freed at the end of the turn
  bool flush_started = false;                 // teardown() cancelled and flushed
  bool closing_started = false;               // teardown() closed
  std::chrono::steady_clock::time_point teardown_since;
  std::vector<void*> flushing;  // ucp_ep_flush_nbx requests in flight
  std::vector<void*> closing;   // ucp_ep_close_nbx requests in flight
  // Receives of the messages that arrived unexpected during the teardown, into buffers of
  // their own: a live partner's send completes instead of waiting for a receive that was
  // cancelled here, so its endpoint is never closed with that send pending.
  std::vector<std::pair<void*, std::unique_ptr<uint8_t[]>>> draining;

  ~Impl() {
    if (worker) ucp_worker_destroy(worker);
    if (context) ucp_cleanup(context);
    if (epoll_fd >= 0) ::close(epoll_fd);
    if (wake_fd >= 0) ::close(wake_fd);
  }

  std::string who(int r) const {
    return "UCX rank " + std::to_string(rank) + " to rank " + std::to_string(r);
  }

  void post(std::unique_ptr<Op> op) {
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(op));
    }
    wake();
  }
  // isend/irecv on the caller's thread: the operation, queued for the progress thread.
  Request transfer(Op::Kind kind, int r, uint64_t tag, void* data, uint64_t len) {
    auto state = std::make_shared<RequestState>();
    if (tag > kMaxTag) {
      state->complete(internal_error("UCX: tag " + std::to_string(tag) + " out of range"));
      return Request(state);
    }
    auto op = std::make_unique<Op>();
    op->kind = kind;
    op->owner = this;
    op->rank = r;
    op->tag = tag;
    op->data = data;
    op->len = len;
    op->state = state;
    post(std::move(op));
    return Request(state);
  }
  void wake() const {
    const uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof one);
  }

  // --- progress thread ---

  void main_loop() {
    std::array<epoll_event, 2> events{};
    for (;;) {
      std::deque<std::unique_ptr<Op>> batch;
      bool stopping;
      {
        std::lock_guard<std::mutex> lock(mu);
        batch.swap(queue);
        stopping = stop;
      }
      for (auto& op : batch) issue(std::move(op));
      // Bounded, so that queued operations (an abort among them) are not starved by traffic.
      int progressed = 0;
      while (worker && progressed < kProgressBurst && ucp_worker_progress(worker) != 0)
        ++progressed;
      if (!aborted.is_ok()) teardown();
      finished.clear();
      if (stopping && !worker) return;
      if (progressed > 0) continue;
      if (worker && !aborted.is_ok()) {
        // Tearing down: UCX finishes the flush and the closes within the next progress calls
        // or never (a partner that cannot take its bytes); a millisecond between the calls,
        // not a core spun for up to kTeardownWait.
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!queue.empty() || stop != stopping) continue;
      }
      if (worker) {
        const ucs_status_t armed = ucp_worker_arm(worker);
        if (armed == UCS_ERR_BUSY) continue;
        if (armed != UCS_OK && !arm_failed) {
          arm_failed = true;
          LOWCOMM_LOG(kWarn, "UCX rank %d: ucp_worker_arm: %s (polling every millisecond instead)",
                      rank, ucs_status_string(armed));
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!queue.empty()) continue;
      }
      // Sleep until the worker or a caller has news; a bound, so a lost wake-up costs little.
      const int n = ::epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()),
                                 arm_failed && worker ? 1 : 200);
      for (int i = 0; i < n; ++i)
        if (events[static_cast<size_t>(i)].data.fd == wake_fd) {
          uint64_t count;
          (void)!::read(wake_fd, &count, sizeof count);
        }
    }
  }

  // After the first failure, outside UCP's callbacks, on each turn until done: first cancels
  // the receives UCX has not matched and flushes the endpoints of the live partners (what they
  // hold goes out, for at most kFlushWait); then closes every endpoint by force (which completes
  // their other requests once UCX has discarded its transport endpoints, a few progress calls
  // later); once no operation is in UCX (or after kTeardownWait, with a warning), destroys the
  // worker, and with it every endpoint, connection and transport: UCX references no buffer after
  // this. Only then are the failed operations completed, with their own error or the site's.
  // The abort tickets posted so far are then done.
  //
  // The flush first: UCX 1.13.1's TCP transport, closing by force a connected endpoint that
  // still holds unsent bytes while the partner closes its end too, completes a send's
  // completion twice or calls a handler through the freed endpoint in a later progress call
  // (docs/sites.md, "UCX inside a site", "Failures": both crashes of a survivor when a rank died).
  void teardown() {
    if (!worker) return mark_aborts_done();
    if (!flush_started) {
      flush_started = true;
      teardown_since = std::chrono::steady_clock::now();
      std::vector<void*> cancel;
      for (auto& [r, p] : partners)
        for (auto& [op, owned] : p.ops)
          if (op->kind == Op::kRecv)
            for (Half& h : op->half)
              if (h.request) cancel.push_back(h.request);
      for (void* req : cancel) ucp_request_cancel(worker, req);
      for (auto& [r, p] : partners) {
        if (!p.ep || p.failed) continue;
        ucp_request_param_t param{};
        ucs_status_ptr_t flush_req = ucp_ep_flush_nbx(p.ep, &param);
        if (flush_req != nullptr && !UCS_PTR_IS_ERR(flush_req)) flushing.push_back(flush_req);
      }
    }
    free_completed(flushing);
    if (!closing_started) {
      drain_unexpected();
      int sending = 0;  // sends to live partners UCX has not completed
      for (const auto& [r, p] : partners)
        if (p.ep && !p.failed)
          for (const auto& [op, owned] : p.ops)
            if (op->kind == Op::kSend && op->pending > 0) ++sending;
      if ((!flushing.empty() || !draining.empty() || sending > 0) &&
          std::chrono::steady_clock::now() - teardown_since < kFlushWait)
        return;
      if (sending > 0) ++closed_with_sends;
      if (sending > 0)
        LOWCOMM_LOG(kInfo,
                    "UCX rank %d: %d send(s) to live partners not taken in %.0f s (a partner "
                    "neither receiving nor closing): their endpoints are closed by force",
                    rank, sending, std::chrono::duration<double>(kFlushWait).count());
      closing_started = true;
      for (auto& [r, p] : partners) {
        if (!p.ep) continue;
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_EP_CLOSE_FLAG_FORCE;
        ucs_status_ptr_t closing_req = ucp_ep_close_nbx(p.ep, &param);
        if (closing_req != nullptr && !UCS_PTR_IS_ERR(closing_req)) closing.push_back(closing_req);
        p.ep = nullptr;
      }
    }
    free_completed(closing);
    int in_ucx = 0;
    for (const auto& [r, p] : partners)
      for (const auto& [op, owned] : p.ops) in_ucx += op->pending > 0 ? 1 : 0;
    if ((in_ucx > 0 || !closing.empty() || !flushing.empty()) &&
        std::chrono::steady_clock::now() - teardown_since < kTeardownWait)
      return;
    if (in_ucx > 0)
      LOWCOMM_LOG(kWarn,
                  "UCX rank %d: %d operation(s) still in UCX %.0f s after the failure: the worker "
                  "is destroyed under them",
                  rank, in_ucx, std::chrono::duration<double>(kTeardownWait).count());
    for (std::vector<void*>* v : {&flushing, &closing}) {
      for (void* req : *v) ucp_request_free(req);
      v->clear();
    }
    for (auto& d : draining) ucp_request_free(d.first);
    ucp_worker_destroy(worker);
    worker = nullptr;
    draining.clear();  // (their buffers: UCX references none now)
    for (auto& [r, p] : partners) {
      for (auto& [op, owned] : p.ops) {
        op->state->complete(op->error.is_ok() ? aborted : op->error);
        finished.push_back(std::move(owned));
      }
      p.ops.clear();
    }
    mark_aborts_done();
  }

  // During the teardown, before the close: every message that arrived with no receive posted
  // (a live partner's next operation, whose receive this site cancelled or never posted) is
  // received into a buffer of its own and dropped, so the partner's send completes (a
  // rendezvous send waits for its receive) and the partner closes with nothing pending.
  void drain_unexpected() {
    for (size_t i = 0; i < draining.size();) {
      if (ucp_request_check_status(draining[i].first) == UCS_INPROGRESS) {
        ++i;
        continue;
      }
      ucp_request_free(draining[i].first);
      draining[i] = std::move(draining.back());
      draining.pop_back();
    }
    for (;;) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h msg = ucp_tag_probe_nb(worker, 0, 0, 1, &info);
      if (msg == nullptr) return;
      auto buf = std::make_unique_for_overwrite<uint8_t[]>(std::max<size_t>(info.length, 1));
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      param.cb.recv = [](void*, ucs_status_t, const ucp_tag_recv_info_t*, void*) {};
      ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(worker, buf.get(), info.length, msg, &param);
      if (r == nullptr || UCS_PTR_IS_ERR(r)) continue;
      draining.emplace_back(r, std::move(buf));
    }
  }

  // Frees the requests of `v` UCX has completed.
  static void free_completed(std::vector<void*>& v) {
    for (size_t i = 0; i < v.size();) {
      if (ucp_request_check_status(v[i]) == UCS_INPROGRESS) {
        ++i;
        continue;
      }
      ucp_request_free(v[i]);
      v[i] = v.back();
      v.pop_back();
    }
  }

  void mark_aborts_done() {
    std::lock_guard<std::mutex> lock(mu);
    if (abort_done < abort_asked) {
      abort_done = abort_asked;
      cv.notify_all();
    }
  }

  void issue(std::unique_ptr<Op> op) {
    switch (op->kind) {
      case Op::kConnect:
        return connect_now(std::move(op));
      case Op::kAbort:
        fail_site(op->abort_why, -1);
        op->state->complete(Status());
        return;  // the loop tears down before it progresses again, then marks the ticket done
      case Op::kSend:
      case Op::kRecv:
        break;
    }
    Op* raw = op.get();
    if (!aborted.is_ok()) {
      raw->state->complete(aborted);
      return;
    }
    auto it = partners.find(raw->rank);
    if (it == partners.end()) {
      raw->state->complete(internal_error(who(raw->rank) + ": no endpoint (not connected)"));
      return;
    }
    Partner& p = it->second;
    p.ops.emplace(raw, std::move(op));
    for (int i = 0; i < 2; ++i) {
      raw->half[static_cast<size_t>(i)].op = raw;
      raw->half[static_cast<size_t>(i)].index = i;
    }
    raw->checked = p.checked;
    raw->pending = p.checked ? 2 : 1;
    if (raw->kind == Op::kSend) {
      const uint64_t tag = (static_cast<uint64_t>(rank) << kRankShift) | raw->tag;
      if (p.checked) raw->digest = digest_of(raw->data, raw->len);
      start_send(p, raw->half[0], raw->data, raw->len, tag);
      if (p.checked)
        start_send(p, raw->half[1], raw->digest.data(), kDigestBytes, tag | kDigestBit);
    } else {
      const uint64_t tag = (static_cast<uint64_t>(raw->rank) << kRankShift) | raw->tag;
      start_recv(raw->half[0], raw->data, raw->len, tag);
      if (p.checked) start_recv(raw->half[1], raw->digest.data(), kDigestBytes, tag | kDigestBit);
    }
  }

  void start_send(Partner& p, Half& h, const void* data, uint64_t len, uint64_t tag) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &on_send;
    param.user_data = &h;
    ucs_status_ptr_t r = ucp_tag_send_nbx(p.ep, data, len, tag, &param);
    if (r == nullptr) return half_done(h, UCS_OK, len);
    if (UCS_PTR_IS_ERR(r)) return half_done(h, UCS_PTR_STATUS(r), 0);
    if (!h.done) h.request = r;  // else the callback ran (and freed it) inside the call
  }

  void start_recv(Half& h, void* data, uint64_t len, uint64_t tag) {
    ucp_request_param_t param{};
    // Always through the callback: UCX 1.13 completing a receive at once (an unexpected eager
    // message) leaves recv_info's length 0.
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    param.cb.recv = &on_recv;
    param.user_data = &h;
    ucs_status_ptr_t r = ucp_tag_recv_nbx(worker, data, len, tag, ~uint64_t{0}, &param);
    if (r == nullptr) return half_done(h, UCS_ERR_NO_MESSAGE, 0);  // not promised by UCX
    if (UCS_PTR_IS_ERR(r)) return half_done(h, UCS_PTR_STATUS(r), 0);
    // A message already here completes the receive inside the call: UCX runs the callback (which
    // frees the request) and still returns the pointer.
    if (!h.done) h.request = r;
  }

  static void on_send(void* request, ucs_status_t status, void* user_data) {
    auto* h = static_cast<Half*>(user_data);
    h->request = nullptr;
    ucp_request_free(request);
    h->op->owner->half_done(*h, status, 0);
  }
  static void on_recv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                      void* user_data) {
    auto* h = static_cast<Half*>(user_data);
    h->request = nullptr;
    const uint64_t length = info != nullptr ? info->length : 0;
    ucp_request_free(request);
    h->op->owner->half_done(*h, status, length);
  }

  void half_done(Half& h, ucs_status_t status, uint64_t length) {
    Op* op = h.op;
    h.request = nullptr;
    h.done = true;
    if (status != UCS_OK && op->error.is_ok()) {
      const char* dir = op->kind == Op::kSend ? "send" : "receive";
      if (status == UCS_ERR_MESSAGE_TRUNCATED) {
        op->error =
            invalid_argument(who(op->rank) + ": message on tag " + std::to_string(op->tag) +
                             " longer than the " + std::to_string(op->len) + "-byte receive");
      } else if (status == UCS_ERR_CANCELED && !aborted.is_ok()) {
        op->error = aborted;
      } else {
        op->error = ucx_error(who(op->rank) + ": " + dir + " of " + std::to_string(op->len) +
                                  " bytes on tag " + std::to_string(op->tag),
                              status);
      }
    }
    // The site fails now, not when the other half is done (it may never be).
    if (!op->error.is_ok()) fail_site(op->error, op->rank);
    if (h.index == 0 && op->kind == Op::kRecv) op->received = length;
    if (--op->pending > 0) return;
    finish(op);
  }

  Partner& partner(int r) { return partners.at(r); }

  // Both halves done. A success completes now (UCX is done with the buffer); a failure is
  // recorded, fails the site, and completes in teardown(), once UCX cannot touch the buffer.
  void finish(Op* op) {
    Status& s = op->error;
    if (s.is_ok() && op->kind == Op::kRecv) {
      if (op->received != op->len) {
        s = invalid_argument(who(op->rank) + ": a " + std::to_string(op->received) +
                             "-byte message on tag " + std::to_string(op->tag) + " met a " +
                             std::to_string(op->len) + "-byte receive");
      } else if (op->checked && digest_of(op->data, op->len) != op->digest) {
        s = corrupt_data(who(op->rank) + ": the " + std::to_string(op->len) +
                         "-byte message on tag " + std::to_string(op->tag) +
                         " does not match its XXH3-128 (corrupted on the way)");
      }
    }
    if (!s.is_ok()) {
      fail_site(s, op->rank);
      return;
    }
    Partner& p = partner(op->rank);
    auto node = p.ops.extract(op);
    op->state->complete(s, op->kind == Op::kRecv ? op->received : 0);
    finished.push_back(std::move(node.mapped()));
  }

  // Failures stick to the whole site (the communicator aborts every peer on any failure
  // anyway): the first one is kept and logged once, naming the partner; teardown() follows.
  // `r`: the partner it came from, -1 for an abort.
  void fail_site(const Status& why, int r) {
    if (!aborted.is_ok()) return;
    aborted = why;
    // An abort (the communicator closing or failing) was logged by whoever asked for it; a
    // partner that leaves while nothing waits on it is news only at INFO.
    if (why.code() == StatusCode::kAborted) return;
    if (r >= 0 && !partner(r).ops.empty()) {
      LOWCOMM_LOG(kWarn, "%s", why.to_string().c_str());
    } else {
      LOWCOMM_LOG(kInfo, "%s", why.to_string().c_str());
    }
  }

  static void on_ep_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    auto* ctx = static_cast<std::pair<Impl*, int>*>(arg);
    Impl* self = ctx->first;
    const int r = ctx->second;
    self->partner(r).failed = true;
    self->fail_site(ucx_error(self->who(r) + ": the endpoint failed (the peer is gone or "
                                             "unreachable)",
                              status),
                    r);
  }

  void connect_now(std::unique_ptr<Op> op) {
    if (!aborted.is_ok()) {
      op->state->complete(aborted);
      return;
    }
    if (partners.count(op->rank) != 0) {
      op->state->complete(internal_error(who(op->rank) + ": connected twice"));
      return;
    }
    // The partner exists before its endpoint: UCX may call the error handler at any time after.
    Partner& p = partners[op->rank];
    p.checked = op->checked;
    auto ctx = std::make_unique<std::pair<Impl*, int>>(this, op->rank);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(op->address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &on_ep_error;
    params.err_handler.arg = ctx.get();
    ucp_ep_h ep = nullptr;
    const ucs_status_t s = ucp_ep_create(worker, &params, &ep);
    if (s != UCS_OK) {
      partners.erase(op->rank);
      op->state->complete(ucx_error(who(op->rank) + ": ucp_ep_create", s));
      return;
    }
    p.ep = ep;
    error_args.push_back(std::move(ctx));
    op->state->complete(Status());
  }
  std::vector<std::unique_ptr<std::pair<Impl*, int>>> error_args;
};

bool UcxTransport::built_with_ucx() {
  return true;
}

UcxTransport::UcxTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<UcxTransport>> UcxTransport::create(int rank) {
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return ucx_error("UCX: ucp_config_read (UCX_* environment)", s);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  s = ucp_init(&params, config, &impl->context);
  ucp_config_release(config);
  if (s != UCS_OK) return ucx_error("UCX: ucp_init", s);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // Serialized: created here, driven by the progress thread, destroyed by the destructor's
  // thread, never two at once (UCP adds no locks for it).
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  s = ucp_worker_create(impl->context, &wp, &impl->worker);
  if (s != UCS_OK) return ucx_error("UCX: ucp_worker_create", s);
  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  s = ucp_worker_get_address(impl->worker, &addr, &addr_len);
  if (s != UCS_OK) return ucx_error("UCX: ucp_worker_get_address", s);
  impl->address.assign(reinterpret_cast<const char*>(addr), addr_len);
  ucp_worker_release_address(impl->worker, addr);
  int efd = -1;
  s = ucp_worker_get_efd(impl->worker, &efd);
  if (s != UCS_OK) return ucx_error("UCX: ucp_worker_get_efd", s);
  impl->epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  impl->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->epoll_fd < 0 || impl->wake_fd < 0)
    return Status(StatusCode::kSystem, std::string("UCX: epoll/eventfd: ") + std::strerror(errno));
  for (int fd : {efd, impl->wake_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(impl->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0)
      return Status(StatusCode::kSystem, std::string("UCX: epoll_ctl: ") + std::strerror(errno));
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    const std::string name = "lc-ucx-r" + std::to_string(raw->rank);
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    raw->main_loop();
  });
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(impl)));
}

UcxTransport::~UcxTransport() {
  if (!impl_) return;
  abort(Status(StatusCode::kAborted, "UCX rank " + std::to_string(impl_->rank) + ": closed"));
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->wake();
  impl_->thread.join();
}

const std::string& UcxTransport::address() const {
  return impl_->address;
}

Status UcxTransport::connect(int rank, const std::string& address, bool checked) {
  auto op = std::make_unique<Impl::Op>();
  op->kind = Impl::Op::kConnect;
  op->owner = impl_.get();
  op->rank = rank;
  op->address = address;
  op->checked = checked;
  auto state = std::make_shared<RequestState>();
  op->state = state;
  impl_->post(std::move(op));
  return state->wait(Deadline::none());
}

Request UcxTransport::isend(int rank, uint64_t tag, const void* data, uint64_t len) {
  return impl_->transfer(Impl::Op::kSend, rank, tag, const_cast<void*>(data), len);
}

Request UcxTransport::irecv(int rank, uint64_t tag, void* data, uint64_t len) {
  return impl_->transfer(Impl::Op::kRecv, rank, tag, data, len);
}

void UcxTransport::abort(const Status& why) {
  auto op = std::make_unique<Impl::Op>();
  op->kind = Impl::Op::kAbort;
  op->owner = impl_.get();
  op->abort_why = why.is_ok() ? Status(StatusCode::kAborted,
                                       "UCX rank " + std::to_string(impl_->rank) + ": aborted")
                              : why;
  op->state = std::make_shared<RequestState>();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    op->ticket = ++impl_->abort_asked;
  }
  impl_->post(std::move(op));
}

uint64_t UcxTransport::closed_with_sends_pending() const {
  return impl_->closed_with_sends.load();
}

void UcxTransport::wait_released() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  const uint64_t ticket = impl_->abort_asked;
  impl_->cv.wait(lock, [&] { return impl_->abort_done >= ticket; });
}

}  // namespace lowcomm::transport
