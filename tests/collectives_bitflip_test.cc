// Bits flipped in received payload bytes, after the kernel's receive (tools/recv_bitflip.cc
// interposes recv), through the C API with real forked ranks on loopback: every altered chunk
// fails its check and is sent again (docs/transport.md, "Re-sends"), so no operation fails and
// none returns a wrong result, and the operations' statistics count the re-sent chunks. Before
// payloads carried a check the same injection gave silently wrong sums; before re-sends it
// failed the operation and latched the communicator.

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "collectives_test_util.h"
#include "lowcomm/lowcomm.h"

extern "C" void lowcomm_test_flip_configure(double rate, uint64_t seed);
extern "C" uint64_t lowcomm_test_flip_count();

namespace lowcomm::testing {
namespace {

constexpr int kRanks = 3;
constexpr int kFlipRank = 2;
constexpr int kOps = 200;
constexpr size_t kCount = 256 << 10;  // fp32 elements: 1 MiB per rank

// Exact in fp32: small integers.
float value(int rank, size_t i, int op) {
  return static_cast<float>(
      static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13 + static_cast<size_t>(op) * 5) %
                       97) -
      48);
}

std::string run_rank(int rank, const UniqueId& id, uint64_t seed) {
  lowcommUniqueId cid;
  std::string text = id.to_string();
  if (lowcommUniqueIdFromString(text.c_str(), &cid) != lowcommSuccess) return "bad id";
  lowcommComm_t comm = nullptr;
  if (lowcommCommInitRank(&comm, kRanks, cid, rank) != lowcommSuccess)
    return std::string("init: ") + lowcommGetLastError(nullptr);
  // Flips start once the mesh stands: this test is about payloads, not set-up.
  if (rank == kFlipRank) lowcomm_test_flip_configure(0.01, seed);
  std::vector<float> x(kCount), y(kCount);
  int done = 0, wrong = 0;
  uint64_t resent = 0;
  std::string failure;
  lowcommResult_t code = lowcommSuccess;
  for (int op = 0; op < kOps; ++op) {
    for (size_t i = 0; i < kCount; ++i) x[i] = value(rank, i, op);
    lowcommRequest_t req = nullptr;
    lowcommResult_t r = lowcommAllReduce(x.data(), y.data(), kCount, lowcommFloat32, lowcommSum,
                                         nullptr, comm, &req);
    lowcommOpStats st = LOWCOMM_OP_STATS_INIT;
    if (r == lowcommSuccess) r = lowcommWaitStats(req, &st);
    if (r != lowcommSuccess) {
      code = r;
      failure = lowcommGetLastError(nullptr);
      if (failure.empty()) failure = lowcommGetLastError(comm);
      break;
    }
    ++done;
    resent += st.chunksResent;
    for (size_t i = 0; i < kCount; ++i) {
      float want = 0;
      for (int q = 0; q < kRanks; ++q) want += value(q, i, op);
      if (y[i] != want) {
        ++wrong;
        break;
      }
    }
  }
  const uint64_t flips = rank == kFlipRank ? lowcomm_test_flip_count() : 0;
  if (rank == kFlipRank) lowcomm_test_flip_configure(0, 0);
  lowcommCommAbort(comm);
  char line[1024];
  std::snprintf(line, sizeof(line), "ok done=%d wrong=%d flips=%llu resent=%llu code=%d |%s", done,
                wrong, static_cast<unsigned long long>(flips),
                static_cast<unsigned long long>(resent), static_cast<int>(code),
                failure.substr(0, 700).c_str());
  return line;
}

int field(const std::string& s, const char* name) {
  auto at = s.find(name);
  return at == std::string::npos ? -1 : std::atoi(s.c_str() + at + std::strlen(name));
}

// 1% of the payload reads on one of three ranks flipped, 200 all-reduces: 0 wrong, 0 failed,
// and as many chunks re-sent as flips injected (a flip lands in one chunk's payload; the sums
// below are over every operation's statistics on the flipping rank).
TEST(CollectivesBitFlip, EveryFlippedChunkIsSentAgainAndEveryOperationSucceedsExact) {
  auto res = run_ranks(
      kRanks, [&](int rank, const UniqueId& id) { return run_rank(rank, id, 1000); }, 120);
  for (int r = 0; r < kRanks; ++r) {
    const std::string& t = res[static_cast<size_t>(r)].text;
    ASSERT_TRUE(res[static_cast<size_t>(r)].ok()) << "rank " << r << ": " << t;
    EXPECT_EQ(field(t, "code="), static_cast<int>(lowcommSuccess)) << "rank " << r << ": " << t;
    EXPECT_EQ(field(t, "done="), kOps) << "rank " << r << ": " << t;
    EXPECT_EQ(field(t, "wrong="), 0) << "rank " << r << " returned a wrong sum: " << t;
    if (r != kFlipRank) {
      EXPECT_EQ(field(t, "resent="), 0) << "rank " << r << ": " << t;
    }
  }
  const std::string& f = res[kFlipRank].text;
  const int flips = field(f, "flips=");
  EXPECT_GT(flips, 20) << f;
  // Each flip altered one chunk's payload, caught and sent again.
  EXPECT_EQ(field(f, "resent="), flips) << f;
  std::printf("C API: %d flips injected in %d all-reduces, %d chunks re-sent, 0 failed, 0 wrong\n",
              flips, kOps, field(f, "resent="));
}

}  // namespace
}  // namespace lowcomm::testing
