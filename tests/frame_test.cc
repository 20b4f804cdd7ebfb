// Wire frame tests: round trips against the codec API, the documented byte layout, and the
// rejection of every kind of bad frame (corrupt header bytes, bad fields behind a valid
// checksum, truncation, payload bit flips, trailing bytes, garbage, oversized claims) with a
// clear error and without crashing, touching the output or allocating by a received size.

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "codec/quant_math.h"
#include "frame/frame.h"

// Records the largest single allocation, so tests can show that a frame claiming a huge size
// is rejected without allocating for it.
namespace {
std::atomic<size_t> g_largest_alloc{0};
}  // namespace

// GCC pairs the replacement operators below with their inlined malloc/free and warns falsely.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t size) {
  size_t seen = g_largest_alloc.load(std::memory_order_relaxed);
  while (size > seen && !g_largest_alloc.compare_exchange_weak(seen, size)) {
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}

namespace lowcomm::frame {
namespace {

using Bytes = std::vector<uint8_t>;

::testing::AssertionResult Mentions(const Status& s, const std::string& text) {
  if (s.message().find(text) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "'" << s.to_string() << "' does not mention '" << text << "'";
}

CodecSpec spec_of(const std::string& text) {
  Result<CodecSpec> s = parse_codec_spec(text);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? *s : CodecSpec{};
}

// n elements of dtype: mostly N(0, 1), with a few larger values so groups differ in scale.
Bytes make_tensor(DType dtype, uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Bytes out(n * dtype_size(dtype));
  for (uint64_t i = 0; i < n; ++i) {
    float v = normal(rng) * (i % 97 == 0 ? 50.0f : 1.0f);
    if (dtype == DType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      uint16_t h = dtype == DType::kBFloat16 ? qm::f32_to_bf16(v) : qm::f32_to_f16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

Bytes make_frame(const CodecSpec& spec, DType dtype, uint64_t n, uint64_t seed = 1) {
  Bytes x = make_tensor(dtype, n, seed);
  Bytes frame(framed_size(spec, n));
  Status s = encode_frame(spec, dtype, x.data(), n, frame.data(), frame.size(), {seed, 0});
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return frame;
}

void set_field(Bytes& frame, size_t offset, size_t size, uint64_t value) {
  for (size_t i = 0; i < size; ++i) frame[offset + i] = static_cast<uint8_t>(value >> (8 * i));
}

uint64_t get_field(const Bytes& frame, size_t offset, size_t size) {
  uint64_t v = 0;
  for (size_t i = 0; i < size; ++i) v |= static_cast<uint64_t>(frame[offset + i]) << (8 * i);
  return v;
}

// Rewrites the header checksum so that the field checks behind it are what a test reaches.
void reseal(Bytes& frame) {
  set_field(frame, 56, 8, frame_header_checksum(frame.data()));
}

// ---- round trips ----

struct RoundTripCase {
  std::string spec;
  DType dtype;
  uint64_t n;
};

std::vector<RoundTripCase> round_trip_cases() {
  const char* specs[] = {
      "none",    "bf16",    "fp16",       "q1",          "q1:block=32",      "q2",
      "q3",      "q4",      "q8",         "q4:block=32", "q2:block=4096:sr", "q8:sr",
      "minmax2", "minmax4", "minmax8:sr", "q4:col=8",    "minmax4:col=24",   "q2:col=1:sr"};
  const uint64_t counts[] = {0, 1, 7, 8, 9, 96, 1000, 4104, 5000};
  std::vector<RoundTripCase> cases;
  for (const char* s : specs) {
    for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (uint64_t n : counts) {
        if (check_count(*parse_codec_spec(s), n).is_ok()) cases.push_back({s, d, n});
      }
    }
  }
  return cases;
}

class FrameRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(FrameRoundTrip, MatchesCodecApi) {
  const RoundTripCase& c = GetParam();
  CodecSpec spec = spec_of(c.spec);
  Bytes x = make_tensor(c.dtype, c.n, c.n + 17);
  RoundingKey key{0xC0FFEE + c.n, 12345};

  Bytes frame(framed_size(spec, c.n));
  ASSERT_EQ(frame.size(), kFrameHeaderBytes + encoded_size(spec, c.n));
  Status s = encode_frame(spec, c.dtype, x.data(), c.n, frame.data(), frame.size(), key);
  ASSERT_TRUE(s.is_ok()) << s.to_string();

  // The payload is exactly what the codec writes.
  Bytes codes(encoded_size(spec, c.n));
  ASSERT_TRUE(encode(spec, c.dtype, x.data(), c.n, codes.data(), codes.size(), key).is_ok());
  ASSERT_TRUE(std::equal(codes.begin(), codes.end(), frame.begin() + kFrameHeaderBytes));

  Result<FrameInfo> info = parse_frame(frame.data(), frame.size());
  ASSERT_TRUE(info.is_ok()) << info.status().to_string();
  EXPECT_EQ(info->spec, spec) << to_string(info->spec) << " vs " << c.spec;
  EXPECT_EQ(info->dtype, c.dtype);
  EXPECT_EQ(info->n, c.n);
  EXPECT_EQ(info->payload_bytes, codes.size());
  EXPECT_EQ(info->payload, frame.data() + kFrameHeaderBytes);

  size_t bytes = c.n * dtype_size(c.dtype);
  Bytes want(bytes + 1, 0xA5), got(bytes + 1, 0xA5);  // one guard byte past the end
  ASSERT_TRUE(decode(spec, codes.data(), codes.size(), c.n, c.dtype, want.data()).is_ok());
  s = decode_frame(frame.data(), frame.size(), c.dtype, got.data(), c.n);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(got, want);

  Bytes acc_want = make_tensor(c.dtype, c.n, 99), acc_got = acc_want;
  ASSERT_TRUE(
      decode_accumulate(spec, codes.data(), codes.size(), c.n, c.dtype, acc_want.data()).is_ok());
  s = decode_accumulate_frame(frame.data(), frame.size(), c.dtype, acc_got.data(), c.n);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(acc_got, acc_want);
}

INSTANTIATE_TEST_SUITE_P(Specs, FrameRoundTrip, ::testing::ValuesIn(round_trip_cases()),
                         [](const ::testing::TestParamInfo<RoundTripCase>& p) {
                           std::string name = p.param.spec + "_" + dtype_name(p.param.dtype) +
                                              "_n" + std::to_string(p.param.n);
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

TEST(Frame, ErrorFeedbackFrameMatchesCodecApi) {
  for (const char* text : {"q2", "minmax4:col=16", "bf16"}) {
    CodecSpec spec = spec_of(text);
    const uint64_t n = 1024;
    Bytes x = make_tensor(DType::kFloat32, n, 5);
    std::vector<float> r_frame(n, 0.01f), r_direct(n, 0.01f);
    Bytes frame(framed_size(spec, n)), codes(encoded_size(spec, n));
    ASSERT_TRUE(encode_frame_error_feedback(spec, DType::kFloat32, x.data(), r_frame.data(), n,
                                            frame.data(), frame.size())
                    .is_ok());
    ASSERT_TRUE(encode_error_feedback(spec, DType::kFloat32, x.data(), r_direct.data(), n,
                                      codes.data(), codes.size())
                    .is_ok());
    EXPECT_TRUE(std::equal(codes.begin(), codes.end(), frame.begin() + kFrameHeaderBytes)) << text;
    EXPECT_EQ(0, std::memcmp(r_frame.data(), r_direct.data(), n * sizeof(float))) << text;
    EXPECT_TRUE(parse_frame(frame.data(), frame.size()).is_ok()) << text;
  }
}

TEST(Frame, WriteFrameHeaderForSeparatelyEncodedPayload) {
  CodecSpec spec = spec_of("q4:block=64:sr");
  const uint64_t n = 777;
  Bytes x = make_tensor(DType::kBFloat16, n, 3);
  Bytes a(framed_size(spec, n)), b(framed_size(spec, n));
  ASSERT_TRUE(
      encode_frame(spec, DType::kBFloat16, x.data(), n, a.data(), a.size(), {7, 0}).is_ok());
  // Encode "elsewhere" straight into place, then put the header in front of it.
  uint8_t* payload = b.data() + kFrameHeaderBytes;
  uint64_t payload_bytes = b.size() - kFrameHeaderBytes;
  ASSERT_TRUE(encode(spec, DType::kBFloat16, x.data(), n, payload, payload_bytes, {7, 0}).is_ok());
  ASSERT_TRUE(
      write_frame_header(spec, DType::kBFloat16, n, payload, payload_bytes, b.data()).is_ok());
  EXPECT_EQ(a, b);

  Status s = write_frame_header(spec, DType::kBFloat16, n, payload, payload_bytes - 1, b.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, std::to_string(payload_bytes)));
  s = write_frame_header(spec, static_cast<DType>(99), n, payload, payload_bytes, b.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "dtype value 99"));
  CodecSpec bad = spec;
  bad.bits = 5;
  EXPECT_EQ(write_frame_header(bad, DType::kBFloat16, n, payload, payload_bytes, b.data()).code(),
            StatusCode::kInvalidArgument);
}

TEST(Frame, HeaderLayoutIsTheDocumentedOne) {
  CodecSpec spec = spec_of("q4:block=64:sr");
  const uint64_t n = 1000;
  Bytes f = make_frame(spec, DType::kBFloat16, n);
  EXPECT_EQ(0, std::memcmp(f.data(), "LCWF", 4));
  EXPECT_EQ(get_field(f, 0, 4), kFrameMagic);
  EXPECT_EQ(get_field(f, 4, 2), 1u);   // version
  EXPECT_EQ(get_field(f, 6, 2), 64u);  // header length
  EXPECT_EQ(f[8], 1);                  // absmax
  EXPECT_EQ(f[9], 4);                  // bits
  EXPECT_EQ(f[10], 1);                 // block grouping
  EXPECT_EQ(f[11], 1);                 // stochastic
  EXPECT_EQ(f[12], 2);                 // bf16 tensor
  EXPECT_EQ(f[13], 0);                 // no passthrough wire dtype
  EXPECT_EQ(get_field(f, 14, 2), 0u);  // flags
  EXPECT_EQ(get_field(f, 16, 4), 64u);
  EXPECT_EQ(get_field(f, 20, 4), 0u);
  EXPECT_EQ(get_field(f, 24, 8), 0u);
  EXPECT_EQ(get_field(f, 32, 8), n);
  EXPECT_EQ(get_field(f, 40, 8), 16 * 4 + 125 * 4u);  // 16 scales + 125 units of 4 bytes
  EXPECT_EQ(get_field(f, 48, 8), XXH3_64bits(f.data() + 64, f.size() - 64));
  EXPECT_EQ(get_field(f, 56, 8), XXH3_64bits(f.data(), 56));

  Bytes c = make_frame(spec_of("minmax8:col=40"), DType::kFloat32, 400);
  EXPECT_EQ(c[8], 2);
  EXPECT_EQ(c[10], 2);
  EXPECT_EQ(get_field(c, 16, 4), 0u);
  EXPECT_EQ(get_field(c, 24, 8), 40u);
  EXPECT_EQ(get_field(c, 40, 8), 40 * 8 + 50 * 8u);

  Bytes p = make_frame(spec_of("fp16"), DType::kFloat32, 10);
  EXPECT_EQ(p[8], 0);
  EXPECT_EQ(p[9], 16);
  EXPECT_EQ(p[10], 0);
  EXPECT_EQ(p[12], 1);
  EXPECT_EQ(p[13], 3);
  EXPECT_EQ(get_field(p, 40, 8), 20u);
}

// Pins the format: any change to these bytes is a wire format change and needs a version bump.
TEST(Frame, GoldenFrame) {
  const float x[8] = {1.0f, -2.0f, 0.5f, 0.0f, 4.0f, -4.0f, 3.0f, -0.25f};
  CodecSpec spec = spec_of("q2:block=32");
  Bytes f(framed_size(spec, 8));
  ASSERT_TRUE(encode_frame(spec, DType::kFloat32, x, 8, f.data(), f.size()).is_ok());
  const uint8_t golden[] = {
      // magic, version 1, header length 64
      0x4c, 0x43, 0x57, 0x46, 0x01, 0x00, 0x40, 0x00,
      // absmax, 2 bits, block grouping, nearest, fp32 tensor, no wire dtype, flags 0
      0x01, 0x02, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00,
      // block 32, reserved 0
      0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      // cols 0
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      // n 8
      0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      // payload 6 bytes
      0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      // payload checksum XXH3-64(payload), header checksum XXH3-64(bytes 0..55)
      0x73, 0xb6, 0x9c, 0x3e, 0x79, 0xfd, 0x0a, 0xff, 0xd8, 0x09, 0xef, 0x44, 0xd0, 0x98, 0x08,
      0xb4,
      // payload: the scale 4.0f, then one 2-byte unit of codes k + 2 with k = rint(x / 4 * 2)
      // (ties to even) clamped to [-2, 1]: 2, 1, 2, 2, 3, 0, 3, 2; element j at bits
      // [2j, 2j + 2) of the little-endian unit.
      0x00, 0x00, 0x80, 0x40, 0xA6, 0xB3};
  ASSERT_EQ(f.size(), sizeof golden);
  for (size_t i = 0; i < sizeof golden; ++i) EXPECT_EQ(f[i], golden[i]) << "byte " << i;
  EXPECT_EQ(get_field(f, 48, 8), 0u + XXH3_64bits(golden + 64, 6));
  EXPECT_EQ(get_field(f, 56, 8), 0u + XXH3_64bits(golden, 56));
  Bytes g(golden, golden + sizeof golden);
  float y[8];
  ASSERT_TRUE(decode_frame(g.data(), g.size(), DType::kFloat32, y, 8).is_ok());
  const float want[8] = {0.0f, -2.0f, 0.0f, 0.0f, 2.0f, -4.0f, 2.0f, 0.0f};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(y[i], want[i]) << i;
}

// ---- caller mistakes on the encode side ----

TEST(Frame, EncodeRejectsCallerMistakes) {
  CodecSpec spec = spec_of("q4");
  const uint64_t n = 300;
  Bytes x = make_tensor(DType::kFloat32, n, 1);
  uint64_t need = framed_size(spec, n);
  Bytes out(need + 8);

  Status s = encode_frame(spec, DType::kFloat32, x.data(), n, out.data(), need - 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, std::to_string(need - 1))) << s.message();
  EXPECT_TRUE(Mentions(s, std::to_string(need)));
  EXPECT_EQ(encode_frame(spec, DType::kFloat32, x.data(), n, nullptr, need).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(encode_frame(spec, DType::kFloat32, nullptr, n, out.data(), need).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(encode_frame(spec, static_cast<DType>(0), x.data(), n, out.data(), need).code(),
            StatusCode::kInvalidArgument);
  CodecSpec bad = spec;
  bad.block = 100;
  EXPECT_EQ(encode_frame(bad, DType::kFloat32, x.data(), n, out.data(), need).code(),
            StatusCode::kInvalidArgument);
  s = encode_frame(spec_of("q4:col=7"), DType::kFloat32, x.data(), n, out.data(), need);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "not a multiple"));
  s = encode_frame(spec, DType::kFloat32, x.data(), n, out.data() + 1, need);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "aligned"));
  // Sparse codecs travel as collective payloads, not frames: refused, not mis-sized.
  s = encode_frame(spec_of("topk:8/256+q2"), DType::kFloat32, x.data(), n, out.data(), need);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "dense codecs only")) << s.message();
}

