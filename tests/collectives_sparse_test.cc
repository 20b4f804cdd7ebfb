// All-reduce with the sparse codecs (topk, randk) over real sockets: every rank's message reaches
// every rank and the P messages are summed in rank order in fp32 (the reference below rebuilds
// the result from the codec functions, error feedback with decay included), bitwise identical on
// every rank; the stats name density, index and value bytes; reduce_scatter and reduce refuse a
// sparse codec the call names and leave a default one exact; ranks that disagree on K fail the
// descriptor check. Random-k's owner schedule over the shared positions is the dense owner
// all-reduce of the kept elements (checked against that call itself), and auto tries both.

#include "collectives/reduce_common.h"
#include "collectives_test_util.h"
#include "lowcomm/lowcomm.h"

namespace lowcomm::testing {
namespace {

TEST(CollectivesSparse, GatherAllSumIsTheReferenceOnEveryRank) {
  constexpr int P = 4;
  auto res = run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, P, test_options());
    RANK_OK(c.status());
    const uint64_t n = 3 * 4096 + 123;  // a short last chunk
    std::string out = "ok ";
    for (const char* text :
         {"topk:64/4096+q2:decay=0.9", "randk:82/4096+q2", "topk:700/4096+q4", "topk:3/32+q8"}) {
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
        o.sparse_schedule = AllReduceOptions::SparseSchedule::kGatherAll;
        RANK_OK(
            (*c)->all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kAverage, o).wait());
        const OpStats st = (*c)->last_op_stats();
        RANK_CHECK(st.schedule == "gather-all", "schedule " + st.schedule);
        const SparseLayout l = sparse_layout(spec, n);
        RANK_CHECK(st.payload_bytes_sent == (P - 1) * encoded_size(spec, n),
                   "payload " + std::to_string(st.payload_bytes_sent));
        RANK_CHECK(st.index_bytes_sent == (P - 1) * l.index_bytes, "index bytes");
        RANK_CHECK(st.value_bytes_sent == (P - 1) * l.value_bytes, "value bytes");
        RANK_CHECK(std::abs(st.density - double(l.kept) / double(n)) < 1e-12,
                   "density " + std::to_string(st.density));
        std::vector<float> acc(n, 0.0f), ref(n);
        std::vector<uint8_t> codes(encoded_size(spec, n));
        for (int r = 0; r < P; ++r) {
          std::vector<float> xr(n);
          for (uint64_t i = 0; i < n; ++i) xr[i] = input_value(step, r, i);
          const bool shared = spec.kind == CodecKind::kRandk;
          RoundingKey key{collectives::rounding_seed(5, step, shared ? 0 : r, shared ? 2 : 1), 0};
          RANK_OK(encode_error_feedback(spec, DType::kFloat32, xr.data(), residual[r].data(), n,
                                        codes.data(), codes.size(), key));
          RANK_OK(
              decode_accumulate(spec, codes.data(), codes.size(), n, DType::kFloat32, acc.data()));
        }
        uint64_t nonzero = 0;
        for (uint64_t i = 0; i < n; ++i) {
          ref[i] = acc[i] / static_cast<float>(P);
          nonzero += y[i] != 0.0f ? 1 : 0;
        }
        RANK_CHECK(std::memcmp(ref.data(), y.data(), n * 4) == 0,
                   std::string(text) + " step " + std::to_string(step) + ": not the reference");
        // Random-k: every rank kept the same positions, so the sum is as sparse as one message.
        if (spec.kind == CodecKind::kRandk)
          RANK_CHECK(nonzero <= l.kept, "randk positions differ across ranks");
        else
          RANK_CHECK(nonzero > l.kept, "topk sets should differ across ranks");
        std::vector<uint8_t> b(n * 4);
        std::memcpy(b.data(), y.data(), b.size());
        out += std::to_string(fnv64(b)) + " ";
      }
    }
    // In place, bf16: the same path, rounded once to bf16.
    Tensor t = make_input(DType::kBFloat16, 5000, 3, rank);
    AllReduceOptions o;
    o.codec = *parse_codec_spec("topk:16/1024+q4");
    RANK_OK((*c)->all_reduce(t.data(), t.data(), 5000, DType::kBFloat16, ReduceOp::kSum, o).wait());
    out += std::to_string(fnv64(t.bytes));
    return out;
  });
  expect_all_ok(res);
  for (int r = 1; r < P; ++r) EXPECT_EQ(res[r].text, res[0].text) << "rank " << r;
}

