// The sparse codecs (topk, randk) on the CPU: encode, encode with error feedback, decode and
// decode-accumulate, chunk by chunk over the codec pool (sparse_format.h has the format and the
// element rules). The scalar statement of each step below is the reference; where the tensor is
// fp32 and the CPU has AVX2, the passes over every element (load and keys, threshold counts,
// selection, the residual) take sparse_avx2.cc's kernels, which compute the same values, so the
// bytes do not depend on the path or the thread count.
//
// Per chunk, encode: y = x (+ r); keys; T = the k-th largest key (a walk down the keys' top 8
// bits, four thresholds per pass, then nth_element over the one bin that holds T); the kept
// offsets in increasing order; lo/hi, positions and value codes; then the residual
// r = β·(y - D(codes)) (β·y where nothing was kept; 0 for a non-finite chunk).
// Decode checks the positions a message carries (in range, increasing, exactly k) and fails
// with kCorruptData, writing nothing of that chunk, when they are not.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "codec/cpu_kernels.h"
#include "codec/element_io.h"
#include "codec/sparse_avx2.h"
#include "codec/sparse_format.h"
#include "core/thread_pool.h"

namespace lowcomm::cpu {
namespace {

constexpr uint64_t kTaskElements = uint64_t{1} << 16;
constexpr int kWalkPasses = 8;  // then a histogram finds T's bin

// Per-thread chunk buffers, kept across calls (allocating and zeroing them per task cost as
// much as a pass over the input). Plain arrays, never read before written.
struct Scratch {
  std::unique_ptr<float[]> y, res;
  std::unique_ptr<uint32_t[]> key, cand, sel;
  uint32_t size = 0;
  void reserve(uint32_t chunk) {
    if (chunk <= size) return;
    y.reset(new float[chunk]);
    res.reset(new float[chunk]);
    key.reset(new uint32_t[chunk]);
    cand.reset(new uint32_t[chunk + 8]);  // sparse_avx2::collect writes 8 lanes at a time
    sel.reset(new uint32_t[chunk]);
    size = chunk;
  }
};

Scratch& thread_scratch(uint32_t chunk) {
  thread_local Scratch s;
  s.reserve(chunk);
  return s;
}

struct Threshold {
  uint32_t t = 0;     // the k-th largest key
  uint32_t ties = 0;  // keys equal to t that are kept (the lowest offsets)
};

// Reference: nth_element over all keys.
Threshold threshold_scalar(const uint32_t* key, uint32_t len, uint32_t k, uint32_t* cand) {
  std::copy(key, key + len, cand);
  std::nth_element(cand, cand + (k - 1), cand + len, std::greater<uint32_t>());
  Threshold th{cand[k - 1], 0};
  uint32_t above = 0;
  for (uint32_t i = 0; i < len; ++i) above += key[i] > th.t ? 1u : 0u;
  th.ties = k - above;
  return th;
}

// Fast: find the bin of the top 8 key bits that holds T, then its sub-bin of the next 4 bits,
// then select inside that.
Threshold threshold_fast(const uint32_t* key, uint32_t len, uint32_t k, uint32_t max_key,
                         uint32_t* cand) {
  uint32_t bin = max_key >> 23;  // keys < 2^31: bins 0..255
  uint32_t above = 0;            // keys in bins above `bin`
  bool found = false;
  for (int pass = 0; pass < kWalkPasses && !found; ++pass) {
    uint32_t t[4], c[4];
    for (int j = 0; j < 4; ++j) {
      int b = static_cast<int>(bin) - j;
      t[j] = b > 0 ? static_cast<uint32_t>(b) << 23 : 0u;
    }
    sparse_avx2::count_ge4(key, len, t, c);
    for (int j = 0; j < 4; ++j) {
      if (c[j] >= k) {
        bin = bin >= static_cast<uint32_t>(j) ? bin - static_cast<uint32_t>(j) : 0u;
        found = true;
        break;
      }
      above = c[j];
    }
    if (!found) bin -= 4;  // c[3] < k: bin - 3 > 0, since count(key >= 0) = len >= k
  }
  if (!found) {
    uint32_t hist[256] = {};
    for (uint32_t i = 0; i < len; ++i) ++hist[key[i] >> 23];
    above = 0;
    for (bin = 255; bin > 0 && above + hist[bin] < k; --bin) above += hist[bin];
  }
  const uint32_t lo = bin << 23;
  const uint64_t hi = (static_cast<uint64_t>(bin) + 1) << 23;
  uint32_t n = sparse_avx2::collect(key, len, lo, hi, cand);
  // Inside the bin, the next 4 key bits narrow the candidates 16-fold before nth_element.
  uint32_t sub[16] = {};
  for (uint32_t i = 0; i < n; ++i) ++sub[(cand[i] >> 19) & 15u];
  uint32_t s = 15;
  for (; s > 0 && above + sub[s] < k; --s) above += sub[s];
  uint32_t m = 0;
  for (uint32_t i = 0; i < n; ++i)
    if (((cand[i] >> 19) & 15u) == s) cand[m++] = cand[i];
  const uint32_t r = k - above;  // 1..m
  std::nth_element(cand, cand + (r - 1), cand + m, std::greater<uint32_t>());
  Threshold th{cand[r - 1], 0};
  uint32_t gt = above;
  for (uint32_t i = 0; i < m; ++i) gt += cand[i] > th.t ? 1u : 0u;
  th.ties = k - gt;
  return th;
}

uint32_t select_scalar(const uint32_t* key, uint32_t len, Threshold th, uint32_t* sel) {
  uint32_t n = 0, ties = th.ties;
  for (uint32_t i = 0; i < len; ++i) {
    if (key[i] > th.t) {
      sel[n++] = i;
    } else if (key[i] == th.t && ties > 0) {
      sel[n++] = i;
      --ties;
    }
  }
  return n;
}

class SparseRun {
 public:
  SparseRun(const CodecJob& job, const CpuOptions& opts)
      : job_(job),
        fast_(opts.simd && avx2_supported()),
        topk_(job.spec.kind == CodecKind::kTopk),
        chunk_(job.spec.block),
        chunks_((job.n + chunk_ - 1) / chunk_) {}