TEST(Frame, FramedSize) {
  EXPECT_EQ(framed_size(spec_of("q4"), 0), kFrameHeaderBytes);
  EXPECT_EQ(framed_size(spec_of("q4"), 256), 64u + 2 * 4 + 32 * 4);
  EXPECT_EQ(framed_size(spec_of("none"), 10), 64u + 40);
  EXPECT_EQ(framed_size(spec_of("none"), UINT64_MAX / 2), UINT64_MAX);  // overflow saturates
  EXPECT_EQ(framed_size(spec_of("bf16"), UINT64_MAX / 2 - 16), UINT64_MAX);
}

// ---- corrupt frames ----

TEST(Frame, EveryCorruptHeaderByteIsRejected) {
  const CodecSpec specs[] = {spec_of("q4"), spec_of("minmax8:col=8"), spec_of("bf16")};
  for (const CodecSpec& spec : specs) {
    const uint64_t n = 64;
    Bytes good = make_frame(spec, DType::kFloat32, n);
    for (size_t offset = 0; offset < kFrameHeaderBytes; ++offset) {
      for (int mask : {0x01, 0x10, 0x80, 0xFF}) {
        Bytes f = good;
        f[offset] ^= static_cast<uint8_t>(mask);
        Result<FrameInfo> info = parse_frame(f.data(), f.size());
        ASSERT_FALSE(info.is_ok()) << to_string(spec) << " offset " << offset;
        Status s = info.status();
        EXPECT_EQ(s.code(), StatusCode::kCorruptData) << s.to_string();
        const char* expect = offset < 4   ? "magic"
                             : offset < 6 ? "version"
                             : offset < 8 ? "header length"
                                          : "header checksum";
        EXPECT_TRUE(Mentions(s, expect)) << "offset " << offset;

        std::vector<float> out(n, 42.0f);
        EXPECT_FALSE(decode_frame(f.data(), f.size(), DType::kFloat32, out.data(), n).is_ok());
        EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == 42.0f; }));
      }
    }
  }
}

