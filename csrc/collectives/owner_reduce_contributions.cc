// Step 1 of the owner reduction (owner_reduce.cc has the schedule): every rank's contribution
// to every owner chunk, one message per pipeline segment.
//
// Segment-major, each rank starting with the next owner, so every owner's first segment leaves
// early and all owners start reducing at once; a rank's own chunk comes last (it is not on the
// wire) but is encoded like the others, so every contribution carries the same single
// quantization. Uncompressed, the input bytes are sent as they are (no copy). Stochastic
// rounding is keyed by (the rank's contribution seed, the element's index in the tensor), so
// the cut into chunks and segments does not change the codes.

#include "collectives/owner_reduce.h"
#include "collectives/reduce_common.h"

namespace lowcomm::collectives {

Contributions post_contribution_receives(const OwnerReduce& o) {
  Contributions c;
  c.codes.resize(static_cast<size_t>(o.P));
  c.requests.resize(static_cast<size_t>(o.P));
  for (int r = 0; r < o.P; ++r) {
    if (r == o.me) continue;
    for (const Range& s : o.my_segs()) {
      uint8_t* b = o.run.scratch(o.bytes(s.count));
      c.codes[r].push_back(b);
      c.requests[r].push_back(o.run.irecv(o.peer(r), o.reduce_tag, b, o.bytes(s.count)));
    }
  }
  c.own.resize(o.my_segs().size());
  return c;
}

Status send_contributions(const OwnerReduce& o, Contributions& c) {
  const ReduceArgs& a = o.a;
  const uint64_t send_seed = rounding_seed(a.seed, a.step, o.me, 1);
  const size_t rounds = o.max_segs();
  for (size_t k = 0; k < rounds; ++k) {
    for (int d = 1; d <= o.P; ++d) {
      const int j = (o.me + d) % o.P;  // own chunk last: it is not on the wire
      if (k >= o.segs[j].size()) continue;
      const Range s = o.segs[j][k];
      const uint8_t* src = o.in + s.begin * o.es;
      const uint8_t* codes = src;
      if (o.dev != nullptr) {
        codes = o.dev->contribution(j, k);  // encoded on the device before step 1
      } else if (!o.plain) {
        uint8_t* b = o.run.scratch(o.bytes(s.count));
        RoundingKey key{send_seed, s.begin};
        ScopedTimer t(o.run.counters().encode);
        if (o.ef) {
          LOWCOMM_CHECK(encode_error_feedback(o.wire, a.dtype, src, o.ef->sender.data() + s.begin,
                                              s.count, b, o.bytes(s.count), key, o.cpu));
        } else {
          LOWCOMM_CHECK(encode(o.wire, a.dtype, src, s.count, b, o.bytes(s.count), key, o.cpu));
        }
        codes = b;
      }
      if (j == o.me) {
        c.own[k] = codes;
      } else {
        o.run.isend(o.peer(j), o.reduce_tag, codes, o.bytes(s.count), s.count * o.es);
      }
    }
  }
  return Status::ok();
}

}  // namespace lowcomm::collectives
