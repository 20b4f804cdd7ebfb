// Host entry points of the CUDA codec API (include/lowcomm/codec_cuda.h): the argument checks
// shared with the CPU path (codec/job_check.h), then a launch plan (launch_policy.h)
// and the kernel family that owns the job (codec_launch.h). Nothing here waits for the device
// but a sparse decode (it reads back the kernel's verdict on the message's positions and scales):
// launches and the column-statistics scratch (cudaMallocAsync) are all ordered on the caller's
// stream.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "codec/codec_job.h"
#include "codec/job_check.h"
#include "codec_launch.h"
#include "cuda_check.h"
#include "launch_policy.h"
#include "lowcomm/codec_cuda.h"

namespace lowcomm {
namespace {

// Stream-ordered device scratch, returned to the pool after the work queued before it.
class StreamScratch {
 public:
  StreamScratch() = default;
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch() {
    // A failure here can only follow one the caller already sees; nothing better to do with it.
    if (ptr_ != nullptr) (void)cudaFreeAsync(ptr_, stream_);
  }

  Status allocate(uint64_t bytes, cudaStream_t stream) {
    LOWCOMM_CHECK_CUDA(cudaMallocAsync(&ptr_, bytes, stream));
    stream_ = stream;
    return Status::ok();
  }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

Status launched(cudaError_t err, const char* what) {
  return err == cudaSuccess ? Status::ok() : cuda::cuda_status(err, what);
}

Status enqueue(const CodecJob& job, cudaStream_t stream) {
  if (job.n == 0) return Status::ok();
  if (job.spec.kind == CodecKind::kNone) {
    return launched(cuda::launch_passthrough(job, cuda::plan_units(job.n), stream),
                    "passthrough kernel launch");
  }
  if (!is_encode(job.op)) {
    return launched(cuda::launch_quant_decode(job, cuda::plan_units(job.n), stream),
                    "decode kernel launch");
  }
  if (job.spec.grouping == Grouping::kBlock) {
    return launched(cuda::launch_block_encode(job, cuda::plan_block_encode(job), stream),
                    "block encode kernel launch");
  }
  StreamScratch scratch;
  LOWCOMM_CHECK(scratch.allocate(cuda::column_scratch_bytes(job), stream));
  return launched(
      cuda::launch_column_encode(job, cuda::plan_column_encode(job), scratch.get(), stream),
      "column encode kernel launch");
}

Status run_checked(const CodecJob& job, const void* data, uint64_t codes_bytes,
                   cudaStream_t stream) {
  LOWCOMM_CHECK(check_codec_job(job, data, codes_bytes));
  if (job.op == CodecOp::kEncodeFeedback && job.spec.ef_decay != 1.0f && !job.spec.sparse()) {
    return unsupported(to_string(job.spec) +
                       ": error feedback with decay runs on the CPU only for dense codecs");
  }
  if (job.spec.sparse()) return cuda::enqueue_sparse(job, stream);
  return enqueue(job, stream);
}

}  // namespace

bool cuda_device_available() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // leave no error behind for the caller's next check
    return false;
  }
  return count > 0;
}

Status encode_cuda(const CodecSpec& spec, DType dtype, const void* x, uint64_t n, void* codes,
                   uint64_t codes_bytes, RoundingKey key, cudaStream_t stream) {
  CodecJob job{
      CodecOp::kEncode, spec, dtype, n, x, nullptr, nullptr, static_cast<uint8_t*>(codes), key};
  return run_checked(job, x, codes_bytes, stream);
}

Status decode_cuda(const CodecSpec& spec, const void* codes, uint64_t codes_bytes, uint64_t n,
                   DType dtype, void* out, cudaStream_t stream) {
  CodecJob job{CodecOp::kDecode,
               spec,
               dtype,
               n,
               nullptr,
               nullptr,
               out,
               const_cast<uint8_t*>(static_cast<const uint8_t*>(codes)),
               {}};
  return run_checked(job, out, codes_bytes, stream);
}

Status decode_accumulate_cuda(const CodecSpec& spec, const void* codes, uint64_t codes_bytes,
                              uint64_t n, DType dtype, void* out, cudaStream_t stream) {
  CodecJob job{CodecOp::kDecodeAccumulate,
               spec,
               dtype,
               n,
               nullptr,
               nullptr,
               out,
               const_cast<uint8_t*>(static_cast<const uint8_t*>(codes)),
               {}};
  return run_checked(job, out, codes_bytes, stream);
}

Status encode_error_feedback_cuda(const CodecSpec& spec, DType dtype, const void* x,
                                  float* residual, uint64_t n, void* codes, uint64_t codes_bytes,
                                  RoundingKey key, cudaStream_t stream) {
  CodecJob job{CodecOp::kEncodeFeedback,     spec, dtype, n, x, residual, nullptr,
               static_cast<uint8_t*>(codes), key};
  return run_checked(job, x, codes_bytes, stream);
}

Status encode_delta_cuda(const CodecSpec& spec, DType dtype, const void* a, void* m, uint64_t n,
                         void* codes, uint64_t codes_bytes, RoundingKey key, cudaStream_t stream) {
  CodecJob job{CodecOp::kEncodeDelta,        spec, dtype, n, a, m, nullptr,
               static_cast<uint8_t*>(codes), key};
  return run_checked(job, a, codes_bytes, stream);
}

Status decode_delta_cuda(const CodecSpec& spec, const void* codes, uint64_t codes_bytes, uint64_t n,
                         DType dtype, void* m, void* out, cudaStream_t stream) {
  CodecJob job{CodecOp::kDecodeDelta,
               spec,
               dtype,
               n,
               nullptr,
               m,
               out,
               const_cast<uint8_t*>(static_cast<const uint8_t*>(codes)),
               {}};
  return run_checked(job, m, codes_bytes, stream);
}

}  // namespace lowcomm