// Bad values behind a valid header checksum: what a buggy or malicious sender could write.
TEST(Frame, EveryFieldIsValidated) {
  struct Case {
    const char* name;
    const char* spec;
    uint64_t n;
    size_t offset, size;
    uint64_t value;
    const char* mention;
  };
  const Case cases[] = {
      {"magic", "q4", 100, 0, 4, 0x46574300, "bad magic"},
      {"version 0", "q4", 100, 4, 2, 0, "version 0 is not supported"},
      {"version 2", "q4", 100, 4, 2, 2, "this build reads version 1"},
      {"header length", "q4", 100, 6, 2, 128, "header length 128"},
      {"kind", "q4", 100, 8, 1, 3, "codec kind 3"},
      {"bits 5", "q4", 100, 9, 1, 5, "not 5"},
      {"bits 0", "minmax4", 100, 9, 1, 0, "not 0"},
      {"bits 255", "q4", 100, 9, 1, 255, "not 255"},
      {"passthrough bits", "fp16", 100, 9, 1, 32, "bits must match"},
      {"grouping", "q4", 100, 10, 1, 3, "grouping 3"},
      {"grouping element for quantized", "q4", 100, 10, 1, 0, "not block"},
      {"grouping column on a block frame", "q4", 100, 10, 1, 2, "block size field is 128"},
      {"rounding", "q4", 100, 11, 1, 2, "rounding 2"},
      {"q1 stochastic", "q1", 100, 11, 1, 1, "q1"},
      {"passthrough stochastic", "none", 100, 11, 1, 1, "passthrough"},
      {"dtype 0", "q4", 100, 12, 1, 0, "tensor dtype 0"},
      {"dtype 4", "q4", 100, 12, 1, 4, "tensor dtype 4"},
      {"wire dtype on quantized", "q4", 100, 13, 1, 1, "wire dtype is 1"},
      {"passthrough wire dtype 0", "bf16", 100, 13, 1, 0, "wire dtype 0"},
      {"passthrough wire dtype 9", "bf16", 100, 13, 1, 9, "wire dtype 9"},
      {"passthrough wire dtype vs bits", "bf16", 100, 13, 1, 1, "bits must match"},
      {"flags", "q4", 100, 14, 2, 0x8000, "reserved flags"},
      {"reserved", "q4", 100, 20, 4, 1, "reserved bytes"},
      {"block not power of two", "q4", 100, 16, 4, 48, "power of two"},
      {"block too large", "q4", 100, 16, 4, 8192, "8192"},
      {"block zero", "q4", 100, 16, 4, 0, "got 0"},
      {"block on column grouping", "q4:col=4", 100, 16, 4, 128, "block size field is 128"},
      {"block on passthrough", "none", 100, 16, 4, 128, "block size field"},
      {"cols on block grouping", "q4", 100, 24, 8, 4, "column count field is 4"},
      {"cols not dividing n", "q4:col=4", 100, 24, 8, 7, "not a multiple"},
      {"cols zero", "q4:col=4", 100, 24, 8, 0, "col=N"},
      {"n one more", "q4", 104, 32, 8, 105, "header says the payload is"},
      {"n one less", "minmax2", 105, 32, 8, 104, "of 104 elements"},
      {"n too large", "q4", 100, 32, 8, (uint64_t{1} << 56) + 1, "too large"},
      {"payload bytes", "q4", 100, 40, 8, 64, "header says the payload is 64 bytes"},
      {"payload checksum", "q4", 100, 48, 8, 12345, "payload checksum mismatch"},
  };
  for (const Case& c : cases) {
    Bytes f = make_frame(spec_of(c.spec), DType::kFloat32, c.n);
    set_field(f, c.offset, c.size, c.value);
    reseal(f);
    Result<FrameInfo> info = parse_frame(f.data(), f.size());
    ASSERT_FALSE(info.is_ok()) << c.name;
    EXPECT_EQ(info.status().code(), StatusCode::kCorruptData) << c.name;
    EXPECT_TRUE(Mentions(info.status(), c.mention)) << c.name;
    EXPECT_TRUE(Mentions(info.status(), "wire frame: ")) << c.name;
  }
}

