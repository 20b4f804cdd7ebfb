// Failures: mismatched collectives, a wrong secret, a missing rank, a killed rank, an expired
// deadline -- each an error on every rank, naming the peer and the operation, never a hang.
// Plus the C API.

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <optional>
#include <thread>

#include "collectives/descriptor.h"
#include "collectives_test_util.h"
#include "core/fnv1a.h"
#include "lowcomm/lowcomm.h"

namespace lowcomm::testing {
namespace {

CommOptions short_timeout(int ms) {
  CommOptions o = test_options();
  o.timeout = std::chrono::milliseconds(ms);
  return o;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Every rank must fail within `max_s` with `code` and every listed fragment in its message.
std::string expect_failure(const Status& s, StatusCode code, std::vector<std::string> parts,
                           Clock::time_point t0, double max_s) {
  double took = std::chrono::duration<double>(Clock::now() - t0).count();
  RANK_CHECK(!s.is_ok(), "the operation succeeded");
  RANK_CHECK(s.code() == code, "code: " + s.to_string());
  for (auto& p : parts)
    RANK_CHECK(contains(s.message(), p), "'" + p + "' missing from: " + s.message());
  RANK_CHECK(took < max_s, "took " + std::to_string(took) + " s: " + s.message());
  return "ok (" + std::to_string(took) + " s) " + s.message();
}

TEST(CollectivesMismatch, DifferentCountFailsOnEveryRankNamingThePeer) {
  auto res = run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 3, test_options());
    RANK_OK(c.status());
    uint64_t n = rank == 2 ? 1001 : 1000;
    std::vector<float> x(n, 1.0f);
    auto t0 = Clock::now();
    Status s = (*c)->all_reduce(x.data(), x.data(), n, DType::kFloat32, ReduceOp::kSum).wait();
    std::string peer = rank == 2 ? "rank 0" : "rank 2";
    return expect_failure(
        s, StatusCode::kInvalidArgument,
        {"mismatched operations", peer, "count 1001", "count 1000", "all_reduce #0"}, t0, 5);
  });
  expect_all_ok(res);
}

TEST(CollectivesMismatch, DifferentCodecFails) {
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 2, test_options());
    RANK_OK(c.status());
    std::vector<float> x(4096, 1.0f);
    AllReduceOptions o;
    o.codec = *parse_codec_spec(rank == 0 ? "q4" : "q8");
    auto t0 = Clock::now();
    Status s =
        (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum, o).wait();
    return expect_failure(s, StatusCode::kInvalidArgument,
                          {"codec q4", "codec q8", rank == 0 ? "rank 1" : "rank 0"}, t0, 5);
  });
  expect_all_ok(res);
}

TEST(CollectivesMismatch, AllReduceAgainstAllGatherFails) {
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 2, test_options());
    RANK_OK(c.status());
    std::vector<float> x(2048, 1.0f);
    auto t0 = Clock::now();
    Status s =
        rank == 0
            ? (*c)->all_reduce(x.data(), x.data(), 2048, DType::kFloat32, ReduceOp::kSum).wait()
            : (*c)->all_gather(x.data(), x.data(), 1024, DType::kFloat32).wait();
    std::string r =
        expect_failure(s, StatusCode::kInvalidArgument, {"all_reduce #0", "all_gather #0"}, t0, 5);
    if (r.rfind("ok", 0) != 0) return r;
    // The failure sticks: the next operation fails at once with the first cause.
    Status later = (*c)->barrier().wait();
    RANK_CHECK(!later.is_ok() && contains(later.message(), "failed earlier"), later.to_string());
    RANK_CHECK(later.code() == StatusCode::kInvalidArgument,
               "a later call must carry the first failure's code: " + later.to_string());
    return r;
  });
  expect_all_ok(res);
}

// Payload is sent before the descriptors are checked (docs/collectives.md): a mismatched peer's
// payload of another length must not fail the connection before the mismatch is named. Three
// segments of contributions per owner, of different sizes on rank 2 (q8) than on 0 and 1.
TEST(CollectivesMismatch, DifferentPayloadLengthsStillNameTheMismatch) {
  auto res = run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 3, test_options());
    RANK_OK(c.status());
    std::vector<float> x(3 * 3 * 16384, 1.0f);
    AllReduceOptions o;
    if (rank == 2) o.codec = *parse_codec_spec("q8");
    auto t0 = Clock::now();
    Status s =
        (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum, o).wait();
    return expect_failure(s, StatusCode::kInvalidArgument,
                          {"mismatched operations", rank == 2 ? "rank 0" : "rank 2", "codec q8",
                           "codec uncompressed"},
                          t0, 5);
  });
  expect_all_ok(res);
}

