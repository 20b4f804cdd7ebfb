#pragma once
// The wire frame of one encoded buffer: a fixed 64-byte header, then the codec payload.
//
// The header is versioned, self-describing (it carries the codec spec, the tensor dtype and the
// element count) and checksummed twice: one XXH3-64 over the payload and one over the header
// itself. docs/wire.md is the specification of every byte; this file is its implementation.
//
// Everything received is validated before use: parse_frame checks every header field, the
// payload length against the codec's size formula and the payload checksum, and returns
// StatusCode::kCorruptData naming the field and the values when the bytes are wrong. Caller
// mistakes (a buffer too small, a count or dtype that does not match the frame) are
// kInvalidArgument. Nothing here allocates memory sized by a received field.
//
// Alignment: the codec reads and writes fp32 scales and wire-dtype values in place, so
// encode_frame / decode_frame need the frame buffer at an address aligned to 4 bytes (2 for
// bf16/fp16 passthrough). The header is 64 bytes, so the payload keeps the buffer's alignment.
// parse_frame itself reads bytes and accepts any address.

#include <cstddef>
#include <cstdint>

#include "lowcomm/codec.h"
#include "lowcomm/status.h"

namespace lowcomm::frame {

constexpr size_t kFrameHeaderBytes = 64;
// The bytes 'L' 'C' 'W' 'F' at offset 0, read as a little-endian uint32.
constexpr uint32_t kFrameMagic = 0x4657434Cu;
// The only header version this build writes and reads (docs/wire.md, "Versioning").
constexpr uint16_t kFrameVersion = 1;

// Header bytes plus encoded_size(spec, n); UINT64_MAX when that overflows. Meaningful for a
// spec and count that validate_spec and check_count accept.
uint64_t framed_size(const CodecSpec& spec, uint64_t n);

// A validated frame. `spec` holds only what the wire carries: fields that do not apply to the
// codec (block for column groups, cols for block groups, wire_dtype for quantized codecs) come
// back as CodecSpec's defaults.
struct FrameInfo {
  CodecSpec spec;
  DType dtype = DType::kFloat32;     // the dtype of the tensor that was encoded
  uint64_t n = 0;                    // elements
  uint64_t payload_bytes = 0;        // == encoded_size(spec, n)
  const uint8_t* payload = nullptr;  // inside the caller's buffer; null from parse_frame_header
  uint64_t payload_checksum = 0;     // XXH3-64 of the payload, as the header states it
};

// out[0, framed_size) = header + encode(spec, dtype, x, n). out_bytes >= framed_size(spec, n).
Status encode_frame(const CodecSpec& spec, DType dtype, const void* x, uint64_t n, void* out,
                    uint64_t out_bytes, RoundingKey key = {}, CpuOptions opts = {});
// As encode_frame, with error feedback (lowcomm::encode_error_feedback): residual is fp32,
// n elements, updated in place.
Status encode_frame_error_feedback(const CodecSpec& spec, DType dtype, const void* x,
                                   float* residual, uint64_t n, void* out, uint64_t out_bytes,
                                   RoundingKey key = {}, CpuOptions opts = {});
// For callers that encoded the payload themselves (on a GPU, say, then copied it to the host):
// writes the kFrameHeaderBytes header for `payload` into header_out. The payload must be
// host-readable (it is checksummed) and exactly encoded_size(spec, n) bytes. header_out may be
// payload - kFrameHeaderBytes.
Status write_frame_header(const CodecSpec& spec, DType dtype, uint64_t n, const void* payload,
                          uint64_t payload_bytes, void* header_out);

// Validates the whole frame: buf holds exactly one frame, header and payload (no trailing
// bytes). On success info.payload points into buf.
Result<FrameInfo> parse_frame(const void* buf, uint64_t len);

// For receivers that read the header before the payload: validates the first
// kFrameHeaderBytes of `header` (len >= kFrameHeaderBytes; bytes past the header are ignored)
// and returns how many payload bytes follow. Cap payload_bytes by what you expect before
// allocating for it; then check the payload with check_frame_payload.
Result<FrameInfo> parse_frame_header(const void* header, uint64_t len);
// Checks that payload[0, len) is the payload `info` (from parse_frame_header) describes.
Status check_frame_payload(const FrameInfo& info, const void* payload, uint64_t len);

// Parses buf, checks that the frame holds n_expected elements encoded from `dtype`, then
// out = decode (or out += decode). `out` holds n_expected elements of dtype.
Status decode_frame(const void* buf, uint64_t len, DType dtype, void* out, uint64_t n_expected,
                    CpuOptions opts = {});
Status decode_accumulate_frame(const void* buf, uint64_t len, DType dtype, void* out,
                               uint64_t n_expected, CpuOptions opts = {});

// The two checksums, as docs/wire.md defines them: XXH3-64 (seed 0) of the header's first 56
// bytes, and of the payload.
uint64_t frame_header_checksum(const void* header);
uint64_t frame_payload_checksum(const void* payload, uint64_t len);

}  // namespace lowcomm::frame