TEST(Frame, TruncationIsRejected) {
  CodecSpec spec = spec_of("q4");  // 1000 elements: 8 scales (32 bytes), then 500 code bytes
  Bytes f = make_frame(spec, DType::kFloat32, 1000);
  ASSERT_EQ(f.size(), 64u + 32 + 500);
  const size_t named[] = {0, 1, 32, 63, 64, 64 + 16, 64 + 31, 64 + 32, 64 + 300, f.size() - 1};
  for (size_t len : named) {
    Result<FrameInfo> info = parse_frame(f.data(), len);
    ASSERT_FALSE(info.is_ok()) << len;
    EXPECT_EQ(info.status().code(), StatusCode::kCorruptData);
    EXPECT_TRUE(Mentions(info.status(), "truncated")) << len;
    EXPECT_TRUE(Mentions(info.status(), std::to_string(len) + " bytes")) << len;
  }
  for (size_t len = 0; len < f.size(); ++len) {
    ASSERT_FALSE(parse_frame(f.data(), len).is_ok()) << len;
    std::vector<float> out(1000, 7.0f);
    ASSERT_FALSE(decode_frame(f.data(), len, DType::kFloat32, out.data(), 1000).is_ok());
    ASSERT_EQ(out[0], 7.0f);
  }
}