// Same bytes on the wire, another reduction: an in-place all-reduce's buffer (its input) must
// come back untouched.
TEST(CollectivesMismatch, InPlaceInputSurvivesAnotherReduction) {
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 2, test_options());
    RANK_OK(c.status());
    std::vector<float> x(50000);
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<float>(i % 97) + 0.5f * static_cast<float>(rank);
    const std::vector<float> before = x;
    auto t0 = Clock::now();
    Status s = (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32,
                                rank == 0 ? ReduceOp::kSum : ReduceOp::kAverage)
                   .wait();
    std::string r = expect_failure(s, StatusCode::kInvalidArgument,
                                   {"mismatched operations", "sum", "avg"}, t0, 5);
    if (r.rfind("ok", 0) != 0) return r;
    RANK_CHECK(x == before, "the in-place buffer changed");
    return r;
  });
  expect_all_ok(res);
}

// Same bytes on the wire, another dtype: the peer's block must not land in our output.
TEST(CollectivesMismatch, AllGatherOfAnotherDtypeLeavesTheOutputAlone) {
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 2, test_options());
    RANK_OK(c.status());
    const uint64_t block = 4096;  // bytes per rank
    std::vector<uint8_t> out(2 * block, 0xAB);
    std::fill_n(out.begin() + static_cast<long>(block) * rank, block, static_cast<uint8_t>(rank));
    auto t0 = Clock::now();
    Status s =
        rank == 0
            ? (*c)->all_gather(out.data(), out.data(), block / 4, DType::kFloat32).wait()
            : (*c)->all_gather(out.data() + block, out.data(), block / 2, DType::kBFloat16).wait();
    std::string r = expect_failure(s, StatusCode::kInvalidArgument,
                                   {"mismatched operations", "fp32", "bf16"}, t0, 5);
    if (r.rfind("ok", 0) != 0) return r;
    for (uint64_t i = 0; i < 2 * block; ++i)
      RANK_CHECK(out[i] == (i / block == static_cast<uint64_t>(rank) ? rank : 0xAB),
                 "byte " + std::to_string(i));
    return r;
  });
  expect_all_ok(res);
}

// Broadcast data leaves the root before the check: a rank that names another root fails, and
// so does everyone else, each naming the mismatch.
TEST(CollectivesMismatch, BroadcastRootDisagreementFailsEveryRank) {
  auto res = run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 3, test_options());
    RANK_OK(c.status());
    std::vector<float> x(200000, static_cast<float>(rank));  // the relay path
    auto t0 = Clock::now();
    Status s =
        (*c)->broadcast(x.data(), x.data(), x.size(), DType::kFloat32, rank == 2 ? 2 : 0).wait();
    return expect_failure(
        s, StatusCode::kInvalidArgument,
        {"mismatched operations", "root 0", "root 2", rank == 2 ? "rank 0" : "rank 2"}, t0, 5);
  });
  expect_all_ok(res);
}

// Ranks whose segment_bytes give different pipeline segments would disagree on message sizes:
// the segment is in the descriptor, so they fail with a mismatch instead.
TEST(CollectivesMismatch, DifferentPipelineSegmentsFail) {
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();  // 64 KiB segments
    if (rank == 1) o.segment_bytes = 1 << 20;
    auto c = Communicator::init(id, rank, 2, o);
    RANK_OK(c.status());
    std::vector<float> x(1 << 20, 1.0f);  // chunks of 2 MiB: 64 KiB and 256 KiB segments
    auto t0 = Clock::now();
    Status s =
        (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait();
    return expect_failure(
        s, StatusCode::kInvalidArgument,
        {"mismatched operations", "all_reduce #0", rank == 0 ? "rank 1" : "rank 0"}, t0, 5);
  });
  expect_all_ok(res);
}

