// The registered state and its transfer to joiners (docs/membership.md, "Joining"): its hash,
// stripes served from a snapshot, the joiner's striped fetch (faults included) and install.
#include "membership/elastic_impl.h"

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "membership/attempt.h"
#include "membership/elastic_util.h"

namespace lowcomm {

using membership::MemberAddress;
using membership::Message;
using membership::MsgType;

namespace {
// A snapshot at least this large is allocated ahead, when the view of an admission is named.
constexpr uint64_t kAheadBytes = 1 << 20;
}  // namespace

void ElasticImpl::serve_fetches() {
  // At most kServeDepth stripes per fresh member not yet gone out on the link: the uplink stays
  // busy, and a member's done (to every member, on the same link) queues behind at most that
  // much state, not behind the whole stripe set.
  // A member's stripes go out in the order it asked for them (its receives match in order): a
  // member found full stays skipped for the rest of this pass, even if a send completes.
  // A stripe of a result (rolling forward) comes from the kept result of that collective; one
  // asked for before this member committed it (it holds it staged: the view that commits it is
  // on its way here) waits for the commit.
  std::set<uint32_t> full;
  for (auto it = fetches_.begin(); it != fetches_.end();) {
    auto& [to, m] = *it;
    const bool result = m.text == "result";
    const bool waiting =
        result ? kept_seq_ != m.seq && staged_ == m.seq : !snapshot_ || snapshot_seq_ < m.seq;
    if (waiting || full.count(to)) {
      ++it;  // not held yet (its collective has not started or committed here), or member full
      continue;
    }
    std::shared_ptr<const void> keep;  // what the send reads, kept alive until it completes
    const uint8_t* src = nullptr;
    uint64_t size = 0;
    if (result && kept_seq_ == m.seq && results_[m.seq % 2]) {
      keep = results_[m.seq % 2];
      src = results_[m.seq % 2]->data();
      size = kept_bytes_;
    } else if (!result && snapshot_seq_ == m.seq) {
      keep = snapshot_;
      src = snapshot_->data();
      size = snapshot_->size();
    }
    const bool held = src != nullptr;
    auto slot = slots_.find(to);
    if (!held || slot == slots_.end() || m.hash > size || m.length > size - m.hash) {
      it = fetches_.erase(it);  // a stale or malformed request: the fetcher times out or retries
      continue;
    }
    auto& q = serving_[to];
    while (!q.empty() && q.front().test()) q.pop_front();
    if (q.size() >= kServeDepth) {
      full.insert(to);
      ++it;
      continue;
    }
    transport::Request r = slot->second.peer->isend(m.tag, src + m.hash, m.length);
    if (!result) stats_.state_served_bytes += m.length;
    outbox_.push_back({std::move(keep), r});
    q.push_back(std::move(r));
    it = fetches_.erase(it);
  }
}

Status ElasticImpl::register_state(const std::string& name, void* data, uint64_t bytes) {
  if (name.empty() || (!data && bytes))
    return invalid_argument("register_state: empty name or null data");
  std::lock_guard<std::mutex> lk(mu_);
  state_[name] = {data, bytes};
  return Status::ok();
}

struct ElasticImpl::Ahead {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  uint64_t bytes = 0;
  Result<std::shared_ptr<membership::StateBuffer>> buffer = Status();
};

void ElasticImpl::allocate_snapshot_ahead() {
  uint64_t bytes = 0;
  for (auto& [n, d] : state_) bytes += d.second;
  if (bytes < kAheadBytes || (snapshot_ahead_ && snapshot_ahead_->bytes == bytes)) return;
  auto ahead = std::make_shared<Ahead>();
  ahead->bytes = bytes;
  std::thread([ahead] {
    auto b = membership::StateBuffer::allocate(ahead->bytes);
    std::lock_guard<std::mutex> g(ahead->mu);
    ahead->buffer = std::move(b);
    ahead->done = true;
    ahead->cv.notify_all();
  }).detach();
  snapshot_ahead_ = std::move(ahead);
}

Result<std::shared_ptr<membership::StateBuffer>> ElasticImpl::snapshot_buffer(uint64_t bytes) {
  std::shared_ptr<Ahead> ahead;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (snapshot_ahead_ && snapshot_ahead_->bytes == bytes) ahead = std::move(snapshot_ahead_);
  }
  if (ahead) {
    std::unique_lock<std::mutex> g(ahead->mu);
    ahead->cv.wait(g, [&] { return ahead->done; });
    if (ahead->buffer) return std::move(ahead->buffer);
  }
  return membership::StateBuffer::allocate(bytes);
}