TEST(Frame, PayloadBitFlipsAreCaughtByTheChecksum) {
  std::mt19937_64 rng(2024);
  for (const char* text : {"q4", "minmax8:col=32", "fp16", "q1:block=32"}) {
    CodecSpec spec = spec_of(text);
    const uint64_t n = 4096;
    Bytes good = make_frame(spec, DType::kFloat32, n);
    const uint64_t payload = good.size() - kFrameHeaderBytes;
    std::vector<float> out(n, 3.0f);
    for (int trial = 0; trial < 1500; ++trial) {
      Bytes f = good;
      int flips = trial < 1000 ? 1 : 1 + static_cast<int>(rng() % 16);
      for (int k = 0; k < flips; ++k) {
        uint64_t bit = rng() % (payload * 8);
        f[kFrameHeaderBytes + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      }
      if (f == good) continue;  // an even number of flips of one bit
      Result<FrameInfo> info = parse_frame(f.data(), f.size());
      ASSERT_FALSE(info.is_ok()) << text << " trial " << trial;
      ASSERT_EQ(info.status().code(), StatusCode::kCorruptData);
      ASSERT_TRUE(Mentions(info.status(), "payload checksum mismatch"));
      ASSERT_FALSE(decode_frame(f.data(), f.size(), DType::kFloat32, out.data(), n).is_ok());
    }
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == 3.0f; }));
  }
}

