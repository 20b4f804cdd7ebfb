// The wire frame of one encoded buffer (docs/wire.md is the specification).
//
// The header is built and read one field at a time, byte by byte, from the offset table below;
// no struct is ever copied to or from the wire, so the layout does not depend on the compiler's
// padding or the host's byte order. Parsing validates in the order docs/wire.md lists: first
// the fields that identify the format (magic, version, header length), so that a frame from a
// newer writer is reported as such rather than as a checksum failure; then the header
// checksum, so that the remaining checks see the bytes the sender wrote; then every field; then
// lengths; the payload checksum last, as it is the only check that reads the payload.

#include "frame/frame.h"

#include <xxhash.h>

#include <bit>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

namespace lowcomm::frame {
namespace {

// The codec stores fp32 scales and passthrough values in host order; the wire says little-endian.
static_assert(std::endian::native == std::endian::little,
              "the codec payload is written in host byte order; big-endian hosts need byte swaps");

// ---- header layout: (offset, size) of every field, in wire order ----

struct Field {
  size_t offset;
  size_t size;
};

constexpr Field kMagic{0, 4};
constexpr Field kVersion{4, 2};
constexpr Field kHeaderLength{6, 2};
constexpr Field kKind{8, 1};
constexpr Field kBits{9, 1};
constexpr Field kGrouping{10, 1};
constexpr Field kRounding{11, 1};
constexpr Field kDType{12, 1};
constexpr Field kWireDType{13, 1};
constexpr Field kFlags{14, 2};
constexpr Field kBlock{16, 4};
constexpr Field kReserved{20, 4};
constexpr Field kCols{24, 8};
constexpr Field kCount{32, 8};
constexpr Field kPayloadBytes{40, 8};
constexpr Field kPayloadChecksum{48, 8};
constexpr Field kHeaderChecksum{56, 8};

constexpr Field kFields[] = {
    kMagic,        kVersion,         kHeaderLength,  kKind,  kBits,     kGrouping, kRounding,
    kDType,        kWireDType,       kFlags,         kBlock, kReserved, kCols,     kCount,
    kPayloadBytes, kPayloadChecksum, kHeaderChecksum};

// The fields tile the header exactly, each at an offset that is a multiple of its size.
constexpr bool fields_tile_header() {
  size_t at = 0;
  for (const Field& f : kFields) {
    if (f.offset != at || f.size > 8 || f.offset % f.size != 0) return false;
    at += f.size;
  }
  return at == kFrameHeaderBytes;
}
static_assert(fields_tile_header(), "header fields must tile the 64-byte header");
static_assert(kHeaderChecksum.offset + kHeaderChecksum.size == kFrameHeaderBytes,
              "the header checksum is the last field");
static_assert(kHeaderChecksum.offset == 56, "the header checksum covers bytes [0, 56)");

void put(uint8_t* h, Field f, uint64_t v) {
  for (size_t i = 0; i < f.size; ++i) h[f.offset + i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t get(const uint8_t* h, Field f) {
  uint64_t v = 0;
  for (size_t i = 0; i < f.size; ++i) v |= static_cast<uint64_t>(h[f.offset + i]) << (8 * i);
  return v;
}

// ---- messages ----

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string num(uint64_t v) {
  return std::to_string(v);
}

Status corrupt(const std::string& what) {
  return corrupt_data("wire frame: " + what);
}
Status caller_error(const std::string& what) {
  return invalid_argument("wire frame: " + what);
}

// ---- sizes ----

// docs/wire.md's payload size, with every step checked for overflow. The codec's
// encoded_size must agree; parse_frame cross-checks, so a codec layout change that is not
// mirrored here (and in the wire version) is caught.
std::optional<uint64_t> checked_payload_bytes(const CodecSpec& s, uint64_t n) {
  uint64_t total = 0;
  if (!s.quantized()) {
    if (__builtin_mul_overflow(n, dtype_size(s.wire_dtype), &total)) return std::nullopt;
    return total;
  }
  uint64_t groups = 0;
  if (s.grouping == Grouping::kBlock) groups = n / s.block + (n % s.block != 0 ? 1 : 0);
  if (s.grouping == Grouping::kColumn) groups = n == 0 ? 0 : s.cols;
  uint64_t record = s.kind == CodecKind::kMinmax ? 8 : 4;  // (min, max) or one scale, fp32
  uint64_t units = n / 8 + (n % 8 != 0 ? 1 : 0);
  uint64_t scale_bytes = 0, code_bytes = 0;
  if (__builtin_mul_overflow(groups, record, &scale_bytes) ||
      __builtin_mul_overflow(units, static_cast<uint64_t>(s.bits), &code_bytes) ||
      __builtin_add_overflow(scale_bytes, code_bytes, &total)) {
    return std::nullopt;
  }
  return total;
}

std::string dtype_text(DType d) {
  return valid_dtype(d) ? std::string(dtype_name(d))
                        : "dtype value " + num(static_cast<uint8_t>(d));
}

// The payload alignment the codec needs to access it in place (see frame.h).
size_t payload_alignment(const CodecSpec& s) {
  return s.quantized() ? alignof(float) : dtype_size(s.wire_dtype);
}

Status check_alignment(const CodecSpec& s, const void* payload) {
  size_t align = payload_alignment(s);
  auto addr = reinterpret_cast<uintptr_t>(payload);
  if (addr % align != 0) {
    return caller_error("payload at address " + hex(addr) + " is not " + num(align) +
                        "-byte aligned; " + to_string(s) +
                        " is accessed in place, so place frames at " + num(align) +
                        "-byte aligned addresses");
  }
  return Status::ok();
}

// What a writer checks before producing a frame, so that it never writes one parse_frame
// rejects.
Status check_frame_args(const CodecSpec& spec, DType dtype, uint64_t n) {
  LOWCOMM_CHECK(validate_spec(spec));
  LOWCOMM_CHECK(check_count(spec, n));
  if (spec.sparse()) {
    return caller_error(to_string(spec) +
                        ": frames carry dense codecs only (a sparse message travels as the "
                        "collectives' payload, docs/codecs.md)");
  }
  if (!codec_dtype(dtype)) {
    return caller_error("unknown tensor " + dtype_text(dtype) + " (expected fp32, bf16 or fp16)");
  }
  if (!checked_payload_bytes(spec, n)) {
    return caller_error("payload size of " + num(n) + " elements overflows");
  }
  return Status::ok();
}

// ---- field validation ----

struct HeaderView {
  uint64_t kind, bits, grouping, rounding, dtype, wire_dtype, flags, block, reserved, cols;
};

Result<CodecSpec> spec_from_header(const HeaderView& h) {
  if (h.kind > 2) {
    return corrupt("unknown codec kind " + num(h.kind) + " (expected 0 none, 1 absmax, 2 minmax)");
  }
  if (h.grouping > 2) {
    return corrupt("unknown grouping " + num(h.grouping) +
                   " (expected 0 element, 1 block, 2 column)");
  }
  if (h.rounding > 1) {
    return corrupt("unknown rounding " + num(h.rounding) + " (expected 0 nearest, 1 stochastic)");
  }
  if (h.dtype < 1 || h.dtype > 3) {
    return corrupt("unknown tensor dtype " + num(h.dtype) + " (expected 1 fp32, 2 bf16, 3 fp16)");
  }
  bool passthrough = h.kind == 0;
  if (passthrough && (h.wire_dtype < 1 || h.wire_dtype > 3)) {
    return corrupt("unknown passthrough wire dtype " + num(h.wire_dtype) +
                   " (expected 1 fp32, 2 bf16, 3 fp16)");
  }
  if (!passthrough && h.wire_dtype != 0) {
    return corrupt("wire dtype is " + num(h.wire_dtype) +
                   " for a quantized codec; it must be 0 (passthrough codecs only)");
  }
  if (h.flags != 0) return corrupt("reserved flags are " + hex(h.flags) + "; version 1 needs 0");
  if (h.reserved != 0) {
    return corrupt("reserved bytes 20..23 are " + hex(h.reserved) + "; version 1 needs 0");
  }
  auto grouping = static_cast<Grouping>(h.grouping);
  if (grouping != Grouping::kBlock && h.block != 0) {
    return corrupt("block size field is " + num(h.block) +
                   " but the grouping is not block; it must be 0");
  }
  if (grouping != Grouping::kColumn && h.cols != 0) {
    return corrupt("column count field is " + num(h.cols) +
                   " but the grouping is not column; it must be 0");
  }

  CodecSpec s;
  s.kind = static_cast<CodecKind>(h.kind);
  s.bits = static_cast<int>(h.bits);
  s.grouping = grouping;
  s.rounding = static_cast<Rounding>(h.rounding);
  if (passthrough) s.wire_dtype = static_cast<DType>(h.wire_dtype);
  if (grouping == Grouping::kBlock) s.block = static_cast<uint32_t>(h.block);
  if (grouping == Grouping::kColumn) s.cols = h.cols;
  Status valid = validate_spec(s);
  if (!valid) {
    return corrupt("invalid codec in header (kind " + num(h.kind) + ", bits " + num(h.bits) +
                   ", grouping " + num(h.grouping) + ", rounding " + num(h.rounding) + ", block " +
                   num(h.block) + ", cols " + num(h.cols) + "): " + valid.message());
  }
  return s;
}

Status check_payload_checksum(const FrameInfo& info, const uint8_t* payload) {
  uint64_t got = frame_payload_checksum(payload, info.payload_bytes);
  if (got != info.payload_checksum) {
    return corrupt("payload checksum mismatch (header says " + hex(info.payload_checksum) +
                   ", the " + num(info.payload_bytes) + " payload bytes hash to " + hex(got) +
                   "); the payload was corrupted");
  }
  return Status::ok();
}

template <typename Encode>
Status encode_framed(const CodecSpec& spec, DType dtype, const void* x, uint64_t n, void* out,
                     uint64_t out_bytes, Encode&& encode_payload) {
  LOWCOMM_CHECK(check_frame_args(spec, dtype, n));
  uint64_t need = framed_size(spec, n);
  if (out == nullptr) return caller_error("null output buffer");
  if (out_bytes < need) {
    return caller_error("output buffer holds " + num(out_bytes) + " bytes; a " + to_string(spec) +
                        " frame of " + num(n) + " elements needs " + num(need) + " (" +
                        num(kFrameHeaderBytes) + "-byte header + " + num(need - kFrameHeaderBytes) +
                        "-byte payload)");
  }
  if (n > 0 && x == nullptr) return caller_error("null input for a non-empty tensor");
  uint8_t* payload = static_cast<uint8_t*>(out) + kFrameHeaderBytes;
  LOWCOMM_CHECK(check_alignment(spec, payload));
  uint64_t payload_bytes = need - kFrameHeaderBytes;
  LOWCOMM_CHECK(encode_payload(payload, payload_bytes));
  return write_frame_header(spec, dtype, n, payload, payload_bytes, out);
}

Status decode_framed(const void* buf, uint64_t len, DType dtype, void* out, uint64_t n_expected,
                     CpuOptions opts, bool accumulate) {
  if (!codec_dtype(dtype)) {
    return caller_error("cannot decode into " + dtype_text(dtype) +
                        " (expected fp32, bf16 or fp16)");
  }
  Result<FrameInfo> parsed = parse_frame(buf, len);
  if (!parsed) return parsed.status();
  const FrameInfo& info = *parsed;
  if (info.n != n_expected) {
    return caller_error("frame holds " + num(info.n) + " elements (" + to_string(info.spec) + ", " +
                        dtype_name(info.dtype) + "), the receiver expected " + num(n_expected) +
                        "; sender and receiver disagree on the tensor size");
  }
  if (info.dtype != dtype) {
    return caller_error("frame was encoded from " + std::string(dtype_name(info.dtype)) +
                        " data, the receiver decodes into " + dtype_name(dtype) +
                        "; sender and receiver disagree on the dtype");
  }
  LOWCOMM_CHECK(check_alignment(info.spec, info.payload));
  if (accumulate) {
    return decode_accumulate(info.spec, info.payload, info.payload_bytes, info.n, dtype, out, opts);
  }
  return decode(info.spec, info.payload, info.payload_bytes, info.n, dtype, out, opts);
}

}  // namespace

uint64_t framed_size(const CodecSpec& spec, uint64_t n) {
  std::optional<uint64_t> payload = checked_payload_bytes(spec, n);
  uint64_t total = 0;
  if (!payload || __builtin_add_overflow(*payload, uint64_t{kFrameHeaderBytes}, &total)) {
    return UINT64_MAX;
  }
  return total;
}

uint64_t frame_header_checksum(const void* header) {
  return XXH3_64bits(header, kHeaderChecksum.offset);
}

uint64_t frame_payload_checksum(const void* payload, uint64_t len) {
  return XXH3_64bits(payload, static_cast<size_t>(len));
}

Status write_frame_header(const CodecSpec& spec, DType dtype, uint64_t n, const void* payload,
                          uint64_t payload_bytes, void* header_out) {
  LOWCOMM_CHECK(check_frame_args(spec, dtype, n));
  uint64_t expect = *checked_payload_bytes(spec, n);
  if (payload_bytes != expect) {
    return caller_error("payload is " + num(payload_bytes) + " bytes; " + to_string(spec) + " of " +
                        num(n) + " elements is " + num(expect));
  }
  if (payload == nullptr && payload_bytes > 0) return caller_error("null payload");
  if (header_out == nullptr) return caller_error("null header buffer");

  // Checksum first: header_out may be the 64 bytes just before the payload, never inside it.
  uint64_t payload_sum = frame_payload_checksum(payload, payload_bytes);
  uint8_t h[kFrameHeaderBytes] = {};
  put(h, kMagic, kFrameMagic);
  put(h, kVersion, kFrameVersion);
  put(h, kHeaderLength, kFrameHeaderBytes);
  put(h, kKind, static_cast<uint8_t>(spec.kind));
  put(h, kBits, static_cast<uint64_t>(spec.bits));
  put(h, kGrouping, static_cast<uint8_t>(spec.grouping));
  put(h, kRounding, static_cast<uint8_t>(spec.rounding));
  put(h, kDType, static_cast<uint8_t>(dtype));
  put(h, kWireDType, spec.quantized() ? 0 : static_cast<uint8_t>(spec.wire_dtype));
  put(h, kFlags, 0);
  put(h, kBlock, spec.grouping == Grouping::kBlock ? spec.block : 0);
  put(h, kReserved, 0);
  put(h, kCols, spec.grouping == Grouping::kColumn ? spec.cols : 0);
  put(h, kCount, n);
  put(h, kPayloadBytes, payload_bytes);
  put(h, kPayloadChecksum, payload_sum);
  put(h, kHeaderChecksum, frame_header_checksum(h));
  auto* out = static_cast<uint8_t*>(header_out);
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) out[i] = h[i];
  return Status::ok();
}

Status encode_frame(const CodecSpec& spec, DType dtype, const void* x, uint64_t n, void* out,
                    uint64_t out_bytes, RoundingKey key, CpuOptions opts) {
  return encode_framed(spec, dtype, x, n, out, out_bytes, [&](uint8_t* payload, uint64_t bytes) {
    return encode(spec, dtype, x, n, payload, bytes, key, opts);
  });
}

Status encode_frame_error_feedback(const CodecSpec& spec, DType dtype, const void* x,
                                   float* residual, uint64_t n, void* out, uint64_t out_bytes,
                                   RoundingKey key, CpuOptions opts) {
  return encode_framed(spec, dtype, x, n, out, out_bytes, [&](uint8_t* payload, uint64_t bytes) {
    return encode_error_feedback(spec, dtype, x, residual, n, payload, bytes, key, opts);
  });
}

Result<FrameInfo> parse_frame_header(const void* header, uint64_t len) {
  if (header == nullptr && len > 0) return caller_error("null buffer of " + num(len) + " bytes");
  if (len < kFrameHeaderBytes) {
    return corrupt("truncated: " + num(len) + " bytes, shorter than the " + num(kFrameHeaderBytes) +
                   "-byte header");
  }
  const auto* h = static_cast<const uint8_t*>(header);

  uint64_t magic = get(h, kMagic);
  if (magic != kFrameMagic) {
    return corrupt(
        "bad magic " + hex(magic) + " (expected " + hex(kFrameMagic) +
        ", the bytes 'LCWF'); this is not a lowcomm frame, or the stream is out of step");
  }
  uint64_t version = get(h, kVersion);
  if (version != kFrameVersion) {
    return corrupt("version " + num(version) + " is not supported (this build reads version " +
                   num(kFrameVersion) + "); sender and receiver run incompatible lowcomm builds");
  }
  uint64_t header_length = get(h, kHeaderLength);
  if (header_length != kFrameHeaderBytes) {
    return corrupt("header length " + num(header_length) + ", but a version " + num(kFrameVersion) +
                   " header is " + num(kFrameHeaderBytes) + " bytes");
  }
  uint64_t stored = get(h, kHeaderChecksum), computed = frame_header_checksum(h);
  if (stored != computed) {
    return corrupt("header checksum mismatch (stored " + hex(stored) + ", header bytes hash to " +
                   hex(computed) + "); the header was corrupted");
  }

  HeaderView view{get(h, kKind),     get(h, kBits),      get(h, kGrouping), get(h, kRounding),
                  get(h, kDType),    get(h, kWireDType), get(h, kFlags),    get(h, kBlock),
                  get(h, kReserved), get(h, kCols)};
  Result<CodecSpec> spec = spec_from_header(view);
  if (!spec) return spec.status();
  uint64_t n = get(h, kCount);
  Status count_ok = check_count(*spec, n);
  if (!count_ok) return corrupt(to_string(*spec) + ": " + count_ok.message());

  uint64_t payload_bytes = get(h, kPayloadBytes);
  std::optional<uint64_t> expect = checked_payload_bytes(*spec, n);
  if (!expect) return corrupt("payload size of " + num(n) + " elements overflows");
  if (*expect != encoded_size(*spec, n)) {
    return internal_error("wire frame: the codec's encoded_size(" + to_string(*spec) + ", " +
                          num(n) + ") = " + num(encoded_size(*spec, n)) +
                          " disagrees with the wire layout's " + num(*expect) +
                          "; the payload layout changed without a wire version bump");
  }
  if (payload_bytes != *expect) {
    return corrupt("header says the payload is " + num(payload_bytes) + " bytes, but " +
                   to_string(*spec) + " of " + num(n) + " elements is " + num(*expect));
  }

  FrameInfo info;
  info.spec = *spec;
  info.dtype = static_cast<DType>(view.dtype);
  info.n = n;
  info.payload_bytes = payload_bytes;
  info.payload_checksum = get(h, kPayloadChecksum);
  return info;
}

Status check_frame_payload(const FrameInfo& info, const void* payload, uint64_t len) {
  if (payload == nullptr && len > 0) return caller_error("null payload of " + num(len) + " bytes");
  if (len != info.payload_bytes) {
    return corrupt(
        std::string(len < info.payload_bytes ? "truncated payload" : "oversized payload") + ": " +
        num(len) + " bytes, the header says " + num(info.payload_bytes));
  }
  return check_payload_checksum(info, static_cast<const uint8_t*>(payload));
}

Result<FrameInfo> parse_frame(const void* buf, uint64_t len) {
  Result<FrameInfo> parsed = parse_frame_header(buf, len);
  if (!parsed) return parsed;
  FrameInfo info = std::move(parsed).value();
  // payload_bytes <= 2^61 (check_count caps n at 2^56), so the frame size cannot overflow.
  uint64_t frame_bytes = kFrameHeaderBytes + info.payload_bytes;
  if (len < frame_bytes) {
    return corrupt("truncated: " + num(len) + " bytes, the frame is " + num(frame_bytes) + " (" +
                   num(kFrameHeaderBytes) + "-byte header + " + num(info.payload_bytes) +
                   "-byte payload for " + num(info.n) + " elements of " + to_string(info.spec) +
                   ")");
  }
  if (len > frame_bytes) {
    return corrupt(num(len - frame_bytes) + " trailing byte(s) after the frame: the buffer is " +
                   num(len) + " bytes, the frame " + num(frame_bytes));
  }
  info.payload = static_cast<const uint8_t*>(buf) + kFrameHeaderBytes;
  LOWCOMM_CHECK(check_payload_checksum(info, info.payload));
  return info;
}

Status decode_frame(const void* buf, uint64_t len, DType dtype, void* out, uint64_t n_expected,
                    CpuOptions opts) {
  return decode_framed(buf, len, dtype, out, n_expected, opts, false);
}

Status decode_accumulate_frame(const void* buf, uint64_t len, DType dtype, void* out,
                               uint64_t n_expected, CpuOptions opts) {
  return decode_framed(buf, len, dtype, out, n_expected, opts, true);
}

}  // namespace lowcomm::frame