// The descriptor's wire form (descriptor.h): every field round-trips, each at its own offset,
// and a difference in any one of them is a different operation.
TEST(CollectivesMismatch, DescriptorFieldsRoundTripEachInItsOwnPlace) {
  using collectives::OpDescriptor;
  using collectives::OpKind;
  using topology::Algorithm;
  OpDescriptor d;
  d.kind = OpKind::kAllReduce;
  d.seq = 7;
  d.count = 1 << 20;
  d.op = ReduceOp::kAverage;
  d.codec = *parse_codec_spec("q4:block=64");
  d.nranks = 3;
  d.segment_elems = 64 * 1000;
  auto bytes = d.encode();
  EXPECT_EQ(bytes[32] | bytes[33] << 8, 64);                      // block u16
  EXPECT_EQ(bytes[34], 0);                                        // the owner reduction
  EXPECT_EQ(bytes[56] | bytes[57] << 8 | bytes[58] << 16, 1000);  // segment, in scale groups
  for (int i = 48; i < 56; ++i) EXPECT_EQ(bytes[i], 0) << "tag byte " << i;
  auto back = OpDescriptor::decode(bytes.data(), "test");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->segment_elems, d.segment_elems);
  EXPECT_EQ(back->algorithm, Algorithm::kDefault);
  EXPECT_EQ(back->codec->block, 64u);
  EXPECT_EQ(back->encode(), bytes);

  OpDescriptor hop = d;
  hop.algorithm = Algorithm::kOneHop;
  hop.segment_elems = 0;
  EXPECT_EQ(hop.encode()[34], 1);
  EXPECT_NE(hop.to_string().find("one hop"), std::string::npos) << hop.to_string();
  EXPECT_EQ(d.to_string().find("one hop"), std::string::npos) << d.to_string();
  EXPECT_FALSE(collectives::same_operation(d, hop));
  OpDescriptor seg = d;
  seg.segment_elems = 64 * 1001;
  EXPECT_FALSE(collectives::same_operation(d, seg));

  OpDescriptor send =
      collectives::p2p_descriptor(OpKind::kSend, 10, DType::kFloat32, 1, (uint64_t{1} << 60) - 1);
  send.nranks = 2;
  auto sb = send.encode();
  for (int i = 56; i < 60; ++i) EXPECT_EQ(sb[i], 0) << "segment byte " << i;
  auto sback = OpDescriptor::decode(sb.data(), "test");
  ASSERT_TRUE(sback.is_ok()) << sback.status().to_string();
  EXPECT_EQ(sback->user_tag, send.user_tag);
  EXPECT_EQ(sback->agree_hash, 0u);
  EXPECT_EQ(sback->report, 0u);
  EXPECT_EQ(sback->segment_elems, 0u);
  EXPECT_EQ(sback->algorithm, Algorithm::kDefault);
  OpDescriptor other_tag = send;
  other_tag.user_tag = 5;
  EXPECT_FALSE(collectives::same_operation(send, other_tag));

  // The two-level all-reduce carries its site map's hash (folded to 32 bits) and the sender's
  // report: in the tag word's high and low halves, as before the fields had names of their own.
  OpDescriptor two = d;
  two.algorithm = Algorithm::kTwoLevel;
  const uint64_t sites = 0x0badf00d19a5c0deull;
  collectives::stamp_agreement(two, sites, 0x5ea5ea5e, 0x90abcdef);
  EXPECT_EQ(two.agree_hash, (sites ^ (sites >> 32)) & 0xffffffffu);
  EXPECT_EQ(two.report, 0x90abcdefu);
  auto tb = two.encode();
  uint64_t word = 0;
  for (int i = 0; i < 8; ++i) word |= static_cast<uint64_t>(tb[48 + i]) << (8 * i);
  EXPECT_EQ(word, two.agree_hash << 32 | 0x90abcdefull);
  auto tback = OpDescriptor::decode(tb.data(), "test");
  ASSERT_TRUE(tback.is_ok()) << tback.status().to_string();
  EXPECT_EQ(tback->algorithm, Algorithm::kTwoLevel);
  EXPECT_EQ(tback->agree_hash, two.agree_hash);
  EXPECT_EQ(tback->report, two.report);
  // The report is the sender's alone (op_report.h): printed and compared without.
  char sites_text[16];
  std::snprintf(sites_text, sizeof(sites_text), "%08llx",
                static_cast<unsigned long long>(two.agree_hash));
  EXPECT_NE(tback->to_string().find(std::string("two-level, sites ") + sites_text + ","),
            std::string::npos)
      << tback->to_string();
  EXPECT_FALSE(collectives::same_operation(d, two));
  OpDescriptor other_report = two;
  other_report.report = 1;
  EXPECT_TRUE(collectives::same_operation(two, other_report));
  other_report.agree_hash ^= 1;
  EXPECT_FALSE(collectives::same_operation(two, other_report));
  // A two-level all-gather (no report) agrees on the whole 64-bit site hash.
  OpDescriptor gather;
  gather.kind = OpKind::kAllGather;
  gather.algorithm = Algorithm::kTwoLevel;
  collectives::stamp_agreement(gather, sites, 0, 0x90abcdef);
  EXPECT_EQ(gather.agree_hash, sites);
  EXPECT_EQ(gather.report, 0u);
  // A flat all-reduce agrees on its owner shares, a randk one on its positions.
  OpDescriptor flat = d;
  collectives::stamp_agreement(flat, sites, 0x5ea5ea5e, 7);
  EXPECT_EQ(flat.agree_hash, 0x5ea5ea5eu);
  // A send keeps its user tag and nothing else.
  OpDescriptor stamped_send = send;
  collectives::stamp_agreement(stamped_send, sites, 0x5ea5ea5e, 7);
  EXPECT_EQ(stamped_send.encode(), send.encode());

  // An algorithm this build does not know is refused as damaged, not read as another one.
  bytes[34] = 3;
  const uint32_t sum = lowcomm::fnv1a32(bytes.data(), 60);
  for (int i = 0; i < 4; ++i) bytes[60 + i] = static_cast<uint8_t>(sum >> (8 * i));
  auto bad = OpDescriptor::decode(bytes.data(), "test");
  EXPECT_EQ(bad.status().code(), StatusCode::kCorruptData);
}

TEST(CollectivesSecurity, WrongSecretCannotJoin) {
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    UniqueId mine = id;
    if (rank == 1) mine.secret[0] ^= 0x5A;
    auto t0 = Clock::now();
    auto c = Communicator::init(mine, rank, 2, short_timeout(3000));
    if (rank == 1) {
      RANK_CHECK(!c.is_ok(), "joined with a wrong secret");
      RANK_CHECK(contains(c.status().message(), "rank 0"), c.status().to_string());
      return "ok " + c.status().to_string();
    }
    return expect_failure(c.status(), StatusCode::kTimeout, {"rank(s) 1 never joined"}, t0, 8);
  });
  expect_all_ok(res);
}

