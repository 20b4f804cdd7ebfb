#pragma once
// lowcomm-bench's model of each collective: buffer shapes for a size, the payload bytes each
// rank sends (from the algorithms of docs/collectives.md and the codec's exact encoded size),
// nccl-tests' bus-bandwidth factors, and the link-limit time of those bytes.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "collectives/algorithms.h"
#include "lowcomm/codec.h"
#include "topology/partition.h"

namespace lowcomm::bench {

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kBroadcast };

inline std::optional<Collective> parse_collective(const std::string& s) {
  if (s == "allreduce" || s == "all_reduce") return Collective::kAllReduce;
  if (s == "allgather" || s == "all_gather") return Collective::kAllGather;
  if (s == "reducescatter" || s == "reduce_scatter") return Collective::kReduceScatter;
  if (s == "broadcast") return Collective::kBroadcast;
  return std::nullopt;
}

inline const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "allreduce";
    case Collective::kAllGather:
      return "allgather";
    case Collective::kReduceScatter:
      return "reducescatter";
    case Collective::kBroadcast:
      return "broadcast";
  }
  return "?";
}

// As nccl-tests: the size is the whole tensor (all-reduce, broadcast), the gathered result
// (all-gather) or the scattered input (reduce-scatter); fp32 elements.
struct Shape {
  uint64_t total_elems = 0;  // elements the size stands for
  uint64_t send_elems = 0;   // per rank
  uint64_t recv_elems = 0;
};

inline Shape shape(Collective c, uint64_t bytes, int P) {
  const uint64_t p = static_cast<uint64_t>(P);
  uint64_t n = bytes / 4;
  switch (c) {
    case Collective::kAllReduce:
    case Collective::kBroadcast:
      return {n, n, n};
    case Collective::kAllGather: {
      uint64_t per = n / p;
      return {per * p, per, per * p};
    }
    case Collective::kReduceScatter: {
      uint64_t per = n / p;
      return {per * p, per * p, per};
    }
  }
  return {};
}

inline double bus_factor(Collective c, int P) {
  double p = P;
  switch (c) {
    case Collective::kAllReduce:
      return 2 * (p - 1) / p;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      return (p - 1) / p;
    case Collective::kBroadcast:
      return 1;
  }
  return 1;
}

struct Traffic {
  uint64_t max_rank_bytes = 0;       // payload bytes the busiest rank sends per call
  uint64_t max_rank_recv_bytes = 0;  // payload bytes the busiest rank receives per call
  // Of those, the busiest rank's (pair's) bytes of the last round, which cannot leave before
  // the previous round's first bytes have arrived (all-reduce results, broadcast relays).
  uint64_t last_round_rank_bytes = 0;
  uint64_t last_round_peer_bytes = 0;
  uint64_t max_peer_bytes = 0;  // payload bytes on the busiest (sender, receiver) pair per call
  uint64_t total_bytes = 0;     // all ranks together per call
};

inline uint64_t encoded_chunk(const std::optional<CodecSpec>& spec, topology::Range chunk,
                              uint64_t seg) {
  if (!spec) return chunk.count * 4;
  uint64_t b = 0;
  for (const auto& s : topology::split_segments(chunk, seg)) b += encoded_size(*spec, s.count);
  return b;
}

