#pragma once
// The codec layer's public API: quantize a tensor to a few bits per element and back.
//
// A CodecSpec names the format; encoded_size(spec, n) is the exact payload size, so buffers can
// be preallocated and receivers can check lengths. Encoded bytes are identical on the CPU
// (scalar or AVX2, any thread count) and the GPU for the same input, spec and seed.
// The grid, rounding and NaN rules are documented in docs/codecs.md.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "lowcomm/export.h"
#include "lowcomm/status.h"

namespace lowcomm {

// Element types. The codecs take the floating-point ones (fp32, bf16, fp16); the exact
// collectives take all of them. kBool is one byte holding 0 or 1.
enum class DType : uint8_t {
  kFloat32 = 1,
  kBFloat16 = 2,
  kFloat16 = 3,
  kFloat64 = 4,
  kInt8 = 5,
  kUInt8 = 6,
  kInt16 = 7,
  kInt32 = 8,
  kUInt32 = 9,
  kInt64 = 10,
  kUInt64 = 11,
  kBool = 12,
};
inline constexpr uint8_t kMaxDType = 12;

LOWCOMM_API size_t dtype_size(DType dtype);
LOWCOMM_API const char* dtype_name(DType dtype);
LOWCOMM_API Result<DType> parse_dtype(std::string_view name);
// The values of the enum above; false for anything else (bytes off the wire, C casts).
LOWCOMM_API bool valid_dtype(DType dtype);
// fp32, bf16, fp16: what a codec quantizes and a passthrough codec carries.
LOWCOMM_API bool codec_dtype(DType dtype);

enum class CodecKind : uint8_t {
  kNone = 0,  // passthrough in wire_dtype (fp32, bf16 or fp16)
  kAbsmax =
      1,  // symmetric: codes k in [-2^(b-1), 2^(b-1)-1] times absmax/2^(b-1); b=1: sign x mean|x|
  kMinmax = 2,  // asymmetric: codes k in [0, 2^b-1], x = min + k (max-min)/(2^b-1)
  // Sparse (docs/codecs.md, "Sparse codecs"): per chunk of `block` elements, `keep` elements
  // are sent, each as a sign and a (b-1)-bit magnitude between the chunk's smallest and largest
  // kept magnitude; the rest decode to zero.
  kTopk = 3,   // the `keep` largest magnitudes of each chunk (ties: the lower index), with their
               // positions (offsets or a bitmap, whichever is smaller)
  kRandk = 4,  // `keep` positions per chunk drawn from a seed the message carries: no positions
               // on the wire, the same positions on every rank that uses the same seed
};

enum class Rounding : uint8_t { kNearest = 0, kStochastic = 1 };

enum class Grouping : uint8_t {
  kElement = 0,  // passthrough: no scales
  kBlock = 1,    // contiguous blocks of `block` elements, one scale each
  kColumn = 2,   // the tensor viewed as [n / cols, cols]; one scale per column
};

struct CodecSpec {
  CodecKind kind = CodecKind::kNone;
  int bits = 32;                       // quantized: 1,2,3,4,8 (absmax) or 2,4,8 (minmax)
  DType wire_dtype = DType::kFloat32;  // passthrough only
  Grouping grouping = Grouping::kElement;
  uint32_t block = 128;  // kBlock: power of two in [32, 4096]; sparse: the chunk C, to 65536
  uint64_t cols = 0;     // kColumn: number of columns (n must be a multiple)
  Rounding rounding = Rounding::kNearest;
  uint32_t keep = 0;  // sparse: elements kept per chunk of `block` (1..block)
  // Error feedback's decay β: the residual is stored as β·(y - D(codes)) and added to the next
  // input (SparseLoCo's e <- β·e + Δ). 1: plain error feedback. Not part of the wire format.
  float ef_decay = 1.0f;

