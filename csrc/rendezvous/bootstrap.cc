#include "rendezvous/bootstrap.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>

#include "core/little_endian.h"
#include "core/log.h"
#include "core/sys_check.h"
#include "rendezvous/listen_address.h"
#include "rendezvous/root_socket.h"
#include "transport/connector.h"
#include "transport/listener.h"

namespace lowcomm::rendezvous {
namespace {

using namespace transport;  // NOLINT

constexpr uint32_t kHelloMagic = 0x3142434Cu;  // "LCB1"
constexpr uint32_t kTableMagic = 0x3154434Cu;  // "LCT1"
constexpr uint32_t kReadyMagic =
    0x3152434Cu;  // "LCR1": a rank to the root, its mesh built or why not
constexpr uint32_t kVerdictMagic = 0x3156434Cu;  // "LCV1": the root to every rank, go or why not
// hello and table entry: magic, rank, nranks, len, address, ..., u32 flags (the last 4 bytes)
constexpr size_t kEntryBytes = 128;
constexpr size_t kAddressMax = kEntryBytes - 20;
constexpr size_t kFlagsOffset = kEntryBytes - 4;
constexpr size_t kTableHeaderBytes = 256;  // magic, status, nranks, text length, text
constexpr size_t kTableTextMax = kTableHeaderBytes - 16;
constexpr auto kTableGrace = std::chrono::seconds(3);

using Bytes = std::vector<uint8_t>;

// The waits of init for other ranks: until the init deadline, or, with a join timeout
// (CommOptions::join_timeout), until that long after the wait began, whichever is first. `why`
// says which one ended a wait, for the error.
struct InitClock {
  Deadline init;
  std::chrono::milliseconds join{0};

