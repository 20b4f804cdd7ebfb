#pragma once
// Per-operation statistics: OpCounters, what one running operation did, counted as it runs
// (OpRun's sends, receives and waits; the algorithms' codec calls), and summarize(), which turns
// them into the public OpStats when the operation completes (docs/collectives.md, "Statistics").

#include <chrono>
#include <cstdint>
#include <vector>

#include "collectives/descriptor.h"
#include "lowcomm/communicator.h"
#include "transport/wan_link.h"

namespace lowcomm::collectives {

using StatsClock = std::chrono::steady_clock;

struct OpCounters {
  struct Peer {
    uint64_t sent = 0;      // on the wire: payload + chunk headers
    uint64_t received = 0;  // likewise
    uint64_t resent = 0;    // chunks of its messages sent again (OpRun::tally_resends)
  };
  std::vector<Peer> wire;  // by rank
  uint64_t payload_sent = 0;
  uint64_t uncompressed_sent = 0;
  uint64_t ucx_sent = 0;  // of the bytes sent, those handed to UCX (intra_site.h)
  // Sparse codecs: of payload_sent, the positions' and the value codes' bytes, and the elements
  // kept of those sent (elements_sent counts every element a sparse message stands for).
  uint64_t index_sent = 0;
  uint64_t value_sent = 0;
  uint64_t kept_sent = 0;
  uint64_t elements_sent = 0;
  StatsClock::duration encode{};
  StatsClock::duration decode{};
  StatsClock::duration wait{};
  // CUDA buffers (device_op.h): bytes copied each way, and the path ("gpu-codec", "staged").
  uint64_t device_to_host = 0;
  uint64_t host_to_device = 0;
  const char* device_path = "";
};

// A message of `len` bytes on the wire: the transport's 48-byte header per chunk of
// `chunk_bytes`, one header for an empty message.
uint64_t wire_bytes(uint64_t len, uint64_t chunk_bytes);

// Adds the time from its construction to its destruction to `into`.
class ScopedTimer {
 public:
  explicit ScopedTimer(StatsClock::duration& into) : into_(into), start_(StatsClock::now()) {}
  ~ScopedTimer() { into_ += StatsClock::now() - start_; }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  StatsClock::duration& into_;
  StatsClock::time_point start_;
};

// The operation's identity (kind, sequence, count, codec) and zero counters: a Work that never
// ran.
OpStats identity_stats(const OpDescriptor& desc);

// `links[r]`: this rank's emulated link to rank r (unshaped: no link limit). Site model: the
// sent bytes against this rank's uplink and the received ones against its downlink; pair model:
// each peer's bytes against that pair's rate. Plus the largest one-way delay to a peer the
// operation exchanged bytes with.
OpStats summarize(const OpDescriptor& desc, const OpCounters& c, StatsClock::duration wall,
                  const std::vector<transport::WanLink>& links);

// The INFO (collective) or TRACE (point-to-point) line summarizing an operation `rank` ran.
void log_stats(int rank, const OpDescriptor& desc, const OpStats& st, const Status& s);

}  // namespace lowcomm::collectives