// One rank: the sum of its own message (the one-hop path runs alone).
TEST(CollectivesSparse, OneRankSumsItsOwnMessage) {
  auto res = run_ranks(1, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 1, test_options());
    RANK_OK(c.status());
    const uint64_t n = 10000;
    std::vector<float> x(n), y(n), want(n);
    for (uint64_t i = 0; i < n; ++i) x[i] = input_value(2, 0, i);
    AllReduceOptions o;
    o.codec = *parse_codec_spec("topk:16/1024+q4");
    RANK_OK((*c)->all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kSum, o).wait());
    std::vector<uint8_t> codes(encoded_size(*o.codec, n));
    RANK_OK(encode(*o.codec, DType::kFloat32, x.data(), n, codes.data(), codes.size()));
    RANK_OK(decode(*o.codec, codes.data(), codes.size(), n, DType::kFloat32, want.data()));
    RANK_CHECK(std::memcmp(y.data(), want.data(), n * 4) == 0, "not decode(encode(x))");
    return "ok";
  });
  expect_all_ok(res);
}

TEST(CollectivesSparse, OtherReductionsRefuseOrBypassSparseCodecs) {
  constexpr int P = 2;
  auto res = run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    CommOptions opts = test_options();
    opts.codec = *parse_codec_spec("topk:8/256+q2");  // the default codec
    auto c = Communicator::init(id, rank, P, opts);
    RANK_OK(c.status());
    std::vector<float> x(1024), y(1024), z(512);
    for (uint64_t i = 0; i < x.size(); ++i) x[i] = input_value(1, rank, i);
    AllReduceOptions named;
    named.codec = *parse_codec_spec("topk:8/256+q2");
    Work w = (*c)->reduce_scatter(x.data(), z.data(), 512, DType::kFloat32, ReduceOp::kSum, named);
    RANK_CHECK(w.refused() && w.status().message().find("all_reduce only") != std::string::npos,
               w.status().to_string());
    w = (*c)->reduce(x.data(), y.data(), 1024, DType::kFloat32, ReduceOp::kSum, 0, named);
    RANK_CHECK(w.refused(), w.status().to_string());
    AllReduceOptions owner = named;
    owner.error_feedback_key = "k";
    owner.owner_error_feedback = true;
    w = (*c)->all_reduce(x.data(), y.data(), 1024, DType::kFloat32, ReduceOp::kSum, owner);
    RANK_CHECK(w.refused(), "owner_error_feedback with a sparse codec");
    // The default sparse codec leaves reduce_scatter exact.
    RANK_OK((*c)->reduce_scatter(x.data(), z.data(), 512, DType::kFloat32, ReduceOp::kSum).wait());
    RANK_CHECK((*c)->last_op_stats().codec.empty(), "reduce_scatter compressed");
    for (uint64_t i = 0; i < 512; ++i) {
      const uint64_t g = static_cast<uint64_t>(rank) * 512 + i;
      volatile float want = input_value(1, 0, g) + input_value(1, 1, g);
      RANK_CHECK(z[i] == want, "reduce_scatter not exact at " + std::to_string(i));
    }
    // ... and all_reduce sparse.
    RANK_OK((*c)->all_reduce(x.data(), y.data(), 1024, DType::kFloat32, ReduceOp::kSum).wait());
    RANK_CHECK((*c)->last_op_stats().codec == "topk:8/256+q2", (*c)->last_op_stats().codec);
    return "ok";
  });
  expect_all_ok(res);
}

