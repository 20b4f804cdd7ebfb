#pragma once
// WanLink: the emulated wide-area link one direction of a peer connection is paced through.
//
// Two models of where the bytes queue:
//   site (the default): each rank sits behind its own access link, an uplink shared by all its
//     sends to every peer and a downlink shared by everything it receives, as a site with one
//     internet connection. up= and down= set the two rates (bw= both); the one-way delay and
//     jitter are per pair of ranks.
//   pair (model=pair): every (sender, receiver) pair has its own link of rate bw=, as if each
//     pair of ranks had a dedicated circuit (a rank with P-1 peers then sends P-1 times bw).
//
// Syntax (LOWCOMM_WAN or an option): sections separated by ';'. The first holds the defaults,
// comma-separated key=value, keys in any order, each once:
//   bw=<number><unit>      unit: bit kbit mbit gbit (bits/s, SI) or kbps mbps gbps (bits/s);
//                          bw=0 means unlimited. Site model: both up and down.
//   up=, down=             site model: the uplink and downlink rates (asymmetric sites)
//   rtt=<number><unit>     unit: s ms us; one-way delay = rtt / 2
//   delay=<number><unit>   one-way delay directly (alternative to rtt)
//   jitter=<number><unit>  extra one-way delay drawn uniformly from [-jitter, +jitter], never
//                          reordering (see pacer.h)
//   loss=<number>%         the probability that a TCP segment is lost (e.g. loss=1%). A lost
//                          segment delays its chunk, and every chunk after it on the peer
//                          (head of line, as TCP delivers in order), by what Linux TCP takes
//                          to recover it: one RTT when at least three segments follow it in
//                          the chunk (fast retransmit on duplicate ACKs), else a
//                          retransmission timeout, RTT + 200 ms (tcp_rto_min); a lost
//                          retransmission adds the timeout again, doubled each time. The rate
//                          is not reduced (no congestion-window model).
//   model=site|pair
//   frame=<bytes>          TCP/IP framing per 1448-byte segment the link also carries (default
//                          66: Ethernet 14 + IPv4 20 + TCP 20 + timestamps 12, what a
//                          kernel's tbf counts); frame=0 paces the payload alone
// Later sections override the defaults for some ranks or pairs (heterogeneous sites):
//   rank=<ranks>:<keys>            rates of those ranks' sites (bw, up, down)
//   site=<ranks>:<keys>            those ranks form one site (site model): they share ONE
//                                  uplink and ONE downlink of these rates (bw, up, down) for
//                                  all their traffic to ranks outside the site, across
//                                  processes; between themselves they talk over the site's
//                                  local network, unshaped. A rank is in at most one site.
//   pair=<ranks>/<ranks>:<keys>    delay, jitter and loss (and bw, pair model) between any rank of
//                                  the first set and any of the second, both directions. In the
//                                  site model a bw= here makes a path: one link of that rate in
//                                  each direction, shared by every rank of the sending set (across
//                                  processes) for its traffic to the other set, in place of the
//                                  sites' access links (a region-to-region route with a bandwidth
//                                  of its own, as published inter-region matrices give); the two
//                                  sets must not overlap.
// A spec "@FILE" is read from FILE: sections one per line or ';'-separated, '#' starting a
// comment (bench/wan/ has a published inter-region matrix).
// <ranks> is one rank or an inclusive range A-B. Example, two sites of two ranks with 1 Gbit/s
// uplinks 20 ms apart inside a continent, and a third site of two ranks on 200 Mbit/s 150 ms
// away from both:
//   "bw=1gbit,rtt=20ms;rank=4-5:bw=200mbit;pair=0-3/4-5:rtt=150ms"
// and two sites of four ranks each behind one shared WAN link, one 10x slower than the other:
//   "rtt=50ms;site=0-3:bw=1gbit;site=4-7:bw=100mbit"
// The empty string is an unshaped link.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lowcomm/status.h"

