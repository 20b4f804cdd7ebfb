#pragma once
// Listener: the accept side of peer set-up. It owns a non-blocking listening socket and every
// connection still in its handshake. test_accept() never blocks: it accepts what is pending,
// advances every handshake, groups authenticated streams by (client rank, connection id), and
// returns a Peer once all of a connection's streams have arrived. Connections that fail
// authentication, break the protocol (a client writing garbage), or stay silent past
// config.handshake_timeout_s are closed and logged; they never surface as peers, and they never
// hold up a legitimate client, whose handshakes proceed alongside.
//
//   auto l = Listener::create(engine, config);          // interface from LOWCOMM_SOCKET_IFNAME
//   auto op = l->start_accept();  while (!*op.test()) {...}  auto peer = op.take_peer();
//   auto peer = l->accept(Deadline::after(30s));          // blocking wrapper
//
// Thread safety: all methods may be called from any thread; an internal mutex serialises them.

#include <poll.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/deadline.h"
#include "core/unique_fd.h"
#include "transport/handshake.h"
#include "transport/peer.h"
#include "transport/socket_address.h"

namespace lowcomm::transport {

class Listener;

// One accept in progress: test() until it returns true, then take_peer().
class AcceptOp {
 public:
  explicit AcceptOp(Listener& listener) : listener_(&listener) {}
  Result<bool> test();
  std::unique_ptr<Peer> take_peer() { return std::move(peer_); }

 private:
  Listener* listener_;
  std::unique_ptr<Peer> peer_;
};

class Listener {
 public:
  // Binds `bind` (port 0 allowed) or, without one, select_listen_address().
  static Result<std::unique_ptr<Listener>> create(std::shared_ptr<ProgressEngine> engine,
                                                  const PeerConfig& config,
                                                  std::optional<SocketAddress> bind = {});
  // Takes over a socket that is already bound and listening (e.g. opened when a communicator
  // id was created, before the process forked); it is made non-blocking here.
  static Result<std::unique_ptr<Listener>> adopt(std::shared_ptr<ProgressEngine> engine,
                                                 const PeerConfig& config, UniqueFd listening);
  const SocketAddress& address() const { return address_; }  // with the bound port

  AcceptOp start_accept() { return AcceptOp(*this); }
  // A newly connected peer, or nullptr when none is complete yet. An error only when the
  // listening socket itself fails; bad clients are dropped, logged and counted.
  Result<std::unique_ptr<Peer>> test_accept();
  Result<std::unique_ptr<Peer>> accept(Deadline deadline = {});
  std::vector<pollfd> poll_fds() const;
  uint64_t rejected_connections() const;

 private:
  struct Group {  // streams of one connection attempt, by stream index
    std::vector<StreamSocket> fds;
    int arrived = 0;
    std::string address;
    Deadline deadline;
  };
  Listener() = default;
  void accept_pending();                                 // mu_ held
  void advance_handshakes();                             // mu_ held
  void drop(const std::string& who, const Status& why);  // mu_ held

  std::shared_ptr<ProgressEngine> engine_;
  PeerConfig config_;
  SocketAddress address_;
  UniqueFd fd_;
  mutable std::mutex mu_;  // guards everything below
  std::vector<StreamHandshake> pending_;
  std::map<std::pair<uint32_t, uint64_t>, Group> groups_;
  std::deque<std::unique_ptr<Peer>> ready_;
  uint64_t rejected_ = 0;
  Status failure_;
};

}  // namespace lowcomm::transport
