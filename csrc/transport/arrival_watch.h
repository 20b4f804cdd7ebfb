#pragma once
// ArrivalWatch: "tell me which peer's message on tag T comes first", the transport half of an
// any-source receive. One watch is registered with several peers (Peer::watch_arrival); each
// reports when the next message on T that no irecv has claimed yet has begun to arrive (or has
// already: it is buffered as unexpected). The first report wins and completes request(); the
// others are ignored and each peer drops its registration at its next arrival on T or when it
// shuts down. A watch claims nothing: the caller then posts an ordinary irecv to the winner,
// which takes that very message (the k-th irecv on a tag meets the k-th message).
//
// Peer failures do not complete the watch: the waiter checks its peers' health itself.

#include <atomic>
#include <memory>

#include "transport/request.h"

namespace lowcomm::transport {

class ArrivalWatch {
 public:
  ArrivalWatch() : state_(std::make_shared<RequestState>()) {}
  // A peer's message has come; returns whether this report won.
  bool report(int rank) {
    int none = -1;
    if (!first_.compare_exchange_strong(none, rank)) return false;
    state_->complete(Status::ok());
    return true;
  }
  bool done() const { return first_.load() >= 0; }
  // The rank that reported first; -1 before.
  int first() const { return first_.load(); }
  // Completes (ok) at the first report.
  Request request() const { return Request(state_); }

 private:
  std::atomic<int> first_{-1};
  std::shared_ptr<RequestState> state_;
};

}  // namespace lowcomm::transport
