// CPU codec throughput (Google Benchmark): every op x dtype x codec x rounding at 1 MiB, 16 MiB
// and 256 MiB of input, on one core (the calling thread, pinned), beside that core's memcpy.
// Counters: GBps is GB/s (1e9 B/s) of input, the tensor in its own dtype; memcpy_GBps is memcpy
// of the same byte count on the same core, measured in the same process; vs_memcpy is their
// ratio. (bytes_per_second is Google Benchmark's own, in GiB/s.)
//   build/bin/lowcomm-codec-bench --benchmark_filter='cpu/(encode|decode_acc)/fp32/q4/rn'
// On a shared machine, compare codecs with interleaved repetitions and their best ("max") GBps:
//   --benchmark_repetitions=7 --benchmark_enable_random_interleaving=true
//   --benchmark_report_aggregates_only=true

#include <benchmark/benchmark.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codec/quant_math.h"
#include "lowcomm/codec.h"

namespace lowcomm {
namespace {

// Pseudo-gradient-like data: a normal core with per-block magnitudes spread over 4 decades and
// occasional outliers, as DiLoCo outer gradients look (not zeros, not uniform noise).
std::vector<uint8_t> pseudo_gradient(DType dtype, uint64_t n) {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-4.0f, 0.0f);
  std::vector<uint8_t> out(n * dtype_size(dtype));
  float block_scale = 1.0f;
  for (uint64_t i = 0; i < n; ++i) {
    if (i % 512 == 0) block_scale = std::pow(10.0f, decade(rng));
    float v = normal(rng) * block_scale;
    if (i % 4099 == 0) v *= 20.0f;
    if (dtype == DType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      uint16_t h = dtype == DType::kBFloat16 ? qm::f32_to_bf16(v) : qm::f32_to_f16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// Inputs are generated once per (dtype, size): generation costs more than the benchmark.
const std::vector<uint8_t>& cached_input(DType dtype, uint64_t n) {
  static std::map<std::pair<int, uint64_t>, std::vector<uint8_t>> cache;
  auto key = std::make_pair(static_cast<int>(dtype), n);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, pseudo_gradient(dtype, n)).first;
  return it->second;
}

void pin_to_core0() {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

// memcpy GB/s for `bytes` on this core (best of several runs), cached per size.
double memcpy_gbps(uint64_t bytes) {
  static std::map<uint64_t, double> cache;
  auto it = cache.find(bytes);
  if (it != cache.end()) return it->second;
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  double best = 0;
  int reps = static_cast<int>(std::clamp<uint64_t>((uint64_t{1} << 30) / bytes, 3, 200));
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    benchmark::DoNotOptimize(b.data());
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  cache[bytes] = best;
  return best;
}

enum class Op {
  kEncode,
  kEncodeFeedback,
  kEncodeDelta,
  kDecode,
  kDecodeAccumulate,
  kDecodeDelta,
  kDecodeAccumulate4,  // zero an fp32 sum, then decode-accumulate 4 messages into it
};
const char* op_name(Op op) {
  switch (op) {
    case Op::kEncode:
      return "encode";
    case Op::kEncodeFeedback:
      return "encode_ef";
    case Op::kEncodeDelta:
      return "encode_delta";
    case Op::kDecode:
      return "decode";
    case Op::kDecodeAccumulate:
      return "decode_acc";
    case Op::kDecodeDelta:
      return "decode_delta";
    case Op::kDecodeAccumulate4:
      return "decode_acc4";
  }
  return "?";
}

void run(benchmark::State& state, Op op, const CodecSpec& spec, DType dtype, uint64_t bytes,
         int threads) {
  pin_to_core0();
  const uint64_t n = bytes / dtype_size(dtype);
  const std::vector<uint8_t>& x = cached_input(dtype, n);
  std::vector<uint8_t> m(x.size(), 0), out(x.size(), 0);
  std::vector<float> residual(n, 0.0f);
  const uint64_t cb = encoded_size(spec, n);
  std::vector<uint8_t> codes(cb);
  CpuOptions opts{threads, true};
  if (!encode(spec, dtype, x.data(), n, codes.data(), cb, {7, 0}, opts).is_ok()) {
    state.SkipWithError("encode failed");
    return;
  }
  // decode_acc4: four different messages (the input, then scaled by 2, 3, 4).
  std::vector<std::vector<uint8_t>> more;
  if (op == Op::kDecodeAccumulate4) {
    std::vector<float> xs(n);
    for (int mult = 2; mult <= 4; ++mult) {
      for (uint64_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, x.data() + 4 * i, 4);
        xs[i] = v * static_cast<float>(mult);
      }
      more.emplace_back(cb);
      if (!encode(spec, DType::kFloat32, xs.data(), n, more.back().data(), cb, {7, 0}, opts)
               .is_ok()) {
        state.SkipWithError("encode failed");
        return;
      }
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    Status s;
    RoundingKey key{7, 0};
    switch (op) {
      case Op::kEncode:
        s = encode(spec, dtype, x.data(), n, codes.data(), cb, key, opts);
        break;
      case Op::kEncodeFeedback:
        s = encode_error_feedback(spec, dtype, x.data(), residual.data(), n, codes.data(), cb, key,
                                  opts);
        break;
      case Op::kEncodeDelta:
        s = encode_delta(spec, dtype, x.data(), m.data(), n, codes.data(), cb, key, opts);
        break;
      case Op::kDecode:
        s = decode(spec, codes.data(), cb, n, dtype, out.data(), opts);
        break;
      case Op::kDecodeAccumulate:
        s = decode_accumulate(spec, codes.data(), cb, n, dtype, out.data(), opts);
        break;
      case Op::kDecodeDelta:
        s = decode_delta(spec, codes.data(), cb, n, dtype, m.data(), out.data(), opts);
        break;
      case Op::kDecodeAccumulate4:
        std::memset(out.data(), 0, out.size());
        s = decode_accumulate(spec, codes.data(), cb, n, dtype, out.data(), opts);
        for (const auto& c : more) {
          if (s.is_ok()) s = decode_accumulate(spec, c.data(), cb, n, dtype, out.data(), opts);
        }
        break;
    }
    if (!s.is_ok()) {
      state.SkipWithError(s.to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(codes.data());
    benchmark::ClobberMemory();
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  const double gbps =
      static_cast<double>(bytes) * static_cast<double>(state.iterations()) / elapsed / 1e9;
  const double mc = memcpy_gbps(bytes);
  state.counters["GBps"] = gbps;
  state.counters["memcpy_GBps"] = mc;
  state.counters["vs_memcpy"] = gbps / mc;
  state.counters["bits_per_elem"] = bits_per_element(spec, n);
  state.counters["vs_fp32"] = 32.0 / bits_per_element(spec, n);
  if (op == Op::kEncode && dtype == DType::kFloat32) {
    // Relative error of one round trip: ||D(Q(x)) - x|| / ||x||.
    std::vector<float> dec(n);
    if (decode(spec, codes.data(), cb, n, dtype, dec.data(), opts).is_ok()) {
      double num = 0, den = 0;
      for (uint64_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, x.data() + 4 * i, 4);
        num += (double(dec[i]) - v) * (double(dec[i]) - v);
        den += double(v) * v;
      }
      state.counters["rel_error"] = std::sqrt(num / den);
    }
  }
}

// With --benchmark_repetitions: the "max" row's GBps is the best repetition, the least disturbed
// by other load on a shared machine (its time column is the slowest repetition).
double max_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

void memcpy_bench(benchmark::State& state, uint64_t bytes) {
  pin_to_core0();
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), bytes);
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

std::string size_name(uint64_t bytes) {
  return std::to_string(bytes >> 20) + "MiB";
}

int register_all() {
  const uint64_t sizes[] = {uint64_t{1} << 20, uint64_t{16} << 20, uint64_t{256} << 20};
  for (uint64_t bytes : sizes) {
    benchmark::RegisterBenchmark(("cpu/memcpy/" + size_name(bytes)).c_str(), memcpy_bench, bytes)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  const char* codecs[] = {"q1",      "q2",      "q3",      "q4",   "q8",
                          "minmax2", "minmax4", "minmax8", "bf16", "fp32"};
  const Op ops[] = {Op::kEncode, Op::kEncodeFeedback,   Op::kEncodeDelta,
                    Op::kDecode, Op::kDecodeAccumulate, Op::kDecodeDelta};
  for (Op op : ops) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (const char* c : codecs) {
        for (bool sr : {false, true}) {
          std::string text = c;
          bool is_encode = op == Op::kEncode || op == Op::kEncodeFeedback || op == Op::kEncodeDelta;
          if (sr && (!is_encode || text == "q1" || text == "bf16" || text == "fp32")) continue;
          auto spec = parse_codec_spec(sr ? text + ":sr" : text);
          if (!spec.is_ok()) continue;
          for (uint64_t bytes : sizes) {
            std::string name = std::string("cpu/") + op_name(op) + "/" + dtype_name(dtype) + "/" +
                               c + (sr ? "/sr/" : "/rn/") + size_name(bytes);
            benchmark::RegisterBenchmark(name.c_str(), run, op, *spec, dtype, bytes, 1)
                ->Unit(benchmark::kMillisecond)
                ->UseRealTime()
                ->ComputeStatistics("max", max_of);
          }
        }
      }
    }
  }
  // The sparse codecs (fp32, the pseudo-gradients' dtype): '/' in their specs reads 'of' here.
  for (const char* c : {"topk:64/4096+q2", "topk:0.03+q2", "randk:64/4096+q2"}) {
    auto spec = parse_codec_spec(c);
    std::string label = c;
    if (label.find('/') != std::string::npos) label.replace(label.find('/'), 1, "of");
    for (Op op : {Op::kEncode, Op::kEncodeFeedback, Op::kDecode, Op::kDecodeAccumulate,
                  Op::kDecodeAccumulate4}) {
      for (uint64_t bytes : sizes) {
        std::string name =
            std::string("cpu/") + op_name(op) + "/fp32/" + label + "/rn/" + size_name(bytes);
        benchmark::RegisterBenchmark(name.c_str(), run, op, *spec, DType::kFloat32, bytes, 1)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime()
            ->ComputeStatistics("max", max_of);
      }
    }
  }
  // The whole codec pool, for contrast with one core.
  auto q4 = parse_codec_spec("q4");
  for (Op op : {Op::kEncode, Op::kDecodeAccumulate}) {
    std::string name = std::string("cpu_pool/") + op_name(op) + "/fp32/q4/rn/256MiB";
    benchmark::RegisterBenchmark(name.c_str(), run, op, *q4, DType::kFloat32, uint64_t{256} << 20,
                                 0)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  return 0;
}

const int registered = register_all();

}  // namespace
}  // namespace lowcomm

BENCHMARK_MAIN();
