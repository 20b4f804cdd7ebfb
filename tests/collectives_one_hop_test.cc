// The one-hop all-reduce (CommOptions::direct_bytes): uncompressed it gives the owner
// reduction's bits; compressed it is exactly one quantization per contribution (the reference
// below rebuilds it from the codec functions), identical on every rank, with error feedback and
// stochastic rounding; ranks that disagree on the threshold fail with a mismatch naming it.

#include "collectives/reduce_common.h"
#include "collectives_test_util.h"

namespace lowcomm::testing {
namespace {

CommOptions one_hop(uint64_t direct_bytes) {
  CommOptions o = test_options();
  o.direct_bytes = direct_bytes;
  return o;
}

// Every (dtype, op) case out of place and in place; "ok " then the output hashes. With one_hop,
// also checks that the call took one hop (it sends the whole tensor to each peer).
std::string uncompressed_cases(int rank, const UniqueId& id, int P, bool one_hop_on) {
  auto c = Communicator::init(id, rank, P, one_hop(one_hop_on ? 1 << 30 : 0));
  RANK_OK(c.status());
  const uint64_t n = 5000;
  std::string out = "ok ";
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kInt32}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
      if (dt == DType::kInt32 && op == ReduceOp::kAverage) continue;
      Tensor x = make_input(dt == DType::kInt32 ? DType::kFloat32 : dt, n, 11, rank);
      std::vector<uint8_t> in = x.bytes;
      if (dt == DType::kInt32)
        for (uint64_t i = 0; i < n; ++i) {
          int32_t v = static_cast<int32_t>(1000 * x.get(i));
          std::memcpy(&in[4 * i], &v, 4);
        }
      std::vector<uint8_t> y(in.size());
      RANK_OK((*c)->all_reduce(in.data(), y.data(), n, dt, op).wait());
      if (one_hop_on) {
        RANK_CHECK((*c)->last_op_stats().bytes_sent >= 2 * in.size(), "did not take one hop");
        std::vector<uint8_t> z = in;  // in place
        RANK_OK((*c)->all_reduce(z.data(), z.data(), n, dt, op).wait());
        RANK_CHECK(z == y, "in place differs");
      }
      out += std::to_string(fnv64(y)) + " ";
    }
  }
  return out;
}

TEST(CollectivesOneHop, UncompressedGivesTheOwnerReductionsBits) {
  constexpr int P = 3;
  auto hop = run_ranks(
      P, [](int rank, const UniqueId& id) { return uncompressed_cases(rank, id, P, true); });
  expect_all_ok(hop);
  auto owner = run_ranks(
      P, [](int rank, const UniqueId& id) { return uncompressed_cases(rank, id, P, false); });
  expect_all_ok(owner);
  for (int r = 0; r < P; ++r) {
    EXPECT_EQ(hop[r].text, owner[r].text) << "rank " << r;
    EXPECT_EQ(hop[r].text, hop[0].text) << "rank " << r;
  }
}

TEST(CollectivesOneHop, CompressedIsOneQuantizationPerContributionOnEveryRank) {
  constexpr int P = 4;
  auto res = run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, P, one_hop(1 << 20));
    RANK_OK(c.status());
    const uint64_t n = 3000 + 17;  // a partial last block
    std::string out = "ok ";
    for (const char* text : {"q4", "q2:sr", "q1"}) {
      const CodecSpec spec = *parse_codec_spec(text);
      std::vector<std::vector<float>> residual(P, std::vector<float>(n, 0.0f));
      for (uint64_t step = 0; step < 3; ++step) {  // error feedback carries across calls
        std::vector<float> x(n), y(n);
        for (uint64_t i = 0; i < n; ++i) x[i] = input_value(step, rank, i);
        AllReduceOptions o;
        o.codec = spec;
        o.error_feedback_key = text;
        o.seed = 5;
        o.step = step;
        RANK_OK(
            (*c)->all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kAverage, o).wait());
        // The reference: every rank's contribution quantized once (its residual added), decoded
        // and summed in rank order in fp32, divided by P.
        std::vector<float> acc(n, 0.0f), ref(n);
        std::vector<uint8_t> codes(encoded_size(spec, n));
        for (int r = 0; r < P; ++r) {
          std::vector<float> xr(n);
          for (uint64_t i = 0; i < n; ++i) xr[i] = input_value(step, r, i);
          RoundingKey key{collectives::rounding_seed(5, step, r, 1), 0};
          RANK_OK(encode_error_feedback(spec, DType::kFloat32, xr.data(), residual[r].data(), n,
                                        codes.data(), codes.size(), key));
          RANK_OK(
              decode_accumulate(spec, codes.data(), codes.size(), n, DType::kFloat32, acc.data()));
        }
        for (uint64_t i = 0; i < n; ++i) ref[i] = acc[i] / static_cast<float>(P);
        RANK_CHECK(std::memcmp(ref.data(), y.data(), n * 4) == 0,
                   std::string(text) + " step " + std::to_string(step) + ": not the reference");
        std::vector<uint8_t> b(n * 4);
        std::memcpy(b.data(), y.data(), b.size());
        out += std::to_string(fnv64(b)) + " ";
      }
    }
    return out;
  });
  expect_all_ok(res);
  for (int r = 1; r < P; ++r) EXPECT_EQ(res[r].text, res[0].text) << "rank " << r;
}

TEST(CollectivesOneHop, RanksThatDisagreeOnTheThresholdFailWithAMismatch) {
  constexpr int P = 2;
  auto res = run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, P, one_hop(rank == 0 ? 1 << 20 : 0));
    RANK_OK(c.status());
    std::vector<float> x(256, 1.0f);
    Status s =
        (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait();
    RANK_CHECK(s.code() == StatusCode::kInvalidArgument, s.to_string());
    RANK_CHECK(s.to_string().find("one hop") != std::string::npos, s.to_string());
    RANK_CHECK(s.to_string().find("mismatched operations") != std::string::npos, s.to_string());
    return "ok";
  });
  expect_all_ok(res);
}

}  // namespace
}  // namespace lowcomm::testing
