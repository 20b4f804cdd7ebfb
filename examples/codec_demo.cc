// The codec demo, for someone meeting the codecs for the first time. Two tables, each followed
// by what its columns mean:
//   1. One call: a realistic DiLoCo-style pseudo-gradient through every codec once: bits per
//      element including scales and the frame header, compression ratio against fp32, relative
//      L2 error, one-core encode / decode-accumulate throughput.
//   2. Error feedback: a run of steps whose gradients point the same way (as consecutive
//      gradients tend to), each sent once per step, with and without error feedback. What
//      training keeps is the sum of the steps; error feedback keeps the error of that sum small
//      while one call's error stays as large (or grows), which is why one call's error alone
//      says little about an error-feedback codec.
//
//   build/bin/lowcomm-codec-demo [--elements N] [--threads T] [--steps S]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "frame/frame.h"
#include "lowcomm/codec.h"

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

// ||a - b|| / ||b||, in double.
double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

struct EfResult {
  double one_call = 0;     // mean over steps: ||D(Q(g_t)) - g_t|| / ||g_t||, no feedback
  double one_call_ef = 0;  // the same for the calls with error feedback
  double sum = 0;          // ||sum D(Q(g_t)) - sum g_t|| / ||sum g_t||, no feedback
  double sum_ef = 0;       // the same with error feedback
};

