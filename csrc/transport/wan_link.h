#pragma once
// WanLink: the emulated wide-area link one direction of a peer connection is paced through.
//
// Syntax (LOWCOMM_WAN or an option): comma-separated key=value, keys in any order, each once:
//   bw=<number><unit>      unit: bit kbit mbit gbit (bits/s, SI) or kbps mbps gbps (bits/s);
//                          bw=0 means unlimited
//   rtt=<number><unit>     unit: s ms us; one-way delay = rtt / 2
//   delay=<number><unit>   one-way delay directly (alternative to rtt)
//   jitter=<number><unit>  extra one-way delay drawn uniformly from [-jitter, +jitter], never
//                          reordering (see pacer.h)
// Example: "bw=1gbit,rtt=80ms,jitter=2ms". The empty string is an unshaped link.

#include <string>
#include <string_view>

#include "lowcomm/status.h"

namespace lowcomm::transport {

struct WanLink {
  double bits_per_second = 0.0;  // 0 = unlimited
  double one_way_delay_s = 0.0;
  double jitter_s = 0.0;

  bool shaped() const { return bits_per_second > 0.0 || one_way_delay_s > 0.0 || jitter_s > 0.0; }
  std::string to_string() const;  // in the syntax parse_wan accepts
};

Result<WanLink> parse_wan(std::string_view text);
// LOWCOMM_WAN, parsed; an unshaped link when unset or empty; an error naming the variable when
// it does not parse.
Result<WanLink> wan_from_env();

}  // namespace lowcomm::transport