  bool quantized() const { return kind != CodecKind::kNone; }
  bool sparse() const { return kind == CodecKind::kTopk || kind == CodecKind::kRandk; }
};

inline bool operator==(const CodecSpec& a, const CodecSpec& b) {
  return a.kind == b.kind && a.bits == b.bits && a.wire_dtype == b.wire_dtype &&
         a.grouping == b.grouping && a.block == b.block && a.cols == b.cols &&
         a.rounding == b.rounding && a.keep == b.keep && a.ef_decay == b.ef_decay;
}
inline bool operator!=(const CodecSpec& a, const CodecSpec& b) {
  return !(a == b);
}

constexpr uint32_t kDefaultBlock = 128;
constexpr uint32_t kMinBlock = 32;
constexpr uint32_t kMaxBlock = 4096;
constexpr uint32_t kDefaultSparseChunk = 4096;
constexpr uint32_t kMaxSparseChunk = 65536;

// Parses the textual form: a name, then ':'-separated options.
//   names:   none | fp32 | bf16 | fp16 | q1 | q2 | q3 | q4 | q8 | minmax2 | minmax4 | minmax8
//            | topk:K/C+qB | topk:D+qB | randk:K/C+qB | randk:D+qB  (sparse: K of every C
//              elements, C a power of two from 32 to 65536, 1 <= K <= C; or density D in
//              (0, 1] of chunks of 4096; values at B = 2, 3, 4 or 8 bits, default 2)
//   options: block=N (power of two, 32..4096) | col=N (one scale per column of [n/N, N])
//            | sr (stochastic rounding) | rn (round to nearest, the default)
//            | decay=B (error feedback's decay, 0 <= B <= 1; any codec)
// Examples: "q4", "q2:block=64:sr", "q4:col=4096", "minmax8", "none", "topk:64/4096+q2",
//           "randk:0.02+q2", "topk:0.01+q2:decay=0.95".
LOWCOMM_API Result<CodecSpec> parse_codec_spec(std::string_view text);
LOWCOMM_API std::string to_string(const CodecSpec& spec);
// The spec in environment variable `name` (e.g. LOWCOMM_CODEC=q4), or `fallback` when unset;
// an invalid value is an error naming the variable.
LOWCOMM_API Result<CodecSpec> codec_spec_from_env(const char* name, std::string_view fallback);
LOWCOMM_API Status validate_spec(const CodecSpec& spec);

// Number of scale groups for n elements (0 for passthrough).
LOWCOMM_API uint64_t group_count(const CodecSpec& spec, uint64_t n);
// Exact payload bytes for n elements: scales then packed codes (see docs/wire.md).
LOWCOMM_API uint64_t encoded_size(const CodecSpec& spec, uint64_t n);
// Payload bits per element including scales (not the fixed frame header).
LOWCOMM_API double bits_per_element(const CodecSpec& spec, uint64_t n);
// Checks that n elements can be encoded with spec (for kColumn: n is a multiple of cols).
LOWCOMM_API Status check_count(const CodecSpec& spec, uint64_t n);

// What a sparse codec's message of n elements holds (zeros for other codecs): elements kept,
// and the bytes of positions (offsets or bitmaps), of value codes, and of the per-chunk scales
// and the message header. index + value + scale + header bytes == encoded_size(spec, n).
struct SparseLayout {
  uint64_t chunks = 0;
  uint64_t kept = 0;
  uint64_t index_bytes = 0;
  uint64_t value_bytes = 0;
  uint64_t scale_bytes = 0;
  uint64_t header_bytes = 0;
};
LOWCOMM_API SparseLayout sparse_layout(const CodecSpec& spec, uint64_t n);

// Stochastic rounding key: the random number for element i is a pure function of
// (seed, offset + i), so chunks of a tensor encoded separately match the whole.
struct RoundingKey {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// CPU execution knobs. threads = 0 uses the codec pool (LOWCOMM_CODEC_THREADS, default: all
// cores); simd = false forces the portable path (which produces the same bytes).
struct CpuOptions {
  int threads = 0;
  bool simd = true;
};

// Random-k's positions: the offsets (ascending) that a randk spec keeps of n elements when its
// encode is passed RoundingKey{seed}: sparse_layout(spec, n).kept of them into `out`, the same
// elements the encoder keeps. Lets a caller run its own schedule over the kept elements (the
// owner all-reduce on shared positions, docs/sparse.md). kInvalidArgument for other specs.
LOWCOMM_API Status randk_positions(const CodecSpec& spec, uint64_t n, uint64_t seed, uint64_t* out,
                                   CpuOptions opts = {});

// All functions below: `n` elements of `dtype` at `x`/`out`; `codes` holds `codes_bytes` bytes,
// at least encoded_size(spec, n), 4-byte aligned (passthrough: wire-dtype aligned). Tensors are
// aligned to their element size. Buffers must not overlap unless stated.

// codes = Q(x)
LOWCOMM_API Status encode(const CodecSpec& spec, DType dtype, const void* x, uint64_t n,
                          void* codes, uint64_t codes_bytes, RoundingKey key = {},
                          CpuOptions opts = {});
// out = D(codes)
LOWCOMM_API Status decode(const CodecSpec& spec, const void* codes, uint64_t codes_bytes,
                          uint64_t n, DType dtype, void* out, CpuOptions opts = {});
// out += D(codes), accumulated in fp32 and rounded once to dtype
LOWCOMM_API Status decode_accumulate(const CodecSpec& spec, const void* codes, uint64_t codes_bytes,
                                     uint64_t n, DType dtype, void* out, CpuOptions opts = {});
// Error feedback, one pass: y = x + residual; codes = Q(y); residual = β·(y - D(codes)) with
// β = spec.ef_decay. residual is fp32, n elements, updated in place.
// Random-k draws its positions from key.seed (not from the rank: every rank must pass the same
// seed to select the same positions) and each chunk's index in this call (key.offset is not
// used); the message carries the seed, so decodes need no key.
LOWCOMM_API Status encode_error_feedback(const CodecSpec& spec, DType dtype, const void* x,
                                         float* residual, uint64_t n, void* codes,
                                         uint64_t codes_bytes, RoundingKey key = {},
                                         CpuOptions opts = {});
// AQ-SGD sender: codes = Q(a - m); m += D(codes). m has a's dtype, updated in place. Dense
// codecs only (as decode_delta).
LOWCOMM_API Status encode_delta(const CodecSpec& spec, DType dtype, const void* a, void* m,
                                uint64_t n, void* codes, uint64_t codes_bytes, RoundingKey key = {},
                                CpuOptions opts = {});
// AQ-SGD receiver: m += D(codes); out = m. out may be null; it must not alias m (a non-finite
// group resets m to 0 and writes NaN to out, which one buffer cannot hold).
LOWCOMM_API Status decode_delta(const CodecSpec& spec, const void* codes, uint64_t codes_bytes,
                                uint64_t n, DType dtype, void* m, void* out, CpuOptions opts = {});

}  // namespace lowcomm