TEST(CollectivesInit, MissingRankIsNamedAtTheDeadline) {
  auto res = run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    if (rank == 2) return "ok (stays away)";
    auto t0 = Clock::now();
    auto c = Communicator::init(id, rank, 3, short_timeout(1500));
    StatusCode want = rank == 0 ? StatusCode::kTimeout : StatusCode::kRemoteError;
    return expect_failure(c.status(), want, {"rank(s) 2 never joined"}, t0, 6);
  });
  expect_all_ok(res);
}

// A rank that dies during init (here: killed while the group waits for a late rank) reaches
// every other rank within seconds, named, instead of at their 30 s init deadline; the late
// rank, arriving after the group has failed, finds no root.
TEST(CollectivesInit, RankKilledDuringInitIsNoticedWithinSeconds) {
  auto res = run_ranks(
      4,
      [](int rank, const UniqueId& id) -> std::string {
        if (rank == 3) std::this_thread::sleep_for(std::chrono::milliseconds(3000));
        if (rank == 2) {
          std::thread([] {
            std::this_thread::sleep_for(std::chrono::milliseconds(1000));
            ::raise(SIGKILL);  // joined the root, waiting for the table
          }).detach();
        }
        auto t0 = Clock::now();
        // Rank 3 retries a refused connect (the root may simply not be up yet) until its deadline.
        auto c = Communicator::init(id, rank, 4, short_timeout(rank == 3 ? 2000 : 30000));
        if (rank == 3)
          return expect_failure(c.status(), c.status().code(), {"root (rank 0)"}, t0, 5);
        if (rank == 0)
          return expect_failure(c.status(), StatusCode::kRemoteError, {"rank 2 failed during init"},
                                t0, 1 + 5);
        return expect_failure(c.status(), StatusCode::kRemoteError,
                              {"root (rank 0) reports", "rank 2 failed during init"}, t0, 1 + 5);
      },
      60);
  ASSERT_EQ(res.size(), 4u);
  EXPECT_EQ(res[2].exit_code, 128 + SIGKILL);
  for (int r : {0, 1, 3}) EXPECT_TRUE(res[r].ok()) << "rank " << r << ": " << res[r].text;
  for (int r : {0, 1}) std::printf("rank %d: %s\n", r, res[r].text.c_str());
}

TEST(CollectivesInit, DifferentNranksIsNamedOnBothSides) {
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto t0 = Clock::now();
    auto c = Communicator::init(id, rank, rank == 0 ? 2 : 3, short_timeout(20000));
    if (rank == 0)
      return expect_failure(c.status(), StatusCode::kInvalidArgument,
                            {"rank 1 was started with nranks 3, the root with 2"}, t0, 10);
    return expect_failure(c.status(), StatusCode::kRemoteError,
                          {"root (rank 0) reports", "nranks 3"}, t0, 10);
  });
  expect_all_ok(res);
}

TEST(CollectivesFailure, KilledRankFailsEveryOtherRankNamingIt) {
  auto res = run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.wan = "bw=100mbit";  // ~2 s for this all-reduce: still in flight when rank 2 dies
    auto c = Communicator::init(id, rank, 3, o);
    RANK_OK(c.status());
    const uint64_t n = 8 << 20;
    std::vector<float> x(n, 1.0f);
    auto t0 = Clock::now();
    Work w = (*c)->all_reduce(x.data(), x.data(), n, DType::kFloat32, ReduceOp::kSum);
    if (rank == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ::raise(SIGKILL);  // mid-transfer: the all-reduce needs about 2 s on this link
    }
    // Killed at ~0.5 s: the others must fail well within a few seconds after, naming it.
    return expect_failure(w.wait(), StatusCode::kRemoteError, {"rank 2", "all_reduce #0"}, t0, 3.5);
  });
  ASSERT_EQ(res.size(), 3u);
  EXPECT_EQ(res[2].exit_code, 128 + SIGKILL);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(res[r].ok()) << "rank " << r << ": " << res[r].text;
  }
}