TEST(CollectivesSparse, RanksThatDisagreeOnKFailWithAMismatch) {
  constexpr int P = 2;
  auto res = run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, P, test_options());
    RANK_OK(c.status());
    std::vector<float> x(4096, 1.0f);
    AllReduceOptions o;
    o.codec = *parse_codec_spec(rank == 0 ? "topk:64/4096+q2" : "topk:65/4096+q2");
    Status s =
        (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum, o).wait();
    RANK_CHECK(s.code() == StatusCode::kInvalidArgument, s.to_string());
    RANK_CHECK(s.to_string().find("mismatched operations") != std::string::npos, s.to_string());
    return "ok";
  });
  expect_all_ok(res);
}

// Random-k's owner schedule: the kept elements (randk_positions), error feedback with decay over
// the whole tensor, the owner all-reduce of the kept values with q<B>; checked against a
// reference built from public calls: the positions, the residual rule, and the dense all-reduce
// of the compacted vectors on the same communicator. Zero elsewhere, the same on every rank.
TEST(CollectivesSparse, OwnerScheduleIsTheDenseOwnerReductionOfTheKeptElements) {
  constexpr int P = 4;
  auto res = run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, P, test_options());
    RANK_OK(c.status());
    const uint64_t n = 20 * 4096 + 777;  // a short last chunk
    const CodecSpec spec = *parse_codec_spec("randk:64/4096+q2:decay=0.9");
    const CodecSpec dense = *parse_codec_spec("q2");  // absmax, blocks of 128, nearest
    const uint64_t kept = sparse_layout(spec, n).kept;
    std::vector<float> r(n, 0.0f);  // this rank's residual, kept by the reference
    std::string out = "ok ";
    for (uint64_t step = 0; step < 3; ++step) {
      std::vector<float> x(n), y(n);
      for (uint64_t i = 0; i < n; ++i) x[i] = input_value(step, rank, i);
      AllReduceOptions o;
      o.codec = spec;
      o.error_feedback_key = "g";
      o.seed = 11;
      o.step = step;
      o.sparse_schedule = AllReduceOptions::SparseSchedule::kOwner;
      RANK_OK(
          (*c)->all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kAverage, o).wait());
      const OpStats st = (*c)->last_op_stats();
      RANK_CHECK(st.schedule == "owner", "schedule " + st.schedule);
      RANK_CHECK(st.index_bytes_sent == 0, "positions sent");
      RANK_CHECK(std::abs(st.density - double(kept) / double(n)) < 1e-12,
                 "density " + std::to_string(st.density));
      // Of the payload, the 2-bit codes; the rest are q2's block scales (32 bits per 128).
      RANK_CHECK(st.value_bytes_sent <= st.payload_bytes_sent * 8 / 9 &&
                     st.value_bytes_sent + 8 >= st.payload_bytes_sent * 8 / 9,
                 "value bytes " + std::to_string(st.value_bytes_sent));
      // About 2 (P-1)/P of the kept values' q2 codes, against gather-all's (P-1) messages.
      RANK_CHECK(st.payload_bytes_sent < (P - 1) * encoded_size(spec, n) * 2 / 3,
                 "payload " + std::to_string(st.payload_bytes_sent));
      RANK_CHECK(st.compression_ratio > 100, "ratio " + std::to_string(st.compression_ratio));

      // The reference: positions, compaction with the residual rule, the dense all-reduce.
      std::vector<uint64_t> pos(kept);
      RANK_OK(randk_positions(spec, n, collectives::rounding_seed(11, step, 0, 2), pos.data()));
      std::vector<float> v(kept), vr(kept), kres(kept, 0.0f);
      for (uint64_t i = 0; i < n; ++i) r[i] = x[i] + r[i];
      for (uint64_t k = 0; k < kept; ++k) v[k] = r[pos[k]];
      for (uint64_t i = 0; i < n; ++i) r[i] *= 0.9f;
      std::vector<uint8_t> codes(encoded_size(dense, kept));
      // The kept elements' residual: β·(v - D(Q(v))), Q the codes v's contribution carries.
      RANK_OK(encode_error_feedback(*parse_codec_spec("q2:decay=0.9"), DType::kFloat32, v.data(),
                                    kres.data(), kept, codes.data(), codes.size()));
      for (uint64_t k = 0; k < kept; ++k) r[pos[k]] = kres[k];
      AllReduceOptions d;
      d.codec = dense;
      RANK_OK((*c)->all_reduce(v.data(), vr.data(), kept, DType::kFloat32, ReduceOp::kAverage, d)
                  .wait());
      std::vector<float> want(n, 0.0f);
      for (uint64_t k = 0; k < kept; ++k) want[pos[k]] = vr[k];
      RANK_CHECK(std::memcmp(want.data(), y.data(), n * 4) == 0,
                 "step " + std::to_string(step) + ": not the reference");
      std::vector<uint8_t> b(n * 4);
      std::memcpy(b.data(), y.data(), b.size());
      out += std::to_string(fnv64(b)) + " ";
    }
    return out;
  });
  expect_all_ok(res);
  for (int r = 1; r < P; ++r) EXPECT_EQ(res[r].text, res[0].text) << "rank " << r;
}

