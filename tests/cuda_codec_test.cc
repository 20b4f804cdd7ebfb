// The CUDA codec against the CPU reference, byte for byte: for every op, codec, dtype and a
// spread of sizes, the same seeded inputs go through lowcomm::encode & co. on the host and
// lowcomm::encode_cuda & co. on the device, and every byte either side may write (payload,
// residual or cache, output, and guard bytes past each buffer) must match. Inputs include
// NaN, Inf, subnormals, huge ranges and groups whose extreme is a signed zero. Every test
// skips, visibly and saying why ("no CUDA device (...)"), on machines without a CUDA device:
// ctest lists each cuda.* test as Skipped. LOWCOMM_REQUIRE_CUDA=1 turns that into a failure.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "codec/quant_math.h"
#include "codec/sparse_format.h"
#include "lowcomm/codec.h"
#include "lowcomm/codec_cuda.h"

namespace lowcomm {
namespace {

// Why there is no CUDA device to run on ("" when there is one): the runtime's error, or none
// found.
std::string no_device_reason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // leave no error behind for the next check
    return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
  }
  return count > 0 ? "" : "the runtime finds 0 devices";
}

// LOWCOMM_REQUIRE_CUDA=1 (a run on a GPU machine): no device fails instead of skipping.
bool cuda_required() {
  const char* v = std::getenv("LOWCOMM_REQUIRE_CUDA");
  return v != nullptr && std::string(v) == "1";
}

// Skips the test, saying why, where there is no CUDA device (ctest then lists it as Skipped:
// gtest_discover_tests marks "[  SKIPPED ]" output so); fails instead under
// LOWCOMM_REQUIRE_CUDA=1.
#define SKIP_WITHOUT_CUDA_DEVICE()                                                            \
  do {                                                                                        \
    const std::string why_ = no_device_reason();                                              \
    if (!why_.empty()) {                                                                      \
      if (cuda_required())                                                                    \
        FAIL() << "no CUDA device (" << why_ << ") under LOWCOMM_REQUIRE_CUDA=1";             \
      GTEST_SKIP() << "no CUDA device (" << why_                                              \
                   << "): the CUDA codec is compared with the CPU path on GPU machines only"; \
    }                                                                                         \
  } while (0)

#define ASSERT_CUDA(expr)                                                              \
  do {                                                                                 \
    const cudaError_t cuda_err_ = (expr);                                              \
    ASSERT_EQ(cudaSuccess, cuda_err_) << #expr << ": " << cudaGetErrorName(cuda_err_); \
  } while (0)

// The reference: the portable scalar path (threaded; results do not depend on threads).
const CpuOptions kReference{0, false};
constexpr size_t kGuard = 64;  // bytes past each buffer that neither side may touch
constexpr uint8_t kGuardByte = 0xA5;

// ---- device resources ----

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&ptr_, std::max<size_t>(bytes, 1)) != cudaSuccess) ptr_ = nullptr;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  void* ptr_ = nullptr;
};

// Copies between host and device, ordered on the stream that runs the kernels. A plain
// cudaMemcpy from pageable memory runs on the legacy stream and may return before its DMA has
// landed, and a kernel on a non-blocking stream does not wait for it: on an H200 the codec
// kernels read half-copied inputs that way.
cudaError_t upload(void* dev, const void* host, size_t bytes, cudaStream_t s) {
  const cudaError_t err = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s);
  return err != cudaSuccess ? err : cudaStreamSynchronize(s);
}

cudaError_t download(void* host, const void* dev, size_t bytes, cudaStream_t s) {
  const cudaError_t err = cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s);
  return err != cudaSuccess ? err : cudaStreamSynchronize(s);
}

class Stream {
 public:
  Stream() {
    if (cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking) != cudaSuccess) s_ = nullptr;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (s_ != nullptr) (void)cudaStreamDestroy(s_);
  }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// ---- inputs ----

enum class Fill {
  kNormal,   // finite values over a wide dynamic range, with zero runs and constant runs
  kSpecial,  // plus NaN (several payloads), Inf, subnormals, +-FLT_MAX and raw random bits
  kZeros,    // signed zeros: groups whose min or max is a zero of either sign
};

const char* fill_name(Fill f) {
  switch (f) {
    case Fill::kNormal:
      return "normal";
    case Fill::kSpecial:
      return "special";
    case Fill::kZeros:
      return "zeros";
  }
  return "?";
}

using Rng = std::mt19937_64;

float gaussian(Rng& rng) {
  return std::normal_distribution<float>(0.0f, 1.0f)(rng);
}

uint16_t to_bits16(DType dtype, float v) {
  return dtype == DType::kBFloat16 ? qm::f32_to_bf16(v) : qm::f32_to_f16(v);
}

void put(std::vector<uint8_t>& buf, DType dtype, uint64_t i, uint32_t bits) {
  if (dtype == DType::kFloat32) {
    std::memcpy(&buf[4 * i], &bits, 4);
  } else {
    uint16_t h = static_cast<uint16_t>(bits);
    std::memcpy(&buf[2 * i], &h, 2);
  }
}