// A rank of a run_ranks group that freezes itself (SIGSTOP) and is killed by the last of the
// others to finish, so that no rank still waiting on it sees its connections close instead of
// the silence the test is about. Shared memory: the frozen rank's pid and how many are done.
class FrozenRank {
 public:
  FrozenRank() {
    void* m =
        ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) shared_ = new (m) Shared;
  }
  ~FrozenRank() {
    if (shared_) ::munmap(shared_, sizeof(Shared));
  }
  bool ok() const { return shared_ != nullptr; }
  void freeze() {
    shared_->pid.store(::getpid());
    ::raise(SIGSTOP);  // until the last other rank kills it
  }
  // In each of the `others` ranks: done with the frozen one when it leaves scope (on every
  // return path); the last one kills it (once it has frozen: waits up to 10 s for that).
  class Done {
   public:
    Done(FrozenRank& frozen, int others) : f_(frozen), others_(others) {}
    Done(const Done&) = delete;
    Done& operator=(const Done&) = delete;
    ~Done() {
      if (f_.shared_->done.fetch_add(1) + 1 != others_) return;
      for (int i = 0; i < 10000 && f_.shared_->pid.load() == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (pid_t p = f_.shared_->pid.load(); p != 0) ::kill(p, SIGKILL);
    }

   private:
    FrozenRank& f_;
    int others_;
  };

 private:
  struct Shared {
    std::atomic<pid_t> pid{0};
    std::atomic<int> done{0};
  };
  Shared* shared_ = nullptr;
};

// A frozen rank (SIGSTOP: its sockets stay open, its kernel even takes some bytes) fails the
// others' collective within seconds, naming it, instead of at the 60 s deadline; on plain and
// on sealed connections.
void frozen_rank_fails_the_others(bool encrypt) {
  FrozenRank frozen;
  ASSERT_TRUE(frozen.ok());
  auto res = run_ranks(3, [&](int rank, const UniqueId& id) -> std::string {
    std::optional<FrozenRank::Done> done;
    if (rank != 2) done.emplace(frozen, 2);
    CommOptions o = test_options();
    o.timeout = std::chrono::seconds(60);
    o.failure_timeout = std::chrono::milliseconds(600);
    o.encrypt = encrypt ? 1 : 0;  // sealed streams: the PINGs and PONGs are sealed too
    auto c = Communicator::init(id, rank, 3, o);
    RANK_OK(c.status());
    const uint64_t n = 1 << 20;
    std::vector<float> x(n, 1.0f);
    RANK_OK((*c)->all_reduce(x.data(), x.data(), n, DType::kFloat32, ReduceOp::kSum).wait());
    if (rank == 2) {
      frozen.freeze();
      return "resumed (wrong)";
    }
    auto t0 = Clock::now();
    Status s = (*c)->all_reduce(x.data(), x.data(), n, DType::kFloat32, ReduceOp::kSum).wait();
    return expect_failure(s, StatusCode::kRemoteError, {"rank 2", "frozen or cut off"}, t0, 10);
  });
  ASSERT_EQ(res.size(), 3u);
  EXPECT_EQ(res[2].exit_code, 128 + SIGKILL) << res[2].text;
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(res[r].ok()) << "rank " << r << ": " << res[r].text;
}

TEST(CollectivesFailure, FrozenRankFailsEveryOtherRankNamingItWithinSeconds) {
  frozen_rank_fails_the_others(/*encrypt=*/false);
}

TEST(CollectivesFailure, FrozenRankOnSealedConnectionsFailsEveryOtherRankWithinSeconds) {
  frozen_rank_fails_the_others(/*encrypt=*/true);
}

// A rank that is alive but late to the collective (still computing) is not silent: its progress
// thread answers the pings, and the collective completes however short the failure timeout.
TEST(CollectivesFailure, LateButAliveRankIsNotFailed) {
  for (int encrypt : {0, 1}) {
    auto res = run_ranks(3, [encrypt](int rank, const UniqueId& id) -> std::string {
      CommOptions o = test_options();
      o.failure_timeout = std::chrono::milliseconds(200);
      o.encrypt = encrypt;  // sealed: ten sealed PING/PONG exchanges at least
      auto c = Communicator::init(id, rank, 3, o);
      RANK_OK(c.status());
      std::vector<float> x(1 << 16, 1.0f);
      if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(2000));  // 10 timeouts
      RANK_OK(
          (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait());
      RANK_CHECK(x[0] == 3.0f, "sum " + std::to_string(x[0]));
      return "ok";
    });
    expect_all_ok(res);
  }
}

