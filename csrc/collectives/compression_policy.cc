// decide_compression: the one rule for which codec and error feedback a reduction gets
// (include/lowcomm/communicator.h states it; every entry point calls this).

#include "lowcomm/codec.h"
#include "lowcomm/communicator.h"

namespace lowcomm {

Compression decide_compression(const CompressionPolicy& policy,
                               const std::optional<CodecSpec>& call_codec, DType dtype, ReduceOp op,
                               uint64_t bytes, std::string error_feedback_key,
                               bool owner_error_feedback) {
  Compression c;
  c.error_feedback_key = std::move(error_feedback_key);
  c.owner_error_feedback = owner_error_feedback;
  if (call_codec) {
    c.codec = call_codec;
    return c;
  }
  if (!policy.codec) return c;
  const bool takes = codec_dtype(dtype) && (op == ReduceOp::kSum || op == ReduceOp::kAverage) &&
                     bytes >= policy.min_bytes;
  if (takes) {
    c.codec = policy.codec;
    return c;
  }
  c.bypassed = true;
  c.error_feedback_key.clear();
  c.owner_error_feedback = false;
  return c;
}

}  // namespace lowcomm