// `steps` gradients g_t = x * (0.75 + 0.5 u), u uniform per element and step: the same
// direction every step, sizes that vary. Each step is encoded and decoded once without and once
// with error feedback (lowcomm::encode_error_feedback, the residual kept across steps).
bool error_feedback_run(const CodecSpec& spec, const std::vector<float>& x, int steps,
                        lowcomm::CpuOptions opts, EfResult* r) {
  const uint64_t n = x.size();
  const uint64_t bytes = lowcomm::encoded_size(spec, n);
  std::vector<uint8_t> codes(bytes);
  std::vector<float> g(n), out(n), residual(n, 0.0f);
  std::vector<double> sent(n, 0), got(n, 0), got_ef(n, 0), step_sent(n), step_got(n);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> jitter(0.75f, 1.25f);
  for (int t = 0; t < steps; ++t) {
    for (uint64_t i = 0; i < n; ++i) g[i] = x[i] * jitter(rng);
    for (int ef = 0; ef < 2; ++ef) {
      auto st =
          ef ? lowcomm::encode_error_feedback(spec, DType::kFloat32, g.data(), residual.data(), n,
                                              codes.data(), bytes, {1, 0}, opts)
             : lowcomm::encode(spec, DType::kFloat32, g.data(), n, codes.data(), bytes, {1, 0},
                               opts);
      if (st.is_ok())
        st = lowcomm::decode(spec, codes.data(), bytes, n, DType::kFloat32, out.data(), opts);
      if (!st.is_ok()) {
        std::fprintf(stderr, "error feedback %s: %s\n", lowcomm::to_string(spec).c_str(),
                     st.to_string().c_str());
        return false;
      }
      std::vector<double>& total = ef ? got_ef : got;
      for (uint64_t i = 0; i < n; ++i) {
        total[i] += out[i];
        step_sent[i] = g[i];
        step_got[i] = out[i];
      }
      (ef ? r->one_call_ef : r->one_call) += rel_err(step_got, step_sent) / steps;
    }
    for (uint64_t i = 0; i < n; ++i) sent[i] += g[i];
  }
  r->sum = rel_err(got, sent);
  r->sum_ef = rel_err(got_ef, sent);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = uint64_t{1} << 24;  // 64 MiB of fp32
  int threads = 1;
  int steps = 16;
  for (int a = 1; a + 1 < argc; a += 2) {
    if (!std::strcmp(argv[a], "--elements")) n = std::strtoull(argv[a + 1], nullptr, 10);
    if (!std::strcmp(argv[a], "--threads")) threads = std::atoi(argv[a + 1]);
    if (!std::strcmp(argv[a], "--steps")) steps = std::max(1, std::atoi(argv[a + 1]));
  }
  const std::vector<float> x = pseudo_gradient(n, 2026);
  double ref_norm = 0;
  for (float v : x) ref_norm += static_cast<double>(v) * v;
  ref_norm = std::sqrt(ref_norm);

  std::printf("lowcomm codec demo: %llu-element fp32 pseudo-gradient (%.0f MiB), %d thread(s)\n",
              static_cast<unsigned long long>(n), static_cast<double>(n) * 4 / (1 << 20), threads);
  std::printf("\n1. One call: the gradient compressed and decompressed once by each codec\n\n");
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
    const uint64_t frame_bytes = lowcomm::frame::framed_size(*spec, n);
    std::vector<uint8_t> frame(frame_bytes);
    // Best of three runs; the last decode-accumulate into zeros leaves out = D(codes).
    double enc_s = 1e30, dec_s = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      auto st = lowcomm::frame::encode_frame(*spec, DType::kFloat32, x.data(), n, frame.data(),
                                             frame_bytes, {1, 0}, opts);
      enc_s = std::min(enc_s, seconds_since(t0));
      if (!st.is_ok()) {
        std::fprintf(stderr, "encode %s: %s\n", text, st.to_string().c_str());
        return 1;
      }
      std::fill(out.begin(), out.end(), 0.0f);
      t0 = std::chrono::steady_clock::now();
      st = lowcomm::frame::decode_accumulate_frame(frame.data(), frame_bytes, DType::kFloat32,
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
      "\n"
      "  bits/elem     bits sent per gradient value, the codec's scales and the %zu-byte frame\n"
      "                header included (fp32 itself is 32).\n"
      "  ratio         how many times smaller than fp32 the message is (32 / bits/elem).\n"
      "  rel L2 err    how far the decoded gradient is from the original, as a fraction of the\n"
      "                gradient's size: ||decoded - original|| / ||original||. 0 is exact, 0.01\n"
      "                is off by 1%%, 1 is an error as large as the gradient itself.\n"
      "  encode GB/s   how fast one core compresses, in GB of fp32 input per second.\n"
      "  dec+acc GB/s  how fast one core decompresses and adds into a running sum (what a\n"
      "                rank does with each peer's contribution).\n",
      lowcomm::frame::kFrameHeaderBytes);

  // 2. Error feedback
  const char* ef_specs[] = {"q8", "q4", "minmax4", "q3", "q2", "q2:block=64", "q1"};
  std::printf(
      "\n2. Error feedback over %d steps: each step's gradient points the same way as the\n"
      "   last (sizes vary by +-25%%), as consecutive gradients tend to\n\n",
      steps);
  std::printf("%-16s %12s %12s %14s %14s\n", "codec", "one call", "one call+EF", "sum, no EF",
              "sum, with EF");
  for (const char* text : ef_specs) {
    auto spec = lowcomm::parse_codec_spec(text);
    EfResult r;
    if (!spec.is_ok() || !error_feedback_run(*spec, x, steps, opts, &r)) return 1;
    std::printf("%-16s %12.3e %12.3e %14.3e %14.3e\n", text, r.one_call, r.one_call_ef, r.sum,
                r.sum_ef);
  }
  std::printf(
      "\n"
      "  one call      rel L2 err of one step's decoded gradient (mean over the steps), sent\n"
      "                without error feedback: table 1's error.\n"
      "  one call+EF   the same, with error feedback: not smaller, often larger, because each\n"
      "                call also carries what the calls before it left out.\n"
      "  sum, no EF    rel L2 err of the sum of the %d decoded gradients against the sum of the\n"
      "                %d originals: what the model's weights accumulate. Without feedback the\n"
      "                codec's rounding repeats every step and adds up.\n"
      "  sum, with EF  the same with error feedback: what one call leaves out is sent with the\n"
      "                next, so the sum is off by one step's leftover only and this error\n"
      "                shrinks as the steps go on.\n"
      "Judge an error-feedback codec by the last column (what the weights see), not by one\n"
      "call's error: a single call with feedback can look worse than without it.\n",
      steps, steps);
  return 0;
}
