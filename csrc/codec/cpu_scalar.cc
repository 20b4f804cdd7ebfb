// The portable CPU path: a direct, element-at-a-time statement of every codec operation. It is
// the reference the AVX2 path and the CUDA kernels must match byte for byte.

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "codec/cpu_kernels.h"
#include "codec/element_io.h"
#include "codec/group_math.h"

namespace lowcomm::cpu {
namespace {

using qm::add;
using qm::sub;

template <DType D>
float source_value(const CodecJob& job, uint64_t i) {
  using IO = ElementIO<D>;
  switch (job.op) {
    case CodecOp::kEncodeFeedback:
      return add(IO::load(job.x, i), static_cast<float*>(job.state)[i]);
    case CodecOp::kEncodeDelta:
      return sub(IO::load(job.x, i), IO::load(job.state, i));
    default:
      return IO::load(job.x, i);
  }
}

// After element i was encoded and decodes to `dec`: update feedback residual or delta cache.
// `finite` is false when the element's group (or, for passthrough, the element) is non-finite;
// the state is then reset to zero (docs/codecs.md, "Non-finite values").
template <DType D>
void update_state(const CodecJob& job, uint64_t i, float y, float dec, bool finite) {
  if (job.op == CodecOp::kEncodeFeedback) {
    static_cast<float*>(job.state)[i] =
        finite ? qm::canonical(qm::mul(job.spec.ef_decay, sub(y, dec))) : 0.0f;
  } else if (job.op == CodecOp::kEncodeDelta) {
    using IO = ElementIO<D>;
    IO::store(job.state, i, finite ? add(IO::load(job.state, i), dec) : 0.0f);
  }
}

void write_unit(uint8_t* packed, uint64_t unit, int bits, const uint32_t codes[8]) {
  uint64_t w = qm::pack_unit(codes, bits);
  for (int b = 0; b < bits; ++b) packed[unit * bits + b] = static_cast<uint8_t>(w >> (8 * b));
}

uint64_t read_unit(const uint8_t* packed, uint64_t unit, int bits) {
  uint64_t w = 0;
  for (int b = 0; b < bits; ++b) w |= static_cast<uint64_t>(packed[unit * bits + b]) << (8 * b);
  return w;
}

// Writes the scale record of group g from the values y[0..count).
void write_group_scale(const CodecJob& job, uint64_t g, const float* y, uint64_t count,
                       float* tree) {
  bool finite = true;
  float amax = 0.0f, lo = 0.0f, hi = 0.0f;
  for (uint64_t k = 0; k < count; ++k) {
    finite = finite && qm::is_finite(y[k]);
    amax = std::max(amax, qm::abs_f(y[k]));
    lo = k == 0 ? y[k] : std::min(lo, y[k]);
    hi = k == 0 ? y[k] : std::max(hi, y[k]);
  }
  float nan = qm::bits_f32(qm::kCanonicalNanF32);
  float* s = job.scales();
  if (job.spec.kind == CodecKind::kMinmax) {
    s[2 * g] = finite ? lo : nan;
    s[2 * g + 1] = finite ? hi : nan;
  } else if (job.spec.bits == 1) {
    uint32_t gsize = job.spec.block;
    for (uint32_t k = 0; k < gsize; ++k) tree[k] = k < count ? qm::abs_f(y[k]) : 0.0f;
    float mean = qm::mean_abs(tree_sum(tree, gsize), static_cast<uint32_t>(count));
    if (finite && !qm::is_finite(mean)) {  // the sum overflowed: see quant_math.h
      for (uint32_t k = 0; k < gsize; ++k) {
        tree[k] = k < count ? qm::mul(qm::abs_f(y[k]), qm::kMeanRescale) : 0.0f;
      }
      mean = qm::rescaled_mean_abs(tree_sum(tree, gsize), static_cast<uint32_t>(count));
    }
    s[g] = finite ? mean : nan;
  } else {
    s[g] = finite ? amax : nan;
  }
}

// Quantizes y (element i) with group g's freshly written scale record.
struct GroupEncoder {
  const CodecJob* job;
  GroupDecode dec;
  qm::AbsmaxParams ap{};

  GroupEncoder(const CodecJob& j, uint64_t g) : job(&j), dec(group_decode(j, g)) {
    if (j.spec.kind == CodecKind::kAbsmax && dec.finite)
      ap = qm::absmax_params(dec.scale, j.spec.bits);
  }

