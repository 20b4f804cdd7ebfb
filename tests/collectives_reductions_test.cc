// Every reduction on every dtype, exact, through all_reduce and reduce_scatter over real
// processes, against references computed here in rank order; what a codec cannot take is
// refused; and the compressed reduce-scatter: within one quantization per contribution,
// deterministic, error feedback unbiased over repeated calls.

#include <bit>
#include <limits>
#include <type_traits>

#include "collectives_test_util.h"

namespace lowcomm::testing {
namespace {

constexpr int kRanks = 3;
constexpr uint64_t kCount = 3 * 9000 + 2;  // several 64 KiB segments, not a multiple of 3

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The test's own bf16/fp16 conversions (round to nearest even).
float widen16(DType d, uint16_t h) {
  if (d == DType::kBFloat16) return from_bf16(h);
  return static_cast<float>(std::bit_cast<_Float16>(h));
}
uint16_t narrow16(DType d, float f) {
  if (d == DType::kBFloat16) return to_bf16(f);
  return std::bit_cast<uint16_t>(static_cast<_Float16>(f));
}

template <typename T>
T wrapped(uint64_t v) {
  return static_cast<T>(static_cast<std::make_unsigned_t<T>>(v));
}

// Rank r's element i for (dtype, op): full-range integers (so sums and products wrap), floats
// around 1 for products, a NaN in one place for min and max, bool bytes of 0, 1 and 2.
template <typename T>
T input(DType d, ReduceOp op, int r, uint64_t i) {
  const uint64_t h = mix64(static_cast<uint64_t>(r) << 48 ^ i ^ static_cast<uint64_t>(op) << 40 ^
                           static_cast<uint64_t>(d) << 32);
  if constexpr (std::is_floating_point_v<T>) {
    double u = static_cast<double>(h >> 11) / 9007199254740992.0 - 0.5;  // [-0.5, 0.5)
    if ((op == ReduceOp::kMin || op == ReduceOp::kMax) && i == 17 && r == 1)
      return std::numeric_limits<T>::quiet_NaN();
    return static_cast<T>(op == ReduceOp::kProduct ? 1.0 + 0.2 * u : 8.0 * u);
  } else {
    if (d == DType::kBool) return static_cast<T>(h % 3);  // 2 is true as well
    return wrapped<T>(h);
  }
}

template <typename T, bool = std::is_integral_v<T>>
struct Unsigned {
  using type = T;
};
template <typename T>
struct Unsigned<T, true> {
  using type = std::make_unsigned_t<T>;
};

template <typename T>
T combine(ReduceOp op, T a, T b) {
  using U = typename Unsigned<T>::type;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      if constexpr (std::is_integral_v<T>) return static_cast<T>(uint64_t(U(a)) + uint64_t(U(b)));
      return static_cast<T>(a + b);
    case ReduceOp::kProduct:
      if constexpr (std::is_integral_v<T>) return static_cast<T>(uint64_t(U(a)) * uint64_t(U(b)));
      return static_cast<T>(a * b);
    case ReduceOp::kMin:
      if constexpr (std::is_floating_point_v<T>)
        if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
      return b < a ? b : a;
    case ReduceOp::kMax:
      if constexpr (std::is_floating_point_v<T>)
        if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
      return b > a ? b : a;
    case ReduceOp::kBAnd:
      if constexpr (std::is_integral_v<T>) return static_cast<T>(a & b);
      break;
    case ReduceOp::kBOr:
      if constexpr (std::is_integral_v<T>) return static_cast<T>(a | b);
      break;
    case ReduceOp::kBXor:
      if constexpr (std::is_integral_v<T>) return static_cast<T>(a ^ b);
      break;
  }
  return a;
}

// Bool as logic: any non-zero byte is true.
uint8_t combine_bool(ReduceOp op, uint8_t a, uint8_t b) {
  bool x = a != 0, y = b != 0;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMax:
    case ReduceOp::kBOr:
      return x || y;
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kBAnd:
      return x && y;
    default:
      return x != y;
  }
}

