#pragma once
// Lossless compression of the plugin's messages (zstd or lz4), with an optional byte-plane
// shuffle first: the bytes of 4-byte (fp32) or 2-byte (bf16/fp16) elements are regrouped so the
// exponent bytes, which repeat, sit together where the compressor finds them.
//
// A frame is self-describing: a 16-byte header, little-endian,
//   off size
//     0    4  magic "LCZ1"
//     4    1  method used (0 none, 1 lz4, 2 zstd)
//     5    1  shuffle width (0/1: none, 2, 4)
//     6    2  zero
//     8    8  raw length
// then the payload. When compressing does not shrink the bytes the frame stores them raw
// (method 0), so a frame is never more than raw + 16 bytes. Decoding validates everything: a
// malformed or truncated frame, a raw length above the capacity or a decompressor error is a
// clear error, never an access outside the buffers.
//
// Decoding writes the destination front to back (raw copy, lz4 and zstd output, and the
// unshuffle), which NCCL's LL/LL128 protocols need: the GPU reads lines as they land.
//
// Thread-safe: no state is shared between calls.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "lowcomm/status.h"

namespace lowcomm::nccl_net {

enum class LosslessMethod : uint8_t { kNone = 0, kLz4 = 1, kZstd = 2 };

struct LosslessConfig {
  LosslessMethod method = LosslessMethod::kNone;
  int level = 1;    // zstd's level (lz4: its acceleration, 1 = default)
  int shuffle = 0;  // 0 or 1: none; 2 or 4: byte planes of that element width
};

// "off", "lz4", "zstd", "zstd:<level>" (1..19).
Result<LosslessConfig> parse_lossless(std::string_view text);
std::string to_string(const LosslessConfig& c);

inline constexpr size_t kLosslessHeaderBytes = 16;
// The largest frame `raw_bytes` can become.
size_t lossless_bound(size_t raw_bytes);

// Encodes n bytes into a frame in out (capacity >= lossless_bound(n)); returns its size.
Result<size_t> lossless_encode(const LosslessConfig& c, const void* in, size_t n, void* out,
                               size_t capacity);
// Decodes a frame of n bytes into out; returns the raw length.
Result<size_t> lossless_decode(const void* in, size_t n, void* out, size_t capacity);

}  // namespace lowcomm::nccl_net
