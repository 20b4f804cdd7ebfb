#include "codec/job_check.h"

#include <string>

namespace lowcomm {
namespace {

bool misaligned(const void* p, size_t align) {
  return reinterpret_cast<uintptr_t>(p) % align != 0;
}

// What a particular operation needs beyond the common checks.
Status check_op_buffers(const CodecJob& job) {
  switch (job.op) {
    case CodecOp::kEncodeFeedback:
      if (job.n > 0 && job.state == nullptr)
        return invalid_argument("error feedback needs a residual buffer");
      // The residual is fp32 whatever the tensor's dtype (and a GPU faults on misalignment).
      if (misaligned(job.state, alignof(float))) {
        return invalid_argument("the error-feedback residual (fp32) must be 4-byte aligned");
      }
      break;
    case CodecOp::kEncodeDelta:
      if (job.n > 0 && job.state == nullptr)
        return invalid_argument("delta encode needs the activation cache m");
      break;
    case CodecOp::kDecodeDelta:
      if (job.n > 0 && job.out != nullptr && job.out == job.state) {
        return invalid_argument(
            "decode_delta: out must not alias the cache m (pass null for no output)");
      }
      break;
    default:
      break;
  }
  return Status::ok();
}

}  // namespace

Status check_codec_job(const CodecJob& job, const void* data, uint64_t codes_bytes) {
  LOWCOMM_CHECK(check_op_buffers(job));
  LOWCOMM_CHECK(validate_spec(job.spec));
  if (job.spec.sparse() && (job.op == CodecOp::kEncodeDelta || job.op == CodecOp::kDecodeDelta)) {
    return invalid_argument(to_string(job.spec) +
                            ": sparse codecs do not take AQ-SGD deltas (use q2..q8)");
  }
  LOWCOMM_CHECK(check_count(job.spec, job.n));
  if (!codec_dtype(job.dtype)) {
    return invalid_argument(
        valid_dtype(job.dtype)
            ? std::string("codecs take fp32, bf16 or fp16 tensors, not ") + dtype_name(job.dtype)
            : "unknown dtype value " + std::to_string(static_cast<int>(job.dtype)));
  }
  uint64_t need = encoded_size(job.spec, job.n);
  if (codes_bytes < need) {
    return invalid_argument("codes buffer holds " + std::to_string(codes_bytes) + " bytes; " +
                            to_string(job.spec) + " needs " + std::to_string(need) + " for " +
                            std::to_string(job.n) + " elements");
  }
  if (job.n > 0 && (data == nullptr || job.payload == nullptr)) {
    return invalid_argument("null buffer for a non-empty tensor");
  }
  // Scales are fp32 at the payload's start, passthrough values are wire-dtype elements, and
  // tensors are accessed as their element type.
  const size_t payload_align = job.spec.quantized() ? 4 : dtype_size(job.spec.wire_dtype);
  if (misaligned(job.payload, payload_align)) {
    return invalid_argument("codes buffer must be " + std::to_string(payload_align) +
                            "-byte aligned");
  }
  for (const void* p :
       {job.x, static_cast<const void*>(job.state), static_cast<const void*>(job.out)}) {
    if (misaligned(p, dtype_size(job.dtype))) {
      return invalid_argument(
          std::string("tensor buffers must be aligned to their element size (") +
          dtype_name(job.dtype) + ")");
    }
  }
  return Status::ok();
}

}  // namespace lowcomm
