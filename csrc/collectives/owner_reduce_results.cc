// Step 3 of the owner reduction (owner_reduce.cc has the schedule): the owners' results.
//
// An owner sends its codes for each segment unchanged to every other rank (a reduce: to the
// root only) as soon as that segment is reduced, and decodes the very bytes it sent, as every
// receiver does: every rank decodes the same bytes, so every rank ends bitwise identical.
// Uncompressed, results are received in place in the output and there is nothing to decode.
//
// A receiver decodes other owners' results in the order they are expected (segment-major, from
// the next owner on, as they are sent), as they arrive: between the segments of its own
// reduction and while it waits for a contribution, so the end of the operation is not one long
// decode of everything (on a busy host that tail was ~10% of a q4 all-reduce).

#include <algorithm>
#include <cstring>

#include "collectives/device_op.h"
#include "collectives/owner_reduce.h"

namespace lowcomm::collectives {

void Results::post_receives(const OwnerReduce& o) {
  codes_.resize(static_cast<size_t>(o.P));
  requests_.resize(static_cast<size_t>(o.P));
  if (!o.gets_results) return;
  for (int j = 0; j < o.P; ++j) {
    if (j == o.me) continue;
    for (size_t k = 0; k < o.segs[j].size(); ++k) {
      const Range s = o.segs[j][k];
      uint8_t* b = o.plain            ? o.out + s.begin * o.es
                   : o.dev != nullptr ? o.dev->result_slot(j, k)
                                      : o.run.scratch(o.bytes(s.count));
      codes_[j].push_back(b);
      requests_[j].push_back(o.run.irecv(o.peer(j), o.gather_tag, b, o.bytes(s.count)));
    }
  }
  const size_t rounds = o.max_segs();
  for (size_t k = 0; k < rounds; ++k)
    for (int d = 1; d < o.P; ++d)
      if (k < o.segs[(o.me + d) % o.P].size()) order_.emplace_back((o.me + d) % o.P, k);
  done_.assign(order_.size(), false);
  left_ = order_.size();
}

Status Results::send_own(const OwnerReduce& o, Range s, const uint8_t* res, uint8_t* dst) {
  if (o.finish.kind == Finish::kAllGather) {
    for (int d = 1; d < o.P; ++d)
      o.run.isend(o.peer((o.me + d) % o.P), o.gather_tag, res, o.bytes(s.count), s.count * o.es);
  } else if (o.sends_results) {
    o.run.isend(o.peer(o.finish.root), o.gather_tag, res, o.bytes(s.count), s.count * o.es);
  }
  // The owner decodes the very bytes it sent, like everyone else (a reduce: the root only); on
  // the GPU-codec path the device decodes them with the others' after the last arrives.
  if (o.dev != nullptr) {
    const size_t k =
        static_cast<size_t>(std::find_if(o.my_segs().begin(), o.my_segs().end(),
                                         [&](const Range& r) { return r.begin == s.begin; }) -
                            o.my_segs().begin());
    std::memcpy(o.dev->result_slot(o.me, k), res, o.bytes(s.count));
    return Status::ok();
  }
  if (!o.plain && o.gets_results) {
    ScopedTimer t(o.run.counters().decode);
    LOWCOMM_CHECK(decode(o.wire, res, o.bytes(s.count), s.count, o.a.dtype, dst, o.cpu));
  }
  if (o.gets_results) o.result_final(s);  // decoded, or (plain) the rounded sum itself
  return Status::ok();
}

Status Results::take(const OwnerReduce& o, bool block) {
  for (size_t i = 0; i < order_.size() && left_ > 0; ++i) {
    if (done_[i]) continue;
    const auto [j, k] = order_[i];
    if (!block && !requests_[j][k].test()) continue;
    LOWCOMM_CHECK(o.run.wait(requests_[j][k]));
    done_[i] = true;
    --left_;
    if (o.dev != nullptr) continue;  // decoded on the device
    const Range s = o.segs[j][k];
    if (!o.plain) {
      ScopedTimer t(o.run.counters().decode);
      LOWCOMM_CHECK(decode(o.wire, codes_[j][k], o.bytes(s.count), s.count, o.a.dtype,
                           o.out + s.begin * o.es, o.cpu));
    }
    o.result_final(s);  // decoded, or (plain) received in place
  }
  return Status::ok();
}

}  // namespace lowcomm::collectives