// n elements of `dtype` followed by kGuard guard bytes. The tensor is cut into runs of
// 32..4096 elements, each with its own mode, so that block and column groups of every size see
// uniform groups (all-zero, all-negative, constant) as well as mixed ones.
std::vector<uint8_t> make_tensor(DType dtype, uint64_t n, uint64_t seed, Fill fill,
                                 float magnitude = 1.0f) {
  Rng rng(seed);
  const size_t es = dtype_size(dtype);
  std::vector<uint8_t> buf(n * es + kGuard, kGuardByte);
  auto store = [&](uint64_t i, float v) {
    put(buf, dtype, i, dtype == DType::kFloat32 ? qm::f32_bits(v) : to_bits16(dtype, v));
  };
  const float nan_payloads[] = {qm::bits_f32(0x7FC00000u), qm::bits_f32(0xFFC00001u),
                                qm::bits_f32(0x7F800001u), qm::bits_f32(0x7FFFFFFFu)};
  uint64_t i = 0;
  while (i < n) {
    const uint64_t run = std::min<uint64_t>(n - i, uint64_t{32} << (rng() % 8));
    const int mode = static_cast<int>(rng() % (fill == Fill::kNormal ? 6 : 10));
    const float scale = magnitude * std::ldexp(1.0f, static_cast<int>(rng() % 41) - 20);
    const float constant = gaussian(rng) * scale;
    for (uint64_t k = 0; k < run; ++k, ++i) {
      const float g = gaussian(rng) * scale;
      const float zero = (rng() & 1) ? -0.0f : 0.0f;
      if (fill == Fill::kZeros) {
        // Only zeros and values of one sign per run: the extreme on that side is a zero.
        const float pick = (rng() % 3 == 0) ? zero : std::fabs(g);
        store(i, mode < 4 ? zero : (mode < 7 ? pick : -pick));
        continue;
      }
      switch (mode) {
        case 0:
        case 1:
        case 2:
          store(i, g);
          break;
        case 3:
          store(i, (rng() % 4 == 0) ? zero : g);
          break;
        case 4:
          store(i, constant);
          break;
        case 5:
          store(i, -std::fabs(g));
          break;
        case 6:
          store(i, (rng() % 97 == 0) ? nan_payloads[rng() % 4] : g);
          break;
        case 7: {
          const float inf = (rng() & 1) ? -INFINITY : INFINITY;
          store(i, (rng() % 61 == 0) ? inf : g);
          break;
        }
        case 8: {  // subnormals of fp32 (1e-45..1e-38) and of the 16-bit types, and the huge
          const uint32_t r = static_cast<uint32_t>(rng() % 4);
          const float v = r == 0   ? qm::bits_f32(static_cast<uint32_t>(rng() % 0x800000u))
                          : r == 1 ? std::ldexp(gaussian(rng), -130)
                          : r == 2 ? std::ldexp(gaussian(rng), -20)
                                   : ((rng() & 1) ? 3.4e38f : -3.0e38f) * std::fabs(gaussian(rng));
          store(i, (rng() & 1) ? -v : v);
          break;
        }
        default:  // raw random bits of the dtype (fp32: exponents everywhere, few non-finite)
          put(buf, dtype, i, static_cast<uint32_t>(rng()));
          break;
      }
    }
  }
  return buf;
}

std::vector<uint8_t> random_bytes(size_t bytes, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint8_t> buf(bytes + kGuard, kGuardByte);
  for (size_t k = 0; k < bytes; ++k) buf[k] = static_cast<uint8_t>(rng());
  return buf;
}

// ---- one op on both sides ----

enum class Op { kEncode, kFeedback, kDelta, kDecode, kAccumulate, kDecodeDelta };
enum class Out { kSeparate, kNull };  // decode_delta's out

