// CUDA codec throughput at 256 MiB of tensor, against a device-to-device copy of 256 MiB (the
// ceiling a memory-bound kernel can reach) measured in the same process:
//   dense absmax q2/q4/q8 (blocks of 128): encode, encode_ef (error feedback), encode_delta
//     (AQ-SGD), each round-to-nearest and stochastic; decode, decode_accumulate, decode_delta;
//   sparse topk:64/4096+qB and randk:64/4096+qB (B = 2, 4, 8): encode and encode_ef;
// each over fp32 and bf16. Each iteration is timed with CUDA events around the call on a
// private stream (manual time); the codec calls never synchronise (sparse decodes excepted, and
// none is timed here), so the events bracket exactly the kernels.
//
// Each case times 100 calls after a warm-up; Time is their mean, and the counters use their
// median (median_ms):
//   tensor_GB/s  bytes of the tensor (n x dtype size) encoded or decoded, per second;
//   rw_GB/s      bytes the op must read plus write in DRAM (inputs, codes and scales, state,
//                outputs: see traffic_bytes), each counted once, per second;
//   rw_bytes     that byte count for one call;
//   vs_copy      rw_GB/s over the read + write rate of a 256 MiB device-to-device copy
//                (2 x 256 MiB per copy; the median of 20), measured once per process.
// Names: cuda/<op>/<dtype>/<codec>/<rn|sr>/256MiB (decodes: rn), codec as the CPU cases write it
// ('/' in a sparse spec reads 'of': topk:64of4096+q2), and cuda/d2d_copy/256MiB.
// scripts/gpu_check.sh runs them all and turns the JSON into kernels.json (docs/gpu.md).

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "lowcomm/codec.h"
#include "lowcomm/codec_cuda.h"

