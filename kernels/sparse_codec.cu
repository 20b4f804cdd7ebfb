// The sparse codecs (topk, randk) on a CUDA device: every op of sparse_cpu.cc, with its bytes.
// sparse_format.h states the format and the element rules; the kernels call its functions for
// every key, code, value and residual, so host and device compute them alike.
//
// One block of 256 threads per chunk (grid-stride over the chunks). Encode, per chunk:
//   1. y = x (+ r) and the chunk's largest magnitude key (a non-finite chunk has one >= Inf's).
//      y stays in shared memory when the chunk and its record fit the default 48 KiB; larger
//      chunks recompute it from x (and r) at each pass, the same operations on the same bits.
//   2. T, the k-th largest key: a radix select, four passes over 8-bit digits with a shared
//      histogram, which also yields `ties`, the keys equal to T that are kept (k less those
//      above T).
//   3. The selection in offset order, a tile of 256 offsets at a time: warp ballots count the
//      keys above T and equal to T before each offset; it is kept when above T or among the
//      first `ties` equal ones, and its slot is above-before + min(equal-before, ties), its
//      index in the CPU's increasing sel[].
//   4. lo/hi: for topk the kept magnitudes are the keys >= T (finite chunk: key = |y|'s bits),
//      so lo is T and hi the chunk's largest key; for randk a min/max over the kept.
//   5. The record (lo, hi, positions, codes) is assembled in zeroed shared memory, fields ORed
//      in at the bit positions put_bits uses, and copied out whole: every byte written, as the
//      CPU's memset and ORs. The residual of an element is written by the thread that read it.
// Decode, per chunk: the positions (randk: the same selection over the hashes; topk: offset j
// read by thread j, or the bitmap, scanned like the selection) and the scale record (both NaN,
// or 0 <= lo <= hi finite) are checked as the CPU checks them before anything of the chunk is
// written. A bad chunk writes nothing and lowers the first-bad-chunk word (atomicMin); a decode
// synchronises the stream to read it and, for a bad message, reads that chunk's record back to
// state the CPU's own kCorruptData message. Encodes do not wait for the device.

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "codec/sparse_format.h"
#include "codec_launch.h"
#include "cuda_check.h"
#include "encode_step.cuh"

