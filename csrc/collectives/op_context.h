#pragma once
// OpContext: what an operation in flight (OpRun, and through it every algorithm) uses of its
// communicator: its place in the group, the options in force, the peers and the transport
// inside the site, scratch memory, error-feedback state, the owner shares (topology/planner.h), the
// health checks between waits. CommImpl implements it; OpRun and the algorithms see this, not the
// runtime (comm_impl.h), and call into the communicator only through it.

#include <cstdint>
#include <vector>

#include "collectives/ef_store.h"
#include "collectives/scratch_pool.h"
#include "core/deadline.h"
#include "lowcomm/communicator.h"
#include "lowcomm/status.h"
#include "topology/partition.h"
#include "topology/shares.h"
#include "topology/sites.h"
#include "transport/peer.h"
#include "transport/ucx_transport.h"

namespace lowcomm::collectives {

// What the algorithms use of the planning layer (topology/): how a tensor is cut, the owner
// shares, the site map.
using topology::granule;
using topology::owner_chunks;
using topology::Range;
using topology::SharePlan;
using topology::SitePlan;
using topology::split_segments;

class OpContext {
 public:
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const CommOptions& options() const = 0;  // every option set (init_settings.h)
  virtual Deadline::Clock::duration timeout() const = 0;
  virtual uint64_t chunk_bytes() const = 0;  // the transport's chunk size
  virtual transport::Peer& peer(int r) = 0;
  // Whether payload messages to and from `r` travel over UCX (ucx()), inside the site.
  virtual bool over_ucx(int r) const = 0;
  virtual transport::UcxTransport& ucx() = 0;
  virtual ErrorFeedbackStore& ef() = 0;
  virtual const SharePlan& share_plan() const = 0;
  virtual ScratchPool& scratch_pool() = 0;
  // ok, or why the operation must stop: the communicator failed or was aborted, a peer sent
  // its failure, or a peer in `involved` broke or left.
  virtual Status check_health(const std::vector<int>& involved) = 0;
  // The sequence number of the next point-to-point receive from `peer` on `tag`.
  virtual uint64_t take_recv_seq(int peer, uint64_t tag) = 0;
  // Point-to-point sends queued behind the running operation that may start now.
  virtual void run_overtaking_sends() = 0;

 protected:
  ~OpContext() = default;
};

}  // namespace lowcomm::collectives
