// Codec spec: parsing, printing, validation, and the encoded-size arithmetic that lets a
// receiver check a payload's length before reading it.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "codec_test_util.h"
#include "lowcomm/codec.h"

namespace lowcomm {
namespace {

using test::spec_of;

// ---- parsing and printing ----

TEST(CodecSpecParse, DefaultsOfEachName) {
  CodecSpec none = spec_of("none");
  EXPECT_EQ(none.kind, CodecKind::kNone);
  EXPECT_EQ(none.bits, 32);
  EXPECT_EQ(none.wire_dtype, DType::kFloat32);
  EXPECT_EQ(none.grouping, Grouping::kElement);
  EXPECT_EQ(spec_of("fp32"), none);

  CodecSpec bf16 = spec_of("bf16");
  EXPECT_EQ(bf16.kind, CodecKind::kNone);
  EXPECT_EQ(bf16.bits, 16);
  EXPECT_EQ(bf16.wire_dtype, DType::kBFloat16);
  EXPECT_EQ(spec_of("fp16").wire_dtype, DType::kFloat16);

  for (int b : {1, 2, 3, 4, 8}) {
    CodecSpec q = spec_of(test::named("q", b));
    EXPECT_EQ(q.kind, CodecKind::kAbsmax);
    EXPECT_EQ(q.bits, b);
    EXPECT_EQ(q.grouping, Grouping::kBlock);
    EXPECT_EQ(q.block, kDefaultBlock);
    EXPECT_EQ(q.rounding, Rounding::kNearest);
    EXPECT_TRUE(q.quantized());
  }
  for (int b : {2, 4, 8}) {
    CodecSpec m = spec_of(test::named("minmax", b));
    EXPECT_EQ(m.kind, CodecKind::kMinmax);
    EXPECT_EQ(m.bits, b);
    EXPECT_EQ(m.block, kDefaultBlock);
  }
}

TEST(CodecSpecParse, Options) {
  CodecSpec s = spec_of("q2:block=64:sr");
  EXPECT_EQ(s.block, 64u);
  EXPECT_EQ(s.grouping, Grouping::kBlock);
  EXPECT_EQ(s.rounding, Rounding::kStochastic);

  s = spec_of("q4:col=4096");
  EXPECT_EQ(s.grouping, Grouping::kColumn);
  EXPECT_EQ(s.cols, 4096u);

  s = spec_of("minmax8:col=1:sr");
  EXPECT_EQ(s.grouping, Grouping::kColumn);
  EXPECT_EQ(s.cols, 1u);
  EXPECT_EQ(s.rounding, Rounding::kStochastic);

  EXPECT_EQ(spec_of("q4:rn").rounding, Rounding::kNearest);
  EXPECT_EQ(spec_of("q4:block=32").block, kMinBlock);
  EXPECT_EQ(spec_of("q4:block=4096").block, kMaxBlock);
  EXPECT_EQ(spec_of("none:rn"), spec_of("none"));
  EXPECT_EQ(spec_of("q4:block=128"), spec_of("q4"));
}

// Every valid form prints to a string that parses back to the same spec, and printing is
// canonical (a second round trip gives the same text).
TEST(CodecSpecParse, EveryValidFormRoundTrips) {
  std::vector<std::string> texts = {"none", "fp32", "bf16", "fp16", "none:rn", "q4:rn"};
  const char* names[] = {"q1", "q2", "q3", "q4", "q8", "minmax2", "minmax4", "minmax8"};
  for (std::string name : names) {
    for (uint32_t block = kMinBlock; block <= kMaxBlock; block *= 2) {
      texts.push_back(name + ":block=" + std::to_string(block));
      if (name != "q1") texts.push_back(name + ":block=" + std::to_string(block) + ":sr");
    }
    texts.push_back(name);
    if (name == "q1") continue;
    texts.push_back(name + ":sr");
    texts.push_back(name + ":sr:block=64");
    for (uint64_t cols : {uint64_t{1}, uint64_t{7}, uint64_t{4096}, uint64_t{1} << 40}) {
      texts.push_back(name + ":col=" + std::to_string(cols));
      texts.push_back(name + ":col=" + std::to_string(cols) + ":sr");
    }
  }
  for (const std::string& text : texts) {
    SCOPED_TRACE(text);
    auto spec = parse_codec_spec(text);
    ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
    EXPECT_TRUE(validate_spec(*spec).is_ok());
    std::string printed = to_string(*spec);
    auto again = parse_codec_spec(printed);
    ASSERT_TRUE(again.is_ok()) << printed << ": " << again.status().to_string();
    EXPECT_EQ(*again, *spec) << printed;
    EXPECT_EQ(to_string(*again), printed);
  }
  EXPECT_EQ(to_string(spec_of("q4")), "q4");
  EXPECT_EQ(to_string(spec_of("q2:sr:block=64")), "q2:block=64:sr");
  EXPECT_EQ(to_string(spec_of("fp32")), "none");
  EXPECT_EQ(to_string(spec_of("minmax8:col=12")), "minmax8:col=12");
}

struct BadSpec {
  std::string text;
  std::vector<std::string> mentions;  // substrings the error message must contain
};

TEST(CodecSpecParse, ErrorsSayWhatIsWrong) {
  const std::vector<BadSpec> bad = {
      {"", {"empty"}},
      {"q5", {"unknown codec 'q5'"}},
      {"q0", {"q0"}},
      {"q9", {"q9"}},
      {"q16", {"q16"}},
      {"Q4", {"Q4"}},
      {"int8", {"int8"}},
      {"minmax3", {"minmax3"}},
      {"minmax1", {"minmax1"}},
      {"minmax", {"minmax"}},
      {"q4x", {"q4x"}},
      {"q4 ", {"q4 "}},
      {"q4:", {"q4:"}},
      {"q4::sr", {"q4::sr"}},
      {"q4:foo", {"foo"}},
      {"q4:sr=1", {"sr=1"}},
      {"q4:block", {"block"}},
      {"q4:block=", {"block"}},
      {"q4:block=48", {"48", "power of two"}},
      {"q4:block=16", {"16"}},
      {"q4:block=0", {"block=0"}},
      {"q4:block=8192", {"8192"}},
      {"q4:block=99999999999", {"99999999999"}},
      {"q4:block=-64", {"-64"}},
      {"q4:block=+64", {"+64"}},
      {"q4:block=64x", {"64x"}},
      {"q4:block=0x40", {"0x40"}},
      {"q4:col=0", {"col=0"}},
      {"q4:col=", {"col"}},
      {"q4:col=abc", {"abc"}},
      {"q1:sr", {"q1", "sr"}},
      {"q1:col=8", {"q1", "col"}},
      {"q1:col=8:block=64", {"col"}},
      {"q4:col=8:block=64", {"col", "block"}},
      {"q4:block=64:col=8", {"col", "block"}},
      {"none:sr", {"sr"}},
      {"bf16:sr", {"sr"}},
      {"none:block=64", {"block"}},
      {"fp16:col=4", {"col"}},
  };
  for (const BadSpec& b : bad) {
    SCOPED_TRACE("'" + b.text + "'");
    auto r = parse_codec_spec(b.text);
    ASSERT_FALSE(r.is_ok()) << "parsed as " << to_string(*r);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    for (const std::string& word : b.mentions) {
      EXPECT_NE(r.status().message().find(word), std::string::npos)
          << "message '" << r.status().message() << "' does not mention '" << word << "'";
    }
  }
}

TEST(CodecSpecValidate, RejectsInconsistentStructs) {
  auto expect_bad = [](CodecSpec s, const std::string& why) {
    Status st = validate_spec(s);
    EXPECT_FALSE(st.is_ok()) << why;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << why;
  };
  CodecSpec q4 = spec_of("q4");
  EXPECT_TRUE(validate_spec(q4).is_ok());
  EXPECT_TRUE(validate_spec(CodecSpec{}).is_ok());  // the default is fp32 passthrough

  CodecSpec s = q4;
  s.bits = 5;
  expect_bad(s, "absmax 5 bits");
  s = spec_of("minmax4");
  s.bits = 1;
  expect_bad(s, "minmax 1 bit");
  s = q4;
  s.grouping = Grouping::kElement;
  expect_bad(s, "quantized without groups");
  s = q4;
  s.block = 100;
  expect_bad(s, "block not a power of two");
  s.block = 8192;
  expect_bad(s, "block too large");
  s = q4;
  s.grouping = Grouping::kColumn;
  s.cols = 0;
  expect_bad(s, "col=0");
  s = CodecSpec{};
  s.bits = 16;
  expect_bad(s, "fp32 passthrough with 16 bits");
  s = CodecSpec{};
  s.grouping = Grouping::kBlock;
  expect_bad(s, "passthrough with blocks");
  s = CodecSpec{};
  s.kind = static_cast<CodecKind>(9);
  expect_bad(s, "unknown kind");
}

TEST(CodecSpecDType, ParseNameAndSize) {
  EXPECT_EQ(*parse_dtype("fp32"), DType::kFloat32);
  EXPECT_EQ(*parse_dtype("float32"), DType::kFloat32);
  EXPECT_EQ(*parse_dtype("bf16"), DType::kBFloat16);
  EXPECT_EQ(*parse_dtype("bfloat16"), DType::kBFloat16);
  EXPECT_EQ(*parse_dtype("fp16"), DType::kFloat16);
  EXPECT_EQ(*parse_dtype("half"), DType::kFloat16);
  auto bad = parse_dtype("fp8");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("fp8"), std::string::npos);
  for (DType d : test::kAllDTypes) {
    EXPECT_EQ(*parse_dtype(dtype_name(d)), d);
  }
  EXPECT_EQ(dtype_size(DType::kFloat32), 4u);
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kFloat16), 2u);
}