TEST(Frame, TrailingBytesAreRejected) {
  Bytes f = make_frame(spec_of("q8"), DType::kFloat16, 50);
  for (size_t extra : {1, 7, 64}) {
    Bytes g = f;
    g.resize(f.size() + extra, 0);
    Result<FrameInfo> info = parse_frame(g.data(), g.size());
    ASSERT_FALSE(info.is_ok());
    EXPECT_EQ(info.status().code(), StatusCode::kCorruptData);
    EXPECT_TRUE(Mentions(info.status(), std::to_string(extra) + " trailing byte(s)"));
  }
  Bytes two = f;
  two.insert(two.end(), f.begin(), f.end());  // two frames back to back are not one frame
  EXPECT_FALSE(parse_frame(two.data(), two.size()).is_ok());
}

TEST(Frame, RandomBuffersAreRejected) {
  std::mt19937_64 rng(77);
  Bytes good = make_frame(spec_of("q2"), DType::kFloat32, 256);
  for (int trial = 0; trial < 30000; ++trial) {
    Bytes b(rng() % 400);
    for (uint8_t& v : b) v = static_cast<uint8_t>(rng());
    int mode = trial % 3;
    if (mode >= 1 && b.size() >= 8) std::copy(good.begin(), good.begin() + 8, b.begin());
    if (mode == 2 && b.size() >= 64) {
      reseal(b);  // a plausible header over random fields
    }
    Result<FrameInfo> info = parse_frame(b.data(), b.size());
    ASSERT_FALSE(info.is_ok()) << "trial " << trial;
    ASSERT_EQ(info.status().code(), StatusCode::kCorruptData) << info.status().to_string();
    ASSERT_FALSE(info.status().message().empty());
  }
}

