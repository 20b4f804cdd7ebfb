#pragma once
// The plugin's comm objects, one per NCCL connection end, and their requests.
//
//   ListenComm  a listening socket (listen); accept() turns the next authenticated connection
//               into a RecvComm once the sender's preamble has arrived. A RecvComm does not
//               depend on its ListenComm (NCCL closes the listener right after accept).
//   SendComm    connect(); sends the preamble, then NCCL's messages in order.
//   RecvComm    receives them in order into NCCL's (possibly larger) buffers.
//
// Wire, on top of a transport Peer: a 16-byte preamble on kPreambleTag (magic, version,
// whether messages are framed by the lossless codec), then every isend as one message on
// kDataTag. The receiver posts Peer::irecv_upto with NCCL's size, so the sender's real size
// comes back from the transport; a framed message goes into a staging buffer and is decoded
// into NCCL's buffer when test() finds it complete.
//
// Flow control: each irecv, once posted to the transport, returns a credit (an empty message
// on kCreditTag; the k-th credit says the k-th receive is posted). A send goes to the transport
// at once if its receive is known to be posted, or if the messages sent ahead of their credits
// stay within the eager window (PluginOptions::eager_bytes, about two bandwidth-delay products):
// those wait at the receiver, in memory, until NCCL posts their receives. So a receiver that
// lags holds the sender back instead of piling up its data without bound (NCCL relies on the
// plugin for this), while NCCL's few small steps in flight per connection (8 x 512 KiB by
// default, far less than a WAN's bandwidth-delay product) do not cap the link at one window
// per round trip. Sends waiting for room are posted by the next isend or test on the comm.
//
// Requests: a fixed pool of 32 per comm (NCCL posts at most 8 per connection); isend/irecv
// return a null request (NCCL retries) when the pool is empty. Data moves on the transport's
// engine thread whatever NCCL tests, so testing only the oldest request never stalls a younger
// one. Thread safety: NCCL's service thread creates and closes comms, its progress thread
// posts and tests; a comm's mutex orders the two.

#include <array>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "compress_policy.h"
#include "lowcomm/status.h"
#include "nccl_net_abi.h"
#include "net_shared.h"
#include "transport/listener.h"
#include "transport/peer.h"

namespace lowcomm::nccl_net {

class DataComm;

struct NetRequest {
  DataComm* comm = nullptr;
  bool in_use = false;
  transport::Request transfer;
  void* user = nullptr;          // NCCL's buffer
  size_t size = 0;               // send: bytes; receive: NCCL's posted size
  std::vector<uint8_t> staging;  // framed messages: the frame
  bool framed = false;
  const void* wire = nullptr;  // send: what goes on the wire (NCCL's buffer or the frame)
  size_t wire_bytes = 0;
  bool posted = false;  // send: handed to the transport (it had a credit)
};

class DataComm {
 public:
  virtual ~DataComm();
  DataComm(const DataComm&) = delete;
  DataComm& operator=(const DataComm&) = delete;
  // test(): *done and, when done, the bytes moved. An error when the transfer failed or a
  // received message cannot be decoded; the request is then released.
  Status test(NetRequest& r, bool* done, size_t* bytes);
  const std::string& name() const { return peer_->name(); }

 protected:
  DataComm(std::shared_ptr<NetShared> shared, std::unique_ptr<transport::Peer> peer);
  // A free request, or null when all 32 are in flight. mu_ held.
  NetRequest* take_request();
  virtual Status finish(NetRequest& r, size_t* bytes) = 0;  // mu_ held, transfer ok
  // Moves what waits for the remote side along; a latched error fails r. mu_ held.
  virtual Status progress(NetRequest& /*r*/) { return Status::ok(); }

  std::shared_ptr<NetShared> shared_;
  std::unique_ptr<transport::Peer> peer_;
  std::mutex mu_;
  std::array<NetRequest, abi::kMaxRequests> requests_;
};

class SendComm final : public DataComm {
 public:
  // A connected peer: sends the preamble (framed when compression is configured).
  static std::unique_ptr<SendComm> start(std::shared_ptr<NetShared> shared,
                                         std::unique_ptr<transport::Peer> peer);
  ~SendComm() override;
  // *request null: no request free, try again.
  Status isend(void* data, size_t size, NetRequest** request);

 private:
  SendComm(std::shared_ptr<NetShared> shared, std::unique_ptr<transport::Peer> peer);
  Status finish(NetRequest& r, size_t* bytes) override;
  Status progress(NetRequest& r) override;
  Status encode(NetRequest& r);  // framed: NCCL's bytes into the request's frame
  // Counts the credits that arrived and posts the waiting sends they (or the eager window)
  // allow. mu_ held.
  void absorb_credits();
  void post(NetRequest& r);  // mu_ held, a credit taken
  std::array<uint8_t, 16> preamble_{};
  transport::Request preamble_sent_;
  bool framed_ = false;
  CompressPolicy policy_;
  std::deque<transport::Request> credit_recvs_;  // posted receives for credits, in order
  uint64_t credits_ = 0;                         // received, not yet spent
  std::deque<size_t> unmatched_;                 // sizes of messages sent ahead of credits
  uint64_t unmatched_bytes_ = 0;
  std::deque<NetRequest*> waiting_;  // sends without room yet, in order
  Status failure_;                   // the credit stream failed
};

class RecvComm final : public DataComm {
 public:
  RecvComm(std::shared_ptr<NetShared> shared, std::unique_ptr<transport::Peer> peer, bool framed)
      : DataComm(std::move(shared), std::move(peer)), framed_(framed) {}
  ~RecvComm() override;
  Status irecv(void* data, size_t size, NetRequest** request);

 private:
  Status finish(NetRequest& r, size_t* bytes) override;
  bool framed_;
  uint64_t raw_bytes_ = 0, wire_bytes_ = 0;
};

class ListenComm {
 public:
  static Result<std::unique_ptr<ListenComm>> create(std::shared_ptr<NetShared> shared);
  const transport::SocketAddress& address() const { return listener_->address(); }
  // A RecvComm once a connection is authenticated and its preamble read; null until then. An
  // error when the listening socket fails, the preamble is malformed, or connections were
  // refused (wrong secret) and none succeeded within the handshake timeout.
  Result<std::unique_ptr<RecvComm>> accept();

 private:
  ListenComm() = default;
  std::shared_ptr<NetShared> shared_;
  std::unique_ptr<transport::Listener> listener_;
  std::unique_ptr<transport::Peer> pending_;  // authenticated, preamble not yet read
  std::array<uint8_t, 16> preamble_{};
  transport::Request preamble_recv_;
  uint64_t rejected_seen_ = 0;
  Deadline refused_deadline_ = Deadline::none();
};

// Bytes on the wire between the two ends.
inline constexpr uint64_t kPreambleTag = 1;
inline constexpr uint64_t kDataTag = 2;
inline constexpr uint64_t kCreditTag = 3;  // receiver -> sender, one empty message per irecv
// Credit receives a send comm keeps posted (more than NCCL can have receives in flight).
inline constexpr int kCreditWindow = 2 * abi::kMaxRequests;

}  // namespace lowcomm::nccl_net
