#include "collectives/scratch_pool.h"

namespace lowcomm::collectives {

ScratchPool::Block ScratchPool::take(uint64_t bytes) {
  const uint64_t words = (bytes + 7) / 8 + 1;
  auto it = free_.lower_bound(words);
  if (it != free_.end() && it->first <= 2 * words) {
    Block b{std::move(it->second), it->first};
    pooled_bytes_ -= b.words * 8;
    free_.erase(it);
    return b;
  }
  return Block{std::make_unique_for_overwrite<uint64_t[]>(words), words};
}

void ScratchPool::give(Block block) {
  if (!block.mem || pooled_bytes_ + block.words * 8 > kMaxPooledBytes) return;
  pooled_bytes_ += block.words * 8;
  free_.emplace(block.words, std::move(block.mem));
}

}  // namespace lowcomm::collectives