// The expected bytes of element i: T is the element type, A the accumulator (fp32 for 16-bit
// floats, whose inputs are held as T = uint16_t bits).
template <typename T>
std::vector<uint8_t> expected(DType d, ReduceOp op, int P, uint64_t n) {
  std::vector<uint8_t> out(n * sizeof(T));
  const bool half = d == DType::kBFloat16 || d == DType::kFloat16;
  for (uint64_t i = 0; i < n; ++i) {
    T v{};
    if (half) {
      // fp32 SUM/AVG accumulate from +0 (the codec path); min/max/product from rank 0's value.
      auto in = [&](int r) { return widen16(d, narrow16(d, input<float>(d, op, r, i))); };
      const bool sum = op == ReduceOp::kSum || op == ReduceOp::kAverage;
      float acc = sum ? 0.0f : in(0);
      for (int r = sum ? 0 : 1; r < P; ++r) acc = combine(op, acc, in(r));
      if (op == ReduceOp::kAverage) acc /= static_cast<float>(P);
      v = static_cast<T>(narrow16(d, acc));
    } else if (d == DType::kBool) {
      uint8_t acc = input<uint8_t>(d, op, 0, i) != 0;
      for (int r = 1; r < P; ++r) acc = combine_bool(op, acc, input<uint8_t>(d, op, r, i));
      v = static_cast<T>(acc);
    } else {
      const bool fsum =
          std::is_same_v<T, float> && (op == ReduceOp::kSum || op == ReduceOp::kAverage);
      T acc = fsum ? T{} : input<T>(d, op, 0, i);
      for (int r = fsum ? 0 : 1; r < P; ++r) acc = combine(op, acc, input<T>(d, op, r, i));
      if (op == ReduceOp::kAverage) acc = static_cast<T>(acc / static_cast<T>(P));
      v = acc;
    }
    std::memcpy(&out[i * sizeof(T)], &v, sizeof(T));
  }
  return out;
}

template <typename T>
std::vector<uint8_t> rank_input(DType d, ReduceOp op, int r, uint64_t n) {
  std::vector<uint8_t> out(n * sizeof(T));
  for (uint64_t i = 0; i < n; ++i) {
    T v;
    if constexpr (std::is_same_v<T, uint16_t>) {
      if (d == DType::kBFloat16 || d == DType::kFloat16) {
        v = narrow16(d, input<float>(d, op, r, i));
      } else {
        v = input<T>(d, op, r, i);
      }
    } else {
      v = input<T>(d, op, r, i);
    }
    std::memcpy(&out[i * sizeof(T)], &v, sizeof(T));
  }
  return out;
}

struct Case {
  DType dtype;
  ReduceOp op;
};

template <typename T>
std::string check_case(Communicator& comm, const Case& c) {
  const int P = comm.size(), me = comm.rank();
  const std::string name = std::string(dtype_name(c.dtype)) + " " + reduce_op_name(c.op);
  std::vector<uint8_t> x = rank_input<T>(c.dtype, c.op, me, kCount);
  std::vector<uint8_t> want = expected<T>(c.dtype, c.op, P, kCount);
  std::vector<uint8_t> y(x.size());
  RANK_OK(comm.all_reduce(x.data(), y.data(), kCount, c.dtype, c.op).wait());
  for (uint64_t i = 0; i < kCount; ++i) {
    bool same = std::memcmp(&y[i * sizeof(T)], &want[i * sizeof(T)], sizeof(T)) == 0;
    if constexpr (std::is_floating_point_v<T>) {
      T a, b;
      std::memcpy(&a, &y[i * sizeof(T)], sizeof(T));
      std::memcpy(&b, &want[i * sizeof(T)], sizeof(T));
      same = same || (std::isnan(a) && std::isnan(b));
    } else if (std::is_same_v<T, uint16_t> && c.dtype != DType::kInt16) {
      uint16_t a, b;
      std::memcpy(&a, &y[i * 2], 2);
      std::memcpy(&b, &want[i * 2], 2);
      same = same || (std::isnan(widen16(c.dtype, a)) && std::isnan(widen16(c.dtype, b)));
    }
    RANK_CHECK(same, "all_reduce " + name + ": element " + std::to_string(i) + " differs");
  }
  // reduce_scatter, in place on this rank's slice (recv = send + rank * rc).
  const uint64_t rc = kCount / static_cast<uint64_t>(P);
  std::vector<uint8_t> rs = x;
  uint8_t* slice = rs.data() + me * rc * sizeof(T);
  RANK_OK(comm.reduce_scatter(rs.data(), slice, rc, c.dtype, c.op).wait());
  RANK_CHECK(std::memcmp(slice, &y[me * rc * sizeof(T)], rc * sizeof(T)) == 0,
             "reduce_scatter " + name + " differs from all_reduce's slice");
  return "ok";
}

