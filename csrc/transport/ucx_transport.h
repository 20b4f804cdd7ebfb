#pragma once
// UcxTransport: the second transport, for ranks of one site. One UCP context and worker per
// communicator (ucp_init, ucp_worker_create), an endpoint per partner created from the address
// blob the partner sent over lowcomm's own authenticated TCP connection, and tagged messages
// with the same contract as Peer's (peer.h): the k-th isend to a rank on a tag meets that rank's
// k-th irecv on it, lengths must match exactly, failures stick. UCX picks the path: TCP or RDMA
// between hosts; on one host, since endpoints ask for peer failure reporting, which UCX 1.13's
// shared-memory transports lack, its TCP transport over loopback.
//
//   auto site = UcxTransport::create(rank);              // unavailable: built without UCX
//   send site->address() to each partner, receive theirs; site->connect(r, theirs);
//   Request q = site->irecv(r, tag, out, len);      // tag < kMaxTag
//   Request s = site->isend(r, tag, in, len);
//
// Integrity, per partner (connect's `checked`): every message is followed by its XXH3-128 (a
// 16-byte message on the same tag with bit 63 set); the receiver hashes what arrived and fails
// the request with kCorruptData naming the partner on a mismatch, as the TCP transport checks
// every chunk. The communicator checks partners on other hosts (their bytes cross a wire: UCX's
// TCP has only TCP's 16-bit checksum, RDMA only the link's CRC) and not those on its own host:
// there UCX's bytes cross no wire (on this UCX, with peer failure reporting asked for, it still
// picks its TCP transport over loopback, which no NIC touches), and the two extra passes over
// the data would cost a quarter of the time. UCX authenticates nothing: whoever can reach a
// worker's address can connect to it, so the communicator uses UCX only when asked (a site is a
// trusted network) and never with sealed streams (LOWCOMM_ENCRYPT).
//
// Tags on the wire: (source rank << 24) | tag, received with a full mask, so a message matches
// only a receive for its sender and tag.
//
// Threads: one progress thread ("lc-ucx-r<rank>") owns the worker; isend/irecv hand their
// operations to it in call order (a queue and an eventfd) and may be called from any thread. It
// sleeps in epoll on the worker's event fd and the eventfd when there is nothing to progress.
// The first failure (abort(), a partner's reported by UCX's error handler, a length or digest
// that does not match) fails the whole site: every outstanding and later request fails, the
// worker is destroyed (every endpoint and connection with it) before any failed request
// completes, so a request's buffer is free once the request has completed, whatever UCX was
// doing with it. abort() returns at once, wait_released() once that is done; the destructor
// aborts and waits.

#include <cstdint>
#include <memory>
#include <string>

#include "lowcomm/status.h"
#include "transport/request.h"

namespace lowcomm::transport {

class UcxTransport {
 public:
  static constexpr uint64_t kMaxTag = (uint64_t{1} << 24) - 1;

  // Whether this build has UCX at all.
  static bool built_with_ucx();
  // The context, the worker and its progress thread; kUnsupported without UCX, kSystem when UCX
  // fails to start (the message says why).
  static Result<std::unique_ptr<UcxTransport>> create(int rank);
  ~UcxTransport();
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  // This worker's address, to send to the partners.
  const std::string& address() const;
  // An endpoint to `rank` from the address it sent, before any isend/irecv with it; `checked`:
  // messages carry their digest (both sides must say the same). Fails once the site has failed.
  Status connect(int rank, const std::string& address, bool checked);

  Request isend(int rank, uint64_t tag, const void* data, uint64_t len);
  Request irecv(int rank, uint64_t tag, void* data, uint64_t len);

  // Fails everything outstanding and later with `why` (kAborted when empty; a site that already
  // failed keeps its first failure) and returns at once. The requests complete (failed) once the
  // worker is destroyed: a request's buffer is free when it has completed, and every buffer once
  // wait_released() returns. Idempotent; any thread.
  void abort(const Status& why = Status());
  // Returns once the aborts asked so far are done: the worker destroyed, every request
  // completed, no user buffer referenced. (The live partners' endpoints are flushed first and
  // what they send is received and dropped, for at most a second.)
  void wait_released();
  // Teardowns that closed endpoints with a send to a live partner still pending (a partner
  // neither receiving nor tearing down within the second): 0 when every send completed first.
  uint64_t closed_with_sends_pending() const;

 private:
  struct Impl;
  explicit UcxTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lowcomm::transport