  Status run(const CpuOptions& opts) {
    if (job_.n == 0) return Status::ok();
    if (!topk_) {
      if (is_encode(job_.op)) {
        seed_ = job_.key.seed;
        for (int b = 0; b < 8; ++b) job_.payload[b] = static_cast<uint8_t>(seed_ >> (8 * b));
      } else {
        seed_ = 0;
        for (int b = 0; b < 8; ++b) seed_ |= static_cast<uint64_t>(job_.payload[b]) << (8 * b);
      }
    }
    const uint64_t per_task = std::max<uint64_t>(1, kTaskElements / chunk_);
    const uint64_t tasks = (chunks_ + per_task - 1) / per_task;
    ThreadPool::global().parallel_for(tasks, opts.threads, [&](uint64_t t) {
      Scratch& s = thread_scratch(chunk_);
      const uint64_t c1 = std::min(chunks_, (t + 1) * per_task);
      for (uint64_t c = t * per_task; c < c1; ++c) {
        Status st = is_encode(job_.op) ? encode_chunk(c, s) : decode_chunk(c, s);
        if (!st.is_ok()) {
          std::lock_guard<std::mutex> lock(mu_);
          if (error_.is_ok() || c < error_chunk_) {  // the first chunk's error, whatever the order
            error_ = st;
            error_chunk_ = c;
          }
          return;
        }
      }
    });
    return error_;
  }

 private:
  sparse::ChunkLayout layout(uint64_t c) const {
    return sparse::chunk_layout(job_.spec.kind, job_.spec.keep, chunk_, job_.spec.bits, job_.n, c);
  }

  bool fp32_fast() const { return fast_ && job_.dtype == DType::kFloat32; }