  // A wait for others that begins now and may last `joins` join timeouts.
  Deadline from_now(int joins = 1) const {
    if (join.count() <= 0) return init;
    Deadline d = Deadline::after(joins * join);
    return d.time() < init.time() ? d : init;
  }
  // What ended a wait until `d` (from from_now(joins), or a grace past the init deadline), for
  // the error.
  std::string why(const Deadline& d, int joins = 1) const {
    if (join.count() <= 0 || d.time() >= init.time()) return "before the init deadline";
    return "within " + std::to_string(joins * join.count()) + " ms (" +
           (joins == 1 ? "" : std::to_string(joins) + "x ") +
           "the join timeout; frozen, gone or late)";
  }
};

Bytes make_entry(uint32_t magic, int rank, int nranks, const std::string& address, uint32_t flags) {
  Bytes b(kEntryBytes, 0);
  store_le32(b.data(), magic);
  store_le32(b.data() + 4, static_cast<uint32_t>(rank));
  store_le32(b.data() + 8, static_cast<uint32_t>(nranks));
  size_t len = std::min(address.size(), kAddressMax);
  store_le32(b.data() + 12, static_cast<uint32_t>(len));
  std::memcpy(b.data() + 16, address.data(), len);
  store_le32(b.data() + kFlagsOffset, flags);
  return b;
}

Result<std::string> entry_address(const uint8_t* e) {
  uint32_t len = load_le32(e + 12);
  if (len == 0 || len > kAddressMax)
    return corrupt_data("bad address length in a bootstrap message");
  return std::string(reinterpret_cast<const char*>(e + 16), len);
}

// A joiner claiming more ranks than this is not sent a table sized for it (it fails on the
// length instead): bounds what a confused joiner can make the root allocate.
constexpr uint32_t kMaxTableRanks = 1u << 16;

Bytes make_table(int nranks, const std::string& error, const BootstrapTable& entries) {
  Bytes b(kTableHeaderBytes + kEntryBytes * static_cast<size_t>(nranks), 0);
  store_le32(b.data(), kTableMagic);
  store_le32(b.data() + 4, error.empty() ? 0 : 1);
  store_le32(b.data() + 8, static_cast<uint32_t>(nranks));
  size_t tl = std::min(error.size(), kTableTextMax);
  store_le32(b.data() + 12, static_cast<uint32_t>(tl));
  std::memcpy(b.data() + 16, error.data(), tl);
  for (size_t r = 0; r < entries.addresses.size() && r < static_cast<size_t>(nranks); ++r) {
    Bytes e = make_entry(kHelloMagic, static_cast<int>(r), nranks, entries.addresses[r],
                         entries.flags[r]);
    std::memcpy(b.data() + kTableHeaderBytes + r * kEntryBytes, e.data(), kEntryBytes);
  }
  return b;
}

// Ready and verdict messages: the table's header alone (magic, status, 0, text length, text).
Bytes make_status(uint32_t magic, const std::string& error) {
  Bytes b = make_table(0, error, {});
  store_le32(b.data(), magic);
  return b;
}

// ok, or the failure a ready/verdict message carries; a malformed one is kCorruptData.
Status read_status(const Bytes& b, uint32_t magic, const std::string& who) {
  if (load_le32(b.data()) != magic) return corrupt_data(who + " sent a malformed init message");
  if (load_le32(b.data() + 4) == 0) return Status::ok();
  uint32_t tl = std::min<uint32_t>(load_le32(b.data() + 12), kTableTextMax);
  return Status(StatusCode::kRemoteError,
                std::string(reinterpret_cast<const char*>(b.data() + 16), tl));
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

Result<std::unique_ptr<Listener>> open_listener(const UniqueId& id, int rank,
                                                const CommOptions& options,
                                                std::shared_ptr<ProgressEngine> engine,
                                                const PeerConfig& config,
                                                const SocketAddress& root) {
  if (rank == 0) {
    UniqueFd pre = take_root_socket(id.to_string());
    if (pre) return Listener::adopt(std::move(engine), config, std::move(pre));
    return Listener::create(std::move(engine), config, root);
  }
  auto a = listen_address_for(options.listen_address, id.root_address);
  if (!a) return a.status();
  return Listener::create(std::move(engine), config, *a);
}

// Waits for socket activity, or 2 ms: hellos and ready messages complete on the engine thread
// without waking this poll, so a longer slice would be added to init whole (a quiet init,
// nothing else waking the poll, waited out every slice).
void poll_some(std::vector<pollfd> fds, const Deadline& deadline) {
  ::poll(fds.empty() ? nullptr : fds.data(), fds.size(), deadline.poll_timeout_ms(2));
}

// Rank 0: accept every other rank, collect hellos, send the table.
// ready[r]/ready_req[r]: rank r's ready message, posted with its hello so that a rank whose
// connection ends at any point of init is noticed at once.
Status root_gather(Listener& listener, int nranks, const InitClock& clock,
                   std::vector<std::unique_ptr<Peer>>& peers, std::vector<Bytes>& ready,
                   std::vector<Request>& ready_req, uint32_t my_flags, BootstrapTable& table_out) {
  const Deadline& deadline = clock.init;
  const Deadline join = clock.from_now();
  std::vector<Bytes> hello(nranks, Bytes(kEntryBytes));
  std::vector<Request> hello_req(nranks);
  std::string error;
  StatusCode code = StatusCode::kInvalidArgument;  // of `error`
  while (true) {
    auto p = listener.test_accept();
    if (!p) return p.status();
    if (*p) {
      int r = (*p)->remote_rank();
      if (r <= 0 || r >= nranks || peers[r]) {
        LOWCOMM_LOG(kWarn, "init: dropping %s: rank %d is out of range or already joined",
                    (*p)->name().c_str(), r);
        if (error.empty())
          error = "a process claiming rank " + std::to_string(r) + " joined a group of " +
                  std::to_string(nranks) + " ranks" + (r > 0 && r < nranks ? " twice" : "");
      } else {
        peers[r] = std::move(p).value();
        hello_req[r] = peers[r]->irecv(kBootstrapTag, hello[r].data(), kEntryBytes);
        ready_req[r] = peers[r]->irecv(kBootstrapTag, ready[r].data(), ready[r].size());
      }
      continue;
    }
    std::vector<int> missing;
    for (int r = 1; r < nranks; ++r) {
      if (!peers[r] || !hello_req[r].test()) missing.push_back(r);
      // A joined rank that is gone (killed, crashed, gave up) fails init now, not at the
      // deadline; its ready message cannot have come before the table.
      if (peers[r] && ready_req[r].test() && error.empty()) {
        Status st = ready_req[r].status();
        error =
            "rank " + std::to_string(r) + " failed during init: " +
            (st.is_ok() ? std::string("it reported ready before the address table") : st.message());
        code = st.is_ok() ? StatusCode::kCorruptData : StatusCode::kRemoteError;
      }
    }
    if (missing.empty() || !error.empty()) break;
    if (join.expired()) {
      error = "rank(s) " + rank_list(missing) +
              (join.time() < deadline.time()
                   ? " did not join the root at " + listener.address().to_string() + " " +
                         clock.why(join)
                   : " never joined (the root at " + listener.address().to_string() +
                         " waited until the init deadline)");
      code = StatusCode::kTimeout;
      break;
    }
    poll_some(listener.poll_fds(), join);
  }
  BootstrapTable entries;
  entries.addresses.resize(nranks);
  entries.flags.assign(nranks, 0);
  entries.addresses[0] = listener.address().to_string();
  entries.flags[0] = my_flags;
  for (int r = 1; r < nranks && error.empty(); ++r) {
    Status s = hello_req[r].status();
    if (!s) {
      error = "receiving rank " + std::to_string(r) + "'s hello: " + s.message();
      code = s.code();
      break;
    }
    const uint8_t* h = hello[r].data();
    if (load_le32(h) != kHelloMagic || load_le32(h + 4) != static_cast<uint32_t>(r)) {
      error = "rank " + std::to_string(r) + " sent a malformed hello";
      code = StatusCode::kCorruptData;
    } else if (load_le32(h + 8) != static_cast<uint32_t>(nranks)) {
      error = "rank " + std::to_string(r) + " was started with nranks " +
              std::to_string(load_le32(h + 8)) + ", the root with " + std::to_string(nranks);
    } else {
      auto a = entry_address(h);
      if (!a) {
        error = a.status().message();
      } else {
        entries.addresses[r] = *a;
        entries.flags[r] = load_le32(h + kFlagsOffset);
      }
    }
  }
  if (error.empty()) table_out = entries;
  // Tell everyone who is connected, the reason included, so nobody waits for its deadline.
  // Each joiner receives a table of the size it expects (its own nranks, from its hello), so
  // one started with another nranks reads the reason instead of failing on the length.
  Bytes table = make_table(nranks, error, entries);
  std::vector<Bytes> odd_tables(nranks);
  std::vector<Request> sends;
  for (int r = 1; r < nranks; ++r) {
    if (!peers[r]) continue;
    const Bytes* t = &table;
    if (hello_req[r].test() && hello_req[r].status().is_ok()) {
      uint32_t theirs = load_le32(hello[r].data() + 8);
      if (theirs != static_cast<uint32_t>(nranks) && theirs > 0 && theirs <= kMaxTableRanks) {
        odd_tables[r] = make_table(static_cast<int>(theirs), error, {});
        t = &odd_tables[r];
      }
    }
    sends.push_back(peers[r]->isend(kBootstrapTag, t->data(), t->size()));
  }
  for (auto& s : sends) {
    Status st = s.wait(deadline);
    if (!st && error.empty()) {
      error = st.message();
      code = st.code();
    }
  }
  if (!error.empty()) {
    for (auto& p : peers)
      if (p) p->abort();  // no request may still reference `table` or `hello`
    return Status(code, error);
  }
  return Status::ok();
}

// Rank 0, after the table: waits for every rank's ready message (its mesh connections are
// built) and answers all of them with one verdict: go, or the first failure, naming the rank
// and its cause. A rank that fails or dies while building its connections thereby reaches
// every other rank at once instead of at their init deadline.
Status root_confirm(Listener& listener, int nranks, const InitClock& clock,
                    std::vector<std::unique_ptr<Peer>>& peers, std::vector<Bytes>& ready,
                    std::vector<Request>& ready_req) {
  const Deadline& deadline = clock.init;
  const Deadline join = clock.from_now();
  Status verdict;
  while (verdict.is_ok()) {
    // Every rank has joined: anything completing a handshake now is not one of ours.
    auto acc = listener.test_accept();
    if (!acc) return acc.status();
    if (*acc) {
      LOWCOMM_LOG(kWarn, "init: dropping %s: every rank has joined", (*acc)->name().c_str());
      continue;
    }
    std::vector<int> waiting;
    for (int r = 1; r < nranks && verdict.is_ok(); ++r) {
      if (!ready_req[r].test()) {
        waiting.push_back(r);
        continue;
      }
      Status st = ready_req[r].status();
      if (!st) {
        verdict = Status(StatusCode::kRemoteError,
                         "rank " + std::to_string(r) + " failed during init: " + st.message());
      } else if (Status rs = read_status(ready[r], kReadyMagic, "rank " + std::to_string(r)); !rs) {
        verdict =
            Status(rs.code(), "rank " + std::to_string(r) + " failed during init: " + rs.message());
      }
    }
    if (!verdict || waiting.empty()) break;
    if (join.expired()) {
      verdict = Status(StatusCode::kTimeout, "rank(s) " + rank_list(waiting) +
                                                 " did not finish connecting " + clock.why(join));
      break;
    }
    (void)ready_req[waiting.front()].wait(Deadline::after(std::chrono::milliseconds(2)));
  }
  Bytes msg = make_status(kVerdictMagic, verdict.is_ok() ? std::string() : verdict.message());
  std::vector<Request> sends;
  for (int r = 1; r < nranks; ++r)
    sends.push_back(peers[r]->isend(kBootstrapTag, msg.data(), msg.size()));
  for (auto& s : sends) {
    Status st = s.wait(Deadline::at(deadline.resolve().time() + kTableGrace));
    if (!st && verdict.is_ok()) verdict = st;
  }
  if (!verdict) {
    for (auto& p : peers)
      if (p) p->abort();  // no request may still reference `msg` or `ready`
  }
  return verdict;
}

// Rank r > 0: join through the root, get the table.
// Takes a peer the listener completed: a rank above ours (it connects to us), once.
void take_accepted(std::unique_ptr<Peer> p, int rank, int nranks,
                   std::vector<std::unique_ptr<Peer>>& peers) {
  int j = p->remote_rank();
  if (j <= rank || j >= nranks || peers[j]) {
    LOWCOMM_LOG(kWarn, "init: rank %d dropping %s: unexpected rank", rank, p->name().c_str());
    return;
  }
  peers[j] = std::move(p);
}

// While the table is on its way the listener is served too: foreign connections are
// authenticated or dropped from the moment it opens, so its backlog never fills, and ranks
// that got the table first may already connect.
Result<BootstrapTable> join_root(const SocketAddress& root, int rank, int nranks,
                                 const std::string& my_address, uint32_t my_flags,
                                 std::shared_ptr<ProgressEngine> engine, const PeerConfig& config,
                                 const InitClock& clock, Listener& listener,
                                 std::vector<std::unique_ptr<Peer>>& peers) {
  const Deadline& deadline = clock.init;
  std::unique_ptr<Peer>& root_peer = peers[0];
  const Deadline join = clock.from_now();
  auto p = connect_peer(std::move(engine), root, config, join);
  if (!p && p.status().code() == StatusCode::kTimeout && join.time() < deadline.time())
    return Status(StatusCode::kTimeout, "connecting to the root (rank 0) at " + root.to_string() +
                                            ": no answer " + clock.why(join));
  if (!p)
    return Status(p.status().code(), "connecting to the root (rank 0) at " + root.to_string() +
                                         ": " + p.status().message());
  root_peer = std::move(p).value();
  if (root_peer->remote_rank() != 0)
    return Status(StatusCode::kRemoteError, "the process at the root address " + root.to_string() +
                                                " is rank " +
                                                std::to_string(root_peer->remote_rank()));
  Bytes hello = make_entry(kHelloMagic, rank, nranks, my_address, my_flags);
  Bytes table(kTableHeaderBytes + kEntryBytes * static_cast<size_t>(nranks));
  Request s = root_peer->isend(kBootstrapTag, hello.data(), hello.size());
  Request t = root_peer->irecv(kBootstrapTag, table.data(), table.size());
  // The root names missing ranks when the deadline passes; give its answer time to arrive. With
  // a join timeout the root, which is up (it answered), names them within one join timeout of
  // this connection: a second is its answer's grace.
  Deadline table_deadline = Deadline::at(deadline.resolve().time() + kTableGrace);
  const Deadline table_join = clock.from_now(2);
  if (clock.join.count() > 0 && table_join.time() < table_deadline.time())
    table_deadline = table_join;
  while (!t.test() && !table_deadline.expired()) {
    auto acc = listener.test_accept();
    if (!acc) return acc.status();
    if (*acc) {
      take_accepted(std::move(acc).value(), rank, nranks, peers);
      continue;
    }
    (void)t.wait(Deadline::after(std::chrono::milliseconds(2)));
  }
  Status st = t.test() ? t.status() : Status(StatusCode::kTimeout, "no table");
  if (st.is_ok()) st = s.wait(table_deadline);
  if (!st) {
    root_peer->abort();
    if (st.code() == StatusCode::kTimeout)
      return Status(StatusCode::kTimeout,
                    "no address table from the root (rank 0) " + clock.why(table_deadline, 2));
    return Status(st.code(), "waiting for the address table from the root: " + st.message());
  }
  const uint8_t* h = table.data();
  if (load_le32(h) != kTableMagic) return corrupt_data("the root sent a malformed address table");
  if (load_le32(h + 4) != 0) {
    uint32_t tl = std::min<uint32_t>(load_le32(h + 12), kTableTextMax);
    return Status(
        StatusCode::kRemoteError,
        "the root (rank 0) reports: " + std::string(reinterpret_cast<const char*>(h + 16), tl));
  }
  BootstrapTable entries;
  for (int r = 0; r < nranks; ++r) {
    const uint8_t* e = h + kTableHeaderBytes + static_cast<size_t>(r) * kEntryBytes;
    auto a = entry_address(e);
    if (!a) return a.status();
    entries.addresses.push_back(*a);
    entries.flags.push_back(load_le32(e + kFlagsOffset));
  }
  return entries;
}

// A completed verdict receive: ok for the root's go, else the failure it names.
Status read_verdict(const Request& req, const Bytes& verdict) {
  Status st = req.status();
  if (!st)
    return Status(
        StatusCode::kRemoteError,
        "the root (rank 0) failed during init: its connection ended (" + st.message() + ")");
  Status v = read_status(verdict, kVerdictMagic, "the root (rank 0)");
  if (!v) return Status(v.code(), "init failed elsewhere: " + v.message());
  return v;
}

// Rank r > 0: connect to 0 < j < r, accept r < j < nranks.
Status build_mesh(Listener& listener, int rank, int nranks,
                  const std::vector<std::string>& addresses, std::shared_ptr<ProgressEngine> engine,
                  const PeerConfig& config, const InitClock& clock,
                  std::vector<std::unique_ptr<Peer>>& peers, const Request& verdict_req,
                  const Bytes& verdict) {
  // The root fails init within a join timeout of sending the table when a rank does not get
  // connected; the second is its verdict's grace.
  const Deadline deadline = clock.from_now(2);
  std::vector<std::unique_ptr<ConnectOp>> ops(nranks);
  for (int j = 1; j < rank; ++j) {
    auto a = SocketAddress::parse(addresses[j]);
    if (!a) return a.status();
    auto op = ConnectOp::start(engine, *a, config);
    if (!op)
      return Status(op.status().code(), "connecting to rank " + std::to_string(j) + " at " +
                                            addresses[j] + ": " + op.status().message());
    ops[j] = std::move(op).value();
  }
  while (true) {
    std::vector<pollfd> fds = listener.poll_fds();
    for (int j = 1; j < rank; ++j) {
      if (!ops[j]) continue;
      auto r = ops[j]->test();
      if (!r)
        return Status(r.status().code(), "connecting to rank " + std::to_string(j) + " at " +
                                             addresses[j] + ": " + r.status().message());
      if (*r) {
        auto p = ops[j]->take_peer();
        ops[j].reset();
        if (p->remote_rank() != j)
          return Status(StatusCode::kRemoteError, "the process at rank " + std::to_string(j) +
                                                      "'s address answers as rank " +
                                                      std::to_string(p->remote_rank()));
        peers[j] = std::move(p);
      } else {
        auto more = ops[j]->poll_fds();
        fds.insert(fds.end(), more.begin(), more.end());
      }
    }
    auto acc = listener.test_accept();
    if (!acc) return acc.status();
    if (*acc) {
      take_accepted(std::move(acc).value(), rank, nranks, peers);
      continue;
    }
    // The root's verdict before ours was asked for: another rank failed (or the root did).
    if (verdict_req.test()) {
      Status v = read_verdict(verdict_req, verdict);
      return v.is_ok() ? internal_error("the root said go before this rank was ready") : v;
    }
    std::vector<int> missing;
    for (int j = 1; j < nranks; ++j)
      if (j != rank && !peers[j]) missing.push_back(j);
    if (missing.empty()) return Status::ok();
    if (deadline.expired())
      return Status(StatusCode::kTimeout, "rank(s) " + rank_list(missing) +
                                              " never connected to rank " + std::to_string(rank) +
                                              " " + clock.why(deadline, 2));
    poll_some(std::move(fds), deadline);
  }
}

}  // namespace

Result<Mesh> bootstrap_mesh(const UniqueId& id, int rank, int nranks, const CommOptions& options,
                            uint32_t flags, const PeerConfig& config, Deadline deadline) {
  auto root = SocketAddress::parse(id.root_address);
  if (!root) return root.status();
  Mesh mesh;
  auto engine = ProgressEngine::create("lc-eng-r" + std::to_string(rank));
  if (!engine) return engine.status();
  mesh.engine = *engine;
  mesh.peers.resize(nranks);
  auto listener = open_listener(id, rank, options, mesh.engine, config, *root);
  if (!listener) return listener.status();
  Listener& l = **listener;
  const InitClock clock{deadline, options.join_timeout};
  if (rank == 0) {
    std::vector<Bytes> ready(nranks, Bytes(kTableHeaderBytes));
    std::vector<Request> ready_req(nranks);
    LOWCOMM_CHECK(root_gather(l, nranks, clock, mesh.peers, ready, ready_req, flags, mesh.table));
    LOWCOMM_CHECK(root_confirm(l, nranks, clock, mesh.peers, ready, ready_req));
    return mesh;
  }
  // A rank forked from the process that created the id holds a copy of the root's listening
  // socket: closed here, or connects would queue on it after rank 0 has gone instead of being
  // refused.
  (void)take_root_socket(id.to_string());
  auto table = join_root(*root, rank, nranks, l.address().to_string(), flags, mesh.engine, config,
                         clock, l, mesh.peers);
  if (!table) return table.status();
  mesh.table = *std::move(table);
  // The verdict's receive is posted before anything else can fail, so the root's word about
  // another rank's failure is seen while this one still builds its connections.
  Peer& root_peer = *mesh.peers[0];
  Bytes verdict(kTableHeaderBytes);
  Request verdict_req = root_peer.irecv(kBootstrapTag, verdict.data(), verdict.size());
  Status built = build_mesh(l, rank, nranks, mesh.table.addresses, mesh.engine, config, clock,
                            mesh.peers, verdict_req, verdict);
  // Tell the root either way; on failure it tells everyone, naming this rank and the cause.
  Bytes ready = make_status(kReadyMagic, built.is_ok() ? std::string() : built.message());
  Request sent = root_peer.isend(kBootstrapTag, ready.data(), ready.size());
  Deadline grace = Deadline::at(deadline.resolve().time() + kTableGrace);
  const Deadline verdict_join = clock.from_now(2);  // the root's verdict: see build_mesh
  if (clock.join.count() > 0 && verdict_join.time() < grace.time()) grace = verdict_join;
  if (!built) {
    (void)sent.wait(Deadline::after(std::chrono::seconds(1)));  // best effort
    for (auto& p : mesh.peers)
      if (p) p->abort();
    return built;
  }
  Status st = sent.wait(grace);
  if (st) st = verdict_req.wait(grace);
  if (st) st = read_verdict(verdict_req, verdict);
  if (!st) {
    for (auto& p : mesh.peers)
      if (p) p->abort();  // no request may still reference `ready` or `verdict`
    if (st.code() == StatusCode::kTimeout)
      return Status(StatusCode::kTimeout, "no word from the root (rank 0) " + clock.why(grace, 2));
    return st;
  }
  return mesh;
}

}  // namespace lowcomm::rendezvous