namespace lowcomm::cuda {
namespace {

constexpr uint32_t kThreads = LaunchPolicy::kThreads;
static_assert(kThreads == 256, "the radix select gives each thread one of 256 digits");
constexpr uint32_t kWarps = kThreads / LaunchPolicy::kWarp;
constexpr uint32_t kAllLanes = 0xFFFFFFFFu;
constexpr uint32_t kNoDigit = 0xFFFFFFFFu;
// Dynamic shared memory a launch may take without opting in: 48 KiB less BlockState's.
constexpr size_t kDefaultDynamicSmem = 46 * 1024;
constexpr unsigned long long kNoBadChunk = ~0ull;

struct SparseArgs {
  const void* x;                  // encode input
  float* residual;                // error feedback's, fp32
  void* out;                      // decode output
  uint8_t* payload;               // the message (header, then one record per chunk)
  unsigned long long* bad_chunk;  // decode: the lowest chunk whose record is malformed
  uint64_t n;
  uint64_t chunks;
  uint64_t seed;          // randk encode: the position seed (the RoundingKey's)
  uint32_t chunk;         // C
  uint32_t keep;          // K
  uint32_t record_words;  // encode: staging words, a full record and one more
  int bits;               // value bits
  float decay;            // error feedback's β
};

// A block's shared bookkeeping; every helper below leaves it free for the next (it ends on a
// barrier after its last read).
struct BlockState {
  uint32_t hist[256];
  uint32_t warp_counts[2][kWarps];
  uint32_t warp_vals[kWarps];
  uint32_t digit;
  uint32_t rank;
};

struct Threshold {
  uint32_t t = 0;     // the k-th largest key
  uint32_t ties = 0;  // keys equal to t that are kept (the lowest offsets)
};

LC_DEV uint32_t lane_id() {
  return threadIdx.x & (LaunchPolicy::kWarp - 1);
}
LC_DEV uint32_t warp_id() {
  return threadIdx.x / LaunchPolicy::kWarp;
}

enum class Reduce { kSum, kMin, kMax };

// v reduced over the block, returned to every thread.
template <Reduce R>
LC_DEV uint32_t block_reduce(uint32_t v, BlockState& s) {
  if constexpr (R == Reduce::kSum) {
    v = __reduce_add_sync(kAllLanes, v);
  } else if constexpr (R == Reduce::kMin) {
    v = __reduce_min_sync(kAllLanes, v);
  } else {
    v = __reduce_max_sync(kAllLanes, v);
  }
  if (lane_id() == 0) s.warp_vals[warp_id()] = v;
  __syncthreads();
  uint32_t r = s.warp_vals[0];
  for (uint32_t w = 1; w < kWarps; ++w) {
    const uint32_t u = s.warp_vals[w];
    if constexpr (R == Reduce::kSum) {
      r += u;
    } else if constexpr (R == Reduce::kMin) {
      r = u < r ? u : r;
    } else {
      r = u > r ? u : r;
    }
  }
  __syncthreads();
  return r;
}

// The sum of v over threads 0..threadIdx.x.
LC_DEV uint32_t inclusive_sum(uint32_t v, BlockState& s) {
  const uint32_t lane = lane_id();
#pragma unroll
  for (uint32_t d = 1; d < LaunchPolicy::kWarp; d <<= 1) {
    const uint32_t u = __shfl_up_sync(kAllLanes, v, d);
    if (lane >= d) v += u;
  }
  if (lane == LaunchPolicy::kWarp - 1) s.warp_vals[warp_id()] = v;
  __syncthreads();
  for (uint32_t w = 0; w < warp_id(); ++w) v += s.warp_vals[w];
  __syncthreads();
  return v;
}

// Threads below this one whose a (b) holds, and the block's totals.
struct Counts {
  uint32_t a_before, b_before, a_total, b_total;
};

LC_DEV Counts count_before(bool a, bool b, BlockState& s) {
  const uint32_t lane = lane_id(), warp = warp_id();
  const uint32_t ma = __ballot_sync(kAllLanes, a), mb = __ballot_sync(kAllLanes, b);
  if (lane == 0) {
    s.warp_counts[0][warp] = static_cast<uint32_t>(__popc(ma));
    s.warp_counts[1][warp] = static_cast<uint32_t>(__popc(mb));
  }
  __syncthreads();
  const uint32_t below = (1u << lane) - 1u;
  Counts c{static_cast<uint32_t>(__popc(ma & below)), static_cast<uint32_t>(__popc(mb & below)), 0,
           0};
  for (uint32_t w = 0; w < kWarps; ++w) {
    const uint32_t ca = s.warp_counts[0][w], cb = s.warp_counts[1][w];
    if (w < warp) {
      c.a_before += ca;
      c.b_before += cb;
    }
    c.a_total += ca;
    c.b_total += cb;
  }
  __syncthreads();
  return c;
}

// T, the k-th largest of the keys key_of(0..len) (all below 2^31), and the ties kept: a radix
// select from the top digit down, keeping the keys that match the digits found so far.
template <typename KeyFn>
LC_DEV Threshold kth_largest(BlockState& s, uint32_t len, uint32_t k, KeyFn key_of) {
  uint32_t prefix = 0, mask = 0, rank = k;  // rank: T's place among the matching keys, from 1
  for (int shift = 24; shift >= 0; shift -= 8) {
    s.hist[threadIdx.x] = 0;
    __syncthreads();
    for (uint32_t i0 = 0; i0 < len; i0 += kThreads) {  // whole warps: the match below
      const uint32_t i = i0 + threadIdx.x;
      uint32_t digit = kNoDigit;
      if (i < len) {
        const uint32_t key = key_of(i);
        if ((key & mask) == prefix) digit = (key >> shift) & 0xFFu;
      }
      // One shared add per distinct digit of the warp (ties and zero runs share one bin).
      const uint32_t peers = __match_any_sync(kAllLanes, digit);
      if (digit != kNoDigit && lane_id() == static_cast<uint32_t>(__ffs(peers) - 1))
        atomicAdd(&s.hist[digit], static_cast<uint32_t>(__popc(peers)));
    }
    __syncthreads();
    // Thread t holds digit 255 - t; its inclusive sum counts the matching keys at or above it.
    const uint32_t d = 255u - threadIdx.x;
    const uint32_t count = s.hist[d];
    const uint32_t at_or_above = inclusive_sum(count, s);
    const uint32_t above = at_or_above - count;
    if (above < rank && rank <= at_or_above) {  // exactly one digit: rank <= matching keys
      s.digit = d;
      s.rank = rank - above;
    }
    __syncthreads();
    prefix |= s.digit << shift;
    mask |= 0xFFu << shift;
    rank = s.rank;
  }
  return Threshold{prefix, rank};
}

// Calls visit(i, kept, slot) for every offset i < len (thread t: offsets t, t + 256, ...):
// kept as the CPU's selection (keys above T, then the first `ties` equal to T in offset
// order), slot the kept offsets below i. Every thread of the block must call it.
template <typename KeyFn, typename Visit>
LC_DEV void for_each_selected(BlockState& s, uint32_t len, Threshold th, KeyFn key_of,
                              Visit visit) {
  uint32_t gt_base = 0, eq_base = 0;
  for (uint32_t i0 = 0; i0 < len; i0 += kThreads) {
    const uint32_t i = i0 + threadIdx.x;
    const uint32_t key = i < len ? key_of(i) : 0u;
    const bool gt = i < len && key > th.t, eq = i < len && key == th.t;
    const Counts c = count_before(gt, eq, s);
    const uint32_t eq_before = eq_base + c.b_before;
    if (i < len) {
      visit(i, gt || (eq && eq_before < th.ties),
            gt_base + c.a_before + (eq_before < th.ties ? eq_before : th.ties));
    }
    gt_base += c.a_total;
    eq_base += c.b_total;
  }
}

// Calls visit(i, marked, slot) for every offset i < len of a topk bitmap: slot is the marked
// offsets below i. Every thread of the block must call it.
template <typename Visit>
LC_DEV void for_each_marked(BlockState& s, uint32_t len, const uint8_t* bitmap, Visit visit) {
  uint32_t base = 0;
  for (uint32_t i0 = 0; i0 < len; i0 += kThreads) {
    const uint32_t i = i0 + threadIdx.x;
    const bool marked = i < len && ((bitmap[i >> 3] >> (i & 7u)) & 1u) != 0;
    const Counts c = count_before(marked, false, s);
    if (i < len) visit(i, marked, base + c.a_before);
    base += c.a_total;
  }
}

// put_bits on shared 32-bit words (little-endian, as the bytes put_bits ORs), for concurrent
// writers of one record: fields of at most 16 bits, so at most two words.
LC_DEV void or_bits(uint32_t* words, uint32_t bit, uint32_t v, uint32_t nbits) {
  const uint32_t w = bit >> 5, shift = bit & 31u;
  atomicOr(&words[w], v << shift);
  if (shift + nbits > 32) atomicOr(&words[w + 1], v >> (32 - shift));
}

// Copies the `bytes` bytes staged at rec (followed by at least one spare word) to dst, which
// need not be aligned: single bytes up to a 4-byte boundary and after the last whole word,
// whole words (funnel-shifted out of the staging words) in between. Only the record's own
// bytes are stored: the neighbouring records belong to other blocks.
LC_DEV void copy_record(uint8_t* dst, const uint32_t* rec, uint32_t bytes) {
  const uint8_t* src = reinterpret_cast<const uint8_t*>(rec);
  uint32_t head = static_cast<uint32_t>((4u - (reinterpret_cast<uintptr_t>(dst) & 3u)) & 3u);
  head = head < bytes ? head : bytes;
  for (uint32_t b = threadIdx.x; b < head; b += kThreads) dst[b] = src[b];
  const uint32_t words = (bytes - head) / 4;
  uint32_t* dw = reinterpret_cast<uint32_t*>(dst + head);
  for (uint32_t q = threadIdx.x; q < words; q += kThreads)
    dw[q] = head == 0 ? rec[q] : __funnelshift_r(rec[q], rec[q + 1], 8 * head);
  for (uint32_t b = head + 4 * words + threadIdx.x; b < bytes; b += kThreads) dst[b] = src[b];
}

LC_DEV uint32_t load_le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

// A scale record an encoder writes: both NaN (a non-finite chunk), or 0 <= lo <= hi, finite
// (sparse_cpu.cc's decode_chunk refuses any other).
LC_HD bool scale_record_ok(float lo, float hi) {
  const bool both_nan = qm::is_nan(lo) && qm::is_nan(hi);
  return both_nan || (qm::is_finite(lo) && qm::is_finite(hi) && lo >= 0.0f && lo <= hi);
}

template <DType D>
LC_DEV void store_element(void* base, uint64_t i, float v) {
  using E = Element<D>;
  static_cast<typename E::Bits*>(base)[i] = E::from_f32(v);
}

template <DType D, CodecOp Op, CodecKind Kind, bool SharedY>
__global__ void __launch_bounds__(kThreads) sparse_encode_kernel(SparseArgs a) {
  constexpr bool kTopk = Kind == CodecKind::kTopk;
  constexpr bool kFeedback = Op == CodecOp::kEncodeFeedback;
  __shared__ BlockState s;
  extern __shared__ uint32_t sparse_dynamic_smem[];
  uint32_t* rec = sparse_dynamic_smem;  // the record being assembled
  float* ys = reinterpret_cast<float*>(sparse_dynamic_smem + a.record_words);  // SharedY: y
  if (!kTopk && blockIdx.x == 0 && threadIdx.x == 0) {
    uint32_t* header = reinterpret_cast<uint32_t*>(a.payload);  // 4-byte aligned (job_check)
    header[0] = static_cast<uint32_t>(a.seed);
    header[1] = static_cast<uint32_t>(a.seed >> 32);
  }
  const uint32_t ob = sparse::offset_bits(a.chunk);
  const uint32_t bits = static_cast<uint32_t>(a.bits);
  for (uint64_t c = blockIdx.x; c < a.chunks; c += gridDim.x) {
    const sparse::ChunkLayout l = sparse::chunk_layout(Kind, a.keep, a.chunk, a.bits, a.n, c);
    const uint64_t begin = c * a.chunk;
    const uint32_t salt = kTopk ? 0u : sparse::randk_salt(a.seed, c);
    __syncthreads();  // the previous chunk's record and y are read out
    for (uint32_t w = threadIdx.x; w < a.record_words; w += kThreads) rec[w] = 0;
    auto y_of = [&](uint32_t i) -> float {
      if constexpr (SharedY) {
        return ys[i];
      } else {
        return load_source_element<D, Op>(a.x, a.residual, begin + i);
      }
    };
    auto key_of = [&](uint32_t i) -> uint32_t {
      if constexpr (kTopk) {
        return sparse::magnitude_key(y_of(i));
      } else {
        return sparse::randk_key(salt, i);
      }
    };

    // 1. y, and whether the chunk is finite.
    uint32_t max_key = 0;
    for (uint32_t i = threadIdx.x; i < l.len; i += kThreads) {
      const float y = load_source_element<D, Op>(a.x, a.residual, begin + i);
      if constexpr (SharedY) ys[i] = y;
      const uint32_t m = sparse::magnitude_key(y);
      max_key = m > max_key ? m : max_key;
    }
    max_key = block_reduce<Reduce::kMax>(max_key, s);
    const bool finite = max_key < sparse::kInfKey;

    // 2. T and the ties kept.
    const Threshold th = kth_largest(s, l.len, l.k, key_of);

    // 3. lo, hi: the smallest and largest kept |y| (canonical NaN for a non-finite chunk).
    uint32_t lo_bits = qm::kCanonicalNanF32, hi_bits = qm::kCanonicalNanF32;
    if (finite) {
      if constexpr (kTopk) {
        lo_bits = th.t;
        hi_bits = max_key;
      } else {
        uint32_t lo = 0xFFFFFFFFu, hi = 0;
        for_each_selected(s, l.len, th, key_of, [&](uint32_t i, bool kept, uint32_t) {
          if (kept) {
            const uint32_t m = qm::f32_bits(qm::abs_f(y_of(i)));
            lo = m < lo ? m : lo;
            hi = m > hi ? m : hi;
          }
        });
        lo_bits = block_reduce<Reduce::kMin>(lo, s);
        hi_bits = block_reduce<Reduce::kMax>(hi, s);
      }
    }
    const sparse::ValueGrid grid =
        sparse::value_grid(qm::bits_f32(lo_bits), qm::bits_f32(hi_bits), a.bits);

    // 4. Positions and codes into the record, the residual into r.
    const uint32_t index_bit = 8 * static_cast<uint32_t>(l.index - l.offset);
    const uint32_t value_bit = 8 * static_cast<uint32_t>(l.values - l.offset);
    const bool bitmap = l.bitmap;
    for_each_selected(s, l.len, th, key_of, [&](uint32_t i, bool kept, uint32_t slot) {
      const float y = y_of(i);
      float dec = 0.0f;
      if (kept) {
        const uint32_t code = sparse::value_code(y, grid);
        or_bits(rec, value_bit + slot * bits, code, bits);
        if constexpr (kTopk) {
          if (bitmap) {
            or_bits(rec, index_bit + i, 1u, 1);
          } else {
            or_bits(rec, index_bit + slot * ob, i, ob);
          }
        }
        if constexpr (kFeedback) dec = sparse::value_of(code, grid);
      }
      if constexpr (kFeedback) a.residual[begin + i] = sparse::residual(y, dec, a.decay, finite);
    });
    if (threadIdx.x == 0) {
      rec[0] = lo_bits;
      rec[1] = hi_bits;
    }
    __syncthreads();

    // 5. The record, every byte of it.
    copy_record(a.payload + l.offset, rec, static_cast<uint32_t>(l.end - l.offset));
  }
}

template <DType D, CodecOp Op, CodecKind Kind>
__global__ void __launch_bounds__(kThreads) sparse_decode_kernel(SparseArgs a) {
  constexpr bool kTopk = Kind == CodecKind::kTopk;
  __shared__ BlockState s;
  uint64_t seed = 0;
  if constexpr (!kTopk) {
    for (int b = 0; b < 8; ++b) seed |= static_cast<uint64_t>(a.payload[b]) << (8 * b);
  }
  const uint32_t ob = sparse::offset_bits(a.chunk);
  const uint32_t bits = static_cast<uint32_t>(a.bits);
  for (uint64_t c = blockIdx.x; c < a.chunks; c += gridDim.x) {
    const sparse::ChunkLayout l = sparse::chunk_layout(Kind, a.keep, a.chunk, a.bits, a.n, c);
    const uint64_t begin = c * a.chunk;
    __syncthreads();  // the previous chunk's bookkeeping is read
    const uint8_t* rec = a.payload + l.offset;
    const float lo = qm::bits_f32(load_le32(rec)), hi = qm::bits_f32(load_le32(rec + 4));
    const bool scales_ok = scale_record_ok(lo, hi);  // the same for every thread
    const sparse::ValueGrid grid = sparse::value_grid(lo, hi, a.bits);
    const uint8_t* idx = a.payload + l.index;
    const uint8_t* vals = a.payload + l.values;
    // Kept offset i, the slot-th: out = value, or out += value in the dtype's arithmetic.
    auto put = [&](uint32_t i, uint32_t slot) {
      const float v = sparse::value_of(sparse::get_bits(vals, uint64_t{slot} * bits, a.bits), grid);
      if constexpr (Op == CodecOp::kDecode) {
        store_element<D>(a.out, begin + i, v);
      } else {
        store_element<D>(a.out, begin + i, qm::add(load_element<D>(a.out, begin + i), v));
      }
    };
    // Offset i not kept: decode writes 0, accumulate leaves it.
    auto clear = [&](uint32_t i) {
      if constexpr (Op == CodecOp::kDecode) {
        store_element<D>(a.out, begin + i, 0.0f);
      } else {
        (void)i;
      }
    };

    if constexpr (!kTopk) {
      if (!scales_ok) {
        if (threadIdx.x == 0) atomicMin(a.bad_chunk, static_cast<unsigned long long>(c));
        continue;
      }
      const uint32_t salt = sparse::randk_salt(seed, c);
      auto key_of = [&](uint32_t i) { return sparse::randk_key(salt, i); };
      const Threshold th = kth_largest(s, l.len, l.k, key_of);
      for_each_selected(s, l.len, th, key_of, [&](uint32_t i, bool kept, uint32_t slot) {
        if (kept) {
          put(i, slot);
        } else {
          clear(i);
        }
      });
    } else if (l.bitmap) {
      // Exactly k bits marked, none past the chunk's end (only the last byte holds such bits).
      const uint32_t bytes = static_cast<uint32_t>(sparse::bitmap_bytes(l.len));
      const uint32_t tail = l.len & 7u;
      uint32_t marked = 0;
      bool bad = false;
      for (uint32_t b = threadIdx.x; b < bytes; b += kThreads) {
        const uint32_t byte = idx[b];
        marked += static_cast<uint32_t>(__popc(byte));
        if (b == bytes - 1 && tail != 0 && (byte >> tail) != 0) bad = true;
      }
      marked = block_reduce<Reduce::kSum>(marked, s);
      if (__syncthreads_or(bad || marked != l.k || !scales_ok)) {
        if (threadIdx.x == 0) atomicMin(a.bad_chunk, static_cast<unsigned long long>(c));
        continue;
      }
      for_each_marked(s, l.len, idx, [&](uint32_t i, bool kept, uint32_t slot) {
        if (kept) {
          put(i, slot);
        } else {
          clear(i);
        }
      });
    } else {
      // Offsets in range and strictly increasing.
      bool bad = false;
      for (uint32_t j = threadIdx.x; j < l.k; j += kThreads) {
        const uint32_t p = sparse::get_bits(idx, uint64_t{j} * ob, static_cast<int>(ob));
        if (p >= l.len) bad = true;
        if (j > 0 && p <= sparse::get_bits(idx, uint64_t{j - 1} * ob, static_cast<int>(ob)))
          bad = true;
      }
      if (__syncthreads_or(bad || !scales_ok)) {
        if (threadIdx.x == 0) atomicMin(a.bad_chunk, static_cast<unsigned long long>(c));
        continue;
      }
      if constexpr (Op == CodecOp::kDecode) {
        for (uint32_t i = threadIdx.x; i < l.len; i += kThreads) clear(i);
        __syncthreads();  // the zeros land before the values
      }
      for (uint32_t j = threadIdx.x; j < l.k; j += kThreads)
        put(sparse::get_bits(idx, uint64_t{j} * ob, static_cast<int>(ob)), j);
    }
  }
}

// ---- host side: plans, launches, the decode's verdict ----

struct EncodePlan {
  uint32_t record_words = 0;  // a full record, rounded up to words, and one spare word
  bool shared_y = false;      // y in shared memory
  size_t smem = 0;            // dynamic shared memory bytes
};

EncodePlan plan_encode(const CodecSpec& spec) {
  EncodePlan p;
  const sparse::ChunkLayout full =
      sparse::chunk_layout(spec.kind, spec.keep, spec.block, spec.bits, spec.block, 0);
  p.record_words = static_cast<uint32_t>((full.end - full.offset + 3) / 4 + 1);
  const size_t record = sizeof(uint32_t) * p.record_words;
  const size_t ys = sizeof(float) * spec.block;
  p.shared_y = record + ys <= kDefaultDynamicSmem;
  p.smem = record + (p.shared_y ? ys : 0);
  return p;
}

SparseArgs make_args(const CodecJob& job) {
  SparseArgs a{};
  a.x = job.x;
  a.residual = static_cast<float*>(job.state);
  a.out = job.out;
  a.payload = job.payload;
  a.n = job.n;
  a.chunk = job.spec.block;
  a.chunks = (job.n + a.chunk - 1) / a.chunk;
  a.seed = job.key.seed;
  a.keep = job.spec.keep;
  a.bits = job.spec.bits;
  a.decay = job.spec.ef_decay;
  return a;
}

uint32_t grid_blocks(uint64_t chunks) {
  return static_cast<uint32_t>(chunks < LaunchPolicy::kMaxBlocks ? chunks
                                                                 : LaunchPolicy::kMaxBlocks);
}

template <DType D, CodecOp Op, CodecKind K, bool SharedY>
cudaError_t launch_encode_kernel(const SparseArgs& a, const EncodePlan& p, cudaStream_t stream) {
  auto kernel = sparse_encode_kernel<D, Op, K, SharedY>;
  if (p.smem > kDefaultDynamicSmem) {  // large records (C of 16K and up): opt in
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(p.smem));
    if (err != cudaSuccess) return err;
  }
  kernel<<<grid_blocks(a.chunks), kThreads, p.smem, stream>>>(a);
  return cudaGetLastError();
}

template <DType D, CodecOp Op, CodecKind K>
cudaError_t launch_encode_kind(const SparseArgs& a, const EncodePlan& p, cudaStream_t stream) {
  return p.shared_y ? launch_encode_kernel<D, Op, K, true>(a, p, stream)
                    : launch_encode_kernel<D, Op, K, false>(a, p, stream);
}

template <DType D, CodecOp Op>
cudaError_t launch_encode_op(const CodecJob& job, const SparseArgs& a, const EncodePlan& p,
                             cudaStream_t stream) {
  return job.spec.kind == CodecKind::kTopk
             ? launch_encode_kind<D, Op, CodecKind::kTopk>(a, p, stream)
             : launch_encode_kind<D, Op, CodecKind::kRandk>(a, p, stream);
}

template <DType D>
cudaError_t launch_encode_dtype(const CodecJob& job, const SparseArgs& a, const EncodePlan& p,
                                cudaStream_t stream) {
  switch (job.op) {
    case CodecOp::kEncode:
      return launch_encode_op<D, CodecOp::kEncode>(job, a, p, stream);
    case CodecOp::kEncodeFeedback:
      return launch_encode_op<D, CodecOp::kEncodeFeedback>(job, a, p, stream);
    default:  // deltas: check_codec_job refused them
      break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_encode(const CodecJob& job, const SparseArgs& a, cudaStream_t stream) {
  const EncodePlan p = plan_encode(job.spec);
  SparseArgs args = a;
  args.record_words = p.record_words;
  switch (job.dtype) {
    case DType::kFloat32:
      return launch_encode_dtype<DType::kFloat32>(job, args, p, stream);
    case DType::kBFloat16:
      return launch_encode_dtype<DType::kBFloat16>(job, args, p, stream);
    case DType::kFloat16:
      return launch_encode_dtype<DType::kFloat16>(job, args, p, stream);
    default:  // not a codec dtype: check_codec_job refused it
      break;
  }
  return cudaErrorInvalidValue;
}

template <DType D, CodecOp Op>
cudaError_t launch_decode_op(const CodecJob& job, const SparseArgs& a, cudaStream_t stream) {
  const uint32_t blocks = grid_blocks(a.chunks);
  if (job.spec.kind == CodecKind::kTopk) {
    sparse_decode_kernel<D, Op, CodecKind::kTopk><<<blocks, kThreads, 0, stream>>>(a);
  } else {
    sparse_decode_kernel<D, Op, CodecKind::kRandk><<<blocks, kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <DType D>
cudaError_t launch_decode_dtype(const CodecJob& job, const SparseArgs& a, cudaStream_t stream) {
  switch (job.op) {
    case CodecOp::kDecode:
      return launch_decode_op<D, CodecOp::kDecode>(job, a, stream);
    case CodecOp::kDecodeAccumulate:
      return launch_decode_op<D, CodecOp::kDecodeAccumulate>(job, a, stream);
    default:  // deltas: check_codec_job refused them
      break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_decode(const CodecJob& job, const SparseArgs& a, cudaStream_t stream) {
  switch (job.dtype) {
    case DType::kFloat32:
      return launch_decode_dtype<DType::kFloat32>(job, a, stream);
    case DType::kBFloat16:
      return launch_decode_dtype<DType::kBFloat16>(job, a, stream);
    case DType::kFloat16:
      return launch_decode_dtype<DType::kFloat16>(job, a, stream);
    default:  // not a codec dtype: check_codec_job refused it
      break;
  }
  return cudaErrorInvalidValue;
}

Status launched(cudaError_t err, const char* what) {
  return err == cudaSuccess ? Status::ok() : cuda_status(err, what);
}

// What is wrong with a topk chunk's positions `idx` (copied from the device), in the words of
// sparse_cpu.cc's positions(); empty when nothing is.
std::string bad_positions(const sparse::ChunkLayout& l, uint32_t chunk, const uint8_t* idx) {
  if (l.bitmap) {
    uint32_t n = 0;
    for (uint64_t b = 0; b < sparse::bitmap_bytes(l.len); ++b) {
      uint32_t byte = idx[b];
      while (byte) {
        const uint32_t p =
            static_cast<uint32_t>(b * 8) + static_cast<uint32_t>(__builtin_ctz(byte));
        byte &= byte - 1;
        if (p >= l.len) {
          return "bitmap marks offset " + std::to_string(p) + " past the chunk's " +
                 std::to_string(l.len);
        }
        if (n == l.k) return "bitmap marks more than " + std::to_string(l.k);
        ++n;
      }
    }
    if (n != l.k) {
      return "bitmap marks " + std::to_string(n) + " of " + std::to_string(l.k) + " offsets";
    }
    return "";
  }
  const int ob = static_cast<int>(sparse::offset_bits(chunk));
  uint32_t prev = 0;
  for (uint32_t j = 0; j < l.k; ++j) {
    const uint32_t p = sparse::get_bits(idx, uint64_t{j} * ob, ob);
    if (p >= l.len) {
      return "offset " + std::to_string(p) + " past the chunk's " + std::to_string(l.len) +
             " elements";
    }
    if (j > 0 && p <= prev) {
      return "offsets not increasing (" + std::to_string(prev) + ", " + std::to_string(p) + ")";
    }
    prev = p;
  }
  return "";
}

// What is wrong with chunk c's record `rec` (lo, hi, then topk's positions; copied from the
// device), in sparse_cpu.cc's words and order: positions first, then the scale record.
std::string bad_record(const CodecSpec& spec, const sparse::ChunkLayout& l, const uint8_t* rec) {
  if (spec.kind == CodecKind::kTopk) {
    std::string what = bad_positions(l, spec.block, rec + (l.index - l.offset));
    if (!what.empty()) return what;
  }
  float lo, hi;
  std::memcpy(&lo, rec, 4);
  std::memcpy(&hi, rec + 4, 4);
  if (!scale_record_ok(lo, hi)) {
    return "scale record (lo " + std::to_string(lo) + ", hi " + std::to_string(hi) +
           ") is not 0 <= lo <= hi";
  }
  return "";
}

// The kCorruptData status of a message whose chunk c the kernel found malformed.
Status corrupt_chunk(const CodecJob& job, uint64_t c, cudaStream_t stream) {
  const sparse::ChunkLayout l =
      sparse::chunk_layout(job.spec.kind, job.spec.keep, job.spec.block, job.spec.bits, job.n, c);
  std::vector<uint8_t> rec(l.values - l.offset);
  LOWCOMM_CHECK_CUDA(cudaMemcpyAsync(rec.data(), job.payload + l.offset, rec.size(),
                                     cudaMemcpyDeviceToHost, stream));
  LOWCOMM_CHECK_CUDA(cudaStreamSynchronize(stream));
  std::string what = bad_record(job.spec, l, rec.data());
  if (what.empty()) what = "malformed record";
  return corrupt_data(std::string(job.spec.kind == CodecKind::kTopk ? "topk" : "randk") +
                      " message, chunk " + std::to_string(c) + ": " + what);
}

// One device word, stream-ordered: allocated, and freed after the work queued before the end
// of its scope.
class DeviceWord {
 public:
  DeviceWord() = default;
  DeviceWord(const DeviceWord&) = delete;
  DeviceWord& operator=(const DeviceWord&) = delete;
  ~DeviceWord() {
    // A failure here can only follow one the caller already sees; nothing better to do with it.
    if (ptr_ != nullptr) (void)cudaFreeAsync(ptr_, stream_);
  }
  Status allocate(cudaStream_t stream) {
    LOWCOMM_CHECK_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&ptr_), sizeof(*ptr_), stream));
    stream_ = stream;
    return Status::ok();
  }
  unsigned long long* get() const { return ptr_; }

 private:
  unsigned long long* ptr_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

Status enqueue_sparse(const CodecJob& job, cudaStream_t stream) {
  if (job.n == 0) return Status::ok();
  SparseArgs a = make_args(job);
  if (is_encode(job.op)) return launched(launch_encode(job, a, stream), "sparse encode launch");
  // Decodes: the kernel's verdict on the records, read back after a stream synchronisation.
  DeviceWord bad;
  LOWCOMM_CHECK(bad.allocate(stream));
  LOWCOMM_CHECK_CUDA(cudaMemsetAsync(bad.get(), 0xFF, sizeof(unsigned long long), stream));
  a.bad_chunk = bad.get();
  LOWCOMM_CHECK(launched(launch_decode(job, a, stream), "sparse decode launch"));
  unsigned long long first_bad = kNoBadChunk;
  LOWCOMM_CHECK_CUDA(
      cudaMemcpyAsync(&first_bad, bad.get(), sizeof(first_bad), cudaMemcpyDeviceToHost, stream));
  LOWCOMM_CHECK_CUDA(cudaStreamSynchronize(stream));
  if (first_bad == kNoBadChunk) return Status::ok();
  return corrupt_chunk(job, first_bad, stream);
}

}  // namespace lowcomm::cuda
