#include "collectives/op_stats.h"

#include <algorithm>
#include <cstdio>

#include "core/log.h"
#include "topology/shares.h"
#include "transport/chunk_header.h"

namespace lowcomm::collectives {
namespace {

std::chrono::nanoseconds ns(StatsClock::duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d);
}

// bytes (chunk headers included) at the link's rate, with its TCP/IP framing
// (WanLink::frame_bytes).
double seconds_at(uint64_t bytes, double bits_per_second, const transport::WanLink& l) {
  if (bits_per_second <= 0.0) return 0.0;
  const double framed =
      static_cast<double>(bytes) *
      (1.0 + l.frame_bytes / static_cast<double>(transport::WanLink::kTcpSegmentBytes));
  return framed * 8.0 / bits_per_second;
}

// The link-limit time of the counted bytes, in seconds; 0 when no link is shaped.
double link_limit_s(const OpCounters& c, const std::vector<transport::WanLink>& links) {
  double limit = 0.0, delay = 0.0;
  bool shaped = false;
  uint64_t sent = 0, received = 0;
  const transport::WanLink* site = nullptr;
  for (size_t r = 0; r < c.wire.size() && r < links.size(); ++r) {
    const OpCounters::Peer& p = c.wire[r];
    if (p.sent == 0 && p.received == 0) continue;
    const transport::WanLink& l = links[r];
    if (!l.shaped()) continue;
    shaped = true;
    delay = std::max(delay, l.one_way_delay_s);
    if (l.model == transport::WanModel::kPair) {
      limit = std::max(limit, seconds_at(std::max(p.sent, p.received), l.bits_per_second, l));
    } else {
      site = &l;  // every peer's link carries the same site rates
      sent += p.sent;
      received += p.received;
    }
  }
  if (site)
    limit = std::max({limit, seconds_at(sent, site->bits_per_second, *site),
                      seconds_at(received, site->down_bits_per_second, *site)});
  return shaped ? limit + delay : 0.0;
}

}  // namespace

uint64_t wire_bytes(uint64_t len, uint64_t chunk_bytes) {
  const uint64_t chunks = len == 0 ? 1 : (len + chunk_bytes - 1) / chunk_bytes;
  return len + chunks * transport::kChunkHeaderBytes;
}

OpStats identity_stats(const OpDescriptor& desc) {
  OpStats s;
  s.kind = op_kind_name(desc.kind);
  s.sequence = desc.seq;
  s.count = desc.count;
  if (desc.codec) s.codec = to_string(*desc.codec);
  return s;
}

OpStats summarize(const OpDescriptor& desc, const OpCounters& c, StatsClock::duration wall,
                  const std::vector<transport::WanLink>& links) {
  OpStats s = identity_stats(desc);
  s.wall = ns(wall);
  for (const OpCounters::Peer& p : c.wire) {
    s.bytes_sent += p.sent;
    s.bytes_received += p.received;
    s.chunks_resent += p.resent;
  }
  if (s.chunks_resent > 0)
    for (const OpCounters::Peer& p : c.wire) s.chunks_resent_by_rank.push_back(p.resent);
  s.payload_bytes_sent = c.payload_sent;
  s.uncompressed_bytes_sent = c.uncompressed_sent;
  s.ucx_bytes_sent = c.ucx_sent;
  s.index_bytes_sent = c.index_sent;
  s.value_bytes_sent = c.value_sent;
  s.device_to_host_bytes = c.device_to_host;
  s.host_to_device_bytes = c.host_to_device;
  s.device_path = c.device_path;
  s.density = c.elements_sent > 0
                  ? static_cast<double>(c.kept_sent) / static_cast<double>(c.elements_sent)
                  : 0.0;
  s.compression_ratio = c.payload_sent > 0 ? static_cast<double>(c.uncompressed_sent) /
                                                 static_cast<double>(c.payload_sent)
                                           : 1.0;
  s.encode = ns(c.encode);
  s.decode = ns(c.decode);
  s.network_wait = ns(c.wait);
  const double limit = link_limit_s(c, links);
  s.link_limit =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(limit));
  const double wall_s = std::chrono::duration<double>(wall).count();
  s.link_efficiency = limit > 0.0 && wall_s > 0.0 ? limit / wall_s : 0.0;
  return s;
}

void log_stats(int rank, const OpDescriptor& desc, const OpStats& st, const Status& s) {
  const bool p2p = desc.kind == OpKind::kSend || desc.kind == OpKind::kRecv;
  if (p2p ? !log_enabled(LogLevel::kTrace) : !log_enabled(LogLevel::kInfo)) return;
  auto ms = [](std::chrono::nanoseconds d) {
    return std::chrono::duration<double>(d).count() * 1e3;
  };
  char efficiency[32] = "unshaped";
  if (st.link_limit.count() > 0)
    std::snprintf(efficiency, sizeof(efficiency), "%.2f", st.link_efficiency);
  log_write(p2p ? LogLevel::kTrace : LogLevel::kInfo, __FILE__, __LINE__,
            "rank %d: %s #%llu%s: count %llu, codec %s, %.3f ms, sent %.3f MB, received %.3f MB, "
            "ratio %.2f, encode %.3f ms, decode %.3f ms, network wait %.3f ms, link efficiency %s",
            rank, st.kind.c_str(), static_cast<unsigned long long>(st.sequence),
            s.is_ok() ? "" : " (failed)", static_cast<unsigned long long>(st.count),
            st.codec.empty() ? "none" : st.codec.c_str(), ms(st.wall),
            static_cast<double>(st.bytes_sent) / 1e6, static_cast<double>(st.bytes_received) / 1e6,
            st.compression_ratio, ms(st.encode), ms(st.decode), ms(st.network_wait), efficiency);
  if (!st.shares.empty() || st.rate_estimate > 0)
    log_write(LogLevel::kInfo, __FILE__, __LINE__,
              "rank %d: %s #%llu: owner shares %s, downlink rate estimate %.1f Mbit/s", rank,
              st.kind.c_str(), static_cast<unsigned long long>(st.sequence),
              topology::shares_to_string(st.shares).c_str(), st.rate_estimate * 8 / 1e6);
}

}  // namespace lowcomm::collectives
