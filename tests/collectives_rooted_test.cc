// Reduce, gather, scatter and all-to-all (uneven splits) over real processes, every root, with
// exact and compressed reductions; their argument checks; and the C API's forms.

#include <numeric>

#include "collectives_test_util.h"
#include "lowcomm/lowcomm.h"

namespace lowcomm::testing {
namespace {

// The value rank r holds at element i (small integers: fp32 sums and products are exact).
float value(int r, uint64_t i) {
  return static_cast<float>((static_cast<uint64_t>(r) * 7 + i * 3) % 11) - 5.0f;
}

std::string rooted_rank(int rank, const UniqueId& id, int P) {
  auto c = Communicator::init(id, rank, P, test_options());
  RANK_OK(c.status());
  Communicator& comm = **c;
  const uint64_t n = 40000 + 13;  // several 64 KiB segments per owner, not a multiple of P
  std::vector<float> x(n);
  for (uint64_t i = 0; i < n; ++i) x[i] = value(rank, i);
  for (int root = 0; root < P; ++root) {
    // Exact reduce (sum and max), result on root only; other ranks pass a null recv.
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      std::vector<float> y(rank == root ? n : 0, -99.0f);
      RANK_OK(comm.reduce(x.data(), rank == root ? y.data() : nullptr, n, DType::kFloat32, op, root)
                  .wait());
      if (rank != root) continue;
      for (uint64_t i = 0; i < n; ++i) {
        float want = value(0, i);
        for (int r = 1; r < P; ++r)
          want = op == ReduceOp::kSum ? want + value(r, i) : std::max(want, value(r, i));
        RANK_CHECK(y[i] == want, std::string("reduce ") + reduce_op_name(op) + " root " +
                                     std::to_string(root) + " element " + std::to_string(i));
      }
    }
    // Compressed reduce (q8): within one quantization per contribution plus the owner's.
    {
      AllReduceOptions o;
      o.codec = *parse_codec_spec("q8");
      std::vector<float> y(n, 0.0f);
      RANK_OK(comm.reduce(x.data(), y.data(), n, DType::kFloat32, ReduceOp::kSum, root, o).wait());
      if (rank == root) {
        for (uint64_t i = 0; i < n; ++i) {
          float want = 0;
          for (int r = 0; r < P; ++r) want += value(r, i);
          // |x| <= 5 per rank: a q8 step is at most 5/128 per contribution, the sum's at most
          // 5P/128.
          RANK_CHECK(std::fabs(y[i] - want) <= 2.0f * 5.0f * static_cast<float>(P) / 128 + 1e-4f,
                     "q8 reduce element " + std::to_string(i) + ": " + std::to_string(y[i]) +
                         " vs " + std::to_string(want));
        }
      }
    }
    // Gather: root gets every rank's block in rank order.
    const uint64_t per = 1000 + 3;
    std::vector<float> g(rank == root ? per * P : 0);
    RANK_OK(comm.gather(x.data(), rank == root ? g.data() : nullptr, per, DType::kFloat32, root)
                .wait());
    if (rank == root)
      for (int r = 0; r < P; ++r)
        for (uint64_t i = 0; i < per; ++i)
          RANK_CHECK(g[r * per + i] == value(r, i), "gather root " + std::to_string(root));
    // Scatter: rank r gets the root's r-th block.
    std::vector<float> all(rank == root ? per * P : 0), mine(per, -1.0f);
    for (uint64_t i = 0; i < all.size(); ++i) all[i] = static_cast<float>(i);
    RANK_OK(
        comm.scatter(rank == root ? all.data() : nullptr, mine.data(), per, DType::kFloat32, root)
            .wait());
    for (uint64_t i = 0; i < per; ++i)
      RANK_CHECK(mine[i] == static_cast<float>(rank * per + i),
                 "scatter root " + std::to_string(root) + " element " + std::to_string(i));
  }
  // All-to-all with uneven splits: rank r sends (r + j + 1) * 100 elements to rank j, valued
  // 1000 r + j; received blocks are packed in rank order.
  std::vector<uint64_t> sc(P), so(P), rc(P), ro(P);
  uint64_t st = 0, rt = 0;
  for (int j = 0; j < P; ++j) {
    sc[j] = static_cast<uint64_t>(rank + j + 1) * 100;
    so[j] = st;
    st += sc[j];
    rc[j] = static_cast<uint64_t>(j + rank + 1) * 100;
    ro[j] = rt;
    rt += rc[j];
  }
  std::vector<int32_t> s(st), r(rt, -1);
  for (int j = 0; j < P; ++j)
    for (uint64_t i = 0; i < sc[j]; ++i) s[so[j] + i] = 1000 * rank + j;
  RANK_OK(comm.all_to_all(s.data(), sc, so, r.data(), rc, ro, DType::kInt32).wait());
  for (int j = 0; j < P; ++j)
    for (uint64_t i = 0; i < rc[j]; ++i)
      RANK_CHECK(r[ro[j] + i] == 1000 * j + rank, "all_to_all block from " + std::to_string(j));
  return "ok";
}

class CollectivesRooted : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesRooted, ReduceGatherScatterAllToAllOnEveryRoot) {
  const int P = GetParam();
  expect_all_ok(run_ranks(
      P, [P](int rank, const UniqueId& id) { return rooted_rank(rank, id, P); }, 90));
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesRooted, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return "P" + std::to_string(p.param);
                         });

