// Barrier: the descriptor exchange alone.
//
// Every collective already starts with a full all-to-all of descriptors (op_run.h), and a rank
// leaves an operation only after it has every peer's descriptor for it, so no rank leaves a
// barrier before every rank has entered it: one one-way delay, 64 bytes to and from each peer.

#include "collectives/algorithms.h"

namespace lowcomm::collectives {

Status barrier(OpRun& run) {
  return run.exchange_descriptors();
}

}  // namespace lowcomm::collectives
