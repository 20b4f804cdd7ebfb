#include "collectives/scratch_pool.h"

#include <utility>

namespace lowcomm::collectives {

namespace {

// The smallest block of `words` to 2 * `words` words in `blocks`, removed; empty if none.
ScratchPool::Block take_from(ScratchBlocks& blocks, uint64_t words) {
  auto it = blocks.lower_bound(words);
  if (it == blocks.end() || it->first > 2 * words) return {};
  ScratchPool::Block b{std::move(it->second), it->first};
  blocks.erase(it);
  return b;
}

}  // namespace

ScratchPool::ScratchPool() {
  ScratchCache::process().attach();
}

ScratchPool::~ScratchPool() {
  ScratchCache::process().detach(free_);
}

ScratchPool::Block ScratchPool::take(uint64_t bytes) {
  const uint64_t words = (bytes + 7) / 8 + 1;
  if (Block b = take_from(free_, words); b.mem) {
    pooled_bytes_ -= b.words * 8;
    return b;
  }
  if (Block b = ScratchCache::process().take(words); b.mem) return b;
  return Block{std::make_unique_for_overwrite<uint64_t[]>(words), words};
}

void ScratchPool::give(Block block) {
  if (!block.mem || pooled_bytes_ + block.words * 8 > kMaxPooledBytes) return;
  pooled_bytes_ += block.words * 8;
  free_.emplace(block.words, std::move(block.mem));
}

ScratchCache& ScratchCache::process() {
  // Never destroyed: pools of communicators that outlive main()'s statics still give to it.
  static auto* cache = new ScratchCache();
  return *cache;
}

ScratchPool::Block ScratchCache::take(uint64_t words) {
  std::lock_guard<std::mutex> g(mu_);
  ScratchPool::Block b = take_from(free_, words);
  if (b.mem) bytes_ -= b.words * 8;
  return b;
}

void ScratchCache::attach() {
  std::lock_guard<std::mutex> g(mu_);
  ++pools_;
}

void ScratchCache::detach(ScratchBlocks& blocks) {
  ScratchBlocks gone;  // freed after the lock
  std::lock_guard<std::mutex> g(mu_);
  if (--pools_ == 0) {
    // The process's last pool: nobody would take them.
    gone.swap(free_);
    bytes_ = 0;
    return;
  }
  // The largest first: they cost the most faults to make again. Nodes move between the maps
  // (no allocation in a destructor).
  while (!blocks.empty()) {
    auto node = blocks.extract(std::prev(blocks.end()));
    const uint64_t bytes = node.key() * 8;
    if (bytes_ + bytes > kMaxCachedBytes) continue;  // freed with `node`
    bytes_ += bytes;
    free_.insert(std::move(node));
  }
}

uint64_t ScratchCache::cached_bytes() const {
  std::lock_guard<std::mutex> g(mu_);
  return bytes_;
}

void ScratchCache::clear() {
  ScratchBlocks gone;
  {
    std::lock_guard<std::mutex> g(mu_);
    gone.swap(free_);
    bytes_ = 0;
  }
}

}  // namespace lowcomm::collectives