  // y (into `y`, which may be the residual r itself) and keys of chunk c; returns the largest
  // magnitude key.
  uint32_t load(uint64_t c, uint32_t len, float* r, float* y, Scratch& s) const {
    const uint64_t begin = c * chunk_;
    const uint32_t salt = topk_ ? 0u : sparse::randk_salt(seed_, c);
    if (fp32_fast()) {
      return sparse_avx2::load_fp32(static_cast<const float*>(job_.x) + begin, r, len, y,
                                    s.key.get(), topk_, salt);
    }
    uint32_t max_key = 0;
    with_dtype(job_.dtype, [&]<DType D>() {
      for (uint32_t i = 0; i < len; ++i) {
        float v = ElementIO<D>::load(job_.x, begin + i);
        if (r) v = qm::add(v, r[i]);
        y[i] = v;
        uint32_t m = sparse::magnitude_key(v);
        max_key = std::max(max_key, m);
        s.key[i] = topk_ ? m : sparse::randk_key(salt, i);
      }
    });
    return max_key;
  }

  uint32_t choose(uint32_t len, uint32_t k, uint32_t max_key, Scratch& s) const {
    // randk's largest key is not the largest magnitude: the walk starts at the top bin.
    const uint32_t top = topk_ ? max_key : 0x7FFFFFFFu;
    if (fast_) {
      Threshold th = threshold_fast(s.key.get(), len, k, top, s.cand.get());
      return sparse_avx2::select(s.key.get(), len, th.t, th.ties, s.sel.get());
    }
    Threshold th = threshold_scalar(s.key.get(), len, k, s.cand.get());
    return select_scalar(s.key.get(), len, th, s.sel.get());
  }

  Status encode_chunk(uint64_t c, Scratch& s) {
    const sparse::ChunkLayout l = layout(c);
    const uint64_t begin = c * chunk_;
    float* r =
        job_.op == CodecOp::kEncodeFeedback ? static_cast<float*>(job_.state) + begin : nullptr;
    // The AVX2 path writes y over the residual it was computed from (one pass over memory
    // fewer); elements not kept then already hold their residual when β = 1.
    const bool in_place = r && fp32_fast();
    float* y = in_place ? r : s.y.get();
    const uint32_t max_key = load(c, l.len, r, y, s);
    const bool finite = max_key < sparse::kInfKey;
    const uint32_t kept = choose(l.len, l.k, max_key, s);
    if (kept != l.k) return internal_error("sparse encode kept " + std::to_string(kept));
    const uint32_t* sel = s.sel.get();

    uint8_t* rec = job_.payload + l.offset;
    std::memset(rec, 0, l.end - l.offset);
    float lo = qm::bits_f32(qm::kCanonicalNanF32), hi = lo;
    if (finite) {
      lo = qm::abs_f(y[sel[0]]);
      hi = lo;
      for (uint32_t j = 1; j < kept; ++j) {
        float m = qm::abs_f(y[sel[j]]);
        lo = m < lo ? m : lo;
        hi = m > hi ? m : hi;
      }
    }
    std::memcpy(rec, &lo, 4);
    std::memcpy(rec + 4, &hi, 4);
    uint8_t* idx = job_.payload + l.index;
    if (topk_) {
      if (l.bitmap) {
        for (uint32_t j = 0; j < kept; ++j) idx[sel[j] >> 3] |= uint8_t(1u << (sel[j] & 7));
      } else {
        const int ob = static_cast<int>(sparse::offset_bits(chunk_));
        for (uint32_t j = 0; j < kept; ++j) sparse::put_bits(idx, uint64_t{j} * ob, sel[j], ob);
      }
    }
    const sparse::ValueGrid grid = sparse::value_grid(lo, hi, job_.spec.bits);
    uint8_t* vals = job_.payload + l.values;
    const int bits = job_.spec.bits;
    const float decay = job_.spec.ef_decay;
    float* res = s.res.get();  // the kept elements' residuals, written after the others'
    for (uint32_t j = 0; j < kept; ++j) {
      const float v = y[sel[j]];
      const uint32_t code = sparse::value_code(v, grid);
      sparse::put_bits(vals, uint64_t{j} * bits, code, bits);
      if (r) res[j] = sparse::residual(v, sparse::value_of(code, grid), decay, finite);
    }
    if (!r) return Status::ok();
    if (!finite) {
      std::memset(r, 0, sizeof(float) * l.len);
      return Status::ok();
    }
    if (fp32_fast()) {
      if (decay != 1.0f) sparse_avx2::scale(r, r, l.len, decay);  // β·y, exact as β·(y - 0)
    } else {
      for (uint32_t i = 0; i < l.len; ++i) r[i] = sparse::residual(y[i], 0.0f, decay, true);
    }
    for (uint32_t j = 0; j < kept; ++j) r[sel[j]] = res[j];
    return Status::ok();
  }