inline Traffic traffic(Collective c, const Shape& sh, int P, const std::optional<CodecSpec>& spec,
                       uint64_t segment_bytes) {
  Traffic t;
  const uint64_t p = static_cast<uint64_t>(P);
  switch (c) {
    case Collective::kAllReduce: {
      // Phase 1: rank r sends its contribution to chunk j to owner j; phase 2: owner r sends its
      // chunk's result to everyone.
      std::optional<CodecSpec> s = spec;
      if (s && !s->quantized() && s->wire_dtype == DType::kFloat32) s.reset();
      uint64_t g = topology::granule(s);
      uint64_t seg =
          collectives::reduce_segment_elems(segment_bytes, DType::kFloat32, s, sh.total_elems / p);
      auto chunks = topology::owner_chunks(sh.total_elems, P, g);
      std::vector<uint64_t> enc(p);
      for (uint64_t j = 0; j < p; ++j) enc[j] = encoded_chunk(s, chunks[j], seg);
      uint64_t all = 0;
      for (uint64_t j = 0; j < p; ++j) all += enc[j];
      for (uint64_t r = 0; r < p; ++r) {
        uint64_t sent = (all - enc[r]) + (p - 1) * enc[r];
        t.max_rank_bytes = std::max(t.max_rank_bytes, sent);
        // Rank r receives every other rank's contribution to its chunk and every other owner's
        // result: the same sum.
        t.max_rank_recv_bytes = std::max(t.max_rank_recv_bytes, sent);
        t.last_round_rank_bytes = std::max(t.last_round_rank_bytes, (p - 1) * enc[r]);
        t.last_round_peer_bytes = std::max(t.last_round_peer_bytes, enc[r]);
        t.total_bytes += sent;
        for (uint64_t j = 0; j < p; ++j)
          if (j != r) t.max_peer_bytes = std::max(t.max_peer_bytes, enc[j] + enc[r]);
      }
      break;
    }
    case Collective::kAllGather:
      t.max_rank_bytes = (p - 1) * sh.send_elems * 4;
      t.max_rank_recv_bytes = t.max_rank_bytes;
      t.max_peer_bytes = sh.send_elems * 4;
      t.total_bytes = p * t.max_rank_bytes;
      break;
    case Collective::kReduceScatter:
      t.max_rank_bytes = (p - 1) * sh.recv_elems * 4;
      t.max_rank_recv_bytes = t.max_rank_bytes;
      t.max_peer_bytes = sh.recv_elems * 4;
      t.total_bytes = p * t.max_rank_bytes;
      break;
    case Collective::kBroadcast: {
      uint64_t b = sh.total_elems * 4;
      t.max_rank_recv_bytes = b;  // every non-root rank receives the whole tensor
      if (P == 2 || b < (64u << 10)) {
        t.max_rank_bytes = (p - 1) * b;
        t.max_peer_bytes = b;
        t.total_bytes = t.max_rank_bytes;
      } else {  // root scatters n/(P-1) slices, the others relay theirs to each other
        uint64_t slice = b / (p - 1);
        t.last_round_rank_bytes = (p - 2) * slice;
        t.last_round_peer_bytes = slice;
        t.max_rank_bytes = b;
        t.max_peer_bytes = slice;
        t.total_bytes = b + (p - 1) * (p - 2) * slice;
      }
      break;
    }
  }
  return t;
}

// One-way hops on the critical path (latency term of the link limit).
inline int rounds(Collective c, const Shape& sh, int P) {
  switch (c) {
    case Collective::kAllReduce:
      return 2;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      return 1;
    case Collective::kBroadcast:
      return (P == 2 || sh.total_elems * 4 < (64u << 10)) ? 1 : 2;
  }
  return 1;
}

// The link every rank's bytes cross:
//  - kSite: lowcomm's emulator (--wan), site model (the default): each rank has one uplink and
//    one downlink shared by all its peers, so the busiest rank's bytes sent (at the uplink
//    rate) or received (at the downlink rate) set the time. Two lower bounds, the larger one is
//    the limit: its last byte arrives one one-way delay after it was serialised
//    (bytes * 8 / rate + delay), and the rounds on the critical path each take a delay, the
//    last round's bytes leaving no earlier than the first round's arrive
//    (rounds * delay + last round's bytes * 8 / rate). Not the sum of wire and rounds:
//    pipelined segments send the second round's bytes while the first round's are still on
//    the wire;
//  - kPerPeer: the emulator with model=pair, one link per (sender, receiver) pair, so the
//    busiest pair's bytes set the time (same two bounds);
//  - kAccess: a tbf-shaped access link per rank (--netns), each way; the busiest rank's bytes
//    set the time (no delay on these kernels).
struct LinkModel {
  enum Kind { kNone, kSite, kPerPeer, kAccess } kind = kNone;
  double bits_per_second = 0;       // uplink (site), pair link, or access link
  double down_bits_per_second = 0;  // site: downlink; 0 = unlimited
  double one_way_delay_s = 0;
  // TCP/IP framing per 1448 payload bytes the link also carries (emulator: its frame=, 66 by
  // default; tbf: 66, the Ethernet, IP and TCP headers it counts).
  double frame_bytes = 66;

