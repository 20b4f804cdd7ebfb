#pragma once
// CPU back end entry points. Ranges are in elements, multiples of 8 (the packing unit) except
// at the tensor's end; for block-grouped encodes they are also multiples of the block size.

#include <cstdint>

#include "codec/codec_job.h"

namespace lowcomm::cpu {

// Portable reference path: every op, codec, grouping and dtype.
void scalar_range(const CodecJob& job, uint64_t begin, uint64_t end);
// Column-grouped encodes only: the scales of columns [c0, c1), written into the payload.
void scalar_column_scales(const CodecJob& job, uint64_t c0, uint64_t c1);

// AVX2 path; returns false (having done nothing) for jobs it does not cover.
bool avx2_supported();
bool avx2_range(const CodecJob& job, uint64_t begin, uint64_t end);
// The min-max codecs' AVX2 kernels (cpu_avx2_minmax.cc), called by avx2_range: whole blocks
// (encode) or whole units (decode) of block-grouped jobs.
void avx2_minmax_range(const CodecJob& job, uint64_t begin, uint64_t end);

// The sparse codecs (topk, randk), whole jobs (sparse_cpu.cc); decodes fail with kCorruptData
// on positions a message cannot hold.
Status sparse_run(const CodecJob& job, const CpuOptions& opts);
// randk's kept offsets of n elements under `seed` (lowcomm::randk_positions).
Status randk_positions(const CodecSpec& spec, uint64_t n, uint64_t seed, uint64_t* out,
                       const CpuOptions& opts);

}  // namespace lowcomm::cpu
