// Column-grouped codecs (`col=N`, docs/codecs.md) through the communicator: a compressed
// all-reduce over real forked processes on loopback ends bitwise identical on every rank and
// within two quantizations of the fp64 average, column by column; and a call the collective
// cannot take with such a codec (a count that is not a multiple of N, an integer tensor, a MAX
// reduction) is refused at the call, names the reason, and leaves the communicator usable.
//
// The inputs give every column its own magnitude (1/16 to 16), so a column-grouped codec must
// keep each column's error to its own scale: scale groups that mixed columns (blocks of a row)
// would take their step from the largest column and miss the small columns' bounds.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "collectives_test_util.h"
#include "lowcomm/lowcomm.h"

namespace lowcomm::testing {
namespace {

constexpr uint64_t kRows = 1001;  // owner chunks and 64 KiB segments end mid-tensor, not evenly

// Column c's magnitude: 2^((c mod 9) - 4), so neighbouring columns differ by 2x up to 256x.
double column_scale(uint64_t c) {
  return std::ldexp(1.0, static_cast<int>(c % 9) - 4);
}

// Rank r's tensor, [kRows, cols] row-major, in `dtype`.
Tensor column_input(DType dtype, uint64_t cols, int r) {
  Tensor t(dtype, kRows * cols);
  for (uint64_t i = 0; i < t.size(); ++i)
    t.set(i, static_cast<float>(input_value(23, r, i) * column_scale(i % cols)));
  return t;
}

// Worst-case error of one quantization of a group whose values lie in [lo, hi] with
// |x| <= amax (as in collectives_compressed_test.cc): absmax one step A / 2^(b-1), minmax one
// step (hi - lo) / (2^b - 1).
double step_bound(const CodecSpec& s, double lo, double hi, double amax) {
  if (s.kind == CodecKind::kMinmax) return (hi - lo) / ((1 << s.bits) - 1);
  return amax / static_cast<double>(1 << (s.bits - 1));
}

struct Case {
  int P;
  std::string codec;
  DType dtype;
  ReduceOp op;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.P << " ranks, " << c.codec << ", " << dtype_name(c.dtype) << ", "
      << reduce_op_name(c.op);
}

// Checks y against the fp64 reduction of every rank's input, column by column. The algorithm
// quantizes each rank's contribution in groups of (rows of one pipeline segment) x (one
// column), then the owner's decoded sum in the same groups; every such group lies within one
// column, so the column's range over the whole tensor bounds its step (a looser bound than the
// group's own, never a tighter one). Returns "" or what is wrong; *worst gets max err / bound.
std::string check_columns(const Case& c, const CodecSpec& spec, const Tensor& y, double* worst) {
  const uint64_t cols = spec.cols;
  std::vector<Tensor> in;
  for (int r = 0; r < c.P; ++r) in.push_back(column_input(c.dtype, cols, r));
  const double scale = c.op == ReduceOp::kAverage ? 1.0 / c.P : 1.0;
  *worst = 0;
  for (uint64_t col = 0; col < cols; ++col) {
    double first = 0;  // the contributions' errors, summed over ranks
    for (int r = 0; r < c.P; ++r) {
      double lo = 1e300, hi = -1e300, a = 0;
      for (uint64_t row = 0; row < kRows; ++row) {
        const double v = in[r].get(row * cols + col);
        lo = std::min(lo, v);
        hi = std::max(hi, v);
        a = std::max(a, std::fabs(v));
      }
      first += step_bound(spec, lo, hi, a);
    }
    std::vector<double> sum(kRows, 0.0);
    double lo_s = 1e300, hi_s = -1e300, a_s = 0;
    for (uint64_t row = 0; row < kRows; ++row) {
      for (int r = 0; r < c.P; ++r) sum[row] += in[r].get(row * cols + col);
      lo_s = std::min(lo_s, sum[row]);
      hi_s = std::max(hi_s, sum[row]);
      a_s = std::max(a_s, std::fabs(sum[row]));
    }
    // The owner re-quantizes the decoded sum (or average), within `first` of the reference.
    const double second = step_bound(spec, lo_s - first, hi_s + first, a_s + first);
    for (uint64_t row = 0; row < kRows; ++row) {
      const double want = sum[row] * scale;
      const double got = y.get(row * cols + col);
      const double out_round = c.dtype == DType::kFloat32 ? 0 : std::fabs(want) / 128;
      const double bound =
          (first + second) * scale * 1.0001 + out_round + 1e-6 * (1 + std::fabs(want));
      const double err = std::fabs(got - want);
      *worst = std::max(*worst, err / bound);
      if (!(err <= bound))
        return "row " + std::to_string(row) + " column " + std::to_string(col) + " (scale " +
               std::to_string(column_scale(col)) + "): got " + std::to_string(got) + ", fp64 " +
               std::to_string(want) + ", bound " + std::to_string(bound);
    }
  }
  return "";
}

std::string column_rank(int rank, const UniqueId& id, const Case& c) {
  auto comm = Communicator::init(id, rank, c.P, test_options());
  RANK_OK(comm.status());
  const CodecSpec spec = *parse_codec_spec(c.codec);
  RANK_CHECK(spec.grouping == Grouping::kColumn, c.codec + " is not column-grouped");
  Tensor x = column_input(c.dtype, spec.cols, rank);
  Tensor y(c.dtype, x.size());
  AllReduceOptions o;
  o.codec = spec;
  Work w = (*comm)->all_reduce(x.data(), y.data(), x.size(), c.dtype, c.op, o);
  RANK_OK(w.wait());
  auto stats = w.stats();
  RANK_OK(stats.status());
  RANK_CHECK(stats->codec == to_string(spec), "the wire codec was '" + stats->codec + "'");
  RANK_CHECK(stats->compression_ratio > 1.0, "nothing was compressed");
  double worst = 0;
  const std::string wrong = check_columns(c, spec, y, &worst);
  RANK_CHECK(wrong.empty(), wrong);
  // Half a column's step is far below its bound on most elements; the bound must not be so
  // loose that any answer would pass.
  RANK_CHECK(worst > 0.01, "worst error / bound " + std::to_string(worst) + ": suspiciously low");
  return "ok " + std::to_string(fnv64(y.bytes)) + " worst/bound " + std::to_string(worst);
}

class CollectivesColumnCodec : public ::testing::TestWithParam<Case> {};

TEST_P(CollectivesColumnCodec, IdenticalOnEveryRankAndWithinTheBoundOfEachColumn) {
  const Case c = GetParam();
  auto res = run_ranks(c.P, [c](int rank, const UniqueId& id) { return column_rank(rank, id, c); });
  expect_all_ok(res);
  std::set<std::string> hashes;
  for (auto& r : res) hashes.insert(r.text.substr(0, r.text.find(" worst")));
  EXPECT_EQ(hashes.size(), 1u) << "ranks ended with different bits: " << res[0].text << " vs "
                               << res[1].text;
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, CollectivesColumnCodec,
    ::testing::Values(Case{3, "q8:col=96", DType::kFloat32, ReduceOp::kAverage},
                      Case{2, "q4:col=96:sr", DType::kFloat32, ReduceOp::kSum},
                      Case{4, "minmax4:col=48", DType::kBFloat16, ReduceOp::kAverage},
                      Case{3, "q4:col=7", DType::kBFloat16, ReduceOp::kSum}));

// ---- what a collective refuses with a column-grouped codec ----

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Refused before it returned: complete, marked refused, kInvalidArgument naming `part`, and
// the communicator not failed.
std::string expect_refused(const Communicator& comm, const Work& w, const std::string& part) {
  RANK_CHECK(w.test(), "not refused at once (queued): expected '" + part + "'");
  RANK_CHECK(w.refused(), "completed, but not marked refused: " + w.status().to_string());
  const Status s = w.status();
  RANK_CHECK(s.code() == StatusCode::kInvalidArgument,
             "expected '" + part + "', got " + s.to_string());
  RANK_CHECK(contains(s.message(), part), "'" + part + "' missing from: " + s.message());
  RANK_CHECK(comm.status().is_ok(), "the communicator failed: " + comm.status().to_string());
  return "ok";
}

// Every rank makes the same refused calls, and rank 0 some more of its own; then both run a
// column-grouped all-reduce that must succeed and agree (a refused call took no sequence
// number, so the ranks still match), through the C++ and the C API.
TEST(CollectivesCodecRefusal, RefusedAtTheCallAndTheCommunicatorStaysUsable) {
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 2, test_options());
    RANK_OK(c.status());
    Communicator& comm = **c;
    const uint64_t cols = 96, n = kRows * cols;
    Tensor x = column_input(DType::kFloat32, cols, rank);
    Tensor y(DType::kFloat32, n);
    AllReduceOptions col;
    col.codec = *parse_codec_spec("q4:col=96");
    const std::vector<std::pair<uint64_t, std::string>> counts = {
        {n - 1, "not a multiple of col=96"}, {n + 48, "not a multiple of col=96"}};
    for (const auto& [count, part] : counts) {
      std::string r = expect_refused(
          comm, comm.all_reduce(x.data(), y.data(), count, DType::kFloat32, ReduceOp::kSum, col),
          part);
      RANK_CHECK(r == "ok", "count " + std::to_string(count) + ": " + r);
    }
    if (rank == 0) {
      std::vector<int32_t> xi(n, 1), yi(n, 0);
      std::string r = expect_refused(
          comm, comm.all_reduce(xi.data(), yi.data(), n, DType::kInt32, ReduceOp::kSum, col),
          "takes fp32, bf16 or fp16 tensors, not int32");
      RANK_CHECK(r == "ok", "int32: " + r);
      r = expect_refused(
          comm, comm.all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kMax, col),
          "takes sum or avg");
      RANK_CHECK(r == "ok", "max: " + r);
      // Reduce-scatter encodes each rank's slice on its own: the slice must hold whole rows.
      r = expect_refused(
          comm, comm.reduce_scatter(x.data(), y.data(), 100, DType::kFloat32, ReduceOp::kSum, col),
          "not a multiple of col=96");
      RANK_CHECK(r == "ok", "reduce_scatter: " + r);
    }
    // Then the group works: the same codec on a count it takes.
    RANK_OK(
        comm.all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kAverage, col).wait());
    const Case avg{2, "q4:col=96", DType::kFloat32, ReduceOp::kAverage};
    double worst = 0;
    const std::string wrong = check_columns(avg, *col.codec, y, &worst);
    RANK_CHECK(wrong.empty(), "after the refusals: " + wrong);
    return "ok " + std::to_string(fnv64(y.bytes));
  });
  expect_all_ok(res);
  ASSERT_EQ(res.size(), 2u);
  EXPECT_EQ(res[0].text, res[1].text) << "ranks ended with different bits";
}

