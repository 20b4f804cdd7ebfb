// The codec demo: one realistic DiLoCo-style pseudo-gradient, every codec, one row each:
// bits per element including scales and the frame header, compression ratio against fp32,
// relative L2 error, and one-core encode / decode-accumulate throughput.
//
//   build/bin/lowcomm-codec-demo [--elements N] [--threads T]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lowcomm/codec.h"
#include "wire/frame.h"

namespace {

using lowcomm::CodecSpec;
using lowcomm::DType;

// A pseudo-gradient θ_global − θ_local after H inner steps looks like this: per-tensor scales
// spread over two decades, heavy tails (a Student-t with 3 degrees of freedom), a few rows that
// barely moved (embeddings of rare tokens), and sparse large outliers.
std::vector<float> pseudo_gradient(uint64_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::student_t_distribution<float> heavy(3.0f);
  std::uniform_real_distribution<float> log_scale(-4.0f, -2.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> g(n);
  uint64_t i = 0;
  while (i < n) {
    uint64_t tensor = std::min<uint64_t>(n - i, uint64_t{1} << (14 + rng() % 8));
    float scale = std::pow(10.0f, log_scale(rng));
    bool rare_rows = unit(rng) < 0.2f;
    for (uint64_t k = 0; k < tensor; ++k, ++i) {
      float v = heavy(rng) * scale;
      if (rare_rows && (k / 1024) % 7 == 0) v *= 1e-3f;
      if (unit(rng) < 1e-4f) v *= 50.0f;
      g[i] = v;
    }
  }
  return g;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = uint64_t{1} << 24;  // 64 MiB of fp32
  int threads = 1;
  for (int a = 1; a + 1 < argc; a += 2) {
    if (!std::strcmp(argv[a], "--elements")) n = std::strtoull(argv[a + 1], nullptr, 10);
    if (!std::strcmp(argv[a], "--threads")) threads = std::atoi(argv[a + 1]);
  }
  const std::vector<float> x = pseudo_gradient(n, 2026);
  double ref_norm = 0;
  for (float v : x) ref_norm += static_cast<double>(v) * v;
  ref_norm = std::sqrt(ref_norm);

  std::printf("lowcomm codec demo: %llu-element fp32 pseudo-gradient (%.0f MiB), %d thread(s)\n",
              static_cast<unsigned long long>(n), static_cast<double>(n) * 4 / (1 << 20), threads);
  std::printf("%-16s %10s %8s %12s %12s %14s\n", "codec", "bits/elem", "ratio", "rel L2 err",
              "encode GB/s", "dec+acc GB/s");
  const char* specs[] = {"none",    "bf16",        "fp16", "q8", "minmax8",     "q4",      "q4:sr",
                         "minmax4", "q4:block=32", "q3",   "q2", "q2:block=64", "minmax2", "q1"};
  lowcomm::CpuOptions opts{threads, true};
  std::vector<float> out(n);
  for (const char* text : specs) {
    auto spec = lowcomm::parse_codec_spec(text);
    if (!spec.is_ok()) {
      std::fprintf(stderr, "%s\n", spec.status().to_string().c_str());
      return 1;
    }
    const uint64_t frame_bytes = lowcomm::wire::framed_size(*spec, n);
    std::vector<uint8_t> frame(frame_bytes);
    // Best of three runs; the last decode-accumulate into zeros leaves out = D(codes).
    double enc_s = 1e30, dec_s = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      auto st = lowcomm::wire::encode_frame(*spec, DType::kFloat32, x.data(), n, frame.data(),
                                            frame_bytes, {1, 0}, opts);
      enc_s = std::min(enc_s, seconds_since(t0));
      if (!st.is_ok()) {
        std::fprintf(stderr, "encode %s: %s\n", text, st.to_string().c_str());
        return 1;
      }
      std::fill(out.begin(), out.end(), 0.0f);
      t0 = std::chrono::steady_clock::now();
      st = lowcomm::wire::decode_accumulate_frame(frame.data(), frame_bytes, DType::kFloat32,
                                                  out.data(), n, opts);
      dec_s = std::min(dec_s, seconds_since(t0));
      if (!st.is_ok()) {
        std::fprintf(stderr, "decode %s: %s\n", text, st.to_string().c_str());
        return 1;
      }
    }
    double err = 0;
    for (uint64_t i = 0; i < n; ++i) {
      double d = static_cast<double>(out[i]) - x[i];
      err += d * d;
    }
    double bits = 8.0 * static_cast<double>(frame_bytes) / static_cast<double>(n);
    double gb = static_cast<double>(n) * 4 / 1e9;
    std::printf("%-16s %10.3f %8.2f %12.3e %12.2f %14.2f\n", text, bits, 32.0 / bits,
                std::sqrt(err) / ref_norm, gb / enc_s, gb / dec_s);
  }
  std::printf(
      "bits/elem counts scales and the %zu-byte frame header; throughput is GB/s of fp32 input.\n",
      lowcomm::wire::kFrameHeaderBytes);
  return 0;
}
