#pragma once
// The per-element steps every encode kernel shares: the value to quantize (source_value in
// cpu_scalar.cc) and the state left behind (update_state), for plain, error-feedback and
// delta encodes. The op is a template argument, so plain encodes never touch state.

#include <cstdint>

#include "codec/codec_job.h"
#include "codec/quant_math.h"
#include "device_io.cuh"
#include "group_quant.cuh"

namespace lowcomm::cuda {

// y = x, x + residual, or a - m for elements [i0, i0 + count) (zero beyond). m receives the
// cache values of a delta encode, which its state update needs again.
template <DType D, CodecOp Op>
LC_DEV void load_source_unit(const void* x, const void* state, uint64_t i0, uint32_t count,
                             float y[8], float m[8]) {
  load_unit<D>(x, i0, count, y);
  if constexpr (Op == CodecOp::kEncodeFeedback) {
    float r[8];
    load_unit<DType::kFloat32>(state, i0, count, r);
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = qm::add(y[j], r[j]);
  } else if constexpr (Op == CodecOp::kEncodeDelta) {
    load_unit<D>(state, i0, count, m);
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = qm::sub(y[j], m[j]);
  }
}

template <DType D, CodecOp Op>
LC_DEV float load_source_element(const void* x, const void* state, uint64_t i) {
  float v = load_element<D>(x, i);
  if constexpr (Op == CodecOp::kEncodeFeedback) {
    return qm::add(v, load_element<DType::kFloat32>(state, i));
  } else if constexpr (Op == CodecOp::kEncodeDelta) {
    return qm::sub(v, load_element<D>(state, i));
  } else {
    return v;
  }
}

// update_state(): the residual y - D(code), or the cache m + D(code); zero when the element's
// group (or, for passthrough, the element) is not finite.
template <CodecOp Op>
LC_DEV float next_state(float y, float m, float dec, bool finite) {
  if constexpr (Op == CodecOp::kEncodeFeedback) {
    return finite ? qm::canonical(qm::sub(y, dec)) : 0.0f;
  } else {
    return finite ? qm::add(m, dec) : 0.0f;
  }
}

template <DType D, CodecOp Op>
LC_DEV void store_state_unit(void* state, uint64_t i0, uint32_t count, const float s[8]) {
  if constexpr (Op == CodecOp::kEncodeFeedback) {
    store_unit<DType::kFloat32>(state, i0, count, s);
  } else if constexpr (Op == CodecOp::kEncodeDelta) {
    store_unit<D>(state, i0, count, s);
  }
}

// Quantizes element y of group q; `s` receives its next state (error feedback, delta).
template <CodecOp Op, QuantKind K, bool SR>
LC_DEV uint32_t encode_element(const GroupQuant& q, float y, float m, int bits, uint32_t rnd,
                               float& s) {
  uint32_t code = quant_code<K, SR>(q, y, bits, rnd);
  if constexpr (Op != CodecOp::kEncode)
    s = next_state<Op>(y, m, quant_value<K>(q, code, bits), q.finite);
  return code;
}

}  // namespace lowcomm::cuda
