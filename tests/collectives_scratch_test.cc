// The scratch pool and the process's cache behind it: a communicator's successor (a group
// rebuilt after a failure, built while its predecessor still lives) takes the memory its
// predecessor faulted in; once the process's last pool goes, the memory goes too.
#include <gtest/gtest.h>

#include <optional>

#include "collectives/scratch_pool.h"

namespace lowcomm::collectives {
namespace {

class ScratchCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { ScratchCache::process().clear(); }
  void TearDown() override { ScratchCache::process().clear(); }
  ScratchPool next_;  // the successor, alive before its predecessor goes
};

TEST_F(ScratchCacheTest, APoolReusesItsOwnBlocks) {
  ScratchPool pool;
  auto a = pool.take(1 << 20);
  uint64_t* mem = a.mem.get();
  pool.give(std::move(a));
  auto b = pool.take(1 << 20);
  EXPECT_EQ(b.mem.get(), mem);
  auto c = pool.take(1 << 20);  // the pool is empty now: a new block
  EXPECT_NE(c.mem.get(), mem);
}

TEST_F(ScratchCacheTest, ADestroyedPoolsBlocksGoToTheNextPool) {
  uint64_t* mem = nullptr;
  {
    ScratchPool first;
    auto a = first.take(8 << 20);
    mem = a.mem.get();
    first.give(std::move(a));
    EXPECT_EQ(ScratchCache::process().cached_bytes(), 0u);
  }
  EXPECT_GE(ScratchCache::process().cached_bytes(), uint64_t{8} << 20);
  auto b = next_.take(8 << 20);
  EXPECT_EQ(b.mem.get(), mem);
  EXPECT_EQ(ScratchCache::process().cached_bytes(), 0u);
}

TEST_F(ScratchCacheTest, ABlockIsTakenOnlyIfAtMostTwiceTheSizeAsked) {
  {
    ScratchPool first;
    first.give(first.take(64 << 20));
  }
  auto small = next_.take(1 << 20);  // 64 MiB for 1 MiB would waste the cache's memory
  EXPECT_GE(ScratchCache::process().cached_bytes(), uint64_t{64} << 20);
  auto fits = next_.take(40 << 20);
  EXPECT_EQ(ScratchCache::process().cached_bytes(), 0u);
  EXPECT_GE(fits.words * 8, uint64_t{40} << 20);
}

TEST_F(ScratchCacheTest, TheCacheHoldsAtMostItsLimit) {
  // Not touched, so these cost address space only.
  const uint64_t big = ScratchCache::kMaxCachedBytes / 2 + (1 << 20);
  {
    ScratchPool first;
    first.give(first.take(big));
  }
  {
    ScratchPool second;
    auto a = second.take(big);  // the cached one
    auto b = second.take(big);  // a new one
    second.give(std::move(a));
    second.give(std::move(b));
  }
  // Both were given back, but only one fits under the limit: the other was freed.
  EXPECT_LE(ScratchCache::process().cached_bytes(), ScratchCache::kMaxCachedBytes);
  EXPECT_GE(ScratchCache::process().cached_bytes(), big);
}

TEST(ScratchCache, TheProcesssLastPoolTakesTheCacheWithIt) {
  ScratchCache::process().clear();
  std::optional<ScratchPool> first(std::in_place), second(std::in_place);
  first->give(first->take(8 << 20));
  second->give(second->take(4 << 20));
  first.reset();  // another pool lives: kept for it
  EXPECT_GE(ScratchCache::process().cached_bytes(), uint64_t{8} << 20);
  second.reset();  // the last: nothing would take them
  EXPECT_EQ(ScratchCache::process().cached_bytes(), 0u);
}

}  // namespace
}  // namespace lowcomm::collectives