// Wrong arguments are refused at the call; a pair disagreeing on an all-to-all count fails
// the operation naming the peer, on both ranks, within seconds.
TEST(CollectivesRooted, BadArgumentsAndMismatchedSplits) {
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 2, test_options());
    RANK_OK(c.status());
    Communicator& comm = **c;
    std::vector<float> x(8, 1.0f);
    RANK_CHECK(comm.reduce(x.data(), x.data(), 8, DType::kFloat32, ReduceOp::kSum, 2).refused(),
               "reduce to root 2 of 2");
    RANK_CHECK(comm.gather(x.data(), nullptr, 4, DType::kFloat32, rank).refused(),
               "gather into a null root buffer");
    RANK_CHECK(comm.all_to_all(x.data(), {1}, {0}, x.data(), {1}, {0}, DType::kFloat32).refused(),
               "all_to_all with one count for two ranks");
    RANK_CHECK(comm.all_to_all(x.data(), {1, 1}, {0, 1}, x.data(), {2, 2}, {2, 0}, DType::kFloat32)
                   .refused(),
               "all_to_all sending itself another count than it expects");
    // Rank 0 expects 3 elements from rank 1, which sends 2.
    std::vector<float> s(4, 2.0f), r(8, 0.0f);
    std::vector<uint64_t> sc = {2, 2}, so = {0, 2}, rc = {2, rank == 0 ? 3u : 2u}, ro = {0, 2};
    Status st = comm.all_to_all(s.data(), sc, so, r.data(), rc, ro, DType::kFloat32).wait();
    if (rank == 0) {
      RANK_CHECK(!st.is_ok(), "a mismatched split must fail");
      RANK_CHECK(st.message().find("length mismatch") != std::string::npos &&
                     st.message().find("rank 1") != std::string::npos,
                 st.to_string());
    }
    // Rank 1's part may have completed; the group is broken either way.
    if (st.is_ok()) st = comm.barrier().wait();
    RANK_CHECK(!st.is_ok(), "rank " + std::to_string(rank) + ": the group must be broken");
    return "ok";
  }));
}

// The C API's reduce, gather, scatter and all-to-all-v.
TEST(CollectivesRooted, CApi) {
  expect_all_ok(run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    lowcommUniqueId uid;
    auto bytes = id.to_bytes();
    std::memcpy(uid.internal, bytes.data(), sizeof(uid.internal));
    lowcommComm_t comm = nullptr;
    RANK_CHECK(lowcommCommInitRank(&comm, 3, uid, rank) == lowcommSuccess,
               lowcommGetLastError(nullptr));
    std::vector<int64_t> v(5, rank + 1), out(15, 0);
    RANK_CHECK(lowcommReduce(v.data(), out.data(), 5, lowcommInt64, lowcommProd, 1, nullptr, comm,
                             nullptr) == lowcommSuccess,
               lowcommGetLastError(comm));
    if (rank == 1)
      for (int i = 0; i < 5; ++i)
        RANK_CHECK(out[i] == 6, "reduce product " + std::to_string(out[i]));
    RANK_CHECK(
        lowcommGather(v.data(), out.data(), 5, lowcommInt64, 2, comm, nullptr) == lowcommSuccess,
        lowcommGetLastError(comm));
    if (rank == 2)
      for (int i = 0; i < 15; ++i) RANK_CHECK(out[i] == i / 5 + 1, "gather");
    std::vector<int64_t> blocks(15), mine(5);
    std::iota(blocks.begin(), blocks.end(), 0);
    RANK_CHECK(lowcommScatter(blocks.data(), mine.data(), 5, lowcommInt64, 0, comm, nullptr) ==
                   lowcommSuccess,
               lowcommGetLastError(comm));
    for (int i = 0; i < 5; ++i) RANK_CHECK(mine[i] == rank * 5 + i, "scatter");
    size_t counts[3] = {1, 1, 1}, displs[3] = {0, 1, 2};
    std::vector<int64_t> a2a_in = {10L * rank, 10L * rank + 1, 10L * rank + 2}, a2a_out(3);
    RANK_CHECK(lowcommAllToAllv(a2a_in.data(), counts, displs, a2a_out.data(), counts, displs,
                                lowcommInt64, comm, nullptr) == lowcommSuccess,
               lowcommGetLastError(comm));
    for (int j = 0; j < 3; ++j) RANK_CHECK(a2a_out[j] == 10 * j + rank, "all_to_all_v");
    RANK_CHECK(lowcommAllToAllv(a2a_in.data(), nullptr, displs, a2a_out.data(), counts, displs,
                                lowcommInt64, comm, nullptr) == lowcommInvalidArgument,
               "NULL counts");
    RANK_CHECK(lowcommCommDestroy(comm) == lowcommSuccess, "destroy");
    return "ok";
  }));
}

}  // namespace
}  // namespace lowcomm::testing