// ---- sizes ----

// The size formula written out independently: scale records (4 bytes absmax, 8 minmax) per
// group, then ceil(n/8) packing units of `bits` bytes; passthrough n * wire size.
uint64_t expected_size(const CodecSpec& s, uint64_t n) {
  if (s.kind == CodecKind::kNone) return n * (s.wire_dtype == DType::kFloat32 ? 4 : 2);
  uint64_t groups = 0;
  if (n > 0) groups = s.grouping == Grouping::kBlock ? (n - 1) / s.block + 1 : s.cols;
  uint64_t units = n == 0 ? 0 : (n - 1) / 8 + 1;
  return groups * (s.kind == CodecKind::kMinmax ? 8 : 4) + units * static_cast<uint64_t>(s.bits);
}

TEST(CodecSpecSize, EncodedSizeFormula) {
  const char* specs[] = {"none",
                         "bf16",
                         "fp16",
                         "q1",
                         "q1:block=32",
                         "q2",
                         "q3",
                         "q4",
                         "q8",
                         "q4:block=4096",
                         "q3:block=64",
                         "minmax2",
                         "minmax4:sr",
                         "minmax8:block=32",
                         "q4:col=7",
                         "q8:col=1",
                         "minmax2:col=64"};
  const uint64_t counts[] = {0,   1,   7,    8,    9,    31,   32,      33,           127,
                             128, 129, 1000, 4095, 4096, 4097, 1 << 20, (1 << 20) + 3};
  for (const char* text : specs) {
    CodecSpec s = spec_of(text);
    for (uint64_t n : counts) {
      if (s.grouping == Grouping::kColumn && n % s.cols != 0) continue;
      SCOPED_TRACE(std::string(text) + " n=" + std::to_string(n));
      EXPECT_EQ(encoded_size(s, n), expected_size(s, n));
      EXPECT_EQ(group_count(s, n), s.kind == CodecKind::kNone
                                       ? 0u
                                       : (expected_size(s, n) - (n + 7) / 8 * s.bits) /
                                             (s.kind == CodecKind::kMinmax ? 8u : 4u));
    }
  }
  // Spot values written by hand.
  EXPECT_EQ(encoded_size(spec_of("q4"), 128), 4u + 64u);
  EXPECT_EQ(encoded_size(spec_of("q4"), 129), 8u + 17u * 4u);
  EXPECT_EQ(encoded_size(spec_of("q3"), 1), 4u + 3u);
  EXPECT_EQ(encoded_size(spec_of("minmax8"), 256), 16u + 256u);
  EXPECT_EQ(encoded_size(spec_of("q2:col=16"), 64), 64u + 16u);
  EXPECT_EQ(encoded_size(spec_of("bf16"), 10), 20u);
  EXPECT_EQ(encoded_size(spec_of("none"), 10), 40u);
  EXPECT_EQ(encoded_size(spec_of("q4:col=16"), 0), 0u);
  EXPECT_EQ(group_count(spec_of("q4:col=16"), 0), 0u);
  EXPECT_EQ(group_count(spec_of("q4:col=16"), 32), 16u);
  EXPECT_EQ(group_count(spec_of("q4:block=64"), 65), 2u);
}