// A non-finite element is sent, never kept back: its chunk's kept positions come out NaN, the
// residual of the chunk restarts at zero, and chunks in other q2 blocks stay finite.
TEST(CollectivesSparse, OwnerScheduleSendsANonFiniteChunkAsNaN) {
  constexpr int P = 3;
  expect_all_ok(run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, P, test_options());
    RANK_OK(c.status());
    const uint64_t n = 8 * 1024;
    const CodecSpec spec = *parse_codec_spec("randk:128/1024+q4");  // a q4 block per chunk
    AllReduceOptions o;
    o.codec = spec;
    o.error_feedback_key = "nan";
    o.sparse_schedule = AllReduceOptions::SparseSchedule::kOwner;
    std::vector<float> x(n), y(n);
    for (uint64_t step = 0; step < 2; ++step) {
      for (uint64_t i = 0; i < n; ++i) x[i] = input_value(step, rank, i);
      // Step 0: rank 1 has an infinity in chunk 2, at a position nobody keeps or one they do.
      if (step == 0 && rank == 1) x[2 * 1024 + 5] = INFINITY;
      o.step = step;
      RANK_OK((*c)->all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kSum, o).wait());
      std::vector<uint64_t> pos(sparse_layout(spec, n).kept);
      RANK_OK(randk_positions(spec, n, collectives::rounding_seed(0, step, 0, 2), pos.data()));
      for (uint64_t k = 0; k < pos.size(); ++k) {
        const bool bad = step == 0 && pos[k] / 1024 == 2;
        RANK_CHECK(bad ? std::isnan(y[pos[k]]) : std::isfinite(y[pos[k]]),
                   "step " + std::to_string(step) + " position " + std::to_string(pos[k]) + ": " +
                       std::to_string(y[pos[k]]));
      }
    }
    return "ok";
  }));
}

