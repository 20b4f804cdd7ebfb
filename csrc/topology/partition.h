#pragma once
// How a tensor is cut: owner chunks (one per rank, aligned to the codec's scale groups so every
// chunk encodes exactly as that range of the whole tensor would) and pipeline segments within a
// chunk (also group aligned). Pure functions: every rank computes the same cuts.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "lowcomm/codec.h"

namespace lowcomm::topology {

struct Range {
  uint64_t begin = 0;
  uint64_t count = 0;
};

// Elements per scale group boundary: block size, column count, or 1.
inline uint64_t granule(const std::optional<CodecSpec>& spec) {
  if (!spec || !spec->quantized()) return 1;
  if (spec->grouping == Grouping::kBlock) return spec->block;
  if (spec->grouping == Grouping::kColumn) return std::max<uint64_t>(spec->cols, 1);
  return 1;
}

// `parts` consecutive ranges covering [0, n), boundaries on multiples of g (the last range
// takes the tail); sizes differ by at most one granule.
inline std::vector<Range> owner_chunks(uint64_t n, int parts, uint64_t g) {
  std::vector<Range> out(static_cast<size_t>(parts));
  uint64_t units = (n + g - 1) / g;
  auto p = static_cast<uint64_t>(parts);
  for (uint64_t j = 0; j < p; ++j) {
    uint64_t b = std::min(n, (units * j / p) * g);
    uint64_t e = std::min(n, (units * (j + 1) / p) * g);
    out[j] = {b, e - b};
  }
  return out;
}

// Segments of at most seg elements (seg a multiple of the granule).
inline std::vector<Range> split_segments(Range r, uint64_t seg) {
  std::vector<Range> out;
  for (uint64_t off = 0; off < r.count; off += seg)
    out.push_back({r.begin + off, std::min(seg, r.count - off)});
  return out;
}

}  // namespace lowcomm::topology