// The C API: the same refusals as lowcommInvalidArgument with the reason in
// lowcommGetLastError, no request handed out, the communicator not failed; then the
// column-grouped all-reduce by name.
TEST(CollectivesCodecRefusal, CApiRefusesWithInvalidArgumentAndTheReason) {
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    lowcommUniqueId cid;
    auto raw = id.to_bytes();
    std::memcpy(cid.internal, raw.data(), raw.size());
    lowcommComm_t comm = nullptr;
    RANK_CHECK(lowcommCommInitRank(&comm, 2, cid, rank) == lowcommSuccess,
               lowcommGetLastError(nullptr));
    const uint64_t cols = 96, n = kRows * cols;
    Tensor x = column_input(DType::kFloat32, cols, rank);
    Tensor y(DType::kFloat32, n);
    std::vector<int32_t> xi(n, 1), yi(n, 0);
    struct Refusal {
      const char* what;
      void* send;
      void* recv;
      uint64_t count;
      lowcommDataType_t dtype;
      const char* part;
    };
    const Refusal refusals[] = {
        {"count n - 1", x.data(), y.data(), n - 1, lowcommFloat32, "not a multiple of col=96"},
        {"int32", xi.data(), yi.data(), n, lowcommInt32, "not int32"},
    };
    for (const Refusal& f : refusals) {
      for (bool async : {true, false}) {
        lowcommRequest_t req = nullptr;
        const lowcommResult_t r = lowcommAllReduce(f.send, f.recv, f.count, f.dtype, lowcommSum,
                                                   "q4:col=96", comm, async ? &req : nullptr);
        const std::string tag = std::string(f.what) + (async ? " (async)" : " (blocking)");
        RANK_CHECK(r == lowcommInvalidArgument, tag + ": returned " + lowcommGetErrorString(r));
        RANK_CHECK(req == nullptr, tag + ": handed out a request");
        RANK_CHECK(contains(lowcommGetLastError(comm), f.part),
                   tag + ": '" + f.part + "' missing from: " + lowcommGetLastError(comm));
        lowcommResult_t async_error = lowcommInternalError;
        RANK_CHECK(lowcommCommGetAsyncError(comm, &async_error) == lowcommSuccess &&
                       async_error == lowcommSuccess,
                   tag + ": the communicator failed: " + lowcommGetLastError(comm));
      }
    }
    RANK_CHECK(lowcommAllReduce(x.data(), y.data(), n, lowcommFloat32, lowcommAvg, "q4:col=96",
                                comm, nullptr) == lowcommSuccess,
               lowcommGetLastError(comm));
    const Case c{2, "q4:col=96", DType::kFloat32, ReduceOp::kAverage};
    double worst = 0;
    const std::string wrong = check_columns(c, *parse_codec_spec(c.codec), y, &worst);
    RANK_CHECK(wrong.empty(), "after the refusals: " + wrong);
    RANK_CHECK(lowcommCommDestroy(comm) == lowcommSuccess, lowcommGetLastError(nullptr));
    return "ok " + std::to_string(fnv64(y.bytes));
  });
  expect_all_ok(res);
  ASSERT_EQ(res.size(), 2u);
  EXPECT_EQ(res[0].text, res[1].text) << "ranks ended with different bits";
}

}  // namespace
}  // namespace lowcomm::testing
