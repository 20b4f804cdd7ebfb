#pragma once
// ConnectOp: the client side of peer set-up, never blocking the caller. start() opens
// config.streams non-blocking sockets to the remote listener; each call to test() advances every
// stream's handshake (handshake.h) as far as the sockets allow. When all streams are
// authenticated, test() returns true and take_peer() hands over the Peer.
//
//   auto op = ConnectOp::start(engine, addr, config);   // returns at once
//   while (!*op->test()) do_other_work();                // or poll op->poll_fds()
//
// connect_peer() is the blocking wrapper: it polls the sockets until done or the deadline, and
// retries a refused connection (the remote listener may not be up yet) until the deadline.
//
// Thread safety: one ConnectOp is driven by one thread at a time.

#include <poll.h>

#include <memory>
#include <vector>

#include "core/deadline.h"
#include "transport/handshake.h"
#include "transport/peer.h"
#include "transport/socket_address.h"

namespace lowcomm::transport {

class ConnectOp {
 public:
  static Result<std::unique_ptr<ConnectOp>> start(std::shared_ptr<ProgressEngine> engine,
                                                  const SocketAddress& remote,
                                                  const PeerConfig& config);
  // true: done, take_peer() is ready; false: in progress; error: failed (the sockets are closed).
  Result<bool> test();
  // After test() failed: whether the server never answered (StreamHandshake::server_silent).
  bool server_silent() const { return server_silent_; }
  std::unique_ptr<Peer> take_peer() { return std::move(peer_); }
  // What to poll before the next test().
  std::vector<pollfd> poll_fds() const;

 private:
  ConnectOp() = default;
  std::shared_ptr<ProgressEngine> engine_;
  SocketAddress remote_;
  PeerConfig config_;
  std::vector<StreamHandshake> streams_;
  std::unique_ptr<Peer> peer_;
  Status failure_;
  bool done_ = false;
  bool server_silent_ = false;
};

Result<std::unique_ptr<Peer>> connect_peer(std::shared_ptr<ProgressEngine> engine,
                                           const SocketAddress& remote, const PeerConfig& config,
                                           Deadline deadline = {});

}  // namespace lowcomm::transport