Status ElasticImpl::install_state(const uint8_t* bytes, uint64_t expected_hash) {
  std::lock_guard<std::mutex> lk(mu_);
  // Checked before it replaces anything: the fetched bytes, laid out as the registered state.
  membership::RegisteredState fetched;
  uint64_t off = 0;
  for (auto& [name, d] : state_) {
    fetched[name] = {const_cast<uint8_t*>(bytes) + off, d.second};
    off += d.second;
  }
  uint64_t h = membership::state_hash(fetched);
  if (h != expected_hash)
    return corrupt_data("fetched state hash " + std::to_string(h) + " != the group's " +
                        std::to_string(expected_hash) + "; the registered state is untouched");
  for (auto& [name, d] : state_) std::memcpy(d.first, fetched[name].first, d.second);
  stats_.state_hash = h;
  return Status::ok();
}

// One fetch under way (fetch): its stripes, and the sources they are dealt over.
struct ElasticImpl::Fetching {
  struct Stripe {
    uint64_t off = 0;
    uint64_t len = 0;
    uint32_t src = 0;
    transport::Request req;  // invalid: not asked yet, or to be asked again
    bool have = false;
  };
  const Attempt& a;
  const std::vector<uint32_t>& sources;
  const bool result;  // a collective's result (rolling forward), not the registered state
  uint8_t* const into;
  const std::string what;  // "fetching ...", in messages
  std::vector<Stripe> stripes{};
  std::set<uint32_t> live{};  // the sources still connected and not failed
  std::set<uint32_t> used{};  // the sources asked
  uint64_t reasked = 0;
};

Status ElasticImpl::fetch(const Attempt& a, const std::vector<uint32_t>& sources, bool result,
                          uint8_t* into, uint64_t n) {
  // Stripes of 256 KiB dealt round-robin over the sources, all requested at once (each source
  // keeps only a few on its link at a time: serve_fetches). A source that fails before sending
  // its stripes (killed, frozen past the failure timeout: its connection is aborted) has them
  // asked again of the others, which hold the same snapshot. Every receive this call posts into
  // `into` has finished or been cancelled when it returns, whatever happened: a later fetch
  // never meets a stale receive (each batch has a tag of its own), and `into` may go with the
  // attempt. A result (rolling forward) comes the same way from the members holding it.
  Fetching f{.a = a,
             .sources = sources,
             .result = result,
             .into = into,
             .what = result ? "fetching the result of collective " + std::to_string(a.seq)
                            : std::string("fetching the registered state")};
  constexpr uint64_t kStripe = 256 << 10;
  for (uint64_t off = 0; off < n; off += kStripe) {
    Fetching::Stripe st;
    st.off = off;
    st.len = std::min<uint64_t>(kStripe, n - off);
    st.src = ~0u;
    f.stripes.push_back(std::move(st));
  }
  const auto started = Clock::now();
  f.live = std::set<uint32_t>(sources.begin(), sources.end());
  Status why;
  {
    std::lock_guard<std::mutex> lk(mu_);
    why = ask_stripes(f);
  }
  const auto deadline = started + change_timeout_;
  while (why.is_ok()) {
    transport::Request pending;
    if (collect_stripes(f, pending)) break;
    {
      std::lock_guard<std::mutex> lk(mu_);
      why = fetch_progress(f, deadline);
    }
    if (why.is_ok() && pending.valid())
      (void)pending.wait(Deadline::after(std::chrono::milliseconds(10)));
  }
  end_stripes(f);
  std::lock_guard<std::mutex> lk(mu_);
  if (result) return why;
  stats_.state_stripes_reasked += f.reasked;
  if (!why.is_ok()) return why;
  stats_.state_fetched_bytes = n;
  stats_.state_fetch_time = Clock::now() - started;
  stats_.state_fetch_sources = static_cast<int>(f.used.size());
  return Status::ok();
}

