#pragma once
// The schedules an operation may run where its kind has more than one. The value travels in
// the operation's descriptor (collectives/descriptor.h, byte 34): ranks must agree on it, and
// the numbers never change.

#include <cstdint>

namespace lowcomm::topology {

enum class Algorithm : uint8_t {
  kDefault = 0,   // the kind's own schedule (all-reduce, reduce-scatter, reduce: owner reduction)
  kOneHop = 1,    // all-reduce: every contribution to every rank (one_hop_reduce.cc)
  kTwoLevel = 2,  // all-reduce, all-gather, broadcast, reduce-scatter over sites (two_level*.cc);
                  // the descriptor's agree_hash carries the site map's hash (SitePlan::hash)
};

// What the statistics and the log call an all-reduce's schedule: "flat", "one-hop",
// "two-level"; a sparse codec's: "owner" or "gather-all".
const char* schedule_name(Algorithm a, bool sparse);

}  // namespace lowcomm::topology