// auto: with three ranks or more, both schedules are tried and every rank runs the same one for
// each call (the slowest rank's times decide); explicit choices that cannot run are refused.
TEST(CollectivesSparse, AutoTriesBothSchedulesEveryRankAlikeAndOwnerRefusesTopk) {
  constexpr int P = 3;
  auto res = run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, P, test_options());
    RANK_OK(c.status());
    const uint64_t n = 64 * 1024;
    std::vector<float> x(n), y(n);
    AllReduceOptions o;
    o.codec = *parse_codec_spec("randk:32/1024+q2");
    std::string out = "ok ";
    bool gathered = false, owned = false;
    for (uint64_t step = 0; step < 8; ++step) {
      for (uint64_t i = 0; i < n; ++i) x[i] = input_value(step, rank, i);
      RANK_OK((*c)->all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kSum, o).wait());
      const std::string s = (*c)->last_op_stats().schedule;
      gathered = gathered || s == "gather-all";
      owned = owned || s == "owner";
      std::vector<uint8_t> b(n * 4);
      std::memcpy(b.data(), y.data(), b.size());
      out += s + ":" + std::to_string(fnv64(b)) + " ";
    }
    RANK_CHECK(gathered && owned, "auto did not try both: " + out);
    AllReduceOptions bad;
    bad.codec = *parse_codec_spec("topk:32/1024+q2");
    bad.sparse_schedule = AllReduceOptions::SparseSchedule::kOwner;
    Work w = (*c)->all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kSum, bad);
    RANK_CHECK(w.refused() && w.status().code() == StatusCode::kInvalidArgument &&
                   w.status().message().find("sparse_schedule owner") != std::string::npos,
               w.status().to_string());
    bad.codec = *parse_codec_spec("randk:32/1024+q2");
    w = (*c)->all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kMax, bad);
    RANK_CHECK(w.refused(), "owner schedule took a MAX reduction");
    // Still usable after the refusals.
    RANK_OK((*c)->all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kSum, o).wait());
    return out;
  });
  expect_all_ok(res);
  for (int r = 1; r < P; ++r) EXPECT_EQ(res[r].text, res[0].text) << "rank " << r;
}

// The owner schedule in place, on one rank, and on tensors so small that some owners own
// nothing; ranks whose seed (or step) differ, and so would keep different positions, fail the
// descriptor check instead of summing values of different elements.
TEST(CollectivesSparse, OwnerScheduleInPlaceTinyAndSeedMismatch) {
  auto one = run_ranks(1, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 1, test_options());
    RANK_OK(c.status());
    const uint64_t n = 3000;
    const CodecSpec spec = *parse_codec_spec("randk:8/256+q8");
    std::vector<float> x(n), y(n);
    for (uint64_t i = 0; i < n; ++i) x[i] = input_value(0, 0, i);
    AllReduceOptions o;
    o.codec = spec;
    o.sparse_schedule = AllReduceOptions::SparseSchedule::kOwner;
    RANK_OK((*c)->all_reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kSum, o).wait());
    RANK_CHECK((*c)->last_op_stats().schedule == "owner", (*c)->last_op_stats().schedule);
    std::vector<uint64_t> pos(sparse_layout(spec, n).kept);
    RANK_OK(randk_positions(spec, n, collectives::rounding_seed(0, 0, 0, 2), pos.data()));
    uint64_t k = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const bool kept = k < pos.size() && pos[k] == i;
      k += kept ? 1 : 0;
      // One rank: its own kept values through q8 once (the owner's own contribution is its
      // sum), the rest zero.
      RANK_CHECK(kept ? std::abs(y[i] - x[i]) <= 0.01f * std::abs(x[i]) + 0.05f : y[i] == 0.0f,
                 "element " + std::to_string(i));
    }
    return "ok";
  });
  expect_all_ok(one);
  constexpr int P = 4;
  auto res = run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, P, test_options());
    RANK_OK(c.status());
    std::string out = "ok ";
    // 300 elements keep 10: one q2 block, owned by rank 0; the others own nothing.
    for (uint64_t n : {300, 5000}) {
      std::vector<float> x(n);
      for (uint64_t i = 0; i < n; ++i) x[i] = input_value(1, rank, i);
      AllReduceOptions o;
      o.codec = *parse_codec_spec("randk:8/256+q2");
      o.error_feedback_key = "tiny" + std::to_string(n);
      o.sparse_schedule = AllReduceOptions::SparseSchedule::kOwner;
      RANK_OK((*c)->all_reduce(x.data(), x.data(), n, DType::kFloat32, ReduceOp::kSum, o).wait());
      std::vector<uint8_t> b(n * 4);
      std::memcpy(b.data(), x.data(), b.size());
      out += std::to_string(fnv64(b)) + " ";
    }
    std::vector<float> x(4096, 1.0f);
    AllReduceOptions o;
    o.codec = *parse_codec_spec("randk:8/256+q2");
    o.sparse_schedule = AllReduceOptions::SparseSchedule::kOwner;
    o.seed = rank == 2 ? 8 : 7;
    Status s =
        (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum, o).wait();
    RANK_CHECK(s.code() == StatusCode::kInvalidArgument &&
                   s.to_string().find("mismatched operations") != std::string::npos &&
                   s.to_string().find("positions") != std::string::npos,
               s.to_string());
    return out;
  });
  expect_all_ok(res);
  for (int r = 1; r < P; ++r) EXPECT_EQ(res[r].text, res[0].text) << "rank " << r;
}

