#pragma once
// Per-group statistics and the per-group decode parameters, shared by the CPU paths.
// The 1-bit mean uses the canonical "stride-halving" tree over the group padded with zeros to
// the block size: t[i] += t[i + s] for s = G/2, G/4, ..., 1. The CUDA kernel sums in exactly
// this order, so both produce the same bits.

#include <cstdint>

#include "codec/codec_job.h"
#include "codec/quant_math.h"

namespace lowcomm::cpu {

// Sums t[0..G) in the canonical tree order; G is a power of two. Destroys t.
inline float tree_sum(float* t, uint32_t g) {
  for (uint32_t s = g / 2; s >= 1; s /= 2) {
    for (uint32_t i = 0; i < s; ++i) t[i] = qm::add(t[i], t[i + s]);
  }
  return t[0];
}

// Decode parameters of one group, derived from its scale record.
struct GroupDecode {
  bool finite = true;
  float scale = 0.0f;  // absmax / mean|x|
  qm::MinmaxParams mm{};
};

inline GroupDecode group_decode(const CodecJob& job, uint64_t g) {
  GroupDecode d;
  const float* s = job.scales();
  if (job.spec.kind == CodecKind::kMinmax) {
    float lo = s[2 * g], hi = s[2 * g + 1];
    d.finite = qm::is_finite(lo) && qm::is_finite(hi);
    if (d.finite) d.mm = qm::minmax_params(lo, hi, job.spec.bits);
  } else {
    d.scale = s[g];
    d.finite = qm::is_finite(d.scale);
  }
  return d;
}

inline float decode_value(const CodecJob& job, const GroupDecode& d, uint32_t code) {
  if (!d.finite) return qm::bits_f32(qm::kCanonicalNanF32);
  if (job.spec.kind == CodecKind::kMinmax) return qm::minmax_value(code, d.mm);
  if (job.spec.bits == 1) return qm::sign_value(code, d.scale);
  return qm::absmax_value(code, d.scale, job.spec.bits);
}

// Stochastic rounding's 8 random bits for element i of the job (qm::sr_draw).
inline uint32_t sr_draw(const RoundingKey& key, uint64_t i) {
  return qm::sr_draw(key.seed, key.offset + i);
}

}  // namespace lowcomm::cpu
