#pragma once
// The codec layer on a CUDA device: the six operations of codec.h, enqueued on a stream.
//
// Every pointer is a device pointer (or any memory the device can access: managed, or host
// memory on systems where the GPU can read it). Each call checks its arguments on the host,
// enqueues its kernels on `stream` and returns without waiting (sparse decodes excepted: they
// synchronise the stream to report a malformed message as kCorruptData, so they cannot be
// captured in a CUDA graph); results are ready when the stream reaches that point. The bytes
// written equal those of the CPU functions in codec.h for the same input, spec and RoundingKey.
//
// Buffers follow codec.h: x, out and m are arrays of `dtype` aligned to its size (the residual,
// fp32, to 4 bytes); codes are 4-byte aligned (passthrough: wire-dtype aligned); buffers do not
// overlap, and decode_delta_cuda's out may be null but not m. Errors: kInvalidArgument for the
// arguments the CPU functions refuse (nothing is enqueued), kSystem naming the cudaError when
// the runtime refuses a launch or an allocation. Faults of kernels already enqueued surface at
// the caller's next synchronisation.
//
// This header is C++17 and needs no CUDA headers.

#include <cstdint>

#include "lowcomm/codec.h"
#include "lowcomm/export.h"
#include "lowcomm/status.h"

// The CUDA runtime's own declaration (driver_types.h), repeated so callers need not include it.
typedef struct CUstream_st* cudaStream_t;

namespace lowcomm {

// True when the CUDA runtime reports at least one usable device.
LOWCOMM_API bool cuda_device_available();

// codes = Q(x)
LOWCOMM_API Status encode_cuda(const CodecSpec& spec, DType dtype, const void* x, uint64_t n,
                               void* codes, uint64_t codes_bytes, RoundingKey key,
                               cudaStream_t stream);
// out = D(codes)
LOWCOMM_API Status decode_cuda(const CodecSpec& spec, const void* codes, uint64_t codes_bytes,
                               uint64_t n, DType dtype, void* out, cudaStream_t stream);
// out += D(codes), accumulated in fp32 and rounded once to dtype
LOWCOMM_API Status decode_accumulate_cuda(const CodecSpec& spec, const void* codes,
                                          uint64_t codes_bytes, uint64_t n, DType dtype, void* out,
                                          cudaStream_t stream);
// y = x + residual; codes = Q(y); residual = β·(y - D(codes))  (residual: fp32, in place;
// β = spec.ef_decay, which the dense codecs' kernels take only at 1: kUnsupported otherwise)
LOWCOMM_API Status encode_error_feedback_cuda(const CodecSpec& spec, DType dtype, const void* x,
                                              float* residual, uint64_t n, void* codes,
                                              uint64_t codes_bytes, RoundingKey key,
                                              cudaStream_t stream);
// codes = Q(a - m); m += D(codes)  (m has a's dtype, in place)
LOWCOMM_API Status encode_delta_cuda(const CodecSpec& spec, DType dtype, const void* a, void* m,
                                     uint64_t n, void* codes, uint64_t codes_bytes, RoundingKey key,
                                     cudaStream_t stream);
// m += D(codes); out = m  (out may be null; it must not alias m)
LOWCOMM_API Status decode_delta_cuda(const CodecSpec& spec, const void* codes, uint64_t codes_bytes,
                                     uint64_t n, DType dtype, void* m, void* out,
                                     cudaStream_t stream);

}  // namespace lowcomm