// A rank paused (SIGSTOP, then SIGCONT: a scheduler's suspend, a VM stun, a debugger) while the
// group is idle is not a failure: nothing waits on it, so nobody pings it or counts its silence.
// The pause is many failure timeouts long; the next all-reduce succeeds on every rank, on plain
// and on sealed connections. Rank 0 stops and resumes rank 1 (shared memory: rank 1's pid, and
// "go" once it runs again); no rank calls the library while it waits.
void paused_while_idle_is_not_failed(bool encrypt, std::chrono::milliseconds pause) {
  struct Shared {
    std::atomic<pid_t> pid{0};
    std::atomic<int> go{0};
  };
  void* m =
      ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* shared = new (m) Shared;
  // Whether process p is stopped (state 'T' in /proc/<p>/stat, after the "(comm)" field).
  auto stopped = [](pid_t p) {
    std::FILE* f = std::fopen(("/proc/" + std::to_string(p) + "/stat").c_str(), "r");
    if (!f) return false;
    char buf[512] = {};
    size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    const char* close_paren = std::strrchr(buf, ')');
    return n > 0 && close_paren && close_paren[1] == ' ' && close_paren[2] == 'T';
  };
  auto res = run_ranks(
      3,
      [&](int rank, const UniqueId& id) -> std::string {
        CommOptions o = test_options();
        o.failure_timeout = std::chrono::milliseconds(1500);  // the default
        o.encrypt = encrypt ? 1 : 0;
        auto c = Communicator::init(id, rank, 3, o);
        RANK_OK(c.status());
        std::vector<float> x(1 << 18, 1.0f);
        RANK_OK(
            (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait());
        if (rank == 1) {
          shared->pid.store(::getpid());
          ::raise(SIGSTOP);  // rank 0 resumes it
        } else if (rank == 0) {
          for (int i = 0; i < 10000 && !(shared->pid.load() && stopped(shared->pid.load())); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          RANK_CHECK(stopped(shared->pid.load()), "rank 1 did not stop");
          std::this_thread::sleep_for(pause);
          shared->go.store(1);
          ::kill(shared->pid.load(), SIGCONT);
        }
        while (shared->go.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::fill(x.begin(), x.end(), static_cast<float>(rank + 1));
        RANK_OK(
            (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait());
        RANK_CHECK(x[0] == 6.0f && x.back() == 6.0f, "sum " + std::to_string(x[0]));
        return "ok";
      },
      40 + static_cast<double>(pause.count()) / 1000);
  expect_all_ok(res);
  ::munmap(m, sizeof(Shared));
}

TEST(CollectivesFailure, RankPausedWhileIdleIsNotFailed) {
  paused_while_idle_is_not_failed(/*encrypt=*/false, std::chrono::seconds(10));
}

TEST(CollectivesFailure, RankPausedWhileIdleOnSealedConnectionsIsNotFailed) {
  paused_while_idle_is_not_failed(/*encrypt=*/true, std::chrono::seconds(4));
}

// A join timeout (CommOptions::join_timeout) is for groups whose members are alive and start
// together (torchft's quorums): a member frozen since before init (SIGSTOP: nothing of it
// answers) fails the others' init within the join timeout, named, not at the 60 s deadline; and
// so does a frozen root, whose listening socket still completes connections in the kernel.
void frozen_member_fails_init(int frozen_rank) {
  FrozenRank frozen;
  ASSERT_TRUE(frozen.ok());
  auto res = run_ranks(3, [&](int rank, const UniqueId& id) -> std::string {
    if (rank == frozen_rank) {
      frozen.freeze();
      return "resumed (wrong)";
    }
    FrozenRank::Done done(frozen, 2);
    CommOptions o = test_options();
    o.timeout = std::chrono::seconds(60);
    o.join_timeout = std::chrono::milliseconds(500);
    auto t0 = Clock::now();
    auto c = Communicator::init(id, rank, 3, o);
    if (frozen_rank == 0)  // every other rank finds the root silent
      return expect_failure(c.status(), StatusCode::kTimeout,
                            {"connecting to the root (rank 0)", "join timeout"}, t0, 5);
    // The root names it; the other rank hears it from the root.
    return expect_failure(c.status(), rank == 0 ? StatusCode::kTimeout : StatusCode::kRemoteError,
                          {"rank(s) 2 did not join", "join timeout"}, t0, 5);
  });
  ASSERT_EQ(res.size(), 3u);
  EXPECT_EQ(res[frozen_rank].exit_code, 128 + SIGKILL) << res[frozen_rank].text;
  for (int r = 0; r < 3; ++r) {
    if (r == frozen_rank) continue;
    EXPECT_TRUE(res[r].ok()) << "rank " << r << ": " << res[r].text;
    std::printf("rank %d: %s\n", r, res[r].text.c_str());
  }
}

TEST(CollectivesInit, JoinTimeoutNamesAMemberFrozenBeforeInitWithinIt) {
  frozen_member_fails_init(2);
}

TEST(CollectivesInit, JoinTimeoutNamesAFrozenRootWithinIt) {
  frozen_member_fails_init(0);
}

// Ranks that start together form the group under a join timeout, a rank a little late included.
TEST(CollectivesInit, JoinTimeoutLetsRanksThatStartTogetherFormTheGroup) {
  auto res = run_ranks(4, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.join_timeout = std::chrono::milliseconds(1500);
    if (rank == 3) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto c = Communicator::init(id, rank, 4, o);
    RANK_OK(c.status());
    std::vector<float> x(1024, 1.0f);
    RANK_OK((*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait());
    RANK_CHECK(x[0] == 4.0f, "sum " + std::to_string(x[0]));
    return "ok";
  });
  expect_all_ok(res);
}

// On a long, jittery, lossy path the PINGs' round trip is long and uneven (the emulator delays
// them like the data: LinkEmulator::control_arrival), and a late rank's peers ping it for
// seconds: the default failure timeout adapts and fails nobody.
TEST(CollectivesFailure, LateRanksOnA200msJitteryLossyPathAreNotFailed) {
  auto res = run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.wan = "bw=100mbit,rtt=200ms,jitter=20ms,loss=1%";
    o.failure_timeout = std::chrono::milliseconds(1500);  // the default
    auto c = Communicator::init(id, rank, 3, o);
    RANK_OK(c.status());
    std::vector<float> x(1 << 16);
    for (int i = 0; i < 4; ++i) {
      std::fill(x.begin(), x.end(), 1.0f);
      if (rank == i % 3) std::this_thread::sleep_for(std::chrono::milliseconds(700));
      RANK_OK(
          (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait());
      RANK_CHECK(x[0] == 3.0f && x.back() == 3.0f, "sum " + std::to_string(x[0]));
    }
    return "ok";
  });
  expect_all_ok(res);
}

// The variable is read strictly, like every size and count: a typo is an error naming it, not
// the default in silence.
TEST(CollectivesInit, MalformedFailureTimeoutIsNamed) {
  auto res = run_ranks(1, [](int, const UniqueId& id) -> std::string {
    ::setenv("LOWCOMM_FAILURE_TIMEOUT_MS", "2s", 1);
    auto c = Communicator::init(id, 0, 1, CommOptions{});
    RANK_CHECK(!c.is_ok(), "init accepted LOWCOMM_FAILURE_TIMEOUT_MS=2s");
    RANK_CHECK(contains(c.status().message(), "LOWCOMM_FAILURE_TIMEOUT_MS"),
               c.status().to_string());
    ::setenv("LOWCOMM_FAILURE_TIMEOUT_MS", "0", 1);  // off
    auto d = Communicator::init(id, 0, 1, CommOptions{});
    RANK_OK(d.status());
    return "ok";
  });
  expect_all_ok(res);
}

TEST(CollectivesFailure, RankThatLeftWithoutTakingPartFailsTheCollective) {
  auto res = run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 3, test_options());
    RANK_OK(c.status());
    std::vector<float> x(4096, 1.0f);
    RANK_OK((*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait());
    if (rank == 2) return "ok";  // destroys its communicator: one collective run, not two
    auto t0 = Clock::now();
    Status s =
        (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait();
    return expect_failure(s, StatusCode::kRemoteError,
                          {"rank 2 has left without taking part", "all_reduce #1"}, t0, 5);
  });
  expect_all_ok(res);
}

TEST(CollectivesFailure, GoodbyeCountsPointToPointMessages) {
  // Rank 0 sends one message and leaves: rank 1's first receive gets it even though the goodbye
  // may arrive first; its second receive fails at once instead of waiting for the deadline.
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 2, test_options());
    RANK_OK(c.status());
    std::vector<float> x(1 << 20, 3.0f);
    if (rank == 0) {
      RANK_OK((*c)->send(x.data(), x.size(), DType::kFloat32, 1, 7).wait());
      return "ok";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the goodbye is here by now
    std::vector<float> y(x.size(), 0.0f);
    RANK_OK((*c)->recv(y.data(), y.size(), DType::kFloat32, 0, 7).wait());
    RANK_CHECK(y == x, "received data differs");
    auto t0 = Clock::now();
    Status s = (*c)->recv(y.data(), y.size(), DType::kFloat32, 0, 7).wait();
    return expect_failure(s, StatusCode::kRemoteError, {"rank 0 has left without taking part"}, t0,
                          3);
  });
  expect_all_ok(res);
}