namespace lowcomm::transport {

struct LinkClock;

enum class WanModel : uint8_t { kSite = 0, kPair = 1 };

// One rank's view of its link to one peer.
struct WanLink {
  double bits_per_second = 0.0;  // site: this rank's uplink; pair: the pair's rate; 0 = unlimited
  double down_bits_per_second = 0.0;  // site: this rank's downlink; 0 = unlimited
  double one_way_delay_s = 0.0;
  double jitter_s = 0.0;
  double loss = 0.0;  // per TCP segment, [0, 1)
  WanModel model = WanModel::kSite;
  double frame_bytes = 66;  // per kTcpSegmentBytes of payload
  // The peer is in this rank's site (site= rules): the pair talks over the site's local network,
  // unshaped, and neither the uplink nor the downlink of the site sees its bytes.
  bool local = false;
  // Site model, a pair= rule with bw= (a path): which path link this peer's traffic takes
  // (WanPlan::path_id), -1 none. With `path_clock` (the link's clock, shared by the ranks that
  // send on it; set by the communicator) the chunks take the path's rate on that clock instead of
  // the site's uplink and do not pass the receiver's downlink.
  int path = -1;
  std::shared_ptr<LinkClock> path_clock;

  static constexpr uint64_t kTcpSegmentBytes = 1448;
  // The bytes `payload` bytes occupy on the link, framing included.
  double wire_bytes(uint64_t payload) const {
    return static_cast<double>(payload) +
           static_cast<double>((payload + kTcpSegmentBytes - 1) / kTcpSegmentBytes) * frame_bytes;
  }

  bool shaped() const {
    return bits_per_second > 0.0 || down_bits_per_second > 0.0 || one_way_delay_s > 0.0 ||
           jitter_s > 0.0 || loss > 0.0;
  }
  std::string to_string() const;  // in the syntax parse_wan accepts
};

// A whole LOWCOMM_WAN spec: the defaults and the per-rank and per-pair overrides.
struct WanPlan {
  struct RankRange {
    int first = 0, last = 0;
    bool contains(int r) const { return r >= first && r <= last; }
  };
  struct Rule {
    RankRange a, b;  // rank and site rules: a only; pair rules: a and b
    bool pair = false;
    bool site = false;
    bool path = false;  // a pair rule with bw= in the site model (its own link)
    std::string keys;   // key=value list, validated when parsed
  };
  std::string defaults;
  std::vector<Rule> rules;

  bool empty() const { return defaults.empty() && rules.empty(); }
  // The link `me` sends to (and, site model, receives from) `peer` over; peer < 0: the rank's
  // own site with the default delay (bootstrap, before peers are known).
  Result<WanLink> link(int me, int peer) const;
  // Pair rules change delay and jitter per peer (and rate, pair model), and site rules make
  // some peers local; the site's rates come from rank and site rules.
  bool has_pair_rules() const;
  // The path links `me` sends on (site model, pair= rules with bw=): their ids, as WanLink::path.
  std::vector<int> paths_from(int me) const;
  // The index of the site= rule holding `rank` (among the site rules, in order), or -1.
  int site_of(int rank) const;
  // One label per rank of [0, nranks): its site= rule's index, or (outside every rule) a label
  // of its own. What the topology's site map is drawn from (topology/sites.h).
  std::vector<int> site_labels(int nranks) const;
  // How many of [0, nranks) share `rank`'s site (1 without a site rule).
  int site_size(int rank, int nranks) const;
};

// One section (no ';'): the defaults of a plan, as one link.
Result<WanLink> parse_wan(std::string_view text);
Result<WanPlan> parse_wan_plan(std::string_view text);
// LOWCOMM_WAN, parsed; an unshaped link when unset or empty; an error naming the variable when
// it does not parse. (Its defaults; per-rank rules are the communicator's: parse_wan_plan.)
Result<WanLink> wan_from_env();

}  // namespace lowcomm::transport
