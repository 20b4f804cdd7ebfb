#pragma once
// Typed loads and stores of tensor elements for the CPU paths: fp32, bf16 and fp16 in memory,
// fp32 in registers. Stores round to nearest even and write the canonical NaN.

#include <cstdint>

#include "codec/quant_math.h"
#include "lowcomm/codec.h"

namespace lowcomm::cpu {

template <DType D>
struct ElementIO;

template <>
struct ElementIO<DType::kFloat32> {
  static float load(const void* p, uint64_t i) { return static_cast<const float*>(p)[i]; }
  static void store(void* p, uint64_t i, float v) { static_cast<float*>(p)[i] = qm::canonical(v); }
};

template <>
struct ElementIO<DType::kBFloat16> {
  static float load(const void* p, uint64_t i) {
    return qm::bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  static void store(void* p, uint64_t i, float v) {
    static_cast<uint16_t*>(p)[i] = qm::f32_to_bf16(v);
  }
};

template <>
struct ElementIO<DType::kFloat16> {
  static float load(const void* p, uint64_t i) {
    return qm::f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  static void store(void* p, uint64_t i, float v) {
    static_cast<uint16_t*>(p)[i] = qm::f32_to_f16(v);
  }
};

// Calls fn.template operator()<D>() for the runtime dtype.
template <typename Fn>
void with_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      fn.template operator()<DType::kFloat32>();
      break;
    case DType::kBFloat16:
      fn.template operator()<DType::kBFloat16>();
      break;
    case DType::kFloat16:
      fn.template operator()<DType::kFloat16>();
      break;
    default:  // not a codec dtype: check_codec_job refused it
      break;
  }
}

}  // namespace lowcomm::cpu
