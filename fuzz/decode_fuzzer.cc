// libFuzzer target for the receive path: arbitrary bytes into parse_frame and, when they parse,
// decode_frame and decode_accumulate_frame.
//
// Random mutations almost never produce a matching XXH3, so each input is tried twice: as
// received (the checksum and length checks), and with both checksums rewritten to match (the
// field checks and the decoder behind them). Beyond "no crash, no sanitizer report", every
// accepted frame must satisfy the invariants below; a violation aborts.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "frame/frame.h"

namespace {

using lowcomm::StatusCode;
namespace frame = lowcomm::frame;

// Decodes at most this many elements (bounded by the input length anyway: a valid frame has
// at least one payload bit per element).
constexpr uint64_t kMaxDecodeElements = uint64_t{1} << 22;

[[noreturn]] void fail(const char* what, const lowcomm::Status& s) {
  std::fprintf(stderr, "decode_fuzzer: %s: %s\n", what, s.to_string().c_str());
  std::abort();
}

void exercise(const uint8_t* buf, uint64_t len) {
  lowcomm::Result<frame::FrameInfo> parsed = frame::parse_frame(buf, len);
  if (!parsed) {
    lowcomm::Status s = parsed.status();
    if (s.code() != StatusCode::kCorruptData || s.message().empty()) fail("bad rejection", s);
    return;
  }
  const frame::FrameInfo& info = *parsed;
  if (!lowcomm::validate_spec(info.spec) || !lowcomm::check_count(info.spec, info.n) ||
      info.payload_bytes != lowcomm::encoded_size(info.spec, info.n) ||
      len != frame::kFrameHeaderBytes + info.payload_bytes ||
      info.payload != buf + frame::kFrameHeaderBytes) {
    fail("accepted an inconsistent frame", lowcomm::Status());
  }
  // Headers are canonical: what parses re-serialises to the same bytes.
  uint8_t header[frame::kFrameHeaderBytes];
  lowcomm::Status s = frame::write_frame_header(info.spec, info.dtype, info.n, info.payload,
                                                info.payload_bytes, header);
  if (!s) fail("write_frame_header rejected a parsed frame", s);
  if (std::memcmp(header, buf, sizeof header) != 0) fail("header is not canonical", s);

  if (info.n > kMaxDecodeElements) return;
  const uint64_t bytes = info.n * lowcomm::dtype_size(info.dtype);
  std::vector<uint8_t> out(bytes);
  lowcomm::CpuOptions opts{1, true};
  s = frame::decode_frame(buf, len, info.dtype, out.data(), info.n, opts);
  if (!s) fail("decode_frame rejected a parsed frame", s);
  s = frame::decode_accumulate_frame(buf, len, info.dtype, out.data(), info.n, opts);
  if (!s) fail("decode_accumulate_frame rejected a parsed frame", s);
  s = frame::decode_frame(buf, len, info.dtype, out.data(), info.n + 1, opts);
  if (s.code() != StatusCode::kInvalidArgument) fail("count mismatch not reported", s);
}

void set_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A heap copy: the frame API needs 4-byte aligned frames to decode in place.
  std::vector<uint8_t> buf(data, data + size);
  exercise(buf.data(), buf.size());
  if (size >= frame::kFrameHeaderBytes) {
    uint8_t* h = buf.data();
    set_u64(h + 48, frame::frame_payload_checksum(h + frame::kFrameHeaderBytes,
                                                  size - frame::kFrameHeaderBytes));
    set_u64(h + 56, frame::frame_header_checksum(h));
    exercise(buf.data(), buf.size());
  }
  return 0;
}
