#pragma once
// Launch shapes of every codec kernel, computed here and nowhere else: the host wrappers
// (codec_cuda.cc) plan a job with these functions and hand the plan to the launchers
// (codec_launch.h), which only read it. All kernels loop grid-stride with 64-bit indices, so
// capping the grid never drops work.

#include <algorithm>
#include <cstdint>

#include "codec/codec_job.h"

namespace lowcomm::cuda {

struct LaunchPolicy {
  // 8 warps a block: small enough for several blocks per SM (latency hiding for the streaming
  // loads), large enough that block scheduling costs nothing at 256 MiB.
  static constexpr uint32_t kThreads = 256;
  static constexpr uint32_t kWarp = 32;
  // The packing unit: 8 elements make `bits` whole bytes, so a lane that owns one unit writes
  // its codes without sharing a byte with another lane.
  static constexpr uint32_t kUnit = 8;
  // Elements a full warp covers in one sweep over a block group.
  static constexpr uint32_t kWarpSweep = kWarp * kUnit;
  // Upper bound of the grid; grid-stride loops cover the rest. 2^20 blocks of 256 threads is
  // far more than any device keeps resident, so the cap only bounds the launch itself.
  static constexpr uint64_t kMaxBlocks = uint64_t{1} << 20;
  // Column statistics: enough (column, row chunk) threads to fill an H100 several times over...
  static constexpr uint64_t kStatsThreads = uint64_t{1} << 19;
  // ...but never so few rows a chunk that the per-chunk atomics dominate.
  static constexpr uint64_t kStatsMinRows = 32;
  // Chunk numbers live in 31 bits of the column min/max keys (column_encode.cu).
  static constexpr uint64_t kMaxChunks = uint64_t{1} << 30;
};

struct GridShape {
  uint32_t blocks = 0;
  uint32_t threads = LaunchPolicy::kThreads;
};

// Fused block-grouped encode: a warp, or a sub-warp of `lanes` lanes, per group.
struct BlockEncodePlan {
  uint32_t lanes = 0;        // lanes per group: min(32, block / 8); each owns 8 elements a sweep
  uint32_t sweeps = 0;       // sweeps of a group: max(1, block / 256)
  uint32_t log2_sweeps = 0;  // for the bit-reversed sweep order of the q1 sum
  uint64_t warp_tasks = 0;   // warps the whole tensor needs: ceil(groups / (32 / lanes))
  GridShape grid;
};

// Column-grouped encode: statistics per (column, row chunk), one finalize thread per column,
// then one quantize thread per unit.
struct ColumnEncodePlan {
  uint64_t rows = 0;
  uint64_t chunks = 0;  // row chunks per column
  uint64_t rows_per_chunk = 0;
  GridShape stats;
  GridShape finalize;
  GridShape quantize;
};

inline uint64_t ceil_div(uint64_t a, uint64_t b) {
  return (a + b - 1) / b;
}

inline uint32_t log2_exact(uint64_t v) {
  uint32_t l = 0;
  while ((uint64_t{1} << l) < v) ++l;
  return l;
}

// Grid for `threads` independent threads of work.
inline GridShape plan_threads(uint64_t threads) {
  GridShape g;
  uint64_t blocks = std::max<uint64_t>(1, ceil_div(threads, LaunchPolicy::kThreads));
  g.blocks = static_cast<uint32_t>(std::min(blocks, LaunchPolicy::kMaxBlocks));
  return g;
}

// Elementwise kernels (decodes, passthrough, column quantize): one 8-element unit a thread.
inline GridShape plan_units(uint64_t n) {
  return plan_threads(ceil_div(n, LaunchPolicy::kUnit));
}

inline BlockEncodePlan plan_block_encode(const CodecJob& job) {
  BlockEncodePlan p;
  const uint32_t block = job.spec.block;
  p.lanes = std::min(LaunchPolicy::kWarp, block / LaunchPolicy::kUnit);
  p.sweeps = std::max<uint32_t>(1, block / LaunchPolicy::kWarpSweep);
  p.log2_sweeps = log2_exact(p.sweeps);
  p.warp_tasks = ceil_div(job.groups(), LaunchPolicy::kWarp / p.lanes);
  p.grid = plan_threads(p.warp_tasks * LaunchPolicy::kWarp);
  return p;
}

inline ColumnEncodePlan plan_column_encode(const CodecJob& job) {
  ColumnEncodePlan p;
  const uint64_t cols = job.spec.cols;
  p.rows = job.n / cols;
  if (p.rows == 0) return p;  // empty tensor: nothing to launch
  uint64_t want = ceil_div(LaunchPolicy::kStatsThreads, cols);
  uint64_t most = std::min(ceil_div(p.rows, LaunchPolicy::kStatsMinRows), LaunchPolicy::kMaxChunks);
  p.chunks = std::max<uint64_t>(1, std::min(want, most));
  p.rows_per_chunk = ceil_div(p.rows, p.chunks);
  p.chunks = ceil_div(p.rows, p.rows_per_chunk);  // no empty chunk
  p.stats = plan_threads(cols * p.chunks);
  p.finalize = plan_threads(cols);
  p.quantize = plan_units(job.n);
  return p;
}

}  // namespace lowcomm::cuda