  uint32_t code(float y, uint64_t i) const {
    const CodecSpec& spec = job->spec;
    if (!dec.finite) return 0;
    bool sr = spec.rounding == Rounding::kStochastic;
    uint32_t rnd = sr ? sr_draw(job->key, i) : 0;
    if (spec.kind == CodecKind::kMinmax) return qm::minmax_code(y, dec.mm, spec.bits, sr, rnd);
    if (spec.bits == 1) return qm::sign_code(y);
    return qm::absmax_code(y, ap, spec.bits, sr, rnd);
  }
};

template <DType D>
void encode_units(const CodecJob& job, uint64_t begin, uint64_t end, const float* y_block,
                  uint64_t y_base) {
  const int bits = job.spec.bits;
  uint64_t cur_group = UINT64_MAX;
  std::optional<GroupEncoder> enc;
  for (uint64_t unit = begin / 8; unit * 8 < end; ++unit) {
    uint32_t codes[8] = {};
    for (int j = 0; j < 8; ++j) {
      uint64_t i = unit * 8 + j;
      if (i >= end) break;
      uint64_t g = job.group_of(i);
      if (g != cur_group) {
        enc.emplace(job, g);
        cur_group = g;
      }
      float y = y_block ? y_block[i - y_base] : source_value<D>(job, i);
      codes[j] = enc->code(y, i);
      if (job.op != CodecOp::kEncode)
        update_state<D>(job, i, y, decode_value(job, enc->dec, codes[j]), enc->dec.finite);
    }
    write_unit(job.packed(), unit, bits, codes);
  }
}

template <DType D>
void passthrough_range(const CodecJob& job, uint64_t begin, uint64_t end) {
  using IO = ElementIO<D>;
  DType wire = job.spec.wire_dtype;
  auto wire_value = [&](uint64_t i) {
    switch (wire) {
      case DType::kBFloat16:
        return ElementIO<DType::kBFloat16>::load(job.payload, i);
      case DType::kFloat16:
        return ElementIO<DType::kFloat16>::load(job.payload, i);
      default:
        return ElementIO<DType::kFloat32>::load(job.payload, i);
    }
  };
  for (uint64_t i = begin; i < end; ++i) {
    if (is_encode(job.op)) {
      float y = source_value<D>(job, i);
      switch (wire) {
        case DType::kBFloat16:
          ElementIO<DType::kBFloat16>::store(job.payload, i, y);
          break;
        case DType::kFloat16:
          ElementIO<DType::kFloat16>::store(job.payload, i, y);
          break;
        default:
          ElementIO<DType::kFloat32>::store(job.payload, i, y);
          break;
      }
      float dec = wire_value(i);
      update_state<D>(job, i, y, dec, qm::is_finite(dec));
      continue;
    }
    float dec = wire_value(i);
    switch (job.op) {
      case CodecOp::kDecode:
        IO::store(job.out, i, dec);
        break;
      case CodecOp::kDecodeAccumulate:
        IO::store(job.out, i, add(IO::load(job.out, i), dec));
        break;
      default: {  // kDecodeDelta
        bool finite = qm::is_finite(dec);
        IO::store(job.state, i, finite ? add(IO::load(job.state, i), dec) : 0.0f);
        if (job.out) IO::store(job.out, i, finite ? IO::load(job.state, i) : dec);
      }
    }
  }
}

template <DType D>
void decode_range(const CodecJob& job, uint64_t begin, uint64_t end) {
  using IO = ElementIO<D>;
  const int bits = job.spec.bits;
  uint64_t cur_group = UINT64_MAX;
  GroupDecode gd;
  for (uint64_t unit = begin / 8; unit * 8 < end; ++unit) {
    uint64_t w = read_unit(job.packed(), unit, bits);
    for (int j = 0; j < 8; ++j) {
      uint64_t i = unit * 8 + j;
      if (i >= end) break;
      uint64_t g = job.group_of(i);
      if (g != cur_group) {
        gd = group_decode(job, g);
        cur_group = g;
      }
      float dec = decode_value(job, gd, qm::unit_code(w, j, bits));
      switch (job.op) {
        case CodecOp::kDecode:
          IO::store(job.out, i, dec);
          break;
        case CodecOp::kDecodeAccumulate:
          IO::store(job.out, i, add(IO::load(job.out, i), dec));
          break;
        default:  // kDecodeDelta
          IO::store(job.state, i, gd.finite ? add(IO::load(job.state, i), dec) : 0.0f);
          if (job.out) IO::store(job.out, i, gd.finite ? IO::load(job.state, i) : dec);
      }
    }
  }
}

template <DType D>
void encode_blocks(const CodecJob& job, uint64_t begin, uint64_t end) {
  const uint32_t gsize = job.spec.block;
  std::vector<float> y(gsize), tree(gsize);
  for (uint64_t start = begin; start < end; start += gsize) {
    uint64_t count = std::min<uint64_t>(gsize, job.n - start);
    for (uint64_t k = 0; k < count; ++k) y[k] = source_value<D>(job, start + k);
    write_group_scale(job, start / gsize, y.data(), count, tree.data());
    encode_units<D>(job, start, start + count, y.data(), start);
  }
}

}  // namespace

void scalar_range(const CodecJob& job, uint64_t begin, uint64_t end) {
  with_dtype(job.dtype, [&]<DType D>() {
    if (job.spec.kind == CodecKind::kNone) {
      passthrough_range<D>(job, begin, end);
    } else if (!is_encode(job.op)) {
      decode_range<D>(job, begin, end);
    } else if (job.spec.grouping == Grouping::kBlock) {
      encode_blocks<D>(job, begin, end);
    } else {
      encode_units<D>(job, begin, end, nullptr, 0);  // column scales already written
    }
  });
}

void scalar_column_scales(const CodecJob& job, uint64_t c0, uint64_t c1) {
  const uint64_t cols = job.spec.cols, rows = job.n / cols;
  with_dtype(job.dtype, [&]<DType D>() {
    std::vector<float> y(rows);
    for (uint64_t c = c0; c < c1; ++c) {
      for (uint64_t r = 0; r < rows; ++r) y[r] = source_value<D>(job, r * cols + c);
      write_group_scale(job, c, y.data(), rows, nullptr);
    }
  });
}

}  // namespace lowcomm::cpu
