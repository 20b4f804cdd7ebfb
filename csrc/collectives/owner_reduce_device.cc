// The owner reduction's GPU-codec path (owner_reduce.h, DeviceCodes): for an all-reduce or
// reduce-scatter of device buffers with a dense lossy codec, the device encodes every
// contribution and decodes every result; the host moves and reduces codes only.
//
// Codes are laid out in tensor order (owner by owner, segment by segment), the same layout for
// the contributions (encoded with the key each host encode would use: the rank's contribution
// seed and the element's index) and the results, so one copy moves each way. The time the
// device takes counts as encode (to the codes in pinned memory) and decode (from the results'
// copy to the decoded output).

#include "collectives/device_op.h"
#include "collectives/owner_reduce.h"
#include "collectives/reduce_common.h"

namespace lowcomm::collectives {

Status DeviceCodes::encode_contributions() {
  const ReduceArgs& a = o_.a;
  // Each segment's codes start 16-byte aligned (the kernels take 4-byte aligned codes; a
  // reduce-scatter's chunks are not cut on scale groups, so a segment's codes may end anywhere).
  offset_.resize(o_.segs.size());
  for (size_t j = 0; j < o_.segs.size(); ++j) {
    for (const Range& s : o_.segs[j]) {
      offset_[j].push_back(total_);
      total_ += (o_.bytes(s.count) + 15) / 16 * 16;
    }
  }
  ScopedTimer t(o_.run.counters().encode);
  auto pinned = d_.pinned(total_);
  if (!pinned) return pinned.status();
  contributions_ = *pinned;
  if (o_.gets_results) {
    auto r = d_.pinned(total_);
    if (!r) return r.status();
    results_ = *r;
  }
  if (o_.finish.kind == Finish::kScatter) {
    auto r = d_.pinned(o_.mine.count * o_.es);
    if (!r) return r.status();
    scatter_out_ = *r;
  }
  auto codes = d_.device_scratch(total_);
  if (!codes) return codes.status();
  auto* dev_codes = static_cast<uint8_t*>(*codes);
  float* residual = nullptr;
  if (!a.error_feedback_key.empty()) {
    auto e = o_.run.ef().entry_for_device(a.error_feedback_key, a.n);
    if (!e) return e.status();
    auto r = device_residual(d_, **e);
    if (!r) return r.status();
    residual = *r;
  }
  const uint64_t seed = rounding_seed(a.seed, a.step, o_.me, 1);
  const auto* in = static_cast<const uint8_t*>(a.send);
  for (size_t j = 0; j < o_.segs.size(); ++j) {
    for (size_t k = 0; k < o_.segs[j].size(); ++k) {
      const Range s = o_.segs[j][k];
      uint8_t* dst = dev_codes + offset_[j][k];
      const RoundingKey key{seed, s.begin};
      if (residual != nullptr) {
        LOWCOMM_CHECK(d_.rt().encode_error_feedback(o_.wire, a.dtype, in + s.begin * o_.es,
                                                    residual + s.begin, s.count, dst,
                                                    o_.bytes(s.count), key, d_.stream()));
      } else {
        LOWCOMM_CHECK(d_.rt().encode(o_.wire, a.dtype, in + s.begin * o_.es, s.count, dst,
                                     o_.bytes(s.count), key, d_.stream()));
      }
    }
  }
  LOWCOMM_CHECK(d_.to_host(contributions_, dev_codes, total_));
  return d_.sync();
}

const uint8_t* DeviceCodes::contribution(int owner, size_t k) const {
  return contributions_ + offset_[static_cast<size_t>(owner)][k];
}

uint8_t* DeviceCodes::result_slot(int owner, size_t k) const {
  return results_ + offset_[static_cast<size_t>(owner)][k];
}

Status DeviceCodes::finish() {
  const ReduceArgs& a = o_.a;
  ScopedTimer t(o_.run.counters().decode);
  if (o_.finish.kind == Finish::kScatter) {
    LOWCOMM_CHECK(d_.to_device(a.recv, scatter_out_, o_.mine.count * o_.es));
    return d_.sync();
  }
  if (!o_.gets_results) return Status::ok();
  auto codes = d_.device_scratch(total_);
  if (!codes) return codes.status();
  auto* dev_codes = static_cast<uint8_t*>(*codes);
  LOWCOMM_CHECK(d_.to_device(dev_codes, results_, total_));
  auto* out = static_cast<uint8_t*>(a.recv);
  for (size_t j = 0; j < o_.segs.size(); ++j) {
    for (size_t k = 0; k < o_.segs[j].size(); ++k) {
      const Range s = o_.segs[j][k];
      LOWCOMM_CHECK(d_.rt().decode(o_.wire, dev_codes + offset_[j][k], o_.bytes(s.count), s.count,
                                   a.dtype, out + s.begin * o_.es, d_.stream()));
    }
  }
  return d_.sync();
}

}  // namespace lowcomm::collectives