TEST(CollectivesFailure, AbortReturnsOnlyAfterTheRunningOperationLetGo) {
  // A 32 MiB compressed all-reduce over 100 Mbit/s takes seconds; rank 0 aborts from another
  // thread mid-way. When abort() returns, the operation must be finished with (its Work
  // complete), so the caller may free the buffers.
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.wan = "bw=100mbit";
    auto c = Communicator::init(id, rank, 2, o);
    RANK_OK(c.status());
    const uint64_t n = 8 << 20;
    auto x = std::make_unique<std::vector<float>>(n, 1.0f);
    auto y = std::make_unique<std::vector<float>>(n, 0.0f);
    Work w = (*c)->all_reduce(x->data(), y->data(), n, DType::kFloat32, ReduceOp::kSum);
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    if (rank == 1) {
      Status s = w.wait();
      RANK_CHECK(!s.is_ok(), "rank 1's all-reduce succeeded");
      return "ok";
    }
    std::thread t([&] { (*c)->abort(); });
    t.join();
    RANK_CHECK(w.test(), "abort() returned while the all-reduce was still running");
    x.reset();  // under ASan, a later touch of these would be a use-after-free
    y.reset();
    RANK_CHECK(w.status().code() == StatusCode::kAborted, "status: " + w.status().to_string());
    return "ok";
  });
  expect_all_ok(res);
}

