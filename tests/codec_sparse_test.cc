// The sparse codecs (topk, randk): spec strings, exact sizes, the kept set against an
// independent oracle (sort by magnitude, ties to the lower offset), value error bounds, error
// feedback with decay, non-finite chunks, malformed messages, and bytes that do not depend on
// the SIMD path or the thread count.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "codec_test_util.h"
#include "lowcomm/codec.h"

namespace lowcomm::test {
namespace {

CodecSpec spec_of(const char* text) {
  auto s = parse_codec_spec(text);
  EXPECT_TRUE(s.is_ok()) << text << ": " << s.status().message();
  return *s;
}

std::vector<float> heavy_tailed(uint64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (auto& v : x) v = static_cast<float>(rng.student_t3());
  return x;
}

std::vector<uint8_t> encode_fp32(const CodecSpec& s, const std::vector<float>& x,
                                 CpuOptions opts = {}, uint64_t seed = 7) {
  std::vector<uint8_t> codes(encoded_size(s, x.size()) + 4);
  Status st = encode(s, DType::kFloat32, x.data(), x.size(), codes.data(), codes.size(),
                     RoundingKey{seed, 0}, opts);
  EXPECT_TRUE(st.is_ok()) << st.message();
  codes.resize(encoded_size(s, x.size()));
  return codes;
}

std::vector<float> decode_fp32(const CodecSpec& s, const std::vector<uint8_t>& codes, uint64_t n) {
  std::vector<float> out(n, 123.0f);
  Status st = decode(s, codes.data(), codes.size(), n, DType::kFloat32, out.data());
  EXPECT_TRUE(st.is_ok()) << st.message();
  return out;
}

// The oracle's kept offsets of chunk [begin, begin + len): the k largest |x|, ties to the lower
// offset (NaN above infinity).
std::vector<uint64_t> oracle_topk(const std::vector<float>& x, uint64_t begin, uint64_t len,
                                  uint64_t k) {
  std::vector<uint64_t> idx(len);
  std::iota(idx.begin(), idx.end(), begin);
  auto mag = [&](uint64_t i) { return std::isnan(x[i]) ? INFINITY : std::fabs(x[i]); };
  auto rank_nan = [&](uint64_t i) { return std::isnan(x[i]) ? 1 : 0; };
  std::stable_sort(idx.begin(), idx.end(), [&](uint64_t a, uint64_t b) {
    if (rank_nan(a) != rank_nan(b)) return rank_nan(a) > rank_nan(b);
    return mag(a) > mag(b);
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

uint64_t keep_of(uint64_t keep, uint64_t chunk, uint64_t len) {
  return len == chunk ? keep : std::max<uint64_t>(1, (keep * len + chunk - 1) / chunk);
}

TEST(CodecSparse, SpecStrings) {
  CodecSpec s = spec_of("topk:64/4096+q2");
  EXPECT_EQ(s.kind, CodecKind::kTopk);
  EXPECT_EQ(s.keep, 64u);
  EXPECT_EQ(s.block, 4096u);
  EXPECT_EQ(s.bits, 2);
  EXPECT_EQ(to_string(s), "topk:64/4096+q2");
  CodecSpec r = spec_of("randk:0.02+q4");
  EXPECT_EQ(r.kind, CodecKind::kRandk);
  EXPECT_EQ(r.keep, 82u);  // round(0.02 * 4096)
  EXPECT_EQ(r.block, 4096u);
  EXPECT_EQ(to_string(r), "randk:82/4096+q4");
  EXPECT_EQ(spec_of("topk:0.01").bits, 2);  // values at 2 bits by default
  CodecSpec d = spec_of("topk:64/4096+q2:decay=0.95");
  EXPECT_FLOAT_EQ(d.ef_decay, 0.95f);
  EXPECT_EQ(*parse_codec_spec(to_string(d)), d);
  EXPECT_FLOAT_EQ(spec_of("q4:decay=0.5").ef_decay, 0.5f);
  for (const char* bad :
       {"topk", "topk:0/4096", "topk:4097/4096", "topk:64/1000", "topk:64/16", "topk:64/131072",
        "topk:0", "topk:1.5", "topk:-0.1", "randk:0.02+q5", "randk:0.02+q1", "topk:64/4096+z2",
        "topk:64/4096:sr", "topk:64/4096:block=64", "q4:decay=1.5", "q4:decay=x", "none:decay=0.5",
        "topk:nan"}) {
    auto p = parse_codec_spec(bad);
    EXPECT_FALSE(p.is_ok()) << bad;
    if (!p.is_ok()) {
      EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
}

TEST(CodecSparse, SizesAreExactAndBelowOnePercentOfFp32) {
  CodecSpec s = spec_of("topk:64/4096+q2");
  // Per chunk: lo, hi (8) + 64 offsets of 12 bits (96) + 64 codes of 2 bits (16).
  EXPECT_EQ(encoded_size(s, 4096), 120u);
  EXPECT_EQ(encoded_size(s, 3 * 4096), 360u);
  const uint64_t n = 64ull << 20;
  EXPECT_LE(bits_per_element(s, n), 32.0 / 100);
  SparseLayout l = sparse_layout(s, n);
  EXPECT_EQ(l.kept, n / 64);
  EXPECT_EQ(l.index_bytes + l.value_bytes + l.scale_bytes + l.header_bytes, encoded_size(s, n));
  // A short last chunk keeps ceil(K len / C); a tensor below one chunk too.
  EXPECT_EQ(sparse_layout(s, 4096 + 100).kept, 64u + 2u);
  EXPECT_EQ(sparse_layout(s, 10).kept, 1u);
  // Dense enough that a bitmap is smaller than the offsets: 700 x 12 bits > 4096 bits.
  CodecSpec dense = spec_of("topk:700/4096+q2");
  EXPECT_EQ(sparse_layout(dense, 4096).index_bytes, 512u);
  // Random-k: the seed, then scales and values only.
  CodecSpec rk = spec_of("randk:64/4096+q2");
  EXPECT_EQ(encoded_size(rk, 4096), 8u + 8u + 16u);
  EXPECT_EQ(sparse_layout(rk, 4096).index_bytes, 0u);
  EXPECT_EQ(encoded_size(rk, 0), 0u);  // an empty tensor sends nothing, not an unwritten seed
  EXPECT_EQ(encoded_size(s, 0), 0u);
}

TEST(CodecSparse, KeepsTheLargestMagnitudesWithinTheGrid) {
  for (const char* text :
       {"topk:64/4096+q2", "topk:3/32+q3", "topk:700/4096+q4", "topk:1/1024+q8", "topk:32/32+q8"}) {
    SCOPED_TRACE(text);
    CodecSpec s = spec_of(text);
    for (uint64_t n : {uint64_t{10}, uint64_t{s.block}, uint64_t{3} * s.block + 77}) {
      std::vector<float> x = heavy_tailed(n, n + s.keep);
      std::vector<float> dec = decode_fp32(s, encode_fp32(s, x), n);
      for (uint64_t begin = 0; begin < n; begin += s.block) {
        uint64_t len = std::min<uint64_t>(s.block, n - begin);
        auto kept = oracle_topk(x, begin, len, keep_of(s.keep, s.block, len));
        float lo = INFINITY, hi = 0;
        for (uint64_t i : kept) {
          lo = std::min(lo, std::fabs(x[i]));
          hi = std::max(hi, std::fabs(x[i]));
        }
        const int levels = (1 << (s.bits - 1)) - 1;
        const double half_step = double(hi - lo) / levels / 2 * (1 + 1e-6) + 1e-30;
        size_t j = 0;
        for (uint64_t i = begin; i < begin + len; ++i) {
          if (j < kept.size() && kept[j] == i) {
            ++j;
            EXPECT_EQ(std::signbit(dec[i]), std::signbit(x[i])) << i;
            EXPECT_LE(std::fabs(std::fabs(double(dec[i])) - std::fabs(double(x[i]))), half_step)
                << i;
          } else {
            ASSERT_EQ(dec[i], 0.0f) << "offset " << i << " was not among the kept";
          }
        }
      }
    }
  }
}

TEST(CodecSparse, TiesGoToTheLowerOffsetAndZeroChunksKeepTheFirst) {
  CodecSpec s = spec_of("topk:4/64+q2");
  std::vector<float> x(128, 0.0f);                                         // chunk 0 all zero
  for (uint64_t i = 64; i < 128; ++i) x[i] = (i % 3 == 0) ? -2.0f : 1.0f;  // many ties
  std::vector<float> dec = decode_fp32(s, encode_fp32(s, x), x.size());
  for (uint64_t i = 0; i < 64; ++i) EXPECT_EQ(dec[i], 0.0f);
  std::vector<uint64_t> nonzero;
  for (uint64_t i = 64; i < 128; ++i)
    if (dec[i] != 0.0f) nonzero.push_back(i);
  EXPECT_EQ(nonzero, (std::vector<uint64_t>{66, 69, 72, 75}));  // the first four -2s
  for (uint64_t i : nonzero) EXPECT_EQ(dec[i], -2.0f);
}

TEST(CodecSparse, ErrorFeedbackWithDecayKeepsWhatWasNotSent) {
  for (const char* text :
       {"topk:16/256+q2:decay=0.9", "randk:16/256+q3:decay=0.9", "topk:16/256+q4"}) {
    SCOPED_TRACE(text);
    CodecSpec s = spec_of(text);
    const uint64_t n = 1000;
    std::vector<float> x = heavy_tailed(n, 5), r0 = heavy_tailed(n, 6);
    for (auto& v : r0) v *= 0.1f;
    for (bool simd : {false, true}) {
      std::vector<float> r = r0;
      std::vector<uint8_t> codes(encoded_size(s, n));
      ASSERT_TRUE(encode_error_feedback(s, DType::kFloat32, x.data(), r.data(), n, codes.data(),
                                        codes.size(), RoundingKey{9, 0}, CpuOptions{1, simd})
                      .is_ok());
      std::vector<float> dec = decode_fp32(s, codes, n);
      for (uint64_t i = 0; i < n; ++i) {
        volatile float y = x[i] + r0[i];
        volatile float diff = y - dec[i];
        float want = s.ef_decay * diff;
        ASSERT_EQ(f32_bits(r[i]), f32_bits(want)) << i << " simd " << simd;
      }
      // Encoding x + r0 without feedback sends the same bytes.
      std::vector<float> y(n);
      for (uint64_t i = 0; i < n; ++i) y[i] = x[i] + r0[i];
      EXPECT_EQ(encode_fp32(s, y, CpuOptions{1, simd}, 9), codes);
    }
  }
}

TEST(CodecSparse, DenseCodecsTakeTheDecayToo) {
  CodecSpec s = spec_of("q2:decay=0.5");
  const uint64_t n = 512;
  std::vector<float> x = heavy_tailed(n, 11), r(n, 0.0f);
  std::vector<uint8_t> codes(encoded_size(s, n));
  ASSERT_TRUE(
      encode_error_feedback(s, DType::kFloat32, x.data(), r.data(), n, codes.data(), codes.size())
          .is_ok());
  std::vector<float> dec(n);
  ASSERT_TRUE(decode(s, codes.data(), codes.size(), n, DType::kFloat32, dec.data()).is_ok());
  for (uint64_t i = 0; i < n; ++i) {
    volatile float diff = x[i] - dec[i];
    ASSERT_EQ(f32_bits(r[i]), f32_bits(0.5f * diff)) << i;
  }
}

TEST(CodecSparse, NonFiniteChunksAreSentNotHidden) {
  CodecSpec s = spec_of("topk:4/64+q2");
  std::vector<float> x = heavy_tailed(192, 3);
  x[10] = NAN;
  x[70] = INFINITY;
  std::vector<float> r(192, 0.5f);
  std::vector<uint8_t> codes(encoded_size(s, 192));
  ASSERT_TRUE(
      encode_error_feedback(s, DType::kFloat32, x.data(), r.data(), 192, codes.data(), codes.size())
          .is_ok());
  std::vector<float> dec = decode_fp32(s, codes, 192);
  EXPECT_TRUE(std::isnan(dec[10]));  // kept (NaN ranks above every magnitude), decoded NaN
  EXPECT_TRUE(std::isnan(dec[70]));
  int nans0 = 0;
  for (uint64_t i = 0; i < 64; ++i) nans0 += std::isnan(dec[i]) ? 1 : 0;
  EXPECT_EQ(nans0, 4);  // every kept element of a non-finite chunk decodes to NaN
  for (uint64_t i = 0; i < 128; ++i) ASSERT_EQ(r[i], 0.0f) << i;  // residual reset
  bool finite_tail = true;
  for (uint64_t i = 128; i < 192; ++i) finite_tail = finite_tail && std::isfinite(dec[i]);
  EXPECT_TRUE(finite_tail);
  // Accumulating a non-finite message makes the sum non-finite there, never finite.
  std::vector<float> acc(192, 1.0f);
  ASSERT_TRUE(
      decode_accumulate(s, codes.data(), codes.size(), 192, DType::kFloat32, acc.data()).is_ok());
  EXPECT_TRUE(std::isnan(acc[10]));
}

TEST(CodecSparse, RandomKPositionsFollowTheSeedNotTheData) {
  CodecSpec s = spec_of("randk:32/1024+q4");
  const uint64_t n = 5000;
  std::vector<float> a = heavy_tailed(n, 1), b = heavy_tailed(n, 2);
  for (auto& v : b) v = v == 0.0f ? 1.0f : v;
  for (auto& v : a) v = v == 0.0f ? 1.0f : v;
  auto nz = [&](const std::vector<float>& d) {
    std::vector<uint64_t> p;
    for (uint64_t i = 0; i < d.size(); ++i)
      if (d[i] != 0.0f) p.push_back(i);
    return p;
  };
  auto pa = nz(decode_fp32(s, encode_fp32(s, a, {}, 42), n));
  auto pb = nz(decode_fp32(s, encode_fp32(s, b, {}, 42), n));
  auto pc = nz(decode_fp32(s, encode_fp32(s, a, {}, 43), n));
  EXPECT_EQ(pa, pb);
  EXPECT_NE(pa, pc);
  EXPECT_EQ(pa.size(), sparse_layout(s, n).kept);
  // randk_positions states the same offsets without encoding (any path, any thread count).
  for (bool simd : {true, false}) {
    for (int threads : {1, 3}) {
      std::vector<uint64_t> pos(sparse_layout(s, n).kept, ~uint64_t{0});
      ASSERT_TRUE(randk_positions(s, n, 42, pos.data(), {threads, simd}).is_ok());
      EXPECT_EQ(pos, pa) << "simd " << simd << " threads " << threads;
    }
  }
  std::vector<uint64_t> pos(64);
  EXPECT_EQ(randk_positions(spec_of("topk:32/1024+q4"), n, 42, pos.data()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(randk_positions(s, n, 42, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST(CodecSparse, BytesDoNotDependOnPathOrThreads) {
  for (const char* text : {"topk:64/4096+q2", "topk:700/4096+q3", "randk:82/4096+q8",
                           "topk:1/65536+q2", "topk:5/32+q4"}) {
    SCOPED_TRACE(text);
    CodecSpec s = spec_of(text);
    const uint64_t n = 3 * 65536 + 1000;
    std::vector<float> x = heavy_tailed(n, 21);
    for (uint64_t i = 0; i < n; i += 97) x[i] = x[i - i % 97];  // some ties
    for (uint64_t i = 70000; i < 70000 + 4096; ++i) x[i] = 0.0f;
    auto ref = encode_fp32(s, x, CpuOptions{1, false});
    EXPECT_EQ(encode_fp32(s, x, CpuOptions{1, true}), ref);
    EXPECT_EQ(encode_fp32(s, x, CpuOptions{0, true}), ref);
    // A tiny spread (all magnitudes in one exponent) and a huge one (many exponents) take the
    // fast path's walk and its histogram fallback.
    std::vector<float> narrow(n), wide(n);
    Rng rng(4);
    for (uint64_t i = 0; i < n; ++i) {
      narrow[i] = static_cast<float>(1.0 + rng.uniform());
      wide[i] = std::ldexp(static_cast<float>(rng.uniform(1, 2)), int(rng.below(200)) - 100);
    }
    EXPECT_EQ(encode_fp32(s, narrow, CpuOptions{1, true}), encode_fp32(s, narrow, {1, false}));
    EXPECT_EQ(encode_fp32(s, wide, CpuOptions{1, true}), encode_fp32(s, wide, {1, false}));
  }
}

TEST(CodecSparse, SixteenBitTensors) {
  CodecSpec s = spec_of("topk:8/256+q4");
  const uint64_t n = 1000;
  for (DType d : {DType::kBFloat16, DType::kFloat16}) {
    Tensor t(d, n);
    std::vector<float> x = heavy_tailed(n, 8);
    for (uint64_t i = 0; i < n; ++i) t.set(i, x[i]);
    std::vector<float> widened(n);
    for (uint64_t i = 0; i < n; ++i) widened[i] = t.get(i);
    std::vector<uint8_t> codes(encoded_size(s, n));
    ASSERT_TRUE(encode(s, d, t.data(), n, codes.data(), codes.size()).is_ok());
    EXPECT_EQ(codes, encode_fp32(s, widened));
    Tensor out(d, n);
    ASSERT_TRUE(decode(s, codes.data(), codes.size(), n, d, out.data()).is_ok());
    std::vector<float> ref = decode_fp32(s, codes, n);
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out.get(i), round_to(d, ref[i])) << i;
  }
}

TEST(CodecSparse, DecodeAccumulateAddsOnlyTheKept) {
  CodecSpec s = spec_of("topk:16/512+q3");
  const uint64_t n = 2048;
  std::vector<float> x = heavy_tailed(n, 13);
  auto codes = encode_fp32(s, x);
  std::vector<float> dec = decode_fp32(s, codes, n);
  std::vector<float> acc(n);
  for (uint64_t i = 0; i < n; ++i) acc[i] = static_cast<float>(i) * 0.25f;
  ASSERT_TRUE(
      decode_accumulate(s, codes.data(), codes.size(), n, DType::kFloat32, acc.data()).is_ok());
  for (uint64_t i = 0; i < n; ++i) {
    volatile float want = static_cast<float>(i) * 0.25f + dec[i];
    ASSERT_EQ(acc[i], want) << i;
  }
}

TEST(CodecSparse, MalformedPositionsFailAsCorruptData) {
  CodecSpec s = spec_of("topk:4/64+q2");  // offsets of 6 bits after lo, hi
  std::vector<float> x = heavy_tailed(128, 17);
  auto codes = encode_fp32(s, x);
  std::vector<float> out(128);
  auto expect_corrupt = [&](std::vector<uint8_t> bad, const char* what) {
    Status st = decode(s, bad.data(), bad.size(), 128, DType::kFloat32, out.data());
    EXPECT_EQ(st.code(), StatusCode::kCorruptData) << what << ": " << st.message();
  };
  auto swapped = codes;  // offsets 0 and 1 of chunk 0 exchanged: not increasing
  uint32_t o0 = swapped[8] & 63u, o1 = ((swapped[8] >> 6) | (swapped[9] << 2)) & 63u;
  ASSERT_LT(o0, o1);
  swapped[8] = static_cast<uint8_t>(o1 | (o0 << 6));
  swapped[9] = static_cast<uint8_t>((swapped[9] & ~0x0Fu) | (o0 >> 2));
  expect_corrupt(swapped, "not increasing");
  // A short last chunk (len 10) whose offset points past it.
  CodecSpec t = spec_of("topk:4/64+q2");
  std::vector<float> y = heavy_tailed(74, 2);
  auto c2 = encode_fp32(t, y);
  uint64_t tail = encoded_size(t, 64) + 8;  // the tail chunk's first offset
  c2[tail] = static_cast<uint8_t>((c2[tail] & ~63u) | 60u);
  std::vector<float> o2(74);
  Status st = decode(t, c2.data(), c2.size(), 74, DType::kFloat32, o2.data());
  EXPECT_EQ(st.code(), StatusCode::kCorruptData) << st.message();
  // Bitmap: a bit past the chunk's end, and a wrong count.
  CodecSpec bm = spec_of("topk:40/64+q2");
  std::vector<float> z = heavy_tailed(70, 3);
  auto c3 = encode_fp32(bm, z);
  ASSERT_EQ(sparse_layout(bm, 70).index_bytes, 8u + 1u);
  uint64_t tail_bitmap = encoded_size(bm, 64) + 8;
  auto past = c3;
  past[tail_bitmap] |= 0x80;  // offset 7 of a 6-element chunk
  std::vector<float> o3(70);
  EXPECT_EQ(decode(bm, past.data(), past.size(), 70, DType::kFloat32, o3.data()).code(),
            StatusCode::kCorruptData);
  auto extra = c3;
  for (int b = 0; b < 8; ++b) extra[8 + b] = 0xFF;  // 64 marked, 40 expected
  EXPECT_EQ(decode(bm, extra.data(), extra.size(), 70, DType::kFloat32, o3.data()).code(),
            StatusCode::kCorruptData);
  // Scale records an encoder never writes: lo > hi, lo < 0, one NaN, an infinity.
  for (auto [lo, hi] :
       {std::pair<float, float>{2.0f, 1.0f}, {-1.0f, 1.0f}, {NAN, 1.0f}, {0.5f, INFINITY}}) {
    auto bad = codes;
    std::memcpy(bad.data(), &lo, 4);
    std::memcpy(bad.data() + 4, &hi, 4);
    Status st2 = decode(s, bad.data(), bad.size(), 128, DType::kFloat32, out.data());
    EXPECT_EQ(st2.code(), StatusCode::kCorruptData) << lo << " " << hi << ": " << st2.message();
  }
}

TEST(CodecSparse, RefusesDeltasAndShortBuffers) {
  CodecSpec s = spec_of("topk:8/256+q2");
  std::vector<float> a(256, 1.0f), m(256, 0.0f);
  std::vector<uint8_t> codes(encoded_size(s, 256));
  EXPECT_EQ(
      encode_delta(s, DType::kFloat32, a.data(), m.data(), 256, codes.data(), codes.size()).code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(encode(s, DType::kFloat32, a.data(), 256, codes.data(), codes.size() - 1).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lowcomm::test
