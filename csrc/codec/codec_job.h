#pragma once
// One codec operation over one tensor, as the CPU and CUDA back ends see it. The public
// functions in codec.h validate their arguments and build a CodecJob; back ends trust it.

#include <cstdint>

#include "lowcomm/codec.h"

namespace lowcomm {

enum class CodecOp : uint8_t {
  kEncode,            // codes = Q(x)
  kEncodeFeedback,    // y = x + r; codes = Q(y); r = β·(y - D(codes)), β = spec.ef_decay
  kEncodeDelta,       // codes = Q(a - m); m += D(codes)
  kDecode,            // out = D(codes)
  kDecodeAccumulate,  // out += D(codes)
  kDecodeDelta,       // m += D(codes); out = m
};

inline bool is_encode(CodecOp op) {
  return op == CodecOp::kEncode || op == CodecOp::kEncodeFeedback || op == CodecOp::kEncodeDelta;
}

struct CodecJob {
  CodecOp op = CodecOp::kEncode;
  CodecSpec spec;
  DType dtype = DType::kFloat32;
  uint64_t n = 0;
  const void* x = nullptr;     // encode input (x, or a for delta)
  void* state = nullptr;       // fp32 residual (feedback) or cache m in dtype (delta)
  void* out = nullptr;         // decode output (decode_delta: may be null)
  uint8_t* payload = nullptr;  // scales, then packed codes (const for decodes)
  RoundingKey key;

  // Payload layout helpers.
  int scale_floats() const { return spec.kind == CodecKind::kMinmax ? 2 : 1; }
  uint64_t groups() const { return group_count(spec, n); }
  float* scales() const { return reinterpret_cast<float*>(payload); }
  uint8_t* packed() const { return payload + groups() * scale_floats() * sizeof(float); }
  uint64_t group_of(uint64_t i) const {
    return spec.grouping == Grouping::kBlock ? i / spec.block : i % spec.cols;
  }
};

}  // namespace lowcomm
