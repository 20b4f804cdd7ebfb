#include "collectives/intra_site.h"

#include "collectives/tags.h"
#include "core/log.h"

namespace lowcomm::collectives {
namespace {

constexpr uint64_t kMaxAddressBytes = 16 << 10;  // UCX 1.13: ~200 B here, a few KiB with many NICs

}  // namespace

Result<IntraSite> connect_intra_site(std::vector<std::unique_ptr<transport::Peer>>& peers, int rank,
                                     const IntraSiteRequest& req, Deadline deadline) {
  IntraSite out;
  out.over_ucx.assign(peers.size(), 0);
  std::string why_not;
  if (req.want_ucx && req.sealed) {
    why_not = "streams are sealed (LOWCOMM_ENCRYPT): UCX would carry the payload unsealed";
  } else if (req.want_ucx) {
    auto site = transport::UcxTransport::create(rank);
    if (site) {
      out.ucx = std::move(site).value();
    } else {
      why_not = site.status().message();
    }
  }
  if (out.ucx && out.ucx->address().size() > kMaxAddressBytes) {
    why_not = "its worker address is " + std::to_string(out.ucx->address().size()) +
              " bytes, more than the " + std::to_string(kMaxAddressBytes) + " a peer takes";
    out.ucx.reset();
  }
  if (req.want_ucx && !out.ucx)
    LOWCOMM_LOG(kWarn, "rank %d: UCX asked for inside the site, TCP instead: %s", rank,
                why_not.c_str());

  const size_t P = peers.size();
  std::vector<char> partner(P, 0);
  for (int r : req.partners) partner[static_cast<size_t>(r)] = 1;
  // The pairs that exchange: both asked (symmetric: every rank holds the same table).
  std::vector<char> pair(P, 0);
  for (size_t r = 0; r < P; ++r)
    pair[r] = static_cast<int>(r) != rank && req.want_ucx && r < req.asks_for_ucx.size() &&
              req.asks_for_ucx[r];
  std::vector<std::string> theirs(P);
  std::vector<transport::Request> recvs(P), sends(P);
  static constexpr char kNone = 0;
  for (size_t r = 0; r < P; ++r) {
    if (!pair[r]) continue;
    theirs[r].assign(kMaxAddressBytes, '\0');
    recvs[r] = peers[r]->irecv_upto(tags::kUcxAddress, theirs[r].data(), kMaxAddressBytes);
    const bool offer = out.ucx && partner[r] && !req.emulated[r];
    sends[r] = peers[r]->isend(tags::kUcxAddress, offer ? out.ucx->address().data() : &kNone,
                               offer ? out.ucx->address().size() : 0);
  }
  // Every request finished before anything returns: a failure aborts every peer (the mesh is
  // lost anyway), so no transfer outlives `theirs` or the worker's address.
  Status failed;
  for (size_t r = 0; r < P && failed.is_ok(); ++r) {
    if (!pair[r]) continue;
    failed = sends[r].wait(deadline);
    if (failed.is_ok()) failed = recvs[r].wait(deadline);
  }
  if (!failed.is_ok()) {
    for (auto& p : peers)
      if (p) p->abort();
    return failed;
  }
  for (size_t r = 0; r < P; ++r) {
    if (!pair[r]) continue;
    theirs[r].resize(recvs[r].received_bytes());
    const bool offered = out.ucx && partner[r] && !req.emulated[r];
    if (!offered || theirs[r].empty()) continue;
    Status s = out.ucx->connect(static_cast<int>(r), theirs[r], !req.same_host[r]);
    if (!s.is_ok())
      return Status(s.code(), "UCX endpoint to rank " + std::to_string(r) + ": " + s.message());
    out.over_ucx[r] = 1;
  }
  if (out.ucx) {
    std::string list;
    for (size_t r = 0; r < out.over_ucx.size(); ++r)
      if (out.over_ucx[r]) list += (list.empty() ? "" : ",") + std::to_string(r);
    LOWCOMM_LOG(kInfo, "rank %d: inside the site, UCX to rank(s) %s, TCP to the others", rank,
                list.empty() ? "none" : list.c_str());
    if (list.empty()) out.ucx.reset();
  }
  return out;
}

}  // namespace lowcomm::collectives
