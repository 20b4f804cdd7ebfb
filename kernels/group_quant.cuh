#pragma once
// One scale group on the device: the parameters derived from its scale record, the code of a
// value and the value of a code, and the stochastic-rounding draws. Each function restates, on
// the device, its host counterpart step for step (named beside it); the arithmetic itself is
// qm:: (csrc/codec/quant_math.h), compiled for both sides, so the bits agree.

#include <cstdint>

#include "codec/quant_math.h"
#include "device_io.cuh"

namespace lowcomm::cuda {

// The three quantizers, fixed at compile time per kernel instantiation.
enum class QuantKind : uint8_t {
  kAbsmax,  // q2, q3, q4, q8
  kSign,    // q1: sign x mean|y|
  kMinmax,  // minmax2, minmax4, minmax8
};

// Host: GroupDecode (group_math.h) plus GroupEncoder's AbsmaxParams (cpu_scalar.cc).
struct GroupQuant {
  bool finite = true;
  float scale = 0.0f;  // absmax or mean|y|
  qm::AbsmaxParams ap{};
  qm::MinmaxParams mm{};
};

// group_decode(): a record with a non-finite field marks the whole group non-finite.
// `s1` is the max of a minmax record, unused otherwise.
template <QuantKind K>
LC_DEV GroupQuant group_for_decode(float s0, float s1, int bits) {
  GroupQuant q;
  if constexpr (K == QuantKind::kMinmax) {
    q.finite = qm::is_finite(s0) && qm::is_finite(s1);
    if (q.finite) q.mm = qm::minmax_params(s0, s1, bits);
  } else {
    q.scale = s0;
    q.finite = qm::is_finite(s0);
  }
  return q;
}

// GroupEncoder's constructor: the decode parameters plus 1/absmax for the absmax grid.
template <QuantKind K>
LC_DEV GroupQuant group_for_encode(float s0, float s1, int bits) {
  GroupQuant q = group_for_decode<K>(s0, s1, bits);
  if constexpr (K == QuantKind::kAbsmax) {
    if (q.finite) q.ap = qm::absmax_params(q.scale, bits);
  }
  return q;
}

// The scale record of group g as stored in the payload (1 float, or lo and hi for minmax).
template <QuantKind K>
LC_DEV void load_record(const uint8_t* payload, uint64_t g, float& s0, float& s1) {
  if constexpr (K == QuantKind::kMinmax) {
    s0 = load_scale(payload, 2 * g);
    s1 = load_scale(payload, 2 * g + 1);
  } else {
    s0 = load_scale(payload, g);
    s1 = 0.0f;
  }
}

// GroupEncoder::code(): non-finite groups get code 0.
template <QuantKind K, bool SR>
LC_DEV uint32_t quant_code(const GroupQuant& q, float y, int bits, uint32_t rnd) {
  if (!q.finite) return 0;
  if constexpr (K == QuantKind::kMinmax) {
    return qm::minmax_code(y, q.mm, bits, SR, rnd);
  } else if constexpr (K == QuantKind::kSign) {
    return qm::sign_code(y);
  } else {
    return qm::absmax_code(y, q.ap, bits, SR, rnd);
  }
}

// decode_value(): non-finite groups decode to the canonical NaN.
template <QuantKind K>
LC_DEV float quant_value(const GroupQuant& q, uint32_t code, int bits) {
  if (!q.finite) return qm::bits_f32(qm::kCanonicalNanF32);
  if constexpr (K == QuantKind::kMinmax) {
    return qm::minmax_value(code, q.mm);
  } else if constexpr (K == QuantKind::kSign) {
    return qm::sign_value(code, q.scale);
  } else {
    return qm::absmax_value(code, q.scale, bits);
  }
}

// ---- stochastic rounding: sr_draw() (group_math.h) for 8 consecutive elements ----

// Draws of lanes S .. S+7 of two consecutive counters' outputs: a's lanes, then b's.
template <int S>
LC_DEV void take_draws(const qm::U32x4& a, const qm::U32x4& b, uint32_t r[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    r[j] = S + j < qm::kSrPerDraw ? qm::sr_lane(a, S + j) : qm::sr_lane(b, S + j - qm::kSrPerDraw);
  }
}

// take_draws<skip>, with skip (< kSrPerDraw) known at run time: every lane index stays a
// compile-time constant, so the words stay in registers.
template <int S = 0>
LC_DEV void take_draws_from(uint32_t skip, const qm::U32x4& a, const qm::U32x4& b, uint32_t r[8]) {
  if constexpr (S + 1 < qm::kSrPerDraw) {
    if (skip != S) return take_draws_from<S + 1>(skip, a, b, r);
  }
  take_draws<S>(a, b, r);
}

// Draws of elements i .. i + 7 where first = key.offset + i (mod 2^64): element k's is
// qm::sr_draw(seed, first + k), lane (first + k) mod kSrPerDraw of counter
// (first + k) / kSrPerDraw. Counters are taken mod 2^64 / kSrPerDraw, so that an index that
// wraps past 2^64 gets the counter the host computes from the wrapped index. The eight draws
// need a second counter only when they do not start inside the first counter's lanes.
LC_DEV void sr_draws8(uint64_t seed, uint64_t first, uint32_t r[8]) {
  const uint64_t c = first >> qm::kSrDrawShift;
  const uint32_t skip = static_cast<uint32_t>(first) & (qm::kSrPerDraw - 1);
  const qm::U32x4 a = qm::philox(c, seed);
  qm::U32x4 b{};
  if (skip + 8 > qm::kSrPerDraw) b = qm::philox((c + 1) & qm::kSrCounterMask, seed);
  take_draws_from(skip, a, b, r);
}

}  // namespace lowcomm::cuda
