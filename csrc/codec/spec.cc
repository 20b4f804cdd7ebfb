// Codec spec: parsing, printing, validation and the encoded-size arithmetic.

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "codec/sparse_format.h"
#include "core/params.h"
#include "lowcomm/codec.h"

namespace lowcomm {

namespace {

struct DTypeInfo {
  DType dtype;
  size_t size;
  const char* name;
  const char* aliases[3];
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, 4, "fp32", {"float32", "float", nullptr}},
    {DType::kBFloat16, 2, "bf16", {"bfloat16", nullptr, nullptr}},
    {DType::kFloat16, 2, "fp16", {"float16", "half", nullptr}},
    {DType::kFloat64, 8, "fp64", {"float64", "double", nullptr}},
    {DType::kInt8, 1, "int8", {nullptr, nullptr, nullptr}},
    {DType::kUInt8, 1, "uint8", {nullptr, nullptr, nullptr}},
    {DType::kInt16, 2, "int16", {nullptr, nullptr, nullptr}},
    {DType::kInt32, 4, "int32", {"int", nullptr, nullptr}},
    {DType::kUInt32, 4, "uint32", {nullptr, nullptr, nullptr}},
    {DType::kInt64, 8, "int64", {nullptr, nullptr, nullptr}},
    {DType::kUInt64, 8, "uint64", {nullptr, nullptr, nullptr}},
    {DType::kBool, 1, "bool", {nullptr, nullptr, nullptr}},
};

const DTypeInfo* find_dtype(DType dtype) {
  for (const DTypeInfo& d : kDTypes)
    if (d.dtype == dtype) return &d;
  return nullptr;
}

}  // namespace

bool valid_dtype(DType dtype) {
  return find_dtype(dtype) != nullptr;
}

