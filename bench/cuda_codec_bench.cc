// CUDA codec throughput at 256 MiB of tensor: each op x {fp32, bf16} x {q2, q4, q8} (encodes
// also with stochastic rounding), against a device-to-device copy of 256 MiB, the ceiling a
// memory-bound kernel can reach. Each iteration is timed with CUDA events around the call on a
// private stream (manual time); the codec calls never synchronise, so the events bracket
// exactly the kernels.
//
// Counters (all per second of kernel time):
//   tensor_GB/s  bytes of the tensor (n x dtype size) encoded or decoded;
//   rw_GB/s      bytes the op must read plus write in DRAM (inputs, codes and scales, state,
//                outputs: see traffic_bytes);
//   vs_copy      rw_GB/s over the read + write rate of a 256 MiB device-to-device copy
//                (2 x 256 MiB per copy), measured once per process.
// Names: cuda/<op>/<dtype>/q<bits>[/rn|/sr]/256MiB, and cuda/d2d_copy/256MiB.

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "lowcomm/codec.h"
#include "lowcomm/codec_cuda.h"

namespace lowcomm {
namespace {

constexpr uint64_t kTensorBytes = uint64_t{256} << 20;

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

bool upload(void* dst, const std::vector<uint8_t>& src) {
  return cudaMemcpy(dst, src.data(), src.size(), cudaMemcpyHostToDevice) == cudaSuccess;
}

// ---- the copy baseline ----

// Read + write bytes per second of a 256 MiB device-to-device copy (mean of 20 after a warm-up),
// measured once per process so that every case compares with the same number; 0 on failure.
double copy_rw_bytes_per_s() {
  static const double rate = [] {
    DeviceBuffer src(kTensorBytes), dst(kTensorBytes);
    Timer timer;
    if (!src || !dst || !timer.ok()) return 0.0;
    constexpr int kCopies = 20;
    (void)cudaMemcpyAsync(dst.get(), src.get(), kTensorBytes, cudaMemcpyDeviceToDevice,
                          timer.stream());
    timer.start();
    for (int k = 0; k < kCopies; ++k) {
      (void)cudaMemcpyAsync(dst.get(), src.get(), kTensorBytes, cudaMemcpyDeviceToDevice,
                            timer.stream());
    }
    const double t = timer.stop();
    return t > 0 ? 2.0 * static_cast<double>(kTensorBytes) * kCopies / t : 0.0;
  }();
  return rate;
}

void BM_d2d_copy(benchmark::State& state) {
  if (!cuda_device_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  DeviceBuffer src(kTensorBytes), dst(kTensorBytes);
  Timer timer;
  if (!src || !dst || !timer.ok()) {
    state.SkipWithError("cudaMalloc or stream creation failed");
    return;
  }
  (void)cudaMemsetAsync(src.get(), 1, kTensorBytes, timer.stream());
  double total = 0.0;
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
    total += t;
  }
  const double iters = static_cast<double>(state.iterations());
  const double rw = 2.0 * static_cast<double>(kTensorBytes) * iters / total;
  state.counters["tensor_GB/s"] = static_cast<double>(kTensorBytes) * iters / total * 1e-9;
  state.counters["rw_GB/s"] = rw * 1e-9;
  const double reference = copy_rw_bytes_per_s();
  if (reference > 0) state.counters["vs_copy"] = rw / reference;
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
  const std::vector<uint8_t> host_x = host_tensor(dtype, n, 1, 1.0f);
  bool ok = upload(x.get(), host_x) && upload(out.get(), host_tensor(dtype, n, 2, 1.0f)) &&
            (op == Op::kFeedback ? upload(st.get(), host_tensor(DType::kFloat32, n, 3, 1e-3f))
                                 : upload(st.get(), host_tensor(dtype, n, 3, 1.0f)));
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
  double total = 0.0;
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
    total += t;
  }
  const double iters = static_cast<double>(state.iterations());
  const double rw = static_cast<double>(traffic_bytes(op, spec, dtype, n)) * iters / total;
  state.counters["tensor_GB/s"] = static_cast<double>(kTensorBytes) * iters / total * 1e-9;
  state.counters["rw_GB/s"] = rw * 1e-9;
  const double reference = copy_rw_bytes_per_s();
  if (reference > 0) state.counters["vs_copy"] = rw / reference;
}

int register_benchmarks() {
  benchmark::RegisterBenchmark("cuda/d2d_copy/256MiB", BM_d2d_copy)
      ->UseManualTime()
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
          std::string name = std::string("cuda/") + op_name(op) + "/" + dtype_name(dtype) + "/q" +
                             std::to_string(bits) +
                             (is_encode_op(op) ? (r == Rounding::kNearest ? "/rn" : "/sr") : "") +
                             "/256MiB";
          benchmark::RegisterBenchmark(name.c_str(),
                                       [=](benchmark::State& s) { BM_codec(s, op, dtype, spec); })
              ->UseManualTime()
              ->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
  return 0;
}

[[maybe_unused]] const int kRegistered = register_benchmarks();

}  // namespace
}  // namespace lowcomm
