#include "collectives/rtt_probe.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "collectives/tags.h"

namespace lowcomm::collectives {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kRounds = 3;  // the lowest of three: a busy host's scheduling delays drop out
// The longest the probe may take: round trips of a few hundred milliseconds at most, and
// peers that are all in init together.
constexpr auto kProbeLimit = std::chrono::seconds(20);

Status failed(const transport::Request& r, int peer, const char* what) {
  Status s = r.status();
  return Status(s.code(), std::string("measuring round trips: ") + what + " rank " +
                              std::to_string(peer) + ": " + s.message());
}

// What the probe's requests read and write: owned by the caller, which aborts the peers before
// letting go of it when the probe fails.
struct ProbeBuffers {
  std::vector<uint64_t> ping_in, pong_in;
  std::vector<std::vector<double>> rows;
  std::vector<double> mine;
  std::vector<transport::Request> sends;
};

Result<std::vector<std::vector<double>>> probe(
    const std::vector<std::unique_ptr<transport::Peer>>& peers, int rank, Deadline deadline,
    ProbeBuffers& buffers) {
  const size_t P = peers.size();
  auto& [ping_in, pong_in, rows, mine, sends] = buffers;
  mine.assign(P, 1e9);
  mine[static_cast<size_t>(rank)] = 0;
  static const uint64_t zero = 0;
  ping_in.assign(P, 0);
  pong_in.assign(P, 0);
  for (int round = 0; round < kRounds; ++round) {
    std::vector<transport::Request> pings(P), pongs(P);
    std::vector<Clock::time_point> sent(P);
    std::vector<bool> echoed(P, false), timed(P, false);
    for (size_t p = 0; p < P; ++p) {
      if (!peers[p]) continue;
      pings[p] = peers[p]->irecv(tags::kRttPing, &ping_in[p], sizeof(uint64_t));
      pongs[p] = peers[p]->irecv(tags::kRttPong, &pong_in[p], sizeof(uint64_t));
    }
    for (size_t p = 0; p < P; ++p) {
      if (!peers[p]) continue;
      sent[p] = Clock::now();
      sends.push_back(peers[p]->isend(tags::kRttPing, &zero, sizeof(zero)));
    }
    // Echo each ping as it comes, and time each echo: polled, so that neither waits on another
    // peer (a blocking wait on one would add to the others' times).
    for (size_t left = 2 * (P - 1); left > 0;) {
      for (size_t p = 0; p < P; ++p) {
        if (!peers[p]) continue;
        if (!echoed[p] && pings[p].test()) {
          if (!pings[p].status().is_ok()) return failed(pings[p], static_cast<int>(p), "ping from");
          sends.push_back(peers[p]->isend(tags::kRttPong, &zero, sizeof(zero)));
          echoed[p] = true;
          --left;
        }
        if (!timed[p] && pongs[p].test()) {
          if (!pongs[p].status().is_ok()) return failed(pongs[p], static_cast<int>(p), "echo from");
          mine[p] =
              std::min(mine[p], std::chrono::duration<double>(Clock::now() - sent[p]).count());
          timed[p] = true;
          --left;
        }
      }
      if (left == 0) break;
      if (deadline.expired()) {
        std::string missing;
        for (size_t p = 0; p < P; ++p)
          if (peers[p] && (!echoed[p] || !timed[p]))
            missing += (missing.empty() ? "" : ", ") + std::to_string(p);
        return Status(StatusCode::kTimeout,
                      "measuring round trips: no answer from rank(s) " + missing +
                          " (does every rank have the same LOWCOMM_SITES and LOWCOMM_WAN? only "
                          "ranks without a site map measure)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  // Every rank's row, to every rank.
  rows.assign(P, std::vector<double>(P, 0));
  rows[static_cast<size_t>(rank)] = mine;
  std::vector<transport::Request> row_recvs(P);
  for (size_t p = 0; p < P; ++p) {
    if (!peers[p]) continue;
    row_recvs[p] = peers[p]->irecv(tags::kRttRow, rows[p].data(), P * sizeof(double));
    sends.push_back(peers[p]->isend(tags::kRttRow, mine.data(), P * sizeof(double)));
  }
  for (size_t p = 0; p < P; ++p) {
    if (!peers[p]) continue;
    if (Status s = row_recvs[p].wait(deadline); !s.is_ok())
      return Status(s.code(), "measuring round trips: the row of rank " + std::to_string(p) + ": " +
                                  s.message());
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
    const std::vector<std::unique_ptr<transport::Peer>>& peers, int rank, Deadline deadline) {
  // Every peer answers at once if it measures too: a rank configured otherwise (a site map of
  // its own) never will, and waiting for it until the init deadline would hide the cause.
  const Deadline probe_deadline =
      Deadline::after(std::min<Deadline::Clock::duration>(deadline.remaining(), kProbeLimit));
  ProbeBuffers buffers;
  auto rtt = probe(peers, rank, probe_deadline, buffers);
  if (!rtt) {
    for (const auto& p : peers)
      if (p) p->abort();  // no request may still reference `buffers`
  }
  return rtt;
}

}  // namespace lowcomm::collectives