TEST(Frame, HugeClaimsAreRejectedWithoutAllocating) {
  struct Claim {
    const char* name;
    const char* spec;
    uint64_t n, cols, payload;
    const char* mention;
  };
  const uint64_t big = uint64_t{1} << 56;
  const Claim claims[] = {
      {"2^56 elements of q4", "q4", big, 0, big / 128 * 4 + big / 8 * 4, "truncated"},
      {"2^56 elements of fp32", "none", big, 0, big * 4, "truncated"},
      {"2^56 columns", "q4:col=4", big, big, big * 4 + big / 8 * 4, "truncated"},
      {"2^63 columns", "q4:col=4", uint64_t{1} << 63, uint64_t{1} << 63, 0, "too large"},
      {"n = 2^64-1", "q4", UINT64_MAX, 0, 0, "too large"},
      {"payload 2^64-1", "q4", 100, 0, UINT64_MAX, "header says the payload"},
      {"payload wraps the frame size", "none", 100, 0, UINT64_MAX - 63, "header says the payload"},
      {"payload 2^64-1 at n 0", "q4", 0, 0, UINT64_MAX, "header says the payload"},
  };
  for (const Claim& c : claims) {
    CodecSpec spec = spec_of(c.spec);
    Bytes f = make_frame(spec, DType::kFloat32, 0);  // just a header
    set_field(f, 32, 8, c.n);
    set_field(f, 40, 8, c.payload);
    if (spec.grouping == Grouping::kColumn) set_field(f, 24, 8, c.cols);
    reseal(f);
    std::vector<float> out(16, 1.0f);
    g_largest_alloc = 0;
    Result<FrameInfo> info = parse_frame(f.data(), f.size());
    Status s = decode_frame(f.data(), f.size(), DType::kFloat32, out.data(), c.n);
    size_t largest = g_largest_alloc;
    ASSERT_FALSE(info.is_ok()) << c.name;
    EXPECT_EQ(info.status().code(), StatusCode::kCorruptData) << c.name;
    EXPECT_TRUE(Mentions(info.status(), c.mention)) << c.name;
    EXPECT_EQ(s.code(), StatusCode::kCorruptData) << c.name;
    EXPECT_LT(largest, size_t{4096}) << c.name;  // error strings only
    EXPECT_EQ(out[0], 1.0f);
  }
  // The split API answers with the claimed size, validated, before any payload is read.
  Bytes f = make_frame(spec_of("q4"), DType::kFloat32, 0);
  set_field(f, 32, 8, big);
  set_field(f, 40, 8, big / 128 * 4 + big / 8 * 4);
  reseal(f);
  Result<FrameInfo> header = parse_frame_header(f.data(), f.size());
  ASSERT_TRUE(header.is_ok()) << header.status().to_string();
  EXPECT_EQ(header->payload_bytes, big / 128 * 4 + big / 8 * 4);
  EXPECT_EQ(header->payload, nullptr);
}

// ---- the receiver's expectations ----

TEST(Frame, CountAndDTypeMismatchesAreClearErrors) {
  const uint64_t n = 100;
  Bytes f = make_frame(spec_of("q4"), DType::kBFloat16, n);
  std::vector<uint16_t> out(n + 1, 0x1234);
  for (uint64_t expected : {n - 1, n + 1, uint64_t{0}}) {
    Status s = decode_frame(f.data(), f.size(), DType::kBFloat16, out.data(), expected);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Mentions(s, "holds 100 elements"));
    EXPECT_TRUE(Mentions(s, "expected " + std::to_string(expected)));
  }
  for (DType d : {DType::kFloat32, DType::kFloat16}) {
    Status s = decode_accumulate_frame(f.data(), f.size(), d, out.data(), n);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Mentions(s, "bf16"));
    EXPECT_TRUE(Mentions(s, dtype_name(d)));
  }
  Status s = decode_frame(f.data(), f.size(), static_cast<DType>(200), out.data(), n);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "dtype value 200"));
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint16_t v) { return v == 0x1234; }));
  EXPECT_TRUE(decode_frame(f.data(), f.size(), DType::kBFloat16, out.data(), n).is_ok());
}