  double limit_seconds(const Traffic& t, int nrounds) const {
    if (kind == kNone) return 0;
    const double framing = 1 + frame_bytes / 1448;
    auto at = [framing](uint64_t bytes, double bps) {
      return bps > 0 ? static_cast<double>(bytes) * framing * 8 / bps : 0.0;
    };
    double wire = 0, last = 0;
    if (kind == kPerPeer) {
      wire = at(t.max_peer_bytes, bits_per_second);
      last = at(t.last_round_peer_bytes, bits_per_second);
    } else if (kind == kSite) {
      wire = std::max(at(t.max_rank_bytes, bits_per_second),
                      at(t.max_rank_recv_bytes, down_bits_per_second));
      last = std::max(at(t.last_round_rank_bytes, bits_per_second),
                      at(t.last_round_rank_bytes, down_bits_per_second));
    } else {
      wire = at(std::max(t.max_rank_bytes, t.max_rank_recv_bytes), bits_per_second);
    }
    if (kind == kAccess) return wire;  // no delay on these links
    if (wire == 0 && one_way_delay_s == 0) return 0;
    // The last round's bytes leave no earlier than (rounds - 1) delays after the start.
    return std::max(wire + one_way_delay_s, nrounds * one_way_delay_s + last);
  }
  std::string describe(const std::string& wan, const std::string& netns) const {
    char buf[320];
    if (kind == kSite)
      std::snprintf(buf, sizeof buf,
                    "lowcomm emulator '%s' (site model: %.3g Gbit/s up, %.3g Gbit/s down per rank, "
                    "shared by its peers; one-way %.1f ms)%s%s",
                    wan.c_str(), bits_per_second / 1e9, down_bits_per_second / 1e9,
                    one_way_delay_s * 1e3, netns.empty() ? "" : " inside ", netns.c_str());
    else if (kind == kPerPeer)
      std::snprintf(buf, sizeof buf,
                    "lowcomm emulator '%s' (pair model: %.3g Gbit/s per peer link, one-way %.1f "
                    "ms)%s%s",
                    wan.c_str(), bits_per_second / 1e9, one_way_delay_s * 1e3,
                    netns.empty() ? "" : " inside ", netns.c_str());
    else if (kind == kAccess)
      std::snprintf(buf, sizeof buf, "tbf-shaped namespaces %s (%.3g Gbit/s per rank, each way)",
                    netns.c_str(), bits_per_second / 1e9);
    else
      std::snprintf(buf, sizeof buf, "unshaped (loopback); no link limit");
    return buf;
  }
};

// A loose sanity bound on the relative L2 error (for --check): two quantizations at b bits.
// Sites (topology/sites.h): the least time the sites' WAN links allow an all-reduce whose
// tensor encodes to `encoded` bytes (payload; `wire` adds the framing the links carry), the max
// over sites of max(bytes out / uplink, bytes in / downlink), plus the schedule's one-way delays.
// Flat full mesh: every rank sends each peer outside its site its contribution to that peer's
// owner chunk and its own chunk's result, 2 E/P each, so a site of m ranks sends
// m (P - m) 2E/P. Two levels (S sites of m): each rank all-reduces its slice E/m with its
// column, 2 (S-1)/S E/m out and in, so a site sends 2 (S-1)/S E. That is also the bound: each
// site must send the other sites its share of every element and receive theirs once each way.
struct SiteLinkModel {
  std::vector<int> site_size;            // ranks per site
  std::vector<double> up_bps, down_bps;  // per site; 0 = unlimited
  double one_way_delay_s = 0;
  double frame_bytes = 66;
  double wire(double payload) const { return payload * (1.0 + frame_bytes / 1448.0); }
  double limit(bool two_level, double encoded) const {
    int P = 0;
    for (int m : site_size) P += m;
    const double S = static_cast<double>(site_size.size());
    double worst = 0;
    for (size_t i = 0; i < site_size.size(); ++i) {
      const double m = site_size[i];
      const double bytes = two_level ? 2.0 * (S - 1) / S * encoded
                                     : m * (P - m) * 2.0 * encoded / static_cast<double>(P);
      for (double r : {up_bps[i], down_bps[i]})
        if (r > 0) worst = std::max(worst, wire(bytes) * 8.0 / r);
    }
    return worst + 2.0 * one_way_delay_s;
  }
  // A ring over the sites in order (lowcomm-bench --schedule ring): one edge leaves each site
  // and carries 2 (P-1)/P E. Of the 2 (P-1) hops on a chunk's way round, 2 (P-1) S/P cross a
  // site link and pay its one-way delay (the hops inside a site are local).
  double ring_limit(double encoded) const {
    int P = 0;
    for (int m : site_size) P += m;
    const double bytes = 2.0 * (P - 1) / P * encoded;
    double worst = 0;
    for (size_t i = 0; i < site_size.size(); ++i)
      for (double r : {up_bps[i], down_bps[i]})
        if (r > 0) worst = std::max(worst, wire(bytes) * 8.0 / r);
    const double crossings = 2.0 * (P - 1) * static_cast<double>(site_size.size()) / P;
    return worst + crossings * one_way_delay_s;
  }
};

inline double error_bound(const std::optional<CodecSpec>& spec) {
  if (!spec || !spec->quantized()) return 1e-5;
  // A sparse codec drops most of each contribution (error feedback carries it to later calls):
  // a single call's result is only sane, not close, below the error of sending nothing.
  if (spec->sparse()) return 1.0;
  double bits = bits_per_element(*spec, 1 << 20);
  return std::min(1.0, 4.0 * std::pow(2.0, -(bits - 1)) * 2);
}

}  // namespace lowcomm::bench
