// The uncompressed collectives over real processes on loopback, against fp64 references.

#include <numeric>

#include "collectives_test_util.h"

namespace lowcomm::testing {
namespace {

TEST(CollectivesUniqueId, RoundTripsThroughBytesAndText) {
  auto id = create_unique_id("127.0.0.1");
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  auto b = id->to_bytes();
  auto back = UniqueId::from_bytes(b.data(), b.size());
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->root_address, id->root_address);
  EXPECT_EQ(back->secret, id->secret);
  auto parsed = UniqueId::parse(id->to_string());
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->secret, id->secret);
  b[50] ^= 1;
  EXPECT_EQ(UniqueId::from_bytes(b.data(), b.size()).status().code(), StatusCode::kInvalidArgument);
  std::string t = id->to_string();
  t.pop_back();
  auto bad = UniqueId::parse(t);
  EXPECT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message().find(t.substr(t.size() - 10)), std::string::npos)
      << "the error must not echo the secret";
  (void)rendezvous::take_root_socket(id->to_string());
}

// torch's reconfigure: one root address, one communicator per context (uuid); a rank with
// another context fails init on every rank by the init deadline, naming no secret.
TEST(CollectivesUniqueId, DerivedIdsJoinOnlyWithTheSameContext) {
  UniqueId base;
  base.root_address = "127.0.0.1:1";
  base.secret.fill(7);
  UniqueId a = derive_unique_id(base, "uuid 1");
  EXPECT_EQ(a.root_address, base.root_address);
  EXPECT_NE(a.secret, base.secret);
  EXPECT_EQ(derive_unique_id(base, "uuid 1").secret, a.secret);
  EXPECT_NE(derive_unique_id(base, "uuid 2").secret, a.secret);

  // Rank 0's kept root socket (inherited from the parent) serves the derived id.
  expect_all_ok(run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(derive_unique_id(id, "uuid 1"), rank, 3, test_options());
    RANK_OK(c.status());
    RANK_OK((*c)->barrier().wait());
    return "ok";
  }));

  auto res = run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.init_timeout = std::chrono::milliseconds(3000);
    auto start = Clock::now();
    auto c = Communicator::init(derive_unique_id(id, rank == 2 ? "uuid 3" : "uuid 2"), rank, 3, o);
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    if (c.is_ok()) return "init succeeded with a rank of another context";
    RANK_CHECK(s < 10, "init failed only after " + std::to_string(s) + " s");
    return "ok " + c.status().to_string();
  });
  expect_all_ok(res);
}

