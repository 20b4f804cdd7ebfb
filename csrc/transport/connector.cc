#include "transport/connector.h"

#include <openssl/rand.h>
#include <sys/socket.h>

#include <thread>

#include "core/log.h"
#include "core/sys_check.h"
#include "transport/socket_options.h"

namespace lowcomm::transport {

Result<std::unique_ptr<ConnectOp>> ConnectOp::start(std::shared_ptr<ProgressEngine> engine,
                                                    const SocketAddress& remote,
                                                    const PeerConfig& config) {
  if (config.secret.empty()) return invalid_argument("connect: the communicator secret is empty");
  if (config.streams < 1 || config.streams > kMaxStreams)
    return invalid_argument("connect: streams must be 1 to " + std::to_string(kMaxStreams));
  std::unique_ptr<ConnectOp> op(new ConnectOp());
  op->engine_ = std::move(engine);
  op->remote_ = remote;
  op->config_ = config;
  uint64_t connection_id = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&connection_id), sizeof(connection_id)) != 1)
    return internal_error("OpenSSL RAND_bytes failed");
  Deadline handshake_deadline = Deadline::after_seconds(config.handshake_timeout_s);
  std::string who = remote.to_string();
  for (int i = 0; i < config.streams; ++i) {
    auto fd = make_tcp_socket(remote);
    if (!fd) return fd.status();
    request_socket_buffers(fd->get(), config.socket_buffer_bytes);
    Status nd = set_nodelay(fd->get(), who);
    if (!nd) return nd;
    int r = static_cast<int>(
        LOWCOMM_SYS_RETRY(::connect(fd->get(), remote.sockaddr_ptr(), remote.length())));
    if (r != 0 && errno != EINPROGRESS) return sys_error("connect", who, errno);
    HelloInfo hello;
    hello.rank = static_cast<uint32_t>(config.local_rank);
    hello.stream_index = static_cast<uint16_t>(i);
    hello.streams = static_cast<uint16_t>(config.streams);
    hello.connection_id = connection_id;
    hello.seal = config.seal;
    op->streams_.push_back(StreamHandshake::client(std::move(fd).value(), who, config.secret, hello,
                                                   handshake_deadline));
  }
  return op;
}

Result<bool> ConnectOp::test() {
  if (!failure_.is_ok()) return failure_;
  if (done_) return true;
  bool all_done = true;
  for (auto& h : streams_) {
    Status s = h.advance();
    if (!s) {
      failure_ = s;
      server_silent_ = h.server_silent();
      if (server_silent_) {
        LOWCOMM_LOG(kInfo, "connect to %s: %s", remote_.to_string().c_str(), s.to_string().c_str());
      } else {
        LOWCOMM_LOG(kWarn, "connect to %s: %s", remote_.to_string().c_str(), s.to_string().c_str());
      }
      streams_.clear();  // closes every socket of this attempt
      return failure_;
    }
    all_done = all_done && h.done();
  }
  if (!all_done) return false;
  uint32_t remote_rank = streams_[0].server_rank();
  std::vector<StreamSocket> fds;
  for (auto& h : streams_) fds.push_back(h.release());
  streams_.clear();
  auto peer = Peer::attach(engine_, std::move(fds), static_cast<int>(remote_rank),
                           remote_.to_string(), config_);
  if (!peer) {
    failure_ = peer.status();
    return failure_;
  }
  peer_ = std::move(peer).value();
  done_ = true;
  return true;
}

std::vector<pollfd> ConnectOp::poll_fds() const {
  std::vector<pollfd> fds;
  for (const auto& h : streams_)
    if (!h.done()) fds.push_back({h.fd(), h.poll_events(), 0});
  return fds;
}

Result<std::unique_ptr<Peer>> connect_peer(std::shared_ptr<ProgressEngine> engine,
                                           const SocketAddress& remote, const PeerConfig& config,
                                           Deadline deadline) {
  deadline = deadline.resolve();
  auto backoff = std::chrono::milliseconds(10);
  while (true) {
    auto op = ConnectOp::start(engine, remote, config);
    if (!op) return op.status();
    while (true) {
      auto r = (*op)->test();
      if (!r) {
        // Retry while nobody answers (a refused connect included): the listener may not be up
        // yet, or its socket exists (opened with the id) but nobody accepts on it yet.
        if (!(*op)->server_silent() || deadline.expired()) return r.status();
        break;
      }
      if (*r) return (*op)->take_peer();
      if (deadline.expired())
        return Status(StatusCode::kTimeout,
                      "connect to " + remote.to_string() + ": not connected before the deadline");
      auto fds = (*op)->poll_fds();
      ::poll(fds.data(), fds.size(), deadline.poll_timeout_ms(100));
    }
    std::this_thread::sleep_for(std::min(
        backoff, std::chrono::duration_cast<std::chrono::milliseconds>(deadline.remaining())));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

}  // namespace lowcomm::transport
