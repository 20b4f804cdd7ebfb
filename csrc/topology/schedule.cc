#include "topology/schedule.h"

namespace lowcomm::topology {

const char* schedule_name(Algorithm a, bool sparse) {
  if (sparse) return a == Algorithm::kOneHop ? "gather-all" : "owner";
  switch (a) {
    case Algorithm::kTwoLevel:
      return "two-level";
    case Algorithm::kOneHop:
      return "one-hop";
    default:
      return "flat";
  }
}

}  // namespace lowcomm::topology
