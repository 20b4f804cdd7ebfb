// UcxSite over UCP 1.13 (ucx_site.h has the contract). Everything that touches the worker runs
// on the progress thread: operations arrive through queue_, completions come back through UCP's
// callbacks inside ucp_worker_progress, and finished operations are freed at the end of each
// turn of the loop (a callback may finish one while another callback's caller still holds it).

#include "transport/ucx_site.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
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
constexpr auto kAbortWait = std::chrono::seconds(5);

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

struct UcxSite::Impl {
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
    uint64_t ticket = 0;     // kAbort
    bool abandoned = false;  // abort gave up waiting for it (see let_go())
    Status error;            // the first half's failure
    std::string address;     // kConnect
    bool checked = true;     // kConnect
    Status abort_why;        // kAbort
  };
  struct Partner {
    ucp_ep_h ep = nullptr;
    bool checked = true;  // messages carry their digest
    Status failed;        // sticky
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

  // Progress thread only.
  std::map<int, Partner> partners;
  Status aborted;         // set by kAbort: every partner failed, every later operation fails
  uint64_t aborting = 0;  // the highest abort ticket issued and not yet done; 0: none
  std::chrono::steady_clock::time_point abort_since;
  bool arm_failed = false;                    // ucp_worker_arm failed once: poll on a short timeout
  std::vector<std::unique_ptr<Op>> finished;  // freed at the end of the turn
  std::vector<void*> closing;                 // ucp_ep_close_nbx requests in flight
  std::vector<int> to_settle;                 // failed partners to cancel and close

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
      settle();
      // Bounded, so that queued operations (an abort among them) are not starved by traffic.
      int progressed = 0;
      while (progressed < kProgressBurst && ucp_worker_progress(worker) != 0) ++progressed;
      const bool settled = settle();
      reap_closing();
      finished.clear();
      if (aborting != 0 && (idle() || let_go())) {
        std::lock_guard<std::mutex> lock(mu);
        abort_done = std::max(abort_done, aborting);
        aborting = 0;
        cv.notify_all();
      }
      if (stopping && (idle() || let_go())) return;
      if (progressed > 0 || settled) continue;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!queue.empty() || stop != stopping) continue;
      }
      const ucs_status_t armed = ucp_worker_arm(worker);
      if (armed == UCS_ERR_BUSY) continue;
      if (armed != UCS_OK && !arm_failed) {
        arm_failed = true;
        LOWCOMM_LOG(kWarn, "UCX rank %d: ucp_worker_arm: %s (polling every millisecond instead)",
                    rank, ucs_status_string(armed));
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!queue.empty()) continue;
      }
      // Sleep until the worker or a caller has news; a bound, so a lost wake-up costs little.
      const int n = ::epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()),
                                 aborting != 0 || !closing.empty() || arm_failed ? 1 : 200);
      for (int i = 0; i < n; ++i)
        if (events[static_cast<size_t>(i)].data.fd == wake_fd) {
          uint64_t count;
          (void)!::read(wake_fd, &count, sizeof count);
        }
    }
  }

  bool idle() const {
    if (!closing.empty() || !to_settle.empty()) return false;
    for (const auto& [r, p] : partners)
      for (const auto& [op, owned] : p.ops)
        if (!op->abandoned) return false;
    return true;
  }

  // An abort (or the destructor) that has waited kAbortWait for operations UCX will not finish:
  // a receive already matched to a message whose sender died mid-way is neither cancellable
  // (ucp_request_cancel takes only unmatched receives) nor purged by closing the endpoint. Their
  // requests fail now, loudly, so nobody hangs; they stay registered (UCX still holds their
  // Halves), and their buffers may still be written if the rest of that message ever arrives.
  bool let_go() {
    if (std::chrono::steady_clock::now() - abort_since < kAbortWait) return false;
    int n = 0;
    for (auto& [r, p] : partners)
      for (auto& [op, owned] : p.ops)
        if (!op->abandoned) {
          op->abandoned = true;
          op->state->complete(aborted);
          ++n;
        }
    if (n > 0)
      LOWCOMM_LOG(kWarn,
                  "UCX rank %d: %d operation(s) still in UCX %.0f s after the abort: failed "
                  "without waiting for them (their buffers may still be written)",
                  rank, n, std::chrono::duration<double>(kAbortWait).count());
    return closing.empty() && to_settle.empty();
  }

  void issue(std::unique_ptr<Op> op) {
    switch (op->kind) {
      case Op::kConnect:
        return connect_now(std::move(op));
      case Op::kAbort:
        if (aborted.is_ok()) aborted = op->abort_why;
        if (aborting == 0) abort_since = std::chrono::steady_clock::now();
        aborting = std::max(aborting, op->ticket);
        for (auto& [r, p] : partners) fail_partner(r, aborted);
        op->state->complete(Status());
        return;
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
    if (!p.failed.is_ok()) {
      raw->state->complete(p.failed);
      return;
    }
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
      } else if (status == UCS_ERR_CANCELED && !partner(op->rank).failed.is_ok()) {
        op->error = partner(op->rank).failed;
      } else {
        op->error = ucx_error(who(op->rank) + ": " + dir + " of " + std::to_string(op->len) +
                                  " bytes on tag " + std::to_string(op->tag),
                              status);
      }
    }
    if (h.index == 0 && op->kind == Op::kRecv) op->received = length;
    if (--op->pending > 0) return;
    finish(op);
  }

  Partner& partner(int r) { return partners.at(r); }

  void finish(Op* op) {
    Status s = op->error;
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
    Partner& p = partner(op->rank);
    auto node = p.ops.extract(op);
    op->state->complete(s, s.is_ok() && op->kind == Op::kRecv ? op->received : 0);
    finished.push_back(std::move(node.mapped()));
    if (!s.is_ok()) fail_partner(op->rank, s);
  }

  // Failures stick (as a Peer's): every outstanding request of the partner fails, receives are
  // cancelled, the endpoint is closed by force (which completes its sends with an error). The
  // cancelling and closing wait for settle(), outside UCP's callbacks.
  void fail_partner(int r, const Status& why) {
    Partner& p = partner(r);
    if (p.failed.is_ok()) {
      p.failed = why;
      // A partner that leaves while nothing waits on it (its communicator closing) is news only
      // at INFO.
      if (why.code() != StatusCode::kAborted) {
        if (p.ops.empty()) {
          LOWCOMM_LOG(kInfo, "%s", why.to_string().c_str());
        } else {
          LOWCOMM_LOG(kWarn, "%s", why.to_string().c_str());
        }
      }
    }
    to_settle.push_back(r);
  }

  // Whether it did anything.
  bool settle() {
    const bool any = !to_settle.empty();
    while (!to_settle.empty()) {
      Partner& p = partner(to_settle.back());
      to_settle.pop_back();
      std::vector<void*> cancel;
      for (auto& [op, owned] : p.ops)
        if (op->kind == Op::kRecv)
          for (Half& h : op->half)
            if (h.request) cancel.push_back(h.request);
      for (void* req : cancel) ucp_request_cancel(worker, req);
      close_endpoint(p);
    }
    return any;
  }

  void close_endpoint(Partner& p) {
    if (!p.ep) return;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(p.ep, &param);
    p.ep = nullptr;
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing.push_back(r);
  }

  void reap_closing() {
    for (size_t i = 0; i < closing.size();) {
      if (ucp_request_check_status(closing[i]) == UCS_INPROGRESS) {
        ++i;
        continue;
      }
      ucp_request_free(closing[i]);
      closing[i] = closing.back();
      closing.pop_back();
    }
  }

  static void on_ep_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    auto* ctx = static_cast<std::pair<Impl*, int>*>(arg);
    Impl* self = ctx->first;
    const int r = ctx->second;
    if (self->partner(r).failed.is_ok())
      self->fail_partner(r, ucx_error(self->who(r) + ": the endpoint failed (the peer is gone "
                                                     "or unreachable)",
                                      status));
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