namespace lowcomm {
namespace {

constexpr uint64_t kTensorBytes = uint64_t{256} << 20;
// Timed calls per case, after one warm-up call: a fixed count, so that each case sets up its
// 256 MiB buffers once (Google Benchmark re-runs a case to size a min_time).
constexpr int kIterations = 100;

class DeviceBuffer {
 public:
  explicit DeviceBuffer(uint64_t bytes) {
    if (cudaMalloc(&ptr_, bytes) != cudaSuccess) ptr_ = nullptr;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  void* get() const { return ptr_; }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  void* ptr_ = nullptr;
};

// A private stream and the two events that bracket each iteration.
class Timer {
 public:
  Timer() {
    ok_ = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) == cudaSuccess &&
          cudaEventCreate(&start_) == cudaSuccess && cudaEventCreate(&stop_) == cudaSuccess;
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  ~Timer() {
    if (stop_ != nullptr) (void)cudaEventDestroy(stop_);
    if (start_ != nullptr) (void)cudaEventDestroy(start_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  bool ok() const { return ok_; }
  cudaStream_t stream() const { return stream_; }
  void start() { (void)cudaEventRecord(start_, stream_); }
  // Seconds since start(), or a negative value if the device reported an error.
  double stop() {
    float ms = 0.0f;
    if (cudaEventRecord(stop_, stream_) != cudaSuccess ||
        cudaEventSynchronize(stop_) != cudaSuccess ||
        cudaEventElapsedTime(&ms, start_, stop_) != cudaSuccess) {
      return -1.0;
    }
    return static_cast<double>(ms) * 1e-3;
  }

 private:
  bool ok_ = false;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

// Tensor-like data: uniform values whose magnitude changes every 4096 elements (so scales
// vary between groups), written straight into the dtype's bits on the host.
std::vector<uint8_t> host_tensor(DType dtype, uint64_t n, uint64_t seed, float magnitude) {
  std::vector<uint8_t> buf(n * dtype_size(dtype));
  uint64_t s = seed;
  float scale = magnitude;
  for (uint64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    if (i % 4096 == 0) scale = magnitude * static_cast<float>(1 + (s >> 60));
    const float v = scale * (static_cast<float>(static_cast<int32_t>(s >> 32)) * 4.656613e-10f);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    if (dtype == DType::kFloat32) {
      std::memcpy(&buf[4 * i], &bits, 4);
    } else {
      // Truncating conversions suffice for benchmark data (|v| < 16 fits fp16; fp16's
      // subnormal range is flushed to zero).
      const uint32_t exp = bits >> 23 & 0xFFu;
      uint16_t h = static_cast<uint16_t>(bits >> 16);
      if (dtype == DType::kFloat16) {
        h = static_cast<uint16_t>((bits >> 16 & 0x8000u) |
                                  (exp > 112 ? ((exp - 112) << 10 | (bits >> 13 & 0x3FFu)) : 0u));
      }
      std::memcpy(&buf[2 * i], &h, 2);
    }
  }
  return buf;
}

// host_tensor, generated once per (dtype, n, seed, magnitude) for the whole process: generating
// 256 MiB costs more than a case's timed iterations.
const std::vector<uint8_t>& cached_tensor(DType dtype, uint64_t n, uint64_t seed, float magnitude) {
  static std::map<std::tuple<DType, uint64_t, uint64_t, float>, std::vector<uint8_t>> cache;
  const auto key = std::make_tuple(dtype, n, seed, magnitude);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, host_tensor(dtype, n, seed, magnitude)).first;
  return it->second;
}

bool upload(void* dst, const std::vector<uint8_t>& src) {
  // cudaMemcpy from pageable memory may return before its DMA lands: wait for the device.
  return cudaMemcpy(dst, src.data(), src.size(), cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaDeviceSynchronize() == cudaSuccess;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// ---- the copy baseline ----

// Read + write bytes per second of a 256 MiB device-to-device copy (the median of 20 timed
// copies after a warm-up), measured once per process so that every case compares with the same
// number; 0 on failure.
double copy_rw_bytes_per_s() {
  static const double rate = [] {
    DeviceBuffer src(kTensorBytes), dst(kTensorBytes);
    Timer timer;
    if (!src || !dst || !timer.ok() ||
        !upload(src.get(), cached_tensor(DType::kFloat32, kTensorBytes / 4, 1, 1.0f))) {
      return 0.0;
    }
    (void)cudaMemcpyAsync(dst.get(), src.get(), kTensorBytes, cudaMemcpyDeviceToDevice,
                          timer.stream());
    std::vector<double> times;
    for (int k = 0; k < 20; ++k) {
      timer.start();
      (void)cudaMemcpyAsync(dst.get(), src.get(), kTensorBytes, cudaMemcpyDeviceToDevice,
                            timer.stream());
      const double t = timer.stop();
      if (t <= 0) return 0.0;
      times.push_back(t);
    }
    return 2.0 * static_cast<double>(kTensorBytes) / median(times);
  }();
  return rate;
}

// The counters of a case from its iteration times (seconds): rates at the median time.
void set_counters(benchmark::State& state, const std::vector<double>& times, uint64_t rw_bytes) {
  const double t = median(times);
  if (t <= 0) return;
  const double rw = static_cast<double>(rw_bytes) / t;
  state.counters["median_ms"] = t * 1e3;
  state.counters["tensor_GB/s"] = static_cast<double>(kTensorBytes) / t * 1e-9;
  state.counters["rw_GB/s"] = rw * 1e-9;
  state.counters["rw_bytes"] = static_cast<double>(rw_bytes);
  const double reference = copy_rw_bytes_per_s();
  if (reference > 0) state.counters["vs_copy"] = rw / reference;
}

void BM_d2d_copy(benchmark::State& state) {
  if (!cuda_device_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  DeviceBuffer src(kTensorBytes), dst(kTensorBytes);
  Timer timer;
  if (!src || !dst || !timer.ok() ||
      !upload(src.get(), cached_tensor(DType::kFloat32, kTensorBytes / 4, 1, 1.0f))) {
    state.SkipWithError("cudaMalloc, stream creation or upload failed");
    return;
  }
  std::vector<double> times;
  for (auto _ : state) {
    timer.start();
    (void)cudaMemcpyAsync(dst.get(), src.get(), kTensorBytes, cudaMemcpyDeviceToDevice,
                          timer.stream());
    const double t = timer.stop();
    if (t < 0) {
      state.SkipWithError("cudaMemcpyAsync failed");
      return;
    }
    state.SetIterationTime(t);
    times.push_back(t);
  }
  set_counters(state, times, 2 * kTensorBytes);
}

// ---- codec ops ----

enum class Op { kEncode, kFeedback, kDelta, kDecode, kAccumulate, kDecodeDelta };

const char* op_name(Op op) {
  switch (op) {
    case Op::kEncode:
      return "encode";
    case Op::kFeedback:
      return "encode_ef";
    case Op::kDelta:
      return "encode_delta";
    case Op::kDecode:
      return "decode";
    case Op::kAccumulate:
      return "decode_accumulate";
    case Op::kDecodeDelta:
      return "decode_delta";
  }
  return "?";
}

bool is_encode_op(Op op) {
  return op == Op::kEncode || op == Op::kFeedback || op == Op::kDelta;
}

// DRAM bytes the op must move: c = payload (codes and scales), t = tensor, r = fp32 residual.
uint64_t traffic_bytes(Op op, const CodecSpec& spec, DType dtype, uint64_t n) {
  const uint64_t c = encoded_size(spec, n), t = n * dtype_size(dtype), r = 4 * n;
  switch (op) {
    case Op::kEncode:
      return t + c;  // read x; write codes
    case Op::kFeedback:
      return t + 2 * r + c;  // read x, r; write r, codes
    case Op::kDelta:
      return 3 * t + c;  // read a, m; write m, codes
    case Op::kDecode:
      return c + t;  // read codes; write out
    case Op::kAccumulate:
      return c + 2 * t;  // read codes, out; write out
    case Op::kDecodeDelta:
      return c + 3 * t;  // read codes, m; write m, out
  }
  return 0;
}

void BM_codec(benchmark::State& state, Op op, DType dtype, CodecSpec spec) {
  if (!cuda_device_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const uint64_t n = kTensorBytes / dtype_size(dtype);
  const uint64_t bytes = encoded_size(spec, n);
  const uint64_t state_bytes = op == Op::kFeedback ? 4 * n : kTensorBytes;
  DeviceBuffer x(kTensorBytes), st(state_bytes), out(kTensorBytes), codes(bytes);
  Timer timer;
  if (!x || !st || !out || !codes || !timer.ok()) {
    state.SkipWithError("cudaMalloc or stream creation failed");
    return;
  }
  bool ok = upload(x.get(), cached_tensor(dtype, n, 1, 1.0f)) &&
            upload(out.get(), cached_tensor(dtype, n, 2, 1.0f)) &&
            (op == Op::kFeedback ? upload(st.get(), cached_tensor(DType::kFloat32, n, 3, 1e-3f))
                                 : upload(st.get(), cached_tensor(dtype, n, 3, 1.0f)));
  // Decodes read real codes.
  ok = ok && encode_cuda(spec, dtype, x.get(), n, codes.get(), bytes, {}, timer.stream()).is_ok() &&
       cudaStreamSynchronize(timer.stream()) == cudaSuccess;
  if (!ok) {
    state.SkipWithError("setting up the buffers failed");
    return;
  }
  auto run = [&](uint64_t iter) {
    const RoundingKey key{iter, 0};
    cudaStream_t s = timer.stream();
    switch (op) {
      case Op::kEncode:
        return encode_cuda(spec, dtype, x.get(), n, codes.get(), bytes, key, s);
      case Op::kFeedback:
        return encode_error_feedback_cuda(spec, dtype, x.get(), static_cast<float*>(st.get()), n,
                                          codes.get(), bytes, key, s);
      case Op::kDelta:
        return encode_delta_cuda(spec, dtype, x.get(), st.get(), n, codes.get(), bytes, key, s);
      case Op::kDecode:
        return decode_cuda(spec, codes.get(), bytes, n, dtype, out.get(), s);
      case Op::kAccumulate:
        return decode_accumulate_cuda(spec, codes.get(), bytes, n, dtype, out.get(), s);
      case Op::kDecodeDelta:
        return decode_delta_cuda(spec, codes.get(), bytes, n, dtype, st.get(), out.get(), s);
    }
    return internal_error("unknown op");
  };
  Status warm = run(0);  // first launch pays for module loading
  if (!warm.is_ok() || cudaStreamSynchronize(timer.stream()) != cudaSuccess) {
    state.SkipWithError(("warm-up failed: " + warm.to_string()).c_str());
    return;
  }
  std::vector<double> times;
  uint64_t iter = 1;
  for (auto _ : state) {
    timer.start();
    Status s = run(iter++);
    const double t = timer.stop();
    if (!s.is_ok() || t < 0) {
      state.SkipWithError(s.is_ok() ? "device error" : s.to_string().c_str());
      return;
    }
    state.SetIterationTime(t);
    times.push_back(t);
  }
  set_counters(state, times, traffic_bytes(op, spec, dtype, n));
}

// Registers cuda/<op>/<dtype>/<label>/<rn|sr>/256MiB for a parsed spec.
void register_case(Op op, DType dtype, const CodecSpec& spec, const std::string& label) {
  const std::string name = std::string("cuda/") + op_name(op) + "/" + dtype_name(dtype) + "/" +
                           label + (spec.rounding == Rounding::kStochastic ? "/sr" : "/rn") +
                           "/256MiB";
  benchmark::RegisterBenchmark(name.c_str(),
                               [=](benchmark::State& s) { BM_codec(s, op, dtype, spec); })
      ->UseManualTime()
      ->Iterations(kIterations)
      ->Unit(benchmark::kMillisecond);
}

int register_benchmarks() {
  benchmark::RegisterBenchmark("cuda/d2d_copy/256MiB", BM_d2d_copy)
      ->UseManualTime()
      ->Iterations(kIterations)
      ->Unit(benchmark::kMillisecond);
  for (Op op :
       {Op::kEncode, Op::kFeedback, Op::kDelta, Op::kDecode, Op::kAccumulate, Op::kDecodeDelta}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (int bits : {2, 4, 8}) {
        for (Rounding r : {Rounding::kNearest, Rounding::kStochastic}) {
          if (!is_encode_op(op) && r == Rounding::kStochastic) continue;
          CodecSpec spec;
          spec.kind = CodecKind::kAbsmax;
          spec.bits = bits;
          spec.grouping = Grouping::kBlock;
          spec.block = kDefaultBlock;
          spec.rounding = r;
          register_case(op, dtype, spec, "q" + std::to_string(bits));
        }
      }
    }
  }
  // The sparse codecs' selection (SparseLoCo's encodes): 64 of every 4096 elements.
  for (const char* kind : {"topk", "randk"}) {
    for (Op op : {Op::kEncode, Op::kFeedback}) {
      for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        for (int bits : {2, 4, 8}) {
          const std::string b = "+q" + std::to_string(bits);
          auto spec = parse_codec_spec(std::string(kind) + ":64/4096" + b);
          if (spec.is_ok()) register_case(op, dtype, *spec, std::string(kind) + ":64of4096" + b);
        }
      }
    }
  }
  return 0;
}

[[maybe_unused]] const int kRegistered = register_benchmarks();

}  // namespace
}  // namespace lowcomm
