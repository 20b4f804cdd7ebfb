#include "transport/listener.h"

#include <sys/socket.h>

#include "core/log.h"
#include "core/sys_check.h"
#include "transport/socket_options.h"

namespace lowcomm::transport {

Result<bool> AcceptOp::test() {
  if (peer_) return true;
  auto p = listener_->test_accept();
  if (!p) return p.status();
  peer_ = std::move(p).value();
  return peer_ != nullptr;
}

Result<std::unique_ptr<Listener>> Listener::create(std::shared_ptr<ProgressEngine> engine,
                                                   const PeerConfig& config,
                                                   std::optional<SocketAddress> bind) {
  if (config.secret.empty()) return invalid_argument("listen: the communicator secret is empty");
  SocketAddress addr;
  if (bind) {
    addr = *bind;
  } else {
    auto chosen = select_listen_address();
    if (!chosen) return chosen.status();
    addr = *chosen;
  }
  auto fd = make_tcp_socket(addr);
  if (!fd) return fd.status();
  int one = 1;
  ::setsockopt(fd->get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  // Accepted sockets inherit the buffer sizes, and the window scale is fixed at the SYN.
  request_socket_buffers(fd->get(), config.socket_buffer_bytes);
  std::string who = "listen address " + addr.to_string();
  LOWCOMM_CHECK_SYS(::bind(fd->get(), addr.sockaddr_ptr(), addr.length()), who);
  LOWCOMM_CHECK_SYS(::listen(fd->get(), SOMAXCONN), who);
  return adopt(std::move(engine), config, std::move(fd).value());
}

Result<std::unique_ptr<Listener>> Listener::adopt(std::shared_ptr<ProgressEngine> engine,
                                                  const PeerConfig& config, UniqueFd listening) {
  if (config.secret.empty()) return invalid_argument("listen: the communicator secret is empty");
  if (!listening) return invalid_argument("listen: no listening socket to adopt");
  LOWCOMM_CHECK(set_nonblocking(listening.get()));
  std::unique_ptr<Listener> l(new Listener());
  l->engine_ = std::move(engine);
  l->config_ = config;
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  LOWCOMM_CHECK_SYS(::getsockname(listening.get(), reinterpret_cast<sockaddr*>(&bound), &len),
                    "a listening socket");
  auto actual = SocketAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&bound), len);
  if (!actual) return actual.status();
  l->address_ = *actual;
  l->fd_ = std::move(listening);
  LOWCOMM_LOG(kInfo, "listening on %s", l->address_.to_string().c_str());
  return l;
}

// The first drops are logged each, then every 1000th with the count: a flood of foreign
// connections must not become a flood of log lines (writing them cost more than the drops).
void Listener::drop(const std::string& who, const Status& why) {
  ++rejected_;
  if (rejected_ <= 10 || rejected_ % 1000 == 0)
    LOWCOMM_LOG(kWarn, "dropping connection from %s: %s (%llu dropped on %s so far%s)", who.c_str(),
                why.to_string().c_str(), static_cast<unsigned long long>(rejected_),
                address_.to_string().c_str(),
                rejected_ == 10 ? "; further drops are logged every 1000th" : "");
}

void Listener::accept_pending() {
  while (true) {
    sockaddr_storage from{};
    socklen_t len = sizeof(from);
    int cfd = static_cast<int>(LOWCOMM_SYS_RETRY(::accept4(
        fd_.get(), reinterpret_cast<sockaddr*>(&from), &len, SOCK_NONBLOCK | SOCK_CLOEXEC)));
    if (cfd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // Transient per-connection errors: the client gave up, or we are out of fds for now.
      if (errno == ECONNABORTED || errno == EPROTO || errno == EMFILE || errno == ENFILE ||
          errno == ENOBUFS || errno == ENOMEM) {
        LOWCOMM_LOG(kWarn, "%s",
                    sys_error("accept4", address_.to_string(), errno).to_string().c_str());
        return;
      }
      failure_ = sys_error("accept4", "listen address " + address_.to_string(), errno);
      return;
    }
    UniqueFd fd(cfd);
    auto peer_addr = SocketAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&from), len);
    std::string who = peer_addr ? peer_addr->to_string() : "?";
    Status nd = set_nodelay(fd.get(), who);
    if (!nd) {
      drop(who, nd);
      continue;
    }
    pending_.push_back(StreamHandshake::server(
        std::move(fd), who, config_.secret, static_cast<uint32_t>(config_.local_rank), config_.seal,
        Deadline::after_seconds(config_.handshake_timeout_s)));
  }
}