bool codec_dtype(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

size_t dtype_size(DType dtype) {
  const DTypeInfo* d = find_dtype(dtype);
  return d ? d->size : 0;
}

const char* dtype_name(DType dtype) {
  const DTypeInfo* d = find_dtype(dtype);
  return d ? d->name : "?";
}

Result<DType> parse_dtype(std::string_view name) {
  std::string known;
  for (const DTypeInfo& d : kDTypes) {
    if (name == d.name) return d.dtype;
    for (const char* a : d.aliases)
      if (a && name == a) return d.dtype;
    known += known.empty() ? d.name : std::string(", ") + d.name;
  }
  return invalid_argument("unknown dtype '" + std::string(name) + "' (expected " + known + ")");
}

namespace {

bool is_power_of_two(uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

Result<uint64_t> parse_u64(std::string_view key, std::string_view text) {
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || text.empty()) {
    return invalid_argument("codec option '" + std::string(key) +
                            "' needs a positive integer, got '" + std::string(text) + "'");
  }
  return v;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    parts.push_back(s.substr(start, pos == std::string_view::npos ? s.npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return parts;
}

Status validate_sparse(const CodecSpec& s) {
  if (s.bits != 2 && s.bits != 3 && s.bits != 4 && s.bits != 8) {
    return invalid_argument(
        "sparse codecs carry values at 2, 3, 4 or 8 bits (+q2, +q3, +q4, "
        "+q8), not " +
        std::to_string(s.bits));
  }
  if (s.grouping != Grouping::kBlock) {
    return invalid_argument("sparse codecs select per chunk of C elements (K/C), not col=");
  }
  if (!is_power_of_two(s.block) || s.block < kMinBlock || s.block > kMaxSparseChunk) {
    return invalid_argument("a sparse codec's chunk must be a power of two from 32 to 65536, got " +
                            std::to_string(s.block));
  }
  if (s.keep == 0 || s.keep > s.block) {
    return invalid_argument("a sparse codec keeps 1 to C elements per chunk of C = " +
                            std::to_string(s.block) + ", not " + std::to_string(s.keep));
  }
  if (s.rounding != Rounding::kNearest) {
    return invalid_argument(
        "sparse codecs round to nearest (error feedback keeps the rest); "
        "drop ':sr'");
  }
  if (!(s.ef_decay >= 0.0f && s.ef_decay <= 1.0f)) {
    return invalid_argument("error feedback decay must be in [0, 1]");
  }
  return Status::ok();
}

// "K/C+qB" or "D+qB" (B optional, default 2) into s.keep, s.block, s.bits.
Status parse_sparse_body(std::string_view body, CodecSpec& s) {
  std::string_view sel = body, value;
  size_t plus = body.find('+');
  if (plus != body.npos) {
    sel = body.substr(0, plus);
    value = body.substr(plus + 1);
  }
  s.bits = 2;
  if (!value.empty() || plus != body.npos) {
    if (value.size() != 2 || value[0] != 'q' || value[1] < '1' || value[1] > '9') {
      return invalid_argument("sparse values are '+q2', '+q3', '+q4' or '+q8', not '+" +
                              std::string(value) + "'");
    }
    s.bits = value[1] - '0';
  }
  size_t slash = sel.find('/');
  if (slash != sel.npos) {
    auto k = parse_u64("K", sel.substr(0, slash));
    if (!k) return k.status();
    auto c = parse_u64("C", sel.substr(slash + 1));
    if (!c) return c.status();
    if (*c > kMaxSparseChunk || !is_power_of_two(*c) || *c < kMinBlock) {
      return invalid_argument(
          "a sparse codec's chunk C must be a power of two from 32 to "
          "65536, got " +
          std::string(sel.substr(slash + 1)));
    }
    if (*k == 0 || *k > *c) {
      return invalid_argument("a sparse codec keeps K of C elements with 1 <= K <= C, got " +
                              std::string(sel));
    }
    s.keep = static_cast<uint32_t>(*k);
    s.block = static_cast<uint32_t>(*c);
    return Status::ok();
  }
  // A density D: K = round(D * 4096), at least 1.
  std::string text(sel);
  char* end = nullptr;
  double d = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(d > 0.0) || d > 1.0) {
    return invalid_argument("a sparse codec needs K/C or a density in (0, 1], got '" + text + "'");
  }
  s.block = kDefaultSparseChunk;
  double k = d * kDefaultSparseChunk + 0.5;
  s.keep = k < 1.0 ? 1u : static_cast<uint32_t>(k);
  if (s.keep > s.block) s.keep = s.block;
  return Status::ok();
}

}  // namespace

Status validate_spec(const CodecSpec& s) {
  switch (s.kind) {
    case CodecKind::kNone:
      if (s.grouping != Grouping::kElement) {
        return invalid_argument("passthrough codecs take no scale groups (block=/col=)");
      }
      if (s.rounding != Rounding::kNearest) {
        return invalid_argument("passthrough codecs round to nearest; 'sr' does not apply");
      }
      if (!codec_dtype(s.wire_dtype)) {
        return invalid_argument("a passthrough codec carries fp32, bf16 or fp16");
      }
      if (s.bits != static_cast<int>(dtype_size(s.wire_dtype) * 8)) {
        return invalid_argument("passthrough bits must match its wire dtype");
      }
      return Status::ok();
    case CodecKind::kAbsmax:
      if (s.bits != 1 && s.bits != 2 && s.bits != 3 && s.bits != 4 && s.bits != 8) {
        return invalid_argument("absmax quantization supports 1, 2, 3, 4 or 8 bits, not " +
                                std::to_string(s.bits));
      }
      if (s.bits == 1 && s.rounding == Rounding::kStochastic) {
        return invalid_argument("q1 (sign x mean|x|) has no stochastic rounding; drop ':sr'");
      }
      if (s.bits == 1 && s.grouping == Grouping::kColumn) {
        return invalid_argument("q1 needs contiguous blocks (block=N), not column groups");
      }
      break;
    case CodecKind::kMinmax:
      if (s.bits != 2 && s.bits != 4 && s.bits != 8) {
        return invalid_argument("minmax quantization supports 2, 4 or 8 bits, not " +
                                std::to_string(s.bits));
      }
      break;
    case CodecKind::kTopk:
    case CodecKind::kRandk:
      return validate_sparse(s);
    default:
      return invalid_argument("unknown codec kind");
  }
  if (!(s.ef_decay >= 0.0f && s.ef_decay <= 1.0f)) {
    return invalid_argument("error feedback decay must be in [0, 1]");
  }
  if (s.grouping == Grouping::kBlock) {
    if (!is_power_of_two(s.block) || s.block < kMinBlock || s.block > kMaxBlock) {
      return invalid_argument("block size must be a power of two from 32 to 4096, got " +
                              std::to_string(s.block));
    }
  } else if (s.grouping == Grouping::kColumn) {
    if (s.cols == 0) return invalid_argument("column groups need col=N with N >= 1");
  } else {
    return invalid_argument("quantized codecs need block or column scale groups");
  }
  return Status::ok();
}

Result<CodecSpec> parse_codec_spec(std::string_view text) {
  if (text.empty()) return invalid_argument("empty codec spec (try 'q4', 'q8', 'none')");
  auto parts = split(text, ':');
  std::string_view name = parts[0];
  CodecSpec s;
  if (name == "none" || name == "fp32") {
    s.kind = CodecKind::kNone;
    s.wire_dtype = DType::kFloat32;
    s.bits = 32;
  } else if (name == "bf16" || name == "fp16") {
    s.kind = CodecKind::kNone;
    s.wire_dtype = name == "bf16" ? DType::kBFloat16 : DType::kFloat16;
    s.bits = 16;
  } else if (name == "q1" || name == "q2" || name == "q3" || name == "q4" || name == "q8") {
    s.kind = CodecKind::kAbsmax;
    s.bits = name[1] - '0';
    s.grouping = Grouping::kBlock;
  } else if (name == "minmax2" || name == "minmax4" || name == "minmax8") {
    s.kind = CodecKind::kMinmax;
    s.bits = name[6] - '0';
    s.grouping = Grouping::kBlock;
  } else if (name == "topk" || name == "randk") {
    s.kind = name == "topk" ? CodecKind::kTopk : CodecKind::kRandk;
    s.grouping = Grouping::kBlock;
    if (parts.size() < 2) {
      return invalid_argument("codec '" + std::string(text) +
                              "' needs its selection: K/C or a density, e.g. " + std::string(name) +
                              ":64/4096+q2 or " + std::string(name) + ":0.02+q2");
    }
    Status body = parse_sparse_body(parts[1], s);
    if (!body.is_ok()) {
      return invalid_argument("codec spec '" + std::string(text) + "': " + body.message());
    }
    parts.erase(parts.begin() + 1);
  } else {
    return invalid_argument("unknown codec '" + std::string(name) +
                            "' (expected none, fp32, bf16, fp16, q1, q2, q3, q4, q8, minmax2, "
                            "minmax4, minmax8, topk or randk)");
  }
  bool has_block = false, has_col = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    std::string_view opt = parts[i];
    size_t eq = opt.find('=');
    std::string_view key = opt.substr(0, eq);
    std::string_view val = eq == opt.npos ? std::string_view() : opt.substr(eq + 1);
    if (key == "sr" && eq == opt.npos) {
      s.rounding = Rounding::kStochastic;
    } else if (key == "rn" && eq == opt.npos) {
      s.rounding = Rounding::kNearest;
    } else if (key == "decay" && eq != opt.npos) {
      std::string v(val);
      char* end = nullptr;
      double d = v.empty() ? -1.0 : std::strtod(v.c_str(), &end);
      if (v.empty() || end != v.c_str() + v.size() || !(d >= 0.0 && d <= 1.0)) {
        return invalid_argument("codec option decay= needs a number in [0, 1], got '" + v + "'");
      }
      if (s.kind == CodecKind::kNone) {
        return invalid_argument("decay= is error feedback's: passthrough codecs lose nothing");
      }
      s.ef_decay = static_cast<float>(d);
    } else if (s.sparse() && (key == "block" || key == "col")) {
      return invalid_argument("codec spec '" + std::string(text) +
                              "': a sparse codec's chunk is its C (K/C), not " + std::string(key) +
                              "=");
    } else if (key == "block" && eq != opt.npos) {
      auto v = parse_u64(key, val);
      if (!v) return v.status();
      if (s.kind == CodecKind::kNone) return invalid_argument("passthrough takes no block=");
      if (*v > UINT32_MAX) return invalid_argument("block size too large: " + std::string(val));
      s.grouping = Grouping::kBlock;
      s.block = static_cast<uint32_t>(*v);
      has_block = true;
    } else if (key == "col" && eq != opt.npos) {
      auto v = parse_u64(key, val);
      if (!v) return v.status();
      if (s.kind == CodecKind::kNone) return invalid_argument("passthrough takes no col=");
      s.grouping = Grouping::kColumn;
      s.cols = *v;
      has_col = true;
    } else {
      return invalid_argument("unknown codec option '" + std::string(opt) + "' in '" +
                              std::string(text) + "' (options: block=N, col=N, sr, rn, decay=B)");
    }
  }
  if (has_block && has_col) {
    return invalid_argument("codec spec '" + std::string(text) +
                            "' sets both block= and col=; a spec has one kind of scale group");
  }
  // Validation messages name the rule; prefix the text so the user sees what broke it.
  Status valid = validate_spec(s);
  if (!valid.is_ok()) {
    return invalid_argument("codec spec '" + std::string(text) + "': " + valid.message());
  }
  return s;
}

std::string to_string(const CodecSpec& s) {
  std::string out;
  if (s.kind == CodecKind::kNone)
    return s.wire_dtype == DType::kFloat32 ? "none" : dtype_name(s.wire_dtype);
  auto decay = [&] {
    if (s.ef_decay == 1.0f) return std::string();
    char buf[32];
    std::snprintf(buf, sizeof(buf), ":decay=%.9g", static_cast<double>(s.ef_decay));
    return std::string(buf);
  };
  if (s.sparse()) {
    return (s.kind == CodecKind::kTopk ? "topk:" : "randk:") + std::to_string(s.keep) + "/" +
           std::to_string(s.block) + "+q" + std::to_string(s.bits) + decay();
  }
  out = (s.kind == CodecKind::kAbsmax ? "q" : "minmax") + std::to_string(s.bits);
  if (s.grouping == Grouping::kBlock && s.block != kDefaultBlock)
    out += ":block=" + std::to_string(s.block);
  if (s.grouping == Grouping::kColumn) out += ":col=" + std::to_string(s.cols);
  if (s.rounding == Rounding::kStochastic) out += ":sr";
  return out + decay();
}

Result<CodecSpec> codec_spec_from_env(const char* name, std::string_view fallback) {
  const auto value = params::text(name);
  auto spec = parse_codec_spec(value ? std::string_view(*value) : fallback);
  if (!spec.is_ok() && value) {
    return invalid_argument(std::string(name) + "='" + *value + "': " + spec.status().message());
  }
  return spec;
}

uint64_t group_count(const CodecSpec& s, uint64_t n) {
  switch (s.grouping) {
    case Grouping::kBlock:
      return (n + s.block - 1) / s.block;
    case Grouping::kColumn:
      return n == 0 ? 0 : s.cols;
    case Grouping::kElement:
      return 0;
  }
  return 0;
}

SparseLayout sparse_layout(const CodecSpec& s, uint64_t n) {
  SparseLayout l;
  if (!s.sparse() || s.block == 0 || s.keep == 0) return l;
  l.chunks = (n + s.block - 1) / s.block;
  if (l.chunks == 0) return l;  // an empty message: no seed either
  l.header_bytes = sparse::header_bytes(s.kind);
  l.scale_bytes = l.chunks * sparse::kScaleBytes;
  const uint64_t full = n / s.block, tail = n % s.block;
  auto add = [&](uint64_t count, uint64_t len) {
    const uint32_t k = sparse::chunk_keep(s.keep, s.block, static_cast<uint32_t>(len));
    l.kept += count * k;
    l.index_bytes += count * sparse::index_bytes(s.kind, k, s.block, static_cast<uint32_t>(len));
    l.value_bytes += count * sparse::value_bytes(k, s.bits);
  };
  add(full, s.block);
  if (tail) add(1, tail);
  return l;
}

uint64_t encoded_size(const CodecSpec& s, uint64_t n) {
  if (s.kind == CodecKind::kNone) return n * dtype_size(s.wire_dtype);
  if (s.sparse()) {
    SparseLayout l = sparse_layout(s, n);
    return l.header_bytes + l.scale_bytes + l.index_bytes + l.value_bytes;
  }
  uint64_t scale_bytes = (s.kind == CodecKind::kMinmax ? 8 : 4) * group_count(s, n);
  return scale_bytes + (n + 7) / 8 * static_cast<uint64_t>(s.bits);
}

double bits_per_element(const CodecSpec& s, uint64_t n) {
  return n == 0 ? 0.0 : 8.0 * static_cast<double>(encoded_size(s, n)) / static_cast<double>(n);
}

Status check_count(const CodecSpec& s, uint64_t n) {
  if (s.grouping == Grouping::kColumn && s.cols == 0)
    return invalid_argument("column groups need col=N with N >= 1");
  if (s.grouping == Grouping::kColumn && n % s.cols != 0) {
    return invalid_argument("column groups: element count " + std::to_string(n) +
                            " is not a multiple of col=" + std::to_string(s.cols));
  }
  if (n > (uint64_t{1} << 56)) return invalid_argument("element count too large");
  return Status::ok();
}

}  // namespace lowcomm