  Status corrupt(uint64_t c, const std::string& what) const {
    return corrupt_data(std::string(job_.spec.kind == CodecKind::kTopk ? "topk" : "randk") +
                        " message, chunk " + std::to_string(c) + ": " + what);
  }

  // The kept offsets of chunk c as the message states them.
  Status positions(uint64_t c, const sparse::ChunkLayout& l, Scratch& s) const {
    const uint8_t* idx = job_.payload + l.index;
    if (!topk_) {
      const uint32_t salt = sparse::randk_salt(seed_, c);
      if (fast_) {
        sparse_avx2::randk_keys(salt, l.len, s.key.get());
      } else {
        for (uint32_t i = 0; i < l.len; ++i) s.key[i] = sparse::randk_key(salt, i);
      }
      uint32_t kept = choose(l.len, l.k, 0, s);
      return kept == l.k ? Status::ok() : internal_error("randk positions");
    }
    if (l.bitmap) {
      uint32_t n = 0;
      for (uint64_t b = 0; b < sparse::bitmap_bytes(l.len); ++b) {
        uint32_t byte = idx[b];
        while (byte) {
          uint32_t p = static_cast<uint32_t>(b * 8) + static_cast<uint32_t>(__builtin_ctz(byte));
          byte &= byte - 1;
          if (p >= l.len)
            return corrupt(c, "bitmap marks offset " + std::to_string(p) + " past the chunk's " +
                                  std::to_string(l.len));
          if (n == l.k) return corrupt(c, "bitmap marks more than " + std::to_string(l.k));
          s.sel[n++] = p;
        }
      }
      if (n != l.k)
        return corrupt(
            c, "bitmap marks " + std::to_string(n) + " of " + std::to_string(l.k) + " offsets");
      return Status::ok();
    }
    const int ob = static_cast<int>(sparse::offset_bits(chunk_));
    for (uint32_t j = 0; j < l.k; ++j) {
      uint32_t p = sparse::get_bits(idx, uint64_t{j} * ob, ob);
      if (p >= l.len)
        return corrupt(c, "offset " + std::to_string(p) + " past the chunk's " +
                              std::to_string(l.len) + " elements");
      if (j > 0 && p <= s.sel[j - 1])
        return corrupt(c, "offsets not increasing (" + std::to_string(s.sel[j - 1]) + ", " +
                              std::to_string(p) + ")");
      s.sel[j] = p;
    }
    return Status::ok();
  }