TEST(CollectivesSparse, SparseScheduleSettingIsCheckedAtInit) {
  expect_all_ok(run_ranks(1, [](int rank, const UniqueId& id) -> std::string {
    CommOptions opts = test_options();
    opts.sparse_schedule = "sometimes";
    auto c = Communicator::init(id, rank, 1, opts);
    RANK_CHECK(!c.status().is_ok() &&
                   c.status().message().find(
                       "sparse_schedule option must be one of auto, gather-all, owner") !=
                       std::string::npos,
               c.status().to_string());
    return "ok";
  }));
}

// The C API takes a sparse spec string and reports density, index and value bytes.
TEST(CollectivesSparse, CApiSpecAndStats) {
  constexpr int P = 3;
  expect_all_ok(run_ranks(P, [](int rank, const UniqueId& id) -> std::string {
    ::setenv("LOWCOMM_TIMEOUT_S", "10", 1);
    lowcommUniqueId cid;
    auto raw = id.to_bytes();
    std::memcpy(cid.internal, raw.data(), raw.size());
    lowcommComm_t comm = nullptr;
    RANK_CHECK(lowcommCommInitRank(&comm, P, cid, rank) == lowcommSuccess,
               lowcommGetLastError(nullptr));
    const uint64_t n = 100000;
    Tensor x = make_input(DType::kFloat32, n, 4, rank);
    lowcommRequest_t req = nullptr;
    RANK_CHECK(lowcommAllReduce(x.data(), x.data(), n, lowcommFloat32, lowcommSum,
                                "topk:64/4096+q2", comm, &req) == lowcommSuccess,
               lowcommGetLastError(comm));
    lowcommOpStats s = LOWCOMM_OP_STATS_INIT;
    RANK_CHECK(lowcommWaitStats(req, &s) == lowcommSuccess, lowcommGetLastError(comm));
    const CodecSpec spec = *parse_codec_spec("topk:64/4096+q2");
    const SparseLayout l = sparse_layout(spec, n);
    RANK_CHECK(std::string(s.codec) == "topk:64/4096+q2", s.codec);
    RANK_CHECK(s.payloadBytesSent == (P - 1) * encoded_size(spec, n), "payload");
    RANK_CHECK(s.indexBytesSent == (P - 1) * l.index_bytes, "index bytes");
    RANK_CHECK(s.valueBytesSent == (P - 1) * l.value_bytes, "value bytes");
    RANK_CHECK(std::abs(s.density - double(l.kept) / double(n)) < 1e-12, "density");
    RANK_CHECK(s.compressionRatio > 100, "ratio " + std::to_string(s.compressionRatio));
    // A bad sparse spec is refused before anything is sent.
    RANK_CHECK(lowcommAllReduce(x.data(), x.data(), n, lowcommFloat32, lowcommSum,
                                "topk:64/1000+q2", comm, &req) == lowcommInvalidArgument,
               "bad chunk accepted");
    RANK_CHECK(std::string(lowcommGetLastError(comm)).find("power of two") != std::string::npos,
               lowcommGetLastError(comm));
    RANK_CHECK(lowcommCommDestroy(comm) == lowcommSuccess, lowcommGetLastError(nullptr));
    return "ok";
  }));
}

}  // namespace
}  // namespace lowcomm::testing