TEST(Frame, ZeroAndOneElementFrames) {
  for (const char* text : {"none", "bf16", "q1", "q4", "minmax8", "q4:col=1", "q2:col=3"}) {
    CodecSpec spec = spec_of(text);
    Bytes empty(framed_size(spec, 0));
    ASSERT_EQ(empty.size(), kFrameHeaderBytes) << text;
    ASSERT_TRUE(
        encode_frame(spec, DType::kFloat32, nullptr, 0, empty.data(), empty.size()).is_ok());
    Result<FrameInfo> info = parse_frame(empty.data(), empty.size());
    ASSERT_TRUE(info.is_ok()) << text << ": " << info.status().to_string();
    EXPECT_EQ(info->n, 0u);
    EXPECT_EQ(info->payload_bytes, 0u);
    EXPECT_TRUE(decode_frame(empty.data(), empty.size(), DType::kFloat32, nullptr, 0).is_ok());
    EXPECT_TRUE(
        decode_accumulate_frame(empty.data(), empty.size(), DType::kFloat32, nullptr, 0).is_ok());

    if (spec.grouping == Grouping::kColumn && spec.cols != 1) continue;
    const float x = -0.75f;
    Bytes one(framed_size(spec, 1));
    ASSERT_TRUE(encode_frame(spec, DType::kFloat32, &x, 1, one.data(), one.size()).is_ok());
    float y = 0.0f;
    ASSERT_TRUE(decode_frame(one.data(), one.size(), DType::kFloat32, &y, 1).is_ok()) << text;
    EXPECT_EQ(y, x) << text;  // the group's own extreme decodes exactly in every codec here
  }
}

TEST(Frame, NullAndMisalignedBuffers) {
  Result<FrameInfo> info = parse_frame(nullptr, 0);
  EXPECT_EQ(info.status().code(), StatusCode::kCorruptData);
  EXPECT_TRUE(Mentions(info.status(), "truncated"));
  EXPECT_EQ(parse_frame(nullptr, 64).status().code(), StatusCode::kInvalidArgument);

  // parse_frame reads bytes, so any address works; decoding in place needs alignment.
  for (const char* text : {"q4", "bf16", "none"}) {
    Bytes f = make_frame(spec_of(text), DType::kFloat32, 40);
    for (size_t shift = 1; shift < 4; ++shift) {
      Bytes moved(f.size() + shift);
      std::copy(f.begin(), f.end(), moved.begin() + shift);
      const uint8_t* at = moved.data() + shift;
      EXPECT_TRUE(parse_frame(at, f.size()).is_ok()) << text << " +" << shift;
      std::vector<float> out(40);
      Status s = decode_frame(at, f.size(), DType::kFloat32, out.data(), 40);
      bool aligned_enough = std::string(text) == "bf16" && shift == 2;
      EXPECT_EQ(s.is_ok(), aligned_enough) << text << " +" << shift << ": " << s.to_string();
      if (!s.is_ok()) {
        EXPECT_TRUE(Mentions(s, "aligned"));
      }
    }
  }
}

TEST(Frame, HeaderThenPayload) {
  Bytes f = make_frame(spec_of("minmax4"), DType::kFloat16, 999);
  Result<FrameInfo> h = parse_frame_header(f.data(), kFrameHeaderBytes);
  ASSERT_TRUE(h.is_ok()) << h.status().to_string();
  EXPECT_EQ(h->n, 999u);
  EXPECT_EQ(h->payload_bytes, f.size() - kFrameHeaderBytes);
  const uint8_t* payload = f.data() + kFrameHeaderBytes;
  EXPECT_TRUE(check_frame_payload(*h, payload, h->payload_bytes).is_ok());
  Status s = check_frame_payload(*h, payload, h->payload_bytes - 1);
  EXPECT_EQ(s.code(), StatusCode::kCorruptData);
  EXPECT_TRUE(Mentions(s, "truncated payload"));
  EXPECT_TRUE(Mentions(check_frame_payload(*h, payload, h->payload_bytes + 1), "oversized"));
  f.back() ^= 0x40;
  EXPECT_TRUE(Mentions(check_frame_payload(*h, payload, h->payload_bytes), "payload checksum"));
  EXPECT_FALSE(parse_frame_header(f.data(), kFrameHeaderBytes - 1).is_ok());
}

}  // namespace
}  // namespace lowcomm::frame
