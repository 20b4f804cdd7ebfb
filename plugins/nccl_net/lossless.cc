#include "lossless.h"

#include <lz4.h>
#include <zstd.h>

#include <climits>
#include <cstring>
#include <memory>

#include "core/little_endian.h"

namespace lowcomm::nccl_net {
namespace {

constexpr uint32_t kMagic = 0x315a434cu;  // "LCZ1"

bool valid_shuffle(int s) {
  return s == 0 || s == 1 || s == 2 || s == 4;
}

// Element e's byte b goes to plane b: out[b * count + e] = in[e * width + b]; the tail of
// n % width bytes is copied as is after the planes.
void shuffle(const uint8_t* in, size_t n, int width, uint8_t* out) {
  const size_t w = static_cast<size_t>(width), count = n / w;
  for (size_t b = 0; b < w; ++b)
    for (size_t e = 0; e < count; ++e) out[b * count + e] = in[e * w + b];
  std::memcpy(out + count * w, in + count * w, n - count * w);
}

// Writes `out` front to back, element by element: for NCCL's LL and LL128 protocols the
// receiving GPU polls the buffer while it is written, so each line's data must land before its
// flag (the last word), as a front-to-back copy does; writing byte planes would set part of a
// flag before its data.
void unshuffle(const uint8_t* in, size_t n, int width, uint8_t* out) {
  const size_t w = static_cast<size_t>(width), count = n / w;
  for (size_t e = 0; e < count; ++e)
    for (size_t b = 0; b < w; ++b) out[e * w + b] = in[b * count + e];
  std::memcpy(out + count * w, in + count * w, n - count * w);
}

void write_header(uint8_t* out, LosslessMethod m, int shuffle_width, uint64_t raw) {
  lowcomm::store_le32(out, kMagic);
  out[4] = static_cast<uint8_t>(m);
  out[5] = static_cast<uint8_t>(shuffle_width);
  out[6] = out[7] = 0;
  lowcomm::store_le64(out + 8, raw);
}

}  // namespace

Result<LosslessConfig> parse_lossless(std::string_view text) {
  LosslessConfig c;
  if (text == "off" || text == "none" || text.empty()) return c;
  if (text == "lz4") {
    c.method = LosslessMethod::kLz4;
    return c;
  }
  if (text == "zstd") {
    c.method = LosslessMethod::kZstd;
    return c;
  }
  if (text.substr(0, 5) == "zstd:") {
    const std::string level(text.substr(5));
    char* end = nullptr;
    long v = std::strtol(level.c_str(), &end, 10);
    if (!level.empty() && *end == '\0' && v >= 1 && v <= 19) {
      c.method = LosslessMethod::kZstd;
      c.level = static_cast<int>(v);
      return c;
    }
  }
  return invalid_argument("'" + std::string(text) +
                          "': expected off, lz4, zstd or zstd:<level 1-19>");
}

std::string to_string(const LosslessConfig& c) {
  std::string s = c.method == LosslessMethod::kNone  ? "off"
                  : c.method == LosslessMethod::kLz4 ? "lz4"
                                                     : "zstd:" + std::to_string(c.level);
  if (c.method != LosslessMethod::kNone && c.shuffle > 1)
    s += " shuffle " + std::to_string(c.shuffle);
  return s;
}

size_t lossless_bound(size_t raw_bytes) {
  // Both compressors are tried only where they can win; otherwise the frame stores raw bytes.
  return kLosslessHeaderBytes + raw_bytes;
}

Result<size_t> lossless_encode(const LosslessConfig& c, const void* in, size_t n, void* out,
                               size_t capacity) {
  if (capacity < lossless_bound(n))
    return invalid_argument("lossless_encode: output capacity " + std::to_string(capacity) +
                            " below the bound " + std::to_string(lossless_bound(n)));
  if (!valid_shuffle(c.shuffle))
    return invalid_argument("lossless_encode: shuffle width " + std::to_string(c.shuffle));
  auto* dst = static_cast<uint8_t*>(out);
  const auto* src = static_cast<const uint8_t*>(in);
  const size_t room = capacity - kLosslessHeaderBytes;
  size_t packed = 0;  // 0: did not shrink, store raw
  const int width = c.shuffle > 1 && n >= static_cast<size_t>(c.shuffle) ? c.shuffle : 0;
  if (c.method != LosslessMethod::kNone && n > 0) {
    std::unique_ptr<uint8_t[]> planes;
    const uint8_t* from = src;
    if (width) {
      planes.reset(new uint8_t[n]);
      shuffle(src, n, width, planes.get());
      from = planes.get();
    }
    // Worth it only below the raw size: the compressor gets n - 1 bytes of room.
    const size_t limit = std::min(room, n) - 1;
    if (c.method == LosslessMethod::kLz4) {
      if (n <= static_cast<size_t>(LZ4_MAX_INPUT_SIZE) && limit > 0) {
        int k = LZ4_compress_fast(reinterpret_cast<const char*>(from),
                                  reinterpret_cast<char*>(dst + kLosslessHeaderBytes),
                                  static_cast<int>(n),
                                  static_cast<int>(std::min<size_t>(limit, INT_MAX)), c.level);
        if (k > 0) packed = static_cast<size_t>(k);
      }
    } else if (limit > 0) {
      size_t k = ZSTD_compress(dst + kLosslessHeaderBytes, limit, from, n, c.level);
      if (!ZSTD_isError(k)) packed = k;  // "dst too small": incompressible, store raw
    }
  }
  if (packed) {
    write_header(dst, c.method, width, n);
    return kLosslessHeaderBytes + packed;
  }
  write_header(dst, LosslessMethod::kNone, 0, n);
  if (n) std::memcpy(dst + kLosslessHeaderBytes, src, n);
  return kLosslessHeaderBytes + n;
}

Result<size_t> lossless_decode(const void* in, size_t n, void* out, size_t capacity) {
  auto bad = [](const std::string& why) {
    return Status(StatusCode::kCorruptData, "lossless frame: " + why);
  };
  if (n < kLosslessHeaderBytes) return bad("shorter than its header");
  const auto* src = static_cast<const uint8_t*>(in);
  if (lowcomm::load_le32(src) != kMagic) return bad("bad magic");
  const auto method = static_cast<LosslessMethod>(src[4]);
  const int width = src[5];
  if (src[6] != 0 || src[7] != 0) return bad("reserved bytes set");
  if (!valid_shuffle(width)) return bad("shuffle width " + std::to_string(width));
  const uint64_t raw = lowcomm::load_le64(src + 8);
  if (raw > capacity)
    return bad("raw length " + std::to_string(raw) + " exceeds the receive of " +
               std::to_string(capacity) + " bytes");
  const uint8_t* payload = src + kLosslessHeaderBytes;
  const size_t payload_len = n - kLosslessHeaderBytes;
  auto* dst = static_cast<uint8_t*>(out);
  if (method == LosslessMethod::kNone) {
    if (payload_len != raw) return bad("raw payload length disagrees with the header");
    if (width > 1) return bad("a raw frame with a shuffle");
    if (raw) std::memcpy(dst, payload, raw);
    return static_cast<size_t>(raw);
  }
  if (method != LosslessMethod::kLz4 && method != LosslessMethod::kZstd)
    return bad("unknown method " + std::to_string(static_cast<int>(method)));
  if (raw == 0) return bad("a compressed frame of nothing");
  std::unique_ptr<uint8_t[]> planes;
  uint8_t* into = dst;
  if (width > 1) {
    planes.reset(new uint8_t[raw]);
    into = planes.get();
  }
  if (method == LosslessMethod::kLz4) {
    if (raw > static_cast<uint64_t>(INT_MAX) || payload_len > static_cast<size_t>(INT_MAX))
      return bad("too large for lz4");
    int k =
        LZ4_decompress_safe(reinterpret_cast<const char*>(payload), reinterpret_cast<char*>(into),
                            static_cast<int>(payload_len), static_cast<int>(raw));
    if (k < 0 || static_cast<uint64_t>(k) != raw) return bad("lz4 payload does not decode");
  } else {
    size_t k = ZSTD_decompress(into, raw, payload, payload_len);
    if (ZSTD_isError(k)) return bad(std::string("zstd: ") + ZSTD_getErrorName(k));
    if (k != raw) return bad("zstd payload decodes to the wrong length");
  }
  if (width > 1) unshuffle(planes.get(), raw, width, dst);
  return static_cast<size_t>(raw);
}

}  // namespace lowcomm::nccl_net