  Status decode_chunk(uint64_t c, Scratch& s) {
    const sparse::ChunkLayout l = layout(c);
    LOWCOMM_CHECK(positions(c, l, s));
    const uint64_t es = dtype_size(job_.dtype);
    if (job_.op == CodecOp::kDecodeAccumulate) {
      // The kept elements are scattered over the chunk: start their loads now, while the
      // values are decoded.
      const auto* base = static_cast<const uint8_t*>(job_.out) + c * chunk_ * es;
      for (uint32_t j = 0; j < l.k; ++j) __builtin_prefetch(base + s.sel[j] * es, 1);
    }
    const uint8_t* rec = job_.payload + l.offset;
    float lo, hi;
    std::memcpy(&lo, rec, 4);
    std::memcpy(&hi, rec + 4, 4);
    // An encoder writes both NaN (a non-finite chunk) or 0 <= lo <= hi, finite.
    const bool both_nan = qm::is_nan(lo) && qm::is_nan(hi);
    if (!both_nan && !(qm::is_finite(lo) && qm::is_finite(hi) && lo >= 0.0f && lo <= hi))
      return corrupt(c, "scale record (lo " + std::to_string(lo) + ", hi " + std::to_string(hi) +
                            ") is not 0 <= lo <= hi");
    const sparse::ValueGrid grid = sparse::value_grid(lo, hi, job_.spec.bits);
    const uint8_t* vals = job_.payload + l.values;
    const int bits = job_.spec.bits;
    const uint64_t begin = c * chunk_;
    with_dtype(job_.dtype, [&]<DType D>() {
      using IO = ElementIO<D>;
      if (job_.op == CodecOp::kDecode) {
        if (D == DType::kFloat32) {
          std::memset(static_cast<float*>(job_.out) + begin, 0, sizeof(float) * l.len);
        } else {
          for (uint32_t i = 0; i < l.len; ++i) IO::store(job_.out, begin + i, 0.0f);
        }
      }
      // The chunk's 2^b values, computed once when there are fewer of them than kept elements.
      float table[256];
      const uint32_t codes = 1u << bits;
      const bool tabled = codes <= l.k;
      if (tabled)
        for (uint32_t code = 0; code < codes; ++code) table[code] = sparse::value_of(code, grid);
      for (uint32_t j = 0; j < l.k; ++j) {
        const uint32_t code = sparse::get_bits(vals, uint64_t{j} * bits, bits);
        const float v = tabled ? table[code] : sparse::value_of(code, grid);
        const uint64_t i = begin + s.sel[j];
        IO::store(job_.out, i, job_.op == CodecOp::kDecode ? v : qm::add(IO::load(job_.out, i), v));
      }
    });
    return Status::ok();
  }

  const CodecJob& job_;
  const bool fast_;
  const bool topk_;
  const uint32_t chunk_;
  const uint64_t chunks_;
  uint64_t seed_ = 0;
  std::mutex mu_;
  Status error_ = Status::ok();
  uint64_t error_chunk_ = 0;
};

}  // namespace

Status sparse_run(const CodecJob& job, const CpuOptions& opts) {
  return SparseRun(job, opts).run(opts);
}

Status randk_positions(const CodecSpec& spec, uint64_t n, uint64_t seed, uint64_t* out,
                       const CpuOptions& opts) {
  if (n == 0) return Status::ok();
  const bool fast = opts.simd && avx2_supported();
  const uint32_t chunk = spec.block;
  const uint64_t chunks = (n + chunk - 1) / chunk;
  const uint64_t per_task = std::max<uint64_t>(1, kTaskElements / chunk);
  const uint64_t tasks = (chunks + per_task - 1) / per_task;
  std::atomic<bool> wrong{false};
  ThreadPool::global().parallel_for(tasks, opts.threads, [&](uint64_t t) {
    Scratch& s = thread_scratch(chunk);
    const uint64_t c1 = std::min(chunks, (t + 1) * per_task);
    for (uint64_t c = t * per_task; c < c1; ++c) {
      // The encoder's own steps (SparseRun::positions): keys from the salt, the k largest.
      const sparse::ChunkLayout l =
          sparse::chunk_layout(spec.kind, spec.keep, chunk, spec.bits, n, c);
      const uint32_t salt = sparse::randk_salt(seed, c);
      if (fast) {
        sparse_avx2::randk_keys(salt, l.len, s.key.get());
      } else {
        for (uint32_t i = 0; i < l.len; ++i) s.key[i] = sparse::randk_key(salt, i);
      }
      uint32_t kept = 0;
      if (fast) {
        Threshold th = threshold_fast(s.key.get(), l.len, l.k, 0x7FFFFFFFu, s.cand.get());
        kept = sparse_avx2::select(s.key.get(), l.len, th.t, th.ties, s.sel.get());
      } else {
        kept = select_scalar(s.key.get(), l.len,
                             threshold_scalar(s.key.get(), l.len, l.k, s.cand.get()), s.sel.get());
      }
      if (kept != l.k) {
        wrong = true;
        return;
      }
      // Chunk c's kept elements start after every earlier chunk's (each full chunk keeps k).
      uint64_t* dst = out + c * spec.keep;
      for (uint32_t j = 0; j < kept; ++j) dst[j] = c * chunk + s.sel[j];
    }
  });
  return wrong ? internal_error("randk positions") : Status::ok();
}

}  // namespace lowcomm::cpu