// mu_ held. Asks for every stripe neither held nor in flight, dealt over the live sources, one
// transport tag per source per round.
Status ElasticImpl::ask_stripes(Fetching& f) {
  std::erase_if(f.live, [&](uint32_t id) { return !slots_.count(id) || failed_.count(id); });
  std::vector<Fetching::Stripe*> todo;
  for (auto& st : f.stripes)
    if (!st.have && !st.req.valid()) todo.push_back(&st);
  if (todo.empty()) return Status::ok();
  if (f.live.empty())
    return Status(StatusCode::kAborted,
                  f.what + ": no member holding it is left (asked " + id_list(f.sources) + ")");
  std::map<uint32_t, uint64_t> tags;
  for (uint32_t src : f.live) tags[src] = membership::state_tag(++fetch_batch_);
  auto next = f.live.begin();
  for (Fetching::Stripe* st : todo) {
    if (next == f.live.end()) next = f.live.begin();
    const uint32_t src = *next++;
    if (st->src != ~0u) ++f.reasked;  // its first source failed
    f.used.insert(src);
    st->src = src;
    st->req = slots_.at(src).peer->irecv(tags[src], f.into + st->off, st->len);
    Message m = message(MsgType::kFetch, f.a.seq);
    if (f.result) m.text = "result";
    m.hash = st->off;
    m.length = st->len;
    m.tag = tags[src];
    send_to(src, m);
  }
  return Status::ok();
}

// Marks the stripes that arrived (one that failed is to be asked again); whether all are in.
// `pending`: a receive still in flight, if any.
bool ElasticImpl::collect_stripes(Fetching& f, transport::Request& pending) {
  for (auto& st : f.stripes) {
    if (st.have || !st.req.valid() || !st.req.test()) {
      if (!st.have && st.req.valid() && !pending.valid()) pending = st.req;
      continue;
    }
    if (st.req.status().is_ok()) {
      st.have = true;
    } else {
      LOWCOMM_LOG(kInfo, "elastic member %u: %s: stripe at %llu from member %u: %s", me_,
                  f.what.c_str(), static_cast<unsigned long long>(st.off), st.src,
                  st.req.status().message().c_str());
      st.req = transport::Request();  // ask another member
    }
  }
  return std::all_of(f.stripes.begin(), f.stripes.end(),
                     [](const Fetching::Stripe& st) { return st.have; });
}

// mu_ held. Whether the fetch goes on (asking again for the stripes that failed) or why not.
Status ElasticImpl::fetch_progress(Fetching& f, Clock::time_point deadline) {
  if (!fence_.is_ok()) return fence_;
  if (f.result && roll_seq_ != f.a.seq) {
    // A later view no longer commits it (nobody in it holds it): the attempt aborts.
    return Status(StatusCode::kAborted, f.what + ": a later view aborted it");
  }
  if (!f.result && committed_ < f.a.seq && view_.id != f.a.view) {
    // The attempt aborted (the next view did not commit it): its retry fetches afresh.
    // (Not while the change is still deciding: it may roll the collective forward.)
    return Status(StatusCode::kAborted, "fetching the registered state: collective " +
                                            std::to_string(f.a.seq) + " aborted in view " +
                                            std::to_string(f.a.view));
  }
  if (Clock::now() > deadline) {
    return Status(StatusCode::kTimeout, f.what + ": not complete within " +
                                            std::to_string(change_timeout_.count()) + " ms");
  }
  return ask_stripes(f);
}

// Withdraws every receive still posted, and waits for those already arriving into `into` (they
// finish, or fail when their source is declared failed and its connection aborted).
void ElasticImpl::end_stripes(Fetching& f) {
  std::vector<Fetching::Stripe*> arriving;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& st : f.stripes) {
      if (!st.req.valid() || st.req.test()) continue;
      auto slot = slots_.find(st.src);
      // No slot: lose() aborted its peer, which finished every request before returning.
      if (slot != slots_.end() && !slot->second.peer->cancel(st.req)) arriving.push_back(&st);
    }
  }
  // A stripe arriving is a source still sending: it ends, or its source is declared failed
  // (the failure detector) and its connection aborted, which finishes the receive. Past the
  // bound (a fenced member no longer watches), the connection is aborted here.
  const auto bound = Clock::now() + change_timeout_ + failure_floor_ * 4;
  for (Fetching::Stripe* st : arriving) {
    if (st->req.wait(Deadline::at(bound)).code() != StatusCode::kTimeout) continue;
    std::lock_guard<std::mutex> lk(mu_);
    if (auto slot = slots_.find(st->src); slot != slots_.end()) slot->second.peer->abort();
  }
}

}  // namespace lowcomm
