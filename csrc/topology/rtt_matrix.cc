#include "topology/rtt_matrix.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace lowcomm::topology {
namespace {

// The longest the exchange may take: round trips of a few hundred milliseconds at most, and
// peers that are all in init together.
constexpr auto kProbeLimit = std::chrono::seconds(20);

// What the exchange's requests read and write: owned by the caller, which aborts the peers
// before letting go of it when the exchange fails.
struct ProbeBuffers {
  std::vector<std::vector<double>> rows;
  std::vector<double> mine;
  std::vector<transport::Request> sends;
};

Result<std::vector<std::vector<double>>> probe(
    const std::vector<std::unique_ptr<transport::Peer>>& peers, int rank,
    const std::vector<double>& extra, Deadline deadline, ProbeBuffers& buffers) {
  const size_t P = peers.size();
  auto& [rows, mine, sends] = buffers;
  mine.assign(P, 1e9);
  mine[static_cast<size_t>(rank)] = 0;
  for (size_t p = 0; p < P; ++p) {
    if (!peers[p]) continue;
    const double kernel = peers[p]->setup_rtt_seconds();
    if (kernel > 0) mine[p] = kernel + (p < extra.size() ? extra[p] : 0.0);
  }
  // Every rank's row, to every rank.
  rows.assign(P, std::vector<double>(P, 0));
  rows[static_cast<size_t>(rank)] = mine;
  std::vector<transport::Request> row_recvs(P);
  for (size_t p = 0; p < P; ++p) {
    if (!peers[p]) continue;
    row_recvs[p] = peers[p]->irecv(kRttRowTag, rows[p].data(), P * sizeof(double));
    sends.push_back(peers[p]->isend(kRttRowTag, mine.data(), P * sizeof(double)));
  }
  for (size_t p = 0; p < P; ++p) {
    if (!peers[p]) continue;
    if (Status s = row_recvs[p].wait(deadline); !s.is_ok())
      return Status(s.code(), "measuring round trips: the row of rank " + std::to_string(p) + ": " +
                                  s.message() +
                                  (s.code() == StatusCode::kTimeout
                                       ? " (does every rank have the same LOWCOMM_SITES and "
                                         "LOWCOMM_WAN? only ranks without a site map measure)"
                                       : ""));
  }
  for (const auto& s : sends)
    if (Status st = s.wait(deadline); !st.is_ok())
      return Status(st.code(), "measuring round trips: " + st.message());
  std::vector<std::vector<double>> rtt(P, std::vector<double>(P, 0));
  for (size_t i = 0; i < P; ++i)
    for (size_t j = 0; j < P; ++j)
      if (i != j) {
        const double a = rows[i][j], b = rows[j][i];
        // A value that is not a time (a peer's bytes are not doubles we can trust): the other.
        const bool ga = a >= 0 && a < 1e6, gb = b >= 0 && b < 1e6;
        rtt[i][j] = ga && gb ? std::min(a, b) : ga ? a : gb ? b : 1e9;
      }
  return rtt;
}

}  // namespace

Result<std::vector<std::vector<double>>> measure_rtt_matrix(
    const std::vector<std::unique_ptr<transport::Peer>>& peers, int rank,
    const std::vector<double>& extra, Deadline deadline) {
  // Every peer answers at once if it measures too: a rank configured otherwise (a site map of
  // its own) never will, and waiting for it until the init deadline would hide the cause.
  const Deadline probe_deadline =
      Deadline::after(std::min<Deadline::Clock::duration>(deadline.remaining(), kProbeLimit));
  ProbeBuffers buffers;
  auto rtt = probe(peers, rank, extra, probe_deadline, buffers);
  if (!rtt) {
    for (const auto& p : peers)
      if (p) p->abort();  // no request may still reference `buffers`
  }
  return rtt;
}

}  // namespace lowcomm::topology