const char* op_name(Op op) {
  switch (op) {
    case Op::kEncode:
      return "encode";
    case Op::kFeedback:
      return "encode_error_feedback";
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

// Every buffer an op reads or writes, each followed by kGuard guard bytes.
struct Buffers {
  std::vector<uint8_t> x;        // encode input
  std::vector<uint8_t> state;    // residual (fp32) or cache m (dtype)
  std::vector<uint8_t> out;      // decode output
  std::vector<uint8_t> payload;  // codes: decode input, encode output (pre-filled)
};

void expect_same_bytes(const std::vector<uint8_t>& cpu, const std::vector<uint8_t>& gpu,
                       const char* what) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  if (std::memcmp(cpu.data(), gpu.data(), cpu.size()) == 0) return;
  size_t first = 0, count = 0;
  for (size_t k = cpu.size(); k-- > 0;) {
    if (cpu[k] != gpu[k]) {
      first = k;
      ++count;
    }
  }
  ADD_FAILURE() << what << ": " << count << " of " << cpu.size() << " bytes differ; first at byte "
                << first << " (cpu 0x" << std::hex << int{cpu[first]} << ", gpu 0x"
                << int{gpu[first]} << std::dec << ")"
                << (first + kGuard >= cpu.size() ? " in the guard bytes" : "");
}

Status run_cpu(Op op, const CodecSpec& spec, DType dtype, uint64_t n, RoundingKey key, Out out_mode,
               Buffers& b) {
  const uint64_t bytes = encoded_size(spec, n);
  uint8_t* m = b.state.data();
  switch (op) {
    case Op::kEncode:
      return encode(spec, dtype, b.x.data(), n, b.payload.data(), bytes, key, kReference);
    case Op::kFeedback:
      return encode_error_feedback(spec, dtype, b.x.data(), reinterpret_cast<float*>(m), n,
                                   b.payload.data(), bytes, key, kReference);
    case Op::kDelta:
      return encode_delta(spec, dtype, b.x.data(), m, n, b.payload.data(), bytes, key, kReference);
    case Op::kDecode:
      return decode(spec, b.payload.data(), bytes, n, dtype, b.out.data(), kReference);
    case Op::kAccumulate:
      return decode_accumulate(spec, b.payload.data(), bytes, n, dtype, b.out.data(), kReference);
    case Op::kDecodeDelta: {
      void* out = out_mode == Out::kSeparate ? b.out.data() : nullptr;
      return decode_delta(spec, b.payload.data(), bytes, n, dtype, m, out, kReference);
    }
  }
  return internal_error("unknown op");
}

// The same call on device copies; the pointers are the device buffers' starts plus `shift`
// bytes (alignment tests).
struct DevicePtrs {
  uint8_t* x;
  uint8_t* state;
  uint8_t* out;
  uint8_t* payload;
};

Status run_gpu(Op op, const CodecSpec& spec, DType dtype, uint64_t n, RoundingKey key, Out out_mode,
               const DevicePtrs& d, cudaStream_t s) {
  const uint64_t bytes = encoded_size(spec, n);
  switch (op) {
    case Op::kEncode:
      return encode_cuda(spec, dtype, d.x, n, d.payload, bytes, key, s);
    case Op::kFeedback:
      return encode_error_feedback_cuda(spec, dtype, d.x, reinterpret_cast<float*>(d.state), n,
                                        d.payload, bytes, key, s);
    case Op::kDelta:
      return encode_delta_cuda(spec, dtype, d.x, d.state, n, d.payload, bytes, key, s);
    case Op::kDecode:
      return decode_cuda(spec, d.payload, bytes, n, dtype, d.out, s);
    case Op::kAccumulate:
      return decode_accumulate_cuda(spec, d.payload, bytes, n, dtype, d.out, s);
    case Op::kDecodeDelta: {
      void* out = out_mode == Out::kSeparate ? d.out : nullptr;
      return decode_delta_cuda(spec, d.payload, bytes, n, dtype, d.state, out, s);
    }
  }
  return internal_error("unknown op");
}

// Byte offsets of each device buffer from a cudaMalloc'd (256-byte aligned) start.
struct Shifts {
  size_t x = 0, state = 0, out = 0, payload = 0;
};

// Runs `op` on the host and on the device from identical buffers and compares all of them.
void compare_op(Op op, const CodecSpec& spec, DType dtype, uint64_t n, RoundingKey key,
                Out out_mode, const Buffers& in, const Shifts& shift = {}) {
  SCOPED_TRACE(
      std::string(op_name(op)) +
      (op == Op::kDecodeDelta ? (out_mode == Out::kSeparate ? " (out)" : " (out null)") : ""));
  Buffers cpu = in;
  Status st = run_cpu(op, spec, dtype, n, key, out_mode, cpu);
  ASSERT_TRUE(st.is_ok()) << "cpu: " << st.to_string();

  Stream stream;
  ASSERT_NE(stream.get(), nullptr);
  DeviceBuffer dx(in.x.size() + shift.x), ds(in.state.size() + shift.state),
      dout(in.out.size() + shift.out), dp(in.payload.size() + shift.payload);
  ASSERT_TRUE(dx && ds && dout && dp) << "cudaMalloc failed";
  DevicePtrs d{dx.get() + shift.x, ds.get() + shift.state, dout.get() + shift.out,
               dp.get() + shift.payload};
  const cudaStream_t s = stream.get();
  ASSERT_CUDA(upload(d.x, in.x.data(), in.x.size(), s));
  ASSERT_CUDA(upload(d.state, in.state.data(), in.state.size(), s));
  ASSERT_CUDA(upload(d.out, in.out.data(), in.out.size(), s));
  ASSERT_CUDA(upload(d.payload, in.payload.data(), in.payload.size(), s));
  st = run_gpu(op, spec, dtype, n, key, out_mode, d, s);
  ASSERT_TRUE(st.is_ok()) << "gpu: " << st.to_string();
  ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
  ASSERT_CUDA(cudaGetLastError());

  Buffers gpu = in;
  ASSERT_CUDA(download(gpu.x.data(), d.x, gpu.x.size(), s));
  ASSERT_CUDA(download(gpu.state.data(), d.state, gpu.state.size(), s));
  ASSERT_CUDA(download(gpu.out.data(), d.out, gpu.out.size(), s));
  ASSERT_CUDA(download(gpu.payload.data(), d.payload, gpu.payload.size(), s));
  expect_same_bytes(cpu.payload, gpu.payload, "payload");
  expect_same_bytes(cpu.state, gpu.state, "state (residual or m)");
  expect_same_bytes(cpu.out, gpu.out, "out");
  expect_same_bytes(cpu.x, gpu.x, "input");
}

// All six ops (decode_delta with and without out) at one size and fill.
void compare_all_ops(const CodecSpec& spec, DType dtype, uint64_t n, Fill fill, uint64_t seed,
                     RoundingKey key, const Shifts& shift = {}) {
  SCOPED_TRACE("spec " + to_string(spec) + ", dtype " + dtype_name(dtype) + ", n " +
               std::to_string(n) + ", fill " + fill_name(fill) + ", key {" +
               std::to_string(key.seed) + ", " + std::to_string(key.offset) + "}");
  const uint64_t bytes = encoded_size(spec, n);
  Buffers in;
  in.x = make_tensor(dtype, n, seed, fill);
  in.out = std::vector<uint8_t>(n * dtype_size(dtype) + kGuard, kGuardByte);
  in.payload = random_bytes(bytes, seed + 1);  // encodes must overwrite every payload byte

  // Encodes: residual small against x (as in training), cache m near x.
  in.state = make_tensor(DType::kFloat32, n, seed + 2,
                         fill == Fill::kSpecial ? fill : Fill::kNormal, 1e-3f);
  compare_op(Op::kFeedback, spec, dtype, n, key, Out::kSeparate, in, shift);
  in.state = make_tensor(dtype, n, seed + 3, fill);
  compare_op(Op::kDelta, spec, dtype, n, key, Out::kSeparate, in, shift);
  compare_op(Op::kEncode, spec, dtype, n, key, Out::kSeparate, in, shift);
  if (::testing::Test::HasFailure()) return;

  // Decodes of real codes (the CPU encoding of x) and of arbitrary bytes: a decoder must agree
  // on any payload, including records with NaN, Inf, subnormal or inverted ranges.
  Buffers enc = in;
  ASSERT_TRUE(
      encode(spec, dtype, in.x.data(), n, enc.payload.data(), bytes, key, kReference).is_ok());
  for (int source = 0; source < 2; ++source) {
    SCOPED_TRACE(source == 0 ? "payload: cpu encoding" : "payload: random bytes");
    Buffers dec = in;
    dec.payload = source == 0 ? enc.payload : random_bytes(bytes, seed + 4);
    compare_op(Op::kDecode, spec, dtype, n, key, Out::kSeparate, dec, shift);
    dec.out = make_tensor(dtype, n, seed + 5, fill);
    compare_op(Op::kAccumulate, spec, dtype, n, key, Out::kSeparate, dec, shift);
    dec.state = make_tensor(dtype, n, seed + 6, fill);
    compare_op(Op::kDecodeDelta, spec, dtype, n, key, Out::kSeparate, dec, shift);
    compare_op(Op::kDecodeDelta, spec, dtype, n, key, Out::kNull, dec, shift);
    if (::testing::Test::HasFailure()) return;
  }
}

// Element counts: the edges (0, 1, a partial unit, one unit), around one group, and a few
// hundred thousand with a partial last group. Column specs: whole rows only.
std::vector<uint64_t> test_sizes(const CodecSpec& spec) {
  std::vector<uint64_t> sizes;
  if (spec.grouping == Grouping::kColumn) {
    for (uint64_t rows : {0, 1, 2, 5, 33, 70}) sizes.push_back(rows * spec.cols);
    sizes.push_back((100003 / spec.cols + 1) * spec.cols);
  } else {
    const uint64_t g = spec.grouping == Grouping::kBlock ? spec.block : 128;
    sizes = {0, 1, 7, 8, 33, g - 1, g, g + 1, 3 * g + 5, 100003, 262147};
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

// Rounding keys: offsets at and mid-way through a Philox counter's 16 draws (an 8-element unit
// then needs one counter, or two: offsets 3 and 8 fit one, 13 straddles), and two that wrap
// past 2^64 inside the tensor. Seven of them, so that every fill meets every offset.
RoundingKey test_key(size_t k) {
  const uint64_t offsets[] = {0, 3, 8, 13, 1000003, UINT64_MAX - 2, UINT64_MAX - 100};
  return RoundingKey{0x9E3779B97F4A7C15ull * (k + 1), offsets[k % 7]};
}

// ---- the matrix: codec x dtype, each over all sizes, fills and ops ----

struct CodecCase {
  std::string spec;
  DType dtype;
};

std::string case_name(const ::testing::TestParamInfo<CodecCase>& info) {
  std::string s = info.param.spec + "_" + dtype_name(info.param.dtype);
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

std::vector<CodecCase> all_cases() {
  std::vector<std::string> specs;
  for (const char* q : {"q2", "q3", "q4", "q8"}) {
    for (int block : {32, 128, 256, 512, 4096}) {
      for (const char* r : {"rn", "sr"}) {
        specs.push_back(std::string(q) + ":block=" + std::to_string(block) + ":" + r);
      }
    }
  }
  for (int block = 32; block <= 4096; block *= 2)
    specs.push_back("q1:block=" + std::to_string(block));
  for (const char* q : {"minmax2", "minmax4", "minmax8"}) {
    for (int block : {32, 128, 512, 4096}) {
      for (const char* r : {"rn", "sr"}) {
        specs.push_back(std::string(q) + ":block=" + std::to_string(block) + ":" + r);
      }
    }
  }
  for (const char* s :
       {"q4:col=96", "q4:col=96:sr", "q8:col=7", "q2:col=1:sr", "q3:col=1000", "minmax4:col=96",
        "minmax8:col=7:sr", "minmax2:col=1", "minmax4:col=3000:sr"}) {
    specs.push_back(s);
  }
  for (const char* s : {"none", "bf16", "fp16"}) specs.push_back(s);
  std::vector<CodecCase> cases;
  for (const std::string& s : specs) {
    for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) cases.push_back({s, d});
  }
  return cases;
}

class CudaCodecMatrix : public ::testing::TestWithParam<CodecCase> {
 protected:
  void SetUp() override { SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_P(CudaCodecMatrix, MatchesCpuByteForByte) {
  auto spec = parse_codec_spec(GetParam().spec);
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  const DType dtype = GetParam().dtype;
  std::vector<Fill> fills = {Fill::kNormal, Fill::kSpecial};
  if (spec->kind == CodecKind::kMinmax) fills.push_back(Fill::kZeros);
  size_t k = 0;
  for (uint64_t n : test_sizes(*spec)) {
    for (Fill fill : fills) {
      compare_all_ops(*spec, dtype, n, fill, 1000 * k + 17, test_key(k));
      ++k;
      if (HasFailure()) return;  // one failing case says enough
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CudaCodecMatrix, ::testing::ValuesIn(all_cases()), case_name);

// ---- the device, or why there is none ----

// One line in the log for the whole run: the device the comparisons use, or, skipped, why
// there is none (ctest: cuda.CudaDevice.Present, Skipped, like every cuda.* test then).
TEST(CudaDevice, Present) {
  SKIP_WITHOUT_CUDA_DEVICE();
  int count = 0;
  ASSERT_CUDA(cudaGetDeviceCount(&count));
  cudaDeviceProp prop{};
  ASSERT_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("CUDA device 0 of %d: %s, compute capability %d.%d, %zu MiB\n", count, prop.name,
              prop.major, prop.minor, static_cast<size_t>(prop.totalGlobalMem >> 20));
  RecordProperty("cuda_device", prop.name);
}

// ---- buffers at offsets that rule out vector accesses ----

TEST(CudaCodec, UnalignedBuffers) {
  SKIP_WITHOUT_CUDA_DEVICE();
  for (const char* text : {"q4", "q3:block=32:sr", "q8:block=64", "q1:block=512",
                           "minmax8:col=7:sr", "minmax2:block=4096", "bf16", "none"}) {
    auto spec = parse_codec_spec(text);
    ASSERT_TRUE(spec.is_ok());
    const size_t payload_align = spec->quantized() ? 4 : dtype_size(spec->wire_dtype);
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      // Tensors one element off 16-byte alignment (the smallest legal offset; the state buffer
      // also holds fp32 residuals), payloads at each legal offset below 16 bytes.
      for (size_t payload_shift = payload_align; payload_shift < 16;
           payload_shift += payload_align) {
        Shifts shift{dtype_size(dtype), 4, dtype_size(dtype), payload_shift};
        const uint64_t n = spec->grouping == Grouping::kColumn ? 7 * 151 : 1005;
        SCOPED_TRACE("payload shift " + std::to_string(payload_shift));
        compare_all_ops(*spec, dtype, n, Fill::kSpecial, 99 + payload_shift,
                        test_key(payload_shift), shift);
        if (HasFailure()) return;
      }
    }
  }
}

// ---- argument checks: nothing is enqueued for a call the CPU path would refuse ----

TEST(CudaCodec, RejectsWhatTheCpuRejects) {
  SKIP_WITHOUT_CUDA_DEVICE();
  Stream stream;
  DeviceBuffer buf(4096);
  ASSERT_TRUE(buf);
  CodecSpec q4 = *parse_codec_spec("q4");
  CodecSpec col = *parse_codec_spec("q4:col=10");
  const uint64_t need = encoded_size(q4, 100);
  uint8_t* p = buf.get();
  auto code = [](const Status& s) { return s.code(); };
  EXPECT_EQ(StatusCode::kInvalidArgument,
            code(encode_cuda(q4, DType::kFloat32, p, 100, p + 1024, need - 1, {}, stream.get())));
  EXPECT_EQ(StatusCode::kInvalidArgument,
            code(encode_cuda(q4, DType::kFloat32, nullptr, 100, p, need, {}, stream.get())));
  EXPECT_EQ(StatusCode::kInvalidArgument,
            code(encode_cuda(col, DType::kFloat32, p, 95, p + 1024, 1024, {}, stream.get())));
  EXPECT_EQ(StatusCode::kInvalidArgument,
            code(encode_error_feedback_cuda(q4, DType::kFloat32, p, nullptr, 100, p + 1024, need,
                                            {}, stream.get())));
  EXPECT_EQ(StatusCode::kInvalidArgument,
            code(encode_delta_cuda(q4, DType::kBFloat16, p, nullptr, 100, p + 1024, need, {},
                                   stream.get())));
  EXPECT_EQ(StatusCode::kInvalidArgument,
            code(decode_cuda(q4, p, need, 100, static_cast<DType>(99), p + 1024, stream.get())));
  CodecSpec bad = q4;
  bad.block = 48;
  EXPECT_EQ(
      StatusCode::kInvalidArgument,
      code(decode_accumulate_cuda(bad, p, 4096, 100, DType::kFloat32, p + 1024, stream.get())));
  // Misaligned tensors and payloads.
  EXPECT_EQ(StatusCode::kInvalidArgument,
            code(encode_cuda(q4, DType::kFloat32, p + 2, 100, p + 1024, need, {}, stream.get())));
  EXPECT_EQ(StatusCode::kInvalidArgument, code(decode_delta_cuda(q4, p, need, 100, DType::kBFloat16,
                                                                 p + 1025, nullptr, stream.get())));
  EXPECT_EQ(StatusCode::kInvalidArgument,
            code(encode_cuda(q4, DType::kFloat32, p, 100, p + 1026, need, {}, stream.get())));
  EXPECT_EQ(StatusCode::kInvalidArgument,
            code(decode_cuda(*parse_codec_spec("bf16"), p + 1, 200, 100, DType::kFloat32, p + 1024,
                             stream.get())));
  // The residual is fp32 whatever the tensor's dtype (the CPU checks only the dtype's size).
  EXPECT_EQ(
      StatusCode::kInvalidArgument,
      code(encode_error_feedback_cuda(q4, DType::kBFloat16, p, reinterpret_cast<float*>(p + 514),
                                      100, p + 1024, need, {}, stream.get())));
  // decode_delta's out must not alias m.
  EXPECT_EQ(
      StatusCode::kInvalidArgument,
      code(decode_delta_cuda(q4, p, need, 100, DType::kFloat32, p + 1024, p + 1024, stream.get())));
  // Empty tensors need no buffers.
  EXPECT_TRUE(encode_cuda(q4, DType::kFloat32, nullptr, 0, nullptr, 0, {}, stream.get()).is_ok());
  EXPECT_TRUE(decode_delta_cuda(q4, nullptr, 0, 0, DType::kFloat16, nullptr, nullptr, stream.get())
                  .is_ok());
  ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
}

// ---- more than 2^31 elements: 64-bit indexing end to end ----

TEST(CudaCodec, MoreThan2Pow31Elements) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t n = (uint64_t{1} << 31) + 1000;
  const DType dtype = DType::kBFloat16;
  const CodecSpec spec = *parse_codec_spec("q4:sr");
  const uint64_t tensor_bytes = n * dtype_size(dtype), bytes = encoded_size(spec, n);
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (free_bytes < 2 * tensor_bytes + bytes + (uint64_t{1} << 30)) {
    GTEST_SKIP() << "needs " << ((2 * tensor_bytes + bytes) >> 20) << " MiB of device memory, "
                 << (free_bytes >> 20) << " MiB free";
  }
  // About 10 GiB of host memory in all.
  std::vector<uint16_t> x, gpu_out;
  std::vector<uint8_t> cpu_codes, gpu_codes;
  try {
    x.resize(n);
    gpu_out.resize(n);
    cpu_codes.resize(bytes);
    gpu_codes.resize(bytes);
  } catch (const std::bad_alloc&) {
    GTEST_SKIP() << "not enough host memory for two copies of a 4 GiB tensor";
  }
  // Cheap, varied input: bf16 bits from a 64-bit mixer, finite only.
  uint64_t s = 0x243F6A8885A308D3ull;
  for (uint64_t i = 0; i < n; i += 4) {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = (s ^ (s >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    for (uint64_t k = 0; k < 4 && i + k < n; ++k) {
      const uint16_t h = static_cast<uint16_t>(z >> (16 * k));
      x[i + k] = static_cast<uint16_t>((h & 0x803F) | 0x3C00 | ((h & 0x0F00) >> 2));
    }
  }
  const RoundingKey key{12345, 7};
  ASSERT_TRUE(encode(spec, dtype, x.data(), n, cpu_codes.data(), bytes, key, CpuOptions{}).is_ok());

  Stream stream;
  DeviceBuffer dx(tensor_bytes), dcodes(bytes), dout(tensor_bytes);
  ASSERT_TRUE(dx && dcodes && dout) << "cudaMalloc failed";
  ASSERT_CUDA(upload(dx.get(), x.data(), tensor_bytes, stream.get()));
  ASSERT_TRUE(
      encode_cuda(spec, dtype, dx.get(), n, dcodes.get(), bytes, key, stream.get()).is_ok());
  ASSERT_TRUE(decode_cuda(spec, dcodes.get(), bytes, n, dtype, dout.get(), stream.get()).is_ok());
  ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
  ASSERT_CUDA(download(gpu_codes.data(), dcodes.get(), bytes, stream.get()));
  EXPECT_EQ(0, std::memcmp(cpu_codes.data(), gpu_codes.data(), bytes)) << "encoded payloads differ";

  // Decode of the same codes; x's host buffer is reused for the CPU output.
  ASSERT_CUDA(download(gpu_out.data(), dout.get(), tensor_bytes, stream.get()));
  ASSERT_TRUE(decode(spec, cpu_codes.data(), bytes, n, dtype, x.data(), CpuOptions{}).is_ok());
  EXPECT_EQ(0, std::memcmp(x.data(), gpu_out.data(), tensor_bytes)) << "decoded tensors differ";
}

// ---- sparse codecs (topk, randk): every op, bytes and verdicts as on the CPU ----

// Sparse inputs: make_tensor's runs (constant and zero runs tie; kSpecial adds NaN and Inf, so
// whole chunks are non-finite), or a few distinct values with all-zero stretches (ties
// everywhere, all-zero chunks), or signed zeros only.
enum class SparseFill { kNormal, kSpecial, kTies, kZeros };

const char* sparse_fill_name(SparseFill f) {
  switch (f) {
    case SparseFill::kNormal:
      return "normal";
    case SparseFill::kSpecial:
      return "special";
    case SparseFill::kTies:
      return "ties";
    case SparseFill::kZeros:
      return "zeros";
  }
  return "?";
}

std::vector<uint8_t> make_sparse_tensor(DType dtype, uint64_t n, uint64_t seed, SparseFill fill) {
  if (fill == SparseFill::kNormal) return make_tensor(dtype, n, seed, Fill::kNormal);
  if (fill == SparseFill::kSpecial) return make_tensor(dtype, n, seed, Fill::kSpecial);
  Rng rng(seed);
  std::vector<uint8_t> buf(n * dtype_size(dtype) + kGuard, kGuardByte);
  const float values[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.0f, -2.0f, 0.5f, -0.5f};
  const uint64_t zero_run = 32 + rng() % 5000;  // all-zero stretches: whole chunks of small C
  for (uint64_t i = 0; i < n; ++i) {
    float v = (rng() & 1) ? 0.0f : -0.0f;
    if (fill == SparseFill::kTies && (i / zero_run) % 3 != 1) v = values[rng() % 8];
    put(buf, dtype, i, dtype == DType::kFloat32 ? qm::f32_bits(v) : to_bits16(dtype, v));
  }
  return buf;
}

// The CPU's encoding with random value codes (and, for randk, a random seed) under random
// scale records of the kinds an encoder writes: both NaN (any payloads), lo == hi, lo = -0 or
// 0 with hi up to FLT_MAX or a subnormal, ranges over many exponents. Positions are kept.
void rescale_records(const CodecSpec& spec, uint64_t n, std::vector<uint8_t>& codes,
                     uint64_t seed) {
  Rng rng(seed);
  if (spec.kind == CodecKind::kRandk) {
    for (int b = 0; b < 8; ++b) codes[b] = static_cast<uint8_t>(rng());
  }
  const uint64_t chunks = (n + spec.block - 1) / spec.block;
  for (uint64_t c = 0; c < chunks; ++c) {
    const sparse::ChunkLayout l =
        sparse::chunk_layout(spec.kind, spec.keep, spec.block, spec.bits, n, c);
    float lo = 0.0f, hi = 0.0f;
    switch (rng() % 6) {
      case 0:
        lo = qm::bits_f32(0x7FC00000u);
        hi = qm::bits_f32(0xFFC00005u);
        break;
      case 1:
        lo = hi = std::ldexp(1.37f, static_cast<int>(rng() % 250) - 125);
        break;
      case 2:
        lo = -0.0f;
        hi = 3.4e38f;
        break;
      case 3:
        lo = 0.0f;
        hi = qm::bits_f32(static_cast<uint32_t>(1 + rng() % 0x7FFFFFu));
        break;
      default: {
        const float a =
            std::ldexp(static_cast<float>(rng() % 1000), static_cast<int>(rng() % 60) - 30);
        const float b =
            std::ldexp(static_cast<float>(rng() % 1000), static_cast<int>(rng() % 60) - 30);
        lo = std::min(a, b);
        hi = std::max(a, b);
        break;
      }
    }
    std::memcpy(&codes[l.offset], &lo, 4);
    std::memcpy(&codes[l.offset + 4], &hi, 4);
    for (uint64_t b = l.values; b < l.end; ++b) codes[b] = static_cast<uint8_t>(rng());
  }
}

// Encode, error feedback (β = 1 and 0.9), decode and decode_accumulate of one spec, dtype, size
// and fill on both sides. Decodes take the CPU's encoding, and the same with random codes under
// random valid scale records (rescale_records).
void compare_sparse(const CodecSpec& spec, DType dtype, uint64_t n, SparseFill fill, uint64_t seed,
                    RoundingKey key, const Shifts& shift = {}) {
  SCOPED_TRACE("spec " + to_string(spec) + ", dtype " + dtype_name(dtype) + ", n " +
               std::to_string(n) + ", fill " + sparse_fill_name(fill) + ", seed " +
               std::to_string(key.seed));
  const uint64_t bytes = encoded_size(spec, n);
  Buffers in;
  in.x = make_sparse_tensor(dtype, n, seed, fill);
  in.out = std::vector<uint8_t>(n * dtype_size(dtype) + kGuard, kGuardByte);
  in.payload = random_bytes(bytes, seed + 1);  // encodes must overwrite every payload byte
  in.state = make_tensor(DType::kFloat32, n, seed + 2,
                         fill == SparseFill::kSpecial ? Fill::kSpecial : Fill::kNormal, 1e-3f);
  compare_op(Op::kEncode, spec, dtype, n, key, Out::kSeparate, in, shift);
  compare_op(Op::kFeedback, spec, dtype, n, key, Out::kSeparate, in, shift);
  CodecSpec decayed = spec;
  decayed.ef_decay = 0.9f;
  compare_op(Op::kFeedback, decayed, dtype, n, key, Out::kSeparate, in, shift);
  if (::testing::Test::HasFailure()) return;

  Buffers enc = in;
  ASSERT_TRUE(
      encode(spec, dtype, in.x.data(), n, enc.payload.data(), bytes, key, kReference).is_ok());
  for (int source = 0; source < 2; ++source) {
    SCOPED_TRACE(source == 0 ? "payload: cpu encoding" : "payload: random codes and scales");
    Buffers dec = in;
    dec.payload = enc.payload;
    if (source == 1) rescale_records(spec, n, dec.payload, seed + 4);
    compare_op(Op::kDecode, spec, dtype, n, key, Out::kSeparate, dec, shift);
    dec.out = make_tensor(dtype, n, seed + 5,
                          fill == SparseFill::kSpecial ? Fill::kSpecial : Fill::kNormal);
    compare_op(Op::kAccumulate, spec, dtype, n, key, Out::kSeparate, dec, shift);
    if (::testing::Test::HasFailure()) return;
  }
}

// Element counts: one element, below one chunk, around one chunk, and a ragged last chunk.
std::vector<uint64_t> sparse_sizes(const CodecSpec& spec) {
  const uint64_t c = spec.block;
  std::vector<uint64_t> sizes = {1, 7, c / 2 + 3, c - 1, c, c + 1, 3 * c + 5};
  if (c <= 4096) sizes.push_back(100003);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

std::vector<CodecCase> sparse_cases() {
  std::vector<CodecCase> cases;
  for (const char* s : {
           "topk:64/4096+q2", "topk:3/32+q3",
           "topk:700/4096+q4",  // positions as a bitmap
           "randk:82/4096+q8", "topk:1/65536+q2",
           "topk:5/32+q4",   // 15-byte records: most start off a 4-byte boundary
           "topk:32/32+q8",  // every element kept
           "randk:3/32+q2",
           "topk:300/16384+q3",    // y recomputed from x (and r) at each pass
           "randk:5000/16384+q4",  // the same for randk
           "topk:40000/65536+q8",  // a record above 48 KiB of shared memory
       }) {
    for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) cases.push_back({s, d});
  }
  return cases;
}

class CudaSparseMatrix : public ::testing::TestWithParam<CodecCase> {
 protected:
  void SetUp() override { SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_P(CudaSparseMatrix, MatchesCpuByteForByte) {
  auto spec = parse_codec_spec(GetParam().spec);
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  size_t k = 0;
  for (uint64_t n : sparse_sizes(*spec)) {
    for (SparseFill fill :
         {SparseFill::kNormal, SparseFill::kSpecial, SparseFill::kTies, SparseFill::kZeros}) {
      compare_sparse(*spec, GetParam().dtype, n, fill, 7000 * k + 29, test_key(k));
      ++k;
      if (HasFailure()) return;  // one failing case says enough
    }
  }
}

INSTANTIATE_TEST_SUITE_P(SparseCodecs, CudaSparseMatrix, ::testing::ValuesIn(sparse_cases()),
                         case_name);

TEST(CudaCodec, SparseUnalignedBuffers) {
  SKIP_WITHOUT_CUDA_DEVICE();
  for (const char* text : {"topk:5/32+q4", "topk:700/4096+q3", "randk:9/64+q3"}) {
    const CodecSpec spec = *parse_codec_spec(text);
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (size_t payload_shift : {4, 8, 12}) {
        SCOPED_TRACE("payload shift " + std::to_string(payload_shift));
        const Shifts shift{dtype_size(dtype), 4, dtype_size(dtype), payload_shift};
        compare_sparse(spec, dtype, 5003, SparseFill::kNormal, 313 + payload_shift,
                       test_key(payload_shift), shift);
        if (HasFailure()) return;
      }
    }
  }
}

// More chunks than one launch has blocks (2^20): the kernels' grid-stride loop over chunks.
TEST(CudaCodec, SparseMoreChunksThanBlocks) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const CodecSpec spec = *parse_codec_spec("topk:2/32+q2");
  const uint64_t n = (uint64_t{1} << 25) + 45;  // 2^20 + 2 chunks, the last of 13 elements
  Buffers in;
  in.x = make_tensor(DType::kBFloat16, n, 4242, Fill::kNormal);
  in.state = make_tensor(DType::kFloat32, n, 4243, Fill::kNormal, 1e-3f);
  in.out = std::vector<uint8_t>(n * 2 + kGuard, kGuardByte);
  in.payload = random_bytes(encoded_size(spec, n), 4244);
  compare_op(Op::kFeedback, spec, DType::kBFloat16, n, {}, Out::kSeparate, in);
  Buffers dec = in;
  ASSERT_TRUE(encode(spec, DType::kBFloat16, in.x.data(), n, dec.payload.data(),
                     encoded_size(spec, n), {}, kReference)
                  .is_ok());
  compare_op(Op::kDecode, spec, DType::kBFloat16, n, {}, Out::kSeparate, dec);
}

// Clears and sets bit field [bit, bit + nbits) of a little-endian bit string.
void set_bits(std::vector<uint8_t>& buf, uint64_t bit, uint32_t v, int nbits) {
  for (int b = 0; b < nbits; ++b, ++bit) {
    const uint8_t m = static_cast<uint8_t>(1u << (bit & 7));
    buf[bit >> 3] =
        static_cast<uint8_t>(((v >> b) & 1u) ? (buf[bit >> 3] | m) : (buf[bit >> 3] & ~m));
  }
}
uint32_t get_bits(const std::vector<uint8_t>& buf, uint64_t bit, int nbits) {
  uint32_t v = 0;
  for (int b = 0; b < nbits; ++b, ++bit)
    v |= static_cast<uint32_t>((buf[bit >> 3] >> (bit & 7)) & 1u) << b;
  return v;
}

// Malformed records (topk positions, scale records an encoder never writes): the GPU decodes
// fail with the CPU's kCorruptData and message, naming the first bad chunk, and the stream
// stays usable.
TEST(CudaCodec, SparseCorruptRecordsFailAsOnTheCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  struct Bad {
    const char* spec;
    uint64_t n;
    const char* what;
  };
  // Offsets: chunk 0 of 4/64 starts at byte 8 (6-bit offsets); the last chunk of 70 elements has
  // 6. 64/4096: 12-bit offsets. Bitmaps: 40/64, the last chunk of 70 elements 6 bits long.
  for (const Bad& bad :
       {Bad{"topk:4/64+q2", 70, "swap"}, Bad{"topk:4/64+q2", 70, "past tail"},
        Bad{"topk:4/64+q2", 192, "repeat"}, Bad{"topk:64/4096+q2", 8292, "past"},
        Bad{"topk:64/4096+q2", 8292, "swap"}, Bad{"topk:40/64+q2", 70, "bit past"},
        Bad{"topk:40/64+q2", 70, "extra"}, Bad{"topk:40/64+q2", 192, "missing"},
        Bad{"topk:4/64+q2", 192, "scales inverted"}, Bad{"topk:40/64+q2", 70, "scales negative"},
        Bad{"randk:16/256+q3", 600, "scales nan"}, Bad{"randk:16/256+q3", 600, "scales inf"},
        Bad{"topk:4/64+q2", 192, "repeat, scales inverted"},
        Bad{"topk:4/64+q2", 192, "scales nan, repeat"}}) {
    SCOPED_TRACE(std::string(bad.spec) + ", n " + std::to_string(bad.n) + ": " + bad.what);
    const CodecSpec spec = *parse_codec_spec(bad.spec);
    const uint64_t n = bad.n, bytes = encoded_size(spec, n);
    std::vector<uint8_t> x = make_tensor(DType::kFloat32, n, n + 1, Fill::kNormal);
    std::vector<uint8_t> codes(bytes);
    ASSERT_TRUE(
        encode(spec, DType::kFloat32, x.data(), n, codes.data(), bytes, {}, kReference).is_ok());
    const uint64_t record = encoded_size(spec, spec.block);  // a full chunk's bytes
    const uint64_t last = (n - 1) / spec.block;
    const int ob = spec.block == 64 ? 6 : 12;
    const std::string what = bad.what;
    // Chunk c's scale record.
    auto set_scales = [&](uint64_t c, float lo, float hi) {
      const uint64_t at =
          sparse::chunk_layout(spec.kind, spec.keep, spec.block, spec.bits, n, c).offset;
      std::memcpy(&codes[at], &lo, 4);
      std::memcpy(&codes[at + 4], &hi, 4);
    };
    if (what == "scales inverted") {  // chunk 1: lo > hi
      set_scales(1, 2.0f, 1.0f);
    } else if (what == "scales negative") {  // the last chunk: lo < 0
      set_scales(last, -1.0f, 1.0f);
    } else if (what == "scales nan") {  // chunk 1: one NaN only
      set_scales(1, NAN, 1.0f);
    } else if (what == "scales inf") {  // the last chunk: an infinite hi
      set_scales(last, 0.5f, INFINITY);
    } else if (what == "repeat, scales inverted") {  // chunk 2 both: its positions are named
      set_bits(codes, 8 * (2 * record + 8) + ob, get_bits(codes, 8 * (2 * record + 8), ob), ob);
      set_scales(2, 2.0f, 1.0f);
    } else if (what == "scales nan, repeat") {  // chunk 1's scales before chunk 2's positions
      set_scales(1, 1.0f, NAN);
      set_bits(codes, 8 * (2 * record + 8) + ob, get_bits(codes, 8 * (2 * record + 8), ob), ob);
    } else if (what == "swap") {  // offsets 0 and 1 of chunk 0 exchanged: not increasing
      const uint32_t o0 = get_bits(codes, 64, ob), o1 = get_bits(codes, 64 + ob, ob);
      set_bits(codes, 64, o1, ob);
      set_bits(codes, 64 + ob, o0, ob);
    } else if (what == "repeat") {  // chunk 2's second offset equal to its first
      set_bits(codes, 8 * (2 * record + 8) + ob, get_bits(codes, 8 * (2 * record + 8), ob), ob);
    } else if (what == "past tail") {  // the last chunk's last offset past its 6 elements
      set_bits(codes, 8 * (last * record + 8), 60, ob);
    } else if (what == "past") {  // chunk 2 (100 elements): its last offset at 100
      const uint32_t k = 2;       // ceil(64 * 100 / 4096)
      set_bits(codes, 8 * (2 * record + 8) + (k - 1) * ob, 100, ob);
    } else if (what == "bit past") {  // bit 7 of a 6-bit bitmap
      codes[last * record + 8] |= 0x80;
    } else if (what == "extra") {  // chunk 0: all 64 bits marked, 40 expected
      for (int b = 0; b < 8; ++b) codes[8 + b] = 0xFF;
    } else {  // chunk 1: the lowest marked bit cleared
      uint8_t* bitmap = codes.data() + record + 8;
      int b = 0;
      while (bitmap[b] == 0) ++b;
      bitmap[b] = static_cast<uint8_t>(bitmap[b] & (bitmap[b] - 1));
    }
    std::vector<uint8_t> out(n * 4 + kGuard, kGuardByte);
    const Status cpu =
        decode(spec, codes.data(), bytes, n, DType::kFloat32, out.data(), kReference);
    ASSERT_EQ(StatusCode::kCorruptData, cpu.code()) << cpu.to_string();

    Stream stream;
    DeviceBuffer dcodes(bytes), dout(n * 4);
    ASSERT_TRUE(dcodes && dout);
    ASSERT_CUDA(upload(dcodes.get(), codes.data(), bytes, stream.get()));
    const Status gpu =
        decode_cuda(spec, dcodes.get(), bytes, n, DType::kFloat32, dout.get(), stream.get());
    EXPECT_EQ(StatusCode::kCorruptData, gpu.code()) << gpu.to_string();
    EXPECT_EQ(cpu.message(), gpu.message());
    const Status acc = decode_accumulate_cuda(spec, dcodes.get(), bytes, n, DType::kBFloat16,
                                              dout.get(), stream.get());
    EXPECT_EQ(StatusCode::kCorruptData, acc.code()) << acc.to_string();
    EXPECT_EQ(cpu.message(), acc.message());

    // The stream and the device go on: the intact message decodes as on the CPU.
    std::vector<uint8_t> good(bytes);
    ASSERT_TRUE(
        encode(spec, DType::kFloat32, x.data(), n, good.data(), bytes, {}, kReference).is_ok());
    ASSERT_TRUE(
        decode(spec, good.data(), bytes, n, DType::kFloat32, out.data(), kReference).is_ok());
    ASSERT_CUDA(upload(dcodes.get(), good.data(), bytes, stream.get()));
    const Status ok =
        decode_cuda(spec, dcodes.get(), bytes, n, DType::kFloat32, dout.get(), stream.get());
    ASSERT_TRUE(ok.is_ok()) << ok.to_string();
    ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
    std::vector<uint8_t> gpu_out(n * 4);
    ASSERT_CUDA(download(gpu_out.data(), dout.get(), n * 4, stream.get()));
    EXPECT_EQ(0, std::memcmp(out.data(), gpu_out.data(), n * 4));
  }
}

}  // namespace
}  // namespace lowcomm