bool UcxSite::built_with_ucx() {
  return true;
}

UcxSite::UcxSite(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<UcxSite>> UcxSite::create(int rank) {
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
  return std::unique_ptr<UcxSite>(new UcxSite(std::move(impl)));
}

UcxSite::~UcxSite() {
  if (!impl_) return;
  abort(Status(StatusCode::kAborted, "UCX rank " + std::to_string(impl_->rank) + ": closed"));
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->wake();
  impl_->thread.join();
}

const std::string& UcxSite::address() const {
  return impl_->address;
}

Status UcxSite::connect(int rank, const std::string& address, bool checked) {
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

Request UcxSite::isend(int rank, uint64_t tag, const void* data, uint64_t len) {
  return impl_->transfer(Impl::Op::kSend, rank, tag, const_cast<void*>(data), len);
}

Request UcxSite::irecv(int rank, uint64_t tag, void* data, uint64_t len) {
  return impl_->transfer(Impl::Op::kRecv, rank, tag, data, len);
}

void UcxSite::abort(const Status& why) {
  auto op = std::make_unique<Impl::Op>();
  op->kind = Impl::Op::kAbort;
  op->owner = impl_.get();
  op->abort_why = why.is_ok() ? Status(StatusCode::kAborted,
                                       "UCX rank " + std::to_string(impl_->rank) + ": aborted")
                              : why;
  op->state = std::make_shared<RequestState>();
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    ticket = op->ticket = ++impl_->abort_asked;
  }
  impl_->post(std::move(op));
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->abort_done >= ticket; });
}

}  // namespace lowcomm::transport