std::string every_reduction(int rank, const UniqueId& id) {
  auto c = Communicator::init(id, rank, kRanks, test_options());
  RANK_OK(c.status());
  Communicator& comm = **c;
  const ReduceOp arith[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kProduct, ReduceOp::kMin,
                            ReduceOp::kMax};
  const ReduceOp bitwise[] = {ReduceOp::kBAnd, ReduceOp::kBOr, ReduceOp::kBXor};
  int cases = 0;
  auto run = [&](DType d, ReduceOp op) -> std::string {
    ++cases;
    switch (d) {
      case DType::kFloat32:
        return check_case<float>(comm, {d, op});
      case DType::kFloat64:
        return check_case<double>(comm, {d, op});
      case DType::kBFloat16:
      case DType::kFloat16:
        return check_case<uint16_t>(comm, {d, op});
      case DType::kInt8:
        return check_case<int8_t>(comm, {d, op});
      case DType::kUInt8:
      case DType::kBool:
        return check_case<uint8_t>(comm, {d, op});
      case DType::kInt16:
        return check_case<int16_t>(comm, {d, op});
      case DType::kInt32:
        return check_case<int32_t>(comm, {d, op});
      case DType::kUInt32:
        return check_case<uint32_t>(comm, {d, op});
      case DType::kInt64:
        return check_case<int64_t>(comm, {d, op});
      case DType::kUInt64:
        return check_case<uint64_t>(comm, {d, op});
    }
    return "unknown dtype";
  };
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16}) {
    for (ReduceOp op : arith)
      if (std::string s = run(d, op); s != "ok") return s;
  }
  for (DType d : {DType::kInt8, DType::kUInt8, DType::kInt16, DType::kInt32, DType::kUInt32,
                  DType::kInt64, DType::kUInt64, DType::kBool}) {
    for (ReduceOp op : arith) {
      if (d == DType::kBool && op == ReduceOp::kAverage) continue;
      if (std::string s = run(d, op); s != "ok") return s;
    }
    for (ReduceOp op : bitwise)
      if (std::string s = run(d, op); s != "ok") return s;
  }
  return "ok " + std::to_string(cases) + " cases";
}

TEST(CollectivesReductions, EveryOpOnEveryDTypeIsExactInRankOrder) {
  expect_all_ok(run_ranks(kRanks, every_reduction, 90));
}

// What a reduction or a codec cannot take is refused at the call; the group stays usable, and
// a communicator-wide codec leaves reductions it cannot take exact.
std::string refusals(int rank, const UniqueId& id) {
  CommOptions o = test_options();
  o.codec = *parse_codec_spec("q4");
  auto c = Communicator::init(id, rank, 2, o);
  RANK_OK(c.status());
  Communicator& comm = **c;
  std::vector<float> f(64, 1.0f);
  std::vector<int32_t> ints(64, rank + 1);
  std::vector<uint8_t> b(64, 1);
  AllReduceOptions q4;
  q4.codec = *parse_codec_spec("q4");
  struct Refusal {
    Work w;
    const char* needle;
  };
  Refusal cases[] = {
      {comm.all_reduce(f.data(), f.data(), 64, DType::kFloat32, ReduceOp::kBXor), "integer"},
      {comm.all_reduce(b.data(), b.data(), 64, DType::kBool, ReduceOp::kAverage), "bool"},
      {comm.all_reduce(ints.data(), ints.data(), 64, DType::kInt32, ReduceOp::kSum, q4), "int32"},
      {comm.all_reduce(f.data(), f.data(), 64, DType::kFloat32, ReduceOp::kMax, q4), "max"},
      {comm.reduce_scatter(f.data(), f.data(), 32, DType::kFloat32, ReduceOp::kMin, q4), "min"},
      {comm.all_reduce(f.data(), f.data(), 64, DType::kFloat32, static_cast<ReduceOp>(99)),
       "unknown reduction"},
      {comm.all_reduce(f.data(), f.data(), 64, static_cast<DType>(99), ReduceOp::kSum),
       "unknown dtype"},
  };
  for (Refusal& r : cases) {
    RANK_CHECK(r.w.refused(), std::string("not refused: ") + r.needle);
    RANK_CHECK(r.w.status().code() == StatusCode::kInvalidArgument, r.w.status().to_string());
    RANK_CHECK(r.w.status().message().find(r.needle) != std::string::npos,
               r.w.status().to_string() + " does not name " + r.needle);
  }
  // The communicator's q4 does not apply to an integer max: exact.
  RANK_OK(comm.all_reduce(ints.data(), ints.data(), 64, DType::kInt32, ReduceOp::kMax).wait());
  for (int32_t v : ints) RANK_CHECK(v == 2, "int32 max on a q4 communicator: " + std::to_string(v));
  return "ok";
}

TEST(CollectivesReductions, WhatACodecCannotTakeIsRefusedAndOtherCallsStayExact) {
  expect_all_ok(run_ranks(2, refusals));
}

