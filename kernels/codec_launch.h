#pragma once
// Launchers of the codec kernel families, one per .cu file. The host wrappers (codec_cuda.cc)
// validate the job and plan its launch (launch_policy.h); a launcher picks the kernel
// instantiation for the job, enqueues it on `stream` and returns the launch's cudaError.
// Jobs reaching a launcher have n > 0 (enqueue_sparse takes n == 0 too).

#include <cuda_runtime_api.h>

#include "codec/codec_job.h"
#include "launch_policy.h"

namespace lowcomm::cuda {

// Encodes of block-grouped quantized codecs: one fused kernel (block_encode.cu).
cudaError_t launch_block_encode(const CodecJob& job, const BlockEncodePlan& plan,
                                cudaStream_t stream);
// The same for groups of several sweeps only (block_encode_sweeps.cu).
cudaError_t launch_block_encode_sweeps(const CodecJob& job, const BlockEncodePlan& plan,
                                       cudaStream_t stream);

// Scratch bytes the column statistics need for `cols` columns.
uint64_t column_scratch_bytes(const CodecJob& job);
// Encodes of column-grouped quantized codecs: statistics into `scratch` (column_scratch_bytes
// of device memory, stream-ordered), scale records, then codes (column_encode.cu).
cudaError_t launch_column_encode(const CodecJob& job, const ColumnEncodePlan& plan, void* scratch,
                                 cudaStream_t stream);

// Decodes of quantized codecs, either grouping (codec_kernels.cu).
cudaError_t launch_quant_decode(const CodecJob& job, const GridShape& grid, cudaStream_t stream);

// Every op of the passthrough codecs none/bf16/fp16 (passthrough.cu).
cudaError_t launch_passthrough(const CodecJob& job, const GridShape& grid, cudaStream_t stream);

// Every op of the sparse codecs topk/randk (sparse_codec.cu): the bytes of sparse_cpu.cc.
// Decodes of malformed positions or scale records fail with kCorruptData (the stream is
// synchronised to read the kernel's verdict).
Status enqueue_sparse(const CodecJob& job, cudaStream_t stream);

}  // namespace lowcomm::cuda
