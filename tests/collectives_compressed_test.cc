// The compressed all-reduce: within two quantizations of the fp64 sum (docs/codecs.md bounds),
// bitwise identical on every rank, reproducible stochastic rounding, error feedback.

#include <algorithm>
#include <map>
#include <set>

#include "collectives_test_util.h"

namespace lowcomm::testing {
namespace {

// Worst-case error of one quantization of a group whose values lie in [lo, hi] with |x| <= amax:
// absmax: one step A / 2^(b-1) (half a step rounded to nearest, the top half-step clamped, or
// stochastic rounding: all below one step); minmax: one step (hi - lo) / (2^b - 1).
double step_bound(const CodecSpec& s, double lo, double hi, double amax) {
  if (s.kind == CodecKind::kMinmax) return (hi - lo) / ((1 << s.bits) - 1);
  return amax / static_cast<double>(1 << (s.bits - 1));
}

struct Case {
  int P;
  std::string codec;
  DType dtype;
};

std::string compressed_rank(int rank, const UniqueId& id, const Case& c) {
  auto comm = Communicator::init(id, rank, c.P, test_options());
  RANK_OK(comm.status());
  const CodecSpec spec = *parse_codec_spec(c.codec);
  const uint64_t n = 40000 + 77;  // a partial last block
  const ReduceOp op = c.P == 3 ? ReduceOp::kAverage : ReduceOp::kSum;
  Tensor x = make_input(c.dtype, n, 5, rank);
  Tensor y(c.dtype, n);
  AllReduceOptions o;
  o.codec = spec;
  RANK_OK((*comm)->all_reduce(x.data(), y.data(), n, c.dtype, op, o).wait());

  // The fp64 reference over what each rank actually held (inputs rounded to the dtype).
  std::vector<std::vector<double>> in(c.P, std::vector<double>(n));
  for (int r = 0; r < c.P; ++r) {
    Tensor t = make_input(c.dtype, n, 5, r);
    for (uint64_t i = 0; i < n; ++i) in[r][i] = t.get(i);
  }
  const uint64_t G = spec.block;
  double worst = 0;
  for (uint64_t b0 = 0; b0 < n; b0 += G) {
    uint64_t b1 = std::min(n, b0 + G);
    double first = 0, lo_s = 1e300, hi_s = -1e300, a_s = 0;
    for (int r = 0; r < c.P; ++r) {
      double lo = 1e300, hi = -1e300, a = 0;
      for (uint64_t i = b0; i < b1; ++i) {
        lo = std::min(lo, in[r][i]);
        hi = std::max(hi, in[r][i]);
        a = std::max(a, std::fabs(in[r][i]));
      }
      first += step_bound(spec, lo, hi, a);
    }
    std::vector<double> ref(b1 - b0);
    for (uint64_t i = b0; i < b1; ++i) {
      for (int r = 0; r < c.P; ++r) ref[i - b0] += in[r][i];
      lo_s = std::min(lo_s, ref[i - b0]);
      hi_s = std::max(hi_s, ref[i - b0]);
      a_s = std::max(a_s, std::fabs(ref[i - b0]));
    }
    // The owner quantizes the decoded sum, which lies within `first` of the reference.
    double second = step_bound(spec, lo_s - first, hi_s + first, a_s + first);
    double scale = op == ReduceOp::kAverage ? 1.0 / c.P : 1.0;
    for (uint64_t i = b0; i < b1; ++i) {
      double want = ref[i - b0] * scale;
      double got = y.get(i);
      double out_round = c.dtype == DType::kFloat32 ? 0 : std::fabs(want) / 128;
      double bound = (first + second) * scale * 1.0001 + out_round + 1e-5 * (1 + std::fabs(want));
      double err = std::fabs(got - want);
      worst = std::max(worst, err / bound);
      RANK_CHECK(err <= bound, "element " + std::to_string(i) + ": got " + std::to_string(got) +
                                   ", fp64 " + std::to_string(want) + ", bound " +
                                   std::to_string(bound));
    }
  }
  // Stochastic rounding is reproducible: the same step and seed give the same bits.
  if (spec.rounding == Rounding::kStochastic) {
    Tensor y1(c.dtype, n), y2(c.dtype, n);
    o.step = 42;
    RANK_OK((*comm)->all_reduce(x.data(), y1.data(), n, c.dtype, op, o).wait());
    RANK_OK((*comm)->all_reduce(x.data(), y2.data(), n, c.dtype, op, o).wait());
    RANK_CHECK(y1.bytes == y2.bytes, "same step and seed, different bits");
  }
  return "ok " + std::to_string(fnv64(y.bytes)) + " worst/bound " + std::to_string(worst);
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.P << " ranks, " << c.codec << ", " << dtype_name(c.dtype);
}

class CollectivesCompressed : public ::testing::TestWithParam<Case> {};

TEST_P(CollectivesCompressed, WithinTwoQuantizationsAndIdenticalOnEveryRank) {
  Case c = GetParam();
  auto res =
      run_ranks(c.P, [c](int rank, const UniqueId& id) { return compressed_rank(rank, id, c); });
  expect_all_ok(res);
  std::set<std::string> hashes;
  for (auto& r : res) hashes.insert(r.text.substr(0, r.text.find(" worst")));
  EXPECT_EQ(hashes.size(), 1u) << "ranks ended with different bits: " << res[0].text << " vs "
                               << res[1].text;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (int P : {2, 3, 4, 8})
    for (const char* codec : {"q8", "q4", "q2:sr", "minmax4"})
      v.push_back({P, codec, DType::kFloat32});
  for (const char* codec : {"q4", "q2:sr"}) v.push_back({16, codec, DType::kFloat32});  // scale
  v.push_back({3, "q4", DType::kBFloat16});
  v.push_back({4, "q8:block=64", DType::kBFloat16});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Codecs, CollectivesCompressed, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           std::string name = "P" + std::to_string(p.param.P) + "_" +
                                              p.param.codec + "_" + dtype_name(p.param.dtype);
                           for (char& ch : name)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

// Error feedback: the running sum of 20 all-reduces of the same inputs tracks the true running
// sum within a couple of quantization steps, where without it the error grows every step.
std::string ef_rank(int rank, const UniqueId& id) {
  const int P = 3;
  auto comm = Communicator::init(id, rank, P, test_options());
  RANK_OK(comm.status());
  const uint64_t n = 4096;
  Tensor x = make_input(DType::kFloat32, n, 9, rank);
  std::vector<double> truth(n), with_ef(n), without(n);
  AllReduceOptions ef, plain;
  ef.codec = plain.codec = *parse_codec_spec("q2");
  ef.error_feedback_key = "grad";
  ef.owner_error_feedback = true;
  Tensor y(DType::kFloat32, n);
  const int steps = 20;
  for (int t = 0; t < steps; ++t) {
    RANK_OK((*comm)->all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kSum, ef).wait());
    for (uint64_t i = 0; i < n; ++i) with_ef[i] += y.get(i);
    RANK_OK(
        (*comm)->all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kSum, plain).wait());
    for (uint64_t i = 0; i < n; ++i) without[i] += y.get(i);
    for (uint64_t i = 0; i < n; ++i)
      for (int r = 0; r < P; ++r) truth[i] += input_value(9, r, i);
  }
  double e_ef = 0, e_plain = 0, amax = 0;
  for (uint64_t i = 0; i < n; ++i) {
    e_ef = std::max(e_ef, std::fabs(with_ef[i] - truth[i]));
    e_plain = std::max(e_plain, std::fabs(without[i] - truth[i]));
    for (int r = 0; r < P; ++r)
      amax = std::max(amax, std::fabs(static_cast<double>(input_value(9, r, i))));
  }
  // One q2 step of a rank's input is at most amax / 2; of the sum at most P amax / 2. The EF error
  // stays at the level of the residuals (a few steps), not 20 steps' worth.
  double one_step = P * amax / 2 + P * amax / 2;
  RANK_CHECK(e_ef <= 2 * one_step, "EF running-sum error " + std::to_string(e_ef) + " exceeds " +
                                       std::to_string(2 * one_step));
  RANK_CHECK(e_ef * 4 < e_plain, "EF error " + std::to_string(e_ef) + " not well below plain " +
                                     std::to_string(e_plain));
  // The state survives a save / restore round trip byte for byte; damaged bytes are refused.
  auto saved = (*comm)->save_error_feedback();
  RANK_OK(saved.status());
  RANK_CHECK(saved->size() > n * 4, "saved state too small");
  RANK_OK((*comm)->restore_error_feedback(saved->data(), saved->size()));
  auto again = (*comm)->save_error_feedback();
  RANK_CHECK(*again == *saved, "restore did not reproduce the state");
  std::vector<uint8_t> bad = *saved;
  bad[bad.size() / 2] ^= 1;
  RANK_CHECK(!(*comm)->restore_error_feedback(bad.data(), bad.size()).is_ok(),
             "damaged state accepted");
  Tensor small(DType::kFloat32, 100);
  // Names are listed; dropping one (and the names under it) frees it for another tensor.
  ef.owner_error_feedback = false;
  ef.error_feedback_key = "grad/sub";
  RANK_OK((*comm)
              ->all_reduce(small.data(), small.data(), 100, DType::kFloat32, ReduceOp::kSum, ef)
              .wait());
  auto names = (*comm)->error_feedback_keys();
  RANK_OK(names.status());
  RANK_CHECK((*names == std::vector<std::string>{"grad", "grad/sub"}), "names not listed");
  auto dropped = (*comm)->reset_error_feedback("gra");  // a prefix that is not a name: nothing
  RANK_CHECK(dropped.is_ok() && *dropped == 0, "a partial name dropped something");
  dropped = (*comm)->reset_error_feedback("grad");
  RANK_CHECK(dropped.is_ok() && *dropped == 2, "reset did not drop grad and grad/sub");
  ef.error_feedback_key = "grad";
  RANK_OK((*comm)
              ->all_reduce(small.data(), small.data(), 100, DType::kFloat32, ReduceOp::kSum, ef)
              .wait());
  // A different tensor under the same key ("grad" holds 100 elements now) is refused, not
  // silently reset (and breaks the communicator: the mismatch is found while running).
  Status s = (*comm)->all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kSum, ef).wait();
  RANK_CHECK(s.code() == StatusCode::kInvalidArgument, s.to_string());
  return "ok ef " + std::to_string(e_ef) + " plain " + std::to_string(e_plain);
}

TEST(CollectivesErrorFeedback, RunningSumTracksTheTruthAndStateRoundTrips) {
  expect_all_ok(run_ranks(3, ef_rank));
}

}  // namespace
}  // namespace lowcomm::testing