// Every collective on one communicator, P ranks.
std::string every_collective(int rank, const UniqueId& id, int P) {
  auto c = Communicator::init(id, rank, P, test_options());
  RANK_OK(c.status());
  Communicator& comm = **c;
  RANK_OK(comm.barrier().wait());

  // all_reduce, fp32 sum, out of place, several in flight at once.
  const uint64_t n = 50003;  // not a multiple of P or of a segment
  std::vector<Tensor> in, out;
  std::vector<Work> works;
  for (int k = 0; k < 3; ++k) {
    in.push_back(make_input(DType::kFloat32, n, 10 + k, rank));
    out.emplace_back(DType::kFloat32, n);
  }
  for (int k = 0; k < 3; ++k)
    works.push_back(comm.all_reduce(in[k].data(), out[k].data(), n, DType::kFloat32,
                                    k == 2 ? ReduceOp::kAverage : ReduceOp::kSum));
  for (int k = 0; k < 3; ++k) {
    RANK_OK(works[k].wait());
    for (uint64_t i = 0; i < n; ++i) {
      double ref = 0;
      for (int r = 0; r < P; ++r) ref += input_value(10 + k, r, i);
      if (k == 2) ref /= P;
      double err = std::fabs(out[k].get(i) - ref);
      RANK_CHECK(err <= 1e-5 * (1 + std::fabs(ref)) * P,
                 "all_reduce " + std::to_string(k) + " element " + std::to_string(i) + ": " +
                     std::to_string(out[k].get(i)) + " vs " + std::to_string(ref));
    }
  }
  // all_reduce bf16 average, in place: fp32 accumulation, one rounding to bf16.
  Tensor x = make_input(DType::kBFloat16, n, 20, rank);
  RANK_OK(comm.all_reduce(x.data(), x.data(), n, DType::kBFloat16, ReduceOp::kAverage).wait());
  for (uint64_t i = 0; i < n; ++i) {
    double ref = 0;
    for (int r = 0; r < P; ++r) ref += from_bf16(to_bf16(input_value(20, r, i)));
    ref /= P;
    RANK_CHECK(std::fabs(x.get(i) - ref) <= std::fabs(ref) * (1.0 / 256) + 1e-6,
               "bf16 element " + std::to_string(i));
  }

  // reduce_scatter fp32 sum.
  const uint64_t rc = 7001;
  Tensor rs_in = make_input(DType::kFloat32, rc * P, 30, rank);
  Tensor rs_out(DType::kFloat32, rc);
  RANK_OK(
      comm.reduce_scatter(rs_in.data(), rs_out.data(), rc, DType::kFloat32, ReduceOp::kSum).wait());
  for (uint64_t i = 0; i < rc; ++i) {
    double ref = 0;
    for (int r = 0; r < P; ++r) ref += input_value(30, r, rank * rc + i);
    RANK_CHECK(std::fabs(rs_out.get(i) - ref) <= 1e-5 * (1 + std::fabs(ref)) * P, "reduce_scatter");
  }

  // all_gather, out of place then in place.
  const uint64_t gc = 3001;
  Tensor g_in = make_input(DType::kFloat32, gc, 40, rank);
  Tensor g_out(DType::kFloat32, gc * P);
  RANK_OK(comm.all_gather(g_in.data(), g_out.data(), gc, DType::kFloat32).wait());
  for (int r = 0; r < P; ++r)
    for (uint64_t i = 0; i < gc; ++i)
      RANK_CHECK(g_out.get(r * gc + i) == input_value(40, r, i), "all_gather");
  Tensor g_inplace(DType::kFloat32, gc * P);
  for (uint64_t i = 0; i < gc; ++i) g_inplace.set(rank * gc + i, input_value(41, rank, i));
  RANK_OK(
      comm.all_gather(g_inplace.bytes.data() + rank * gc * 4, g_inplace.data(), gc, DType::kFloat32)
          .wait());
  for (int r = 0; r < P; ++r)
    for (uint64_t i = 0; i < gc; ++i)
      RANK_CHECK(g_inplace.get(r * gc + i) == input_value(41, r, i), "all_gather in place");

  // broadcast: small (direct) and large (scatter + relay), root P-1.
  for (uint64_t bc : {uint64_t{100}, uint64_t{300007}}) {
    const int root = P - 1;
    Tensor b_in = make_input(DType::kFloat32, bc, 50, rank);
    Tensor b_out(DType::kFloat32, bc);
    RANK_OK(comm.broadcast(b_in.data(), b_out.data(), bc, DType::kFloat32, root).wait());
    for (uint64_t i = 0; i < bc; ++i)
      RANK_CHECK(b_out.get(i) == input_value(50, root, i), "broadcast");
  }

  // send/recv around a ring, two tags, posted in opposite orders on the two sides.
  const uint64_t sc = 12345;
  Tensor s0 = make_input(DType::kFloat32, sc, 60, rank),
         s1 = make_input(DType::kFloat32, sc, 61, rank);
  Tensor r0(DType::kFloat32, sc), r1(DType::kFloat32, sc);
  int next = (rank + 1) % P, prev = (rank + P - 1) % P;
  Work w0 = comm.send(s0.data(), sc, DType::kFloat32, next, 5);
  Work w1 = comm.send(s1.data(), sc, DType::kFloat32, next, 6);
  Work w3 = comm.recv(r1.data(), sc, DType::kFloat32, prev, 6);
  Work w2 = comm.recv(r0.data(), sc, DType::kFloat32, prev, 5);
  for (Work* w : {&w0, &w1, &w2, &w3}) RANK_OK(w->wait());
  for (uint64_t i = 0; i < sc; ++i) {
    RANK_CHECK(r0.get(i) == input_value(60, prev, i), "recv tag 5");
    RANK_CHECK(r1.get(i) == input_value(61, prev, i), "recv tag 6");
  }
  RANK_OK(comm.barrier().wait());
  return "ok";
}

class CollectivesEvery : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesEvery, MatchFp64References) {
  int P = GetParam();
  expect_all_ok(
      run_ranks(P, [P](int rank, const UniqueId& id) { return every_collective(rank, id, P); }));
}

// CUDA buffers are refused at once with a clear error, and the group stays usable.
TEST(CollectivesMemory, CudaBuffersRefusedWithoutBreakingTheGroup) {
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto comm = Communicator::init(id, rank, 2, test_options());
    if (!comm) return "init: " + comm.status().to_string();
    std::vector<float> x(64, 1.0f);
    AllReduceOptions cuda;
    cuda.memory = MemoryKind::kCuda;
    Status s = (*comm)
                   ->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum, cuda)
                   .wait();
    if (s.code() != StatusCode::kUnsupported) return "cuda all_reduce gave " + s.to_string();
    if (s.message().find("CUDA") == std::string::npos) return "unclear message: " + s.message();
    s = (*comm)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait();
    if (!s.is_ok()) return "host all_reduce after refusal: " + s.to_string();
    if (x[0] != 2.0f) return "wrong sum " + std::to_string(x[0]);
    return "ok";
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesEvery, ::testing::Values(2, 3, 4, 8, 16),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return "P" + std::to_string(p.param);
                         });

}  // namespace
}  // namespace lowcomm::testing
