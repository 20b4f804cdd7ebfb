// Host entry points of the codec API: argument checks, then the job split over the codec
// thread pool. Every split point is a multiple of the block size (block grouping) or of the
// 8-element packing unit, so each task writes whole groups and whole bytes; results do not
// depend on the thread count.

#include <algorithm>
#include <cstdint>
#include <string>

#include "codec/codec_job.h"
#include "codec/cpu_kernels.h"
#include "codec/job_check.h"
#include "core/thread_pool.h"

namespace lowcomm {
namespace {

constexpr uint64_t kTaskElements = uint64_t{1} << 16;

void run_range(const CodecJob& job, const CpuOptions& opts, uint64_t begin, uint64_t end) {
  if (opts.simd && cpu::avx2_supported() && cpu::avx2_range(job, begin, end)) return;
  cpu::scalar_range(job, begin, end);
}

void run_job(const CodecJob& job, const CpuOptions& opts) {
  if (job.n == 0) return;
  ThreadPool& pool = ThreadPool::global();
  if (is_encode(job.op) && job.spec.grouping == Grouping::kColumn) {
    uint64_t cols = job.spec.cols;
    uint64_t col_chunk =
        std::max<uint64_t>(64, kTaskElements / std::max<uint64_t>(1, job.n / cols));
    uint64_t col_tasks = (cols + col_chunk - 1) / col_chunk;
    pool.parallel_for(col_tasks, opts.threads, [&](uint64_t t) {
      cpu::scalar_column_scales(job, t * col_chunk, std::min(cols, (t + 1) * col_chunk));
    });
  }
  uint64_t chunk = kTaskElements;
  if (job.spec.grouping == Grouping::kBlock) chunk = std::max<uint64_t>(chunk, job.spec.block);
  uint64_t tasks = (job.n + chunk - 1) / chunk;
  pool.parallel_for(tasks, opts.threads, [&](uint64_t t) {
    run_range(job, opts, t * chunk, std::min(job.n, (t + 1) * chunk));
  });
}

Status run_checked(CodecJob& job, const void* data, uint64_t codes_bytes, const CpuOptions& opts) {
  LOWCOMM_CHECK(check_codec_job(job, data, codes_bytes));
  if (job.spec.sparse()) return cpu::sparse_run(job, opts);
  run_job(job, opts);
  return Status::ok();
}

}  // namespace

Status encode(const CodecSpec& spec, DType dtype, const void* x, uint64_t n, void* codes,
              uint64_t codes_bytes, RoundingKey key, CpuOptions opts) {
  CodecJob job{
      CodecOp::kEncode, spec, dtype, n, x, nullptr, nullptr, static_cast<uint8_t*>(codes), key};
  return run_checked(job, x, codes_bytes, opts);
}

Status decode(const CodecSpec& spec, const void* codes, uint64_t codes_bytes, uint64_t n,
              DType dtype, void* out, CpuOptions opts) {
  CodecJob job{CodecOp::kDecode,
               spec,
               dtype,
               n,
               nullptr,
               nullptr,
               out,
               const_cast<uint8_t*>(static_cast<const uint8_t*>(codes)),
               {}};
  return run_checked(job, out, codes_bytes, opts);
}

Status decode_accumulate(const CodecSpec& spec, const void* codes, uint64_t codes_bytes, uint64_t n,
                         DType dtype, void* out, CpuOptions opts) {
  CodecJob job{CodecOp::kDecodeAccumulate,
               spec,
               dtype,
               n,
               nullptr,
               nullptr,
               out,
               const_cast<uint8_t*>(static_cast<const uint8_t*>(codes)),
               {}};
  return run_checked(job, out, codes_bytes, opts);
}

Status randk_positions(const CodecSpec& spec, uint64_t n, uint64_t seed, uint64_t* out,
                       CpuOptions opts) {
  LOWCOMM_CHECK(validate_spec(spec));
  LOWCOMM_CHECK(check_count(spec, n));
  if (spec.kind != CodecKind::kRandk)
    return invalid_argument("randk_positions: " + to_string(spec) + " is not a randk spec");
  if (n > 0 && out == nullptr) return invalid_argument("randk_positions: null output");
  return cpu::randk_positions(spec, n, seed, out, opts);
}

Status encode_error_feedback(const CodecSpec& spec, DType dtype, const void* x, float* residual,
                             uint64_t n, void* codes, uint64_t codes_bytes, RoundingKey key,
                             CpuOptions opts) {
  CodecJob job{CodecOp::kEncodeFeedback,     spec, dtype, n, x, residual, nullptr,
               static_cast<uint8_t*>(codes), key};
  return run_checked(job, x, codes_bytes, opts);
}

Status encode_delta(const CodecSpec& spec, DType dtype, const void* a, void* m, uint64_t n,
                    void* codes, uint64_t codes_bytes, RoundingKey key, CpuOptions opts) {
  CodecJob job{CodecOp::kEncodeDelta,        spec, dtype, n, a, m, nullptr,
               static_cast<uint8_t*>(codes), key};
  return run_checked(job, a, codes_bytes, opts);
}

Status decode_delta(const CodecSpec& spec, const void* codes, uint64_t codes_bytes, uint64_t n,
                    DType dtype, void* m, void* out, CpuOptions opts) {
  CodecJob job{CodecOp::kDecodeDelta,
               spec,
               dtype,
               n,
               nullptr,
               m,
               out,
               const_cast<uint8_t*>(static_cast<const uint8_t*>(codes)),
               {}};
  return run_checked(job, m, codes_bytes, opts);
}

}  // namespace lowcomm