TEST(CollectivesMismatch, PointToPointOfAnotherLengthFailsNamingBoth) {
  // The receiver posts its data receive with the descriptor's, so the sender's longer message
  // may be refused by the transport before the descriptor is read: either way the error names
  // the mismatch, and the sender learns of it.
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 2, test_options());
    RANK_OK(c.status());
    std::vector<float> x(1000, 1.0f);
    auto t0 = Clock::now();
    if (rank == 0) {
      RANK_OK((*c)->send(x.data(), 1000, DType::kFloat32, 1, 3).wait());
      Status s = (*c)->barrier().wait();
      return expect_failure(s, StatusCode::kRemoteError, {"rank 1 failed"}, t0, 5);
    }
    Status s = (*c)->recv(x.data(), 500, DType::kFloat32, 0, 3).wait();
    RANK_CHECK(!s.is_ok(), "the mismatched recv succeeded");
    RANK_CHECK(contains(s.message(), "mismatched operations") ||
                   (contains(s.message(), "length mismatch") &&
                    contains(s.message(), "2000 bytes") && contains(s.message(), "4000 bytes")),
               "unclear error: " + s.to_string());
    return "ok";
  });
  expect_all_ok(res);
}

TEST(CollectivesFailure, ExpiredDeadlineGivesTimeoutAndThePeerLearnsWhy) {
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 2, short_timeout(800));
    RANK_OK(c.status());
    std::vector<float> x(1000, 1.0f);
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    auto t0 = Clock::now();
    Status s =
        (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait();
    if (rank == 0)
      return expect_failure(s, StatusCode::kTimeout, {"deadline passed", "rank 1", "all_reduce #0"},
                            t0, 3);
    return expect_failure(s, StatusCode::kRemoteError, {"rank 0 failed", "deadline passed"}, t0, 2);
  });
  expect_all_ok(res);
}

// Three ranks, rank 2 late: the deadline's error names rank 2 as the one that never started,
// not the healthy rank that is waiting too; a later call carries the first failure's code.
TEST(CollectivesFailure, DeadlineNamesTheRankThatNeverStarted) {
  auto res = run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 3, short_timeout(800));
    RANK_OK(c.status());
    std::vector<float> x(1000, 1.0f);
    if (rank == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      return "ok";  // never calls
    }
    Status s =
        (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait();
    RANK_CHECK(s.code() == StatusCode::kTimeout || s.code() == StatusCode::kRemoteError,
               s.to_string());
    RANK_CHECK(contains(s.message(), "rank 2 has not started"), s.to_string());
    if (s.code() == StatusCode::kTimeout) {
      const std::string other = rank == 0 ? "rank 1" : "rank 0";
      RANK_CHECK(!contains(s.message(), other),
                 "names the healthy " + other + ": " + s.to_string());
    }
    Status later = (*c)->barrier().wait();
    RANK_CHECK(later.code() == s.code(), "later call: " + later.to_string());
    return "ok";
  });
  expect_all_ok(res);
}

TEST(CollectivesCApi, AllReduceWithACodecAndErrorStrings) {
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    lowcommUniqueId cid;
    auto b = id.to_bytes();
    std::memcpy(cid.internal, b.data(), b.size());
    char text[LOWCOMM_UNIQUE_ID_STRING_BYTES];
    RANK_CHECK(lowcommUniqueIdToString(&cid, text, sizeof(text)) == lowcommSuccess, "to string");
    lowcommUniqueId back;
    RANK_CHECK(lowcommUniqueIdFromString(text, &back) == lowcommSuccess, "from string");
    lowcommComm_t comm = nullptr;
    RANK_CHECK(lowcommCommInitRank(&comm, 2, back, rank) == lowcommSuccess,
               lowcommGetLastError(nullptr));
    int count = 0, me = -1;
    RANK_CHECK(lowcommCommCount(comm, &count) == lowcommSuccess && count == 2, "count");
    RANK_CHECK(lowcommCommUserRank(comm, &me) == lowcommSuccess && me == rank, "rank");
    std::vector<float> x(10000, static_cast<float>(rank + 1)), y(10000);
    lowcommRequest_t req = nullptr;
    RANK_CHECK(lowcommAllReduce(x.data(), y.data(), x.size(), lowcommFloat32, lowcommSum, "q8",
                                comm, &req) == lowcommSuccess,
               lowcommGetLastError(comm));
    int done = 0;
    lowcommResult_t r = lowcommSuccess;
    while (!done) r = lowcommTest(req, &done);
    RANK_CHECK(r == lowcommSuccess, lowcommGetLastError(comm));
    for (float v : y) RANK_CHECK(std::fabs(v - 3.0f) < 0.05f, std::to_string(v));
    RANK_CHECK(lowcommAllReduce(x.data(), y.data(), x.size(), lowcommFloat32, lowcommSum, "q5",
                                comm, nullptr) == lowcommInvalidArgument,
               "a bad codec spec was accepted");
    RANK_CHECK(contains(lowcommGetLastError(comm), "q5"), lowcommGetLastError(comm));
    RANK_CHECK(lowcommBarrier(comm, nullptr) == lowcommSuccess, lowcommGetLastError(comm));
    RANK_CHECK(std::string(lowcommGetErrorString(lowcommTimeout)).size() > 0, "error string");
    RANK_CHECK(lowcommCommDestroy(comm) == lowcommSuccess, "destroy");
    return "ok";
  });
  expect_all_ok(res);
}

}  // namespace
}  // namespace lowcomm::testing