TEST(CodecSpecSize, MetadataOverheadAtDefaultBlock) {
  const uint64_t n = uint64_t{1} << 22;
  for (int b : {2, 4}) {
    CodecSpec s = spec_of(test::named("q", b));
    double overhead = bits_per_element(s, n) - b;
    EXPECT_GE(overhead, 0.0);
    EXPECT_LE(overhead, 0.25) << "q" << b;
  }
  EXPECT_DOUBLE_EQ(bits_per_element(spec_of("q4"), 128), 4.25);
  EXPECT_DOUBLE_EQ(bits_per_element(spec_of("q8:block=4096"), 4096), 8.0 + 32.0 / 4096);
  EXPECT_DOUBLE_EQ(bits_per_element(spec_of("none"), 100), 32.0);
  EXPECT_DOUBLE_EQ(bits_per_element(spec_of("bf16"), 100), 16.0);
  EXPECT_EQ(bits_per_element(spec_of("q4"), 0), 0.0);
}

TEST(CodecSpecSize, CheckCount) {
  EXPECT_TRUE(check_count(spec_of("q4"), 12345).is_ok());
  EXPECT_TRUE(check_count(spec_of("q4:col=16"), 0).is_ok());
  EXPECT_TRUE(check_count(spec_of("q4:col=16"), 48).is_ok());
  Status st = check_count(spec_of("q4:col=16"), 50);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("50"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("16"), std::string::npos) << st.message();
  CodecSpec no_cols = spec_of("q4:col=16");
  no_cols.cols = 0;  // invalid, but must not divide by zero
  EXPECT_FALSE(check_count(no_cols, 32).is_ok());
  EXPECT_FALSE(check_count(spec_of("q4"), (uint64_t{1} << 56) + 1).is_ok());
  EXPECT_FALSE(check_count(spec_of("none"), UINT64_MAX).is_ok());
}

}  // namespace
}  // namespace lowcomm