void Listener::advance_handshakes() {
  for (size_t i = 0; i < pending_.size();) {
    StreamHandshake& h = pending_[i];
    Status s = h.advance();
    if (!s) {
      drop(h.peer_name(), s);
      pending_.erase(pending_.begin() + static_cast<long>(i));
      continue;
    }
    if (!h.done()) {
      ++i;
      continue;
    }
    // A copy: h is erased from pending_ below, before hello.rank is used.
    const HelloInfo hello = h.hello();
    if (hello.streams < 1 || hello.streams > kMaxStreams || hello.stream_index >= hello.streams) {
      drop(h.peer_name(), corrupt_data("bad stream index " + std::to_string(hello.stream_index) +
                                       " of " + std::to_string(hello.streams)));
      pending_.erase(pending_.begin() + static_cast<long>(i));
      continue;
    }
    auto key = std::make_pair(hello.rank, hello.connection_id);
    Group& g = groups_[key];
    if (g.fds.empty()) {
      g.fds.resize(hello.streams);
      g.address = h.peer_name();
      g.deadline = h.deadline();
    }
    if (g.fds.size() != hello.streams || g.fds[hello.stream_index].fd) {
      drop(h.peer_name(), corrupt_data("inconsistent or duplicate stream in one connection"));
      pending_.erase(pending_.begin() + static_cast<long>(i));
      continue;
    }
    g.fds[hello.stream_index] = h.release();
    pending_.erase(pending_.begin() + static_cast<long>(i));
    if (++g.arrived == static_cast<int>(g.fds.size())) {
      auto peer =
          Peer::attach(engine_, std::move(g.fds), static_cast<int>(hello.rank), g.address, config_);
      groups_.erase(key);
      if (peer) {
        ready_.push_back(std::move(peer).value());
      } else {
        LOWCOMM_LOG(kWarn, "attaching a peer failed: %s", peer.status().to_string().c_str());
      }
    }
  }
  // Connections whose other streams never came.
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (it->second.deadline.expired()) {
      drop(it->second.address, Status(StatusCode::kTimeout, "not all streams arrived in time"));
      it = groups_.erase(it);
    } else {
      ++it;
    }
  }
}

Result<std::unique_ptr<Peer>> Listener::test_accept() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.is_ok()) return failure_;
  accept_pending();
  if (!failure_.is_ok()) return failure_;
  advance_handshakes();
  if (ready_.empty()) return std::unique_ptr<Peer>();
  auto p = std::move(ready_.front());
  ready_.pop_front();
  return p;
}

std::vector<pollfd> Listener::poll_fds() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<pollfd> fds{{fd_.get(), POLLIN, 0}};
  for (const auto& h : pending_) fds.push_back({h.fd(), h.poll_events(), 0});
  return fds;
}

uint64_t Listener::rejected_connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rejected_;
}

Result<std::unique_ptr<Peer>> Listener::accept(Deadline deadline) {
  deadline = deadline.resolve();
  while (true) {
    auto p = test_accept();
    if (!p || *p) return p;
    if (deadline.expired())
      return Status(StatusCode::kTimeout, "accept on " + address_.to_string() +
                                              ": no peer connected before the deadline");
    auto fds = poll_fds();
    // Capped so handshake deadlines of silent clients are noticed.
    ::poll(fds.data(), fds.size(), deadline.poll_timeout_ms(100));
  }
}

}  // namespace lowcomm::transport