// Compressed reduce-scatter: each contribution quantized once, so every element is within the
// sum over ranks of one quantization step of that rank's group, plus the rounding of the
// fp32 sum to the dtype; the same bits on a repeat; and with error feedback the mean over T
// calls of a fixed input approaches the exact sum (the residual carries what each call lost).
std::string compressed_reduce_scatter(int rank, const UniqueId& id, std::string codec, DType d,
                                      int P) {
  auto c = Communicator::init(id, rank, P, test_options());
  RANK_OK(c.status());
  Communicator& comm = **c;
  const CodecSpec spec = *parse_codec_spec(codec);
  const uint64_t rc = 20000 + 64;  // several segments, a partial last block
  const uint64_t n = rc * P;
  Tensor x = make_input(d, n, 21, rank);
  Tensor y(d, rc), y2(d, rc);
  ReduceScatterOptions o;
  o.codec = spec;
  RANK_OK(comm.reduce_scatter(x.data(), y.data(), rc, d, ReduceOp::kSum, o).wait());
  o.step = 0;  // stochastic rounding: same step, same bits
  Work a = comm.reduce_scatter(x.data(), y.data(), rc, d, ReduceOp::kSum, o);
  Work b = comm.reduce_scatter(x.data(), y2.data(), rc, d, ReduceOp::kSum, o);
  RANK_OK(a.wait());
  RANK_OK(b.wait());
  RANK_CHECK(y.bytes == y2.bytes, "the same compressed reduce_scatter twice gave other bits");

  std::vector<Tensor> in;
  for (int r = 0; r < P; ++r) in.push_back(make_input(d, n, 21, r));
  const uint64_t base = static_cast<uint64_t>(rank) * rc;
  const uint64_t G = spec.block;
  double worst = 0;
  for (uint64_t g0 = 0; g0 < rc; g0 += G) {  // segments are whole blocks from the slice start
    const uint64_t g1 = std::min(rc, g0 + G);
    double bound = 0;
    for (int r = 0; r < P; ++r) {
      double amax = 0;
      for (uint64_t i = g0; i < g1; ++i)
        amax = std::max(amax, std::fabs(double(in[r].get(base + i))));
      bound += amax / static_cast<double>(1 << (spec.bits - 1));
    }
    for (uint64_t i = g0; i < g1; ++i) {
      double want = 0;
      for (int r = 0; r < P; ++r) want += in[r].get(base + i);
      double out_round = d == DType::kFloat32 ? 0 : std::fabs(want) / 128;
      double err = std::fabs(y.get(i) - want);
      double lim = bound * 1.0001 + out_round + 1e-5;
      worst = std::max(worst, err / lim);
      RANK_CHECK(err <= lim, "element " + std::to_string(i) + ": " + std::to_string(y.get(i)) +
                                 " vs " + std::to_string(want) + ", bound " + std::to_string(lim));
    }
  }
  // Error feedback: the mean of T outputs for the same input has a far smaller error than one.
  ReduceScatterOptions ef;
  ef.codec = spec;
  ef.error_feedback_key = "rs";
  const int T = 16;
  std::vector<double> mean(rc, 0.0);
  double one_err = 0, mean_err = 0;
  for (int t = 0; t < T; ++t) {
    RANK_OK(comm.reduce_scatter(x.data(), y.data(), rc, d, ReduceOp::kSum, ef).wait());
    for (uint64_t i = 0; i < rc; ++i) mean[i] += y.get(i) / T;
  }
  for (uint64_t i = 0; i < rc; ++i) {
    double want = 0;
    for (int r = 0; r < P; ++r) want += in[r].get(base + i);
    one_err += std::fabs(y.get(i) - want);
    mean_err += std::fabs(mean[i] - want);
  }
  if (d == DType::kFloat32)
    RANK_CHECK(mean_err < one_err / 4, "error feedback: mean error " + std::to_string(mean_err) +
                                           " not well below one call's " + std::to_string(one_err));
  return "ok worst " + std::to_string(worst);
}

TEST(CollectivesReductions, CompressedReduceScatterQ4Fp32) {
  expect_all_ok(run_ranks(4, [](int r, const UniqueId& id) {
    return compressed_reduce_scatter(r, id, "q4", DType::kFloat32, 4);
  }));
}

TEST(CollectivesReductions, CompressedReduceScatterQ8StochasticBf16) {
  expect_all_ok(run_ranks(4, [](int r, const UniqueId& id) {
    return compressed_reduce_scatter(r, id, "q8:sr", DType::kBFloat16, 4);
  }));
}

TEST(CollectivesReductions, CompressedReduceScatterQ4Fp32SixteenRanks) {
  expect_all_ok(run_ranks(
      16,
      [](int r, const UniqueId& id) {
        return compressed_reduce_scatter(r, id, "q4", DType::kFloat32, 16);
      },
      90));
}

}  // namespace
}  // namespace lowcomm::testing
