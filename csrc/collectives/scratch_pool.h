#pragma once
// Scratch memory reused from one operation to the next. A fresh multi-MiB allocation per call
// costs a page fault per 4 KiB (and zeroing by the kernel) on every all-reduce: for 256 MiB over
// 4 ranks that is ~200 MiB of faults per rank per call on a machine whose cores are also doing
// the TCP work. Blocks are not zero-initialised.
//
// A communicator's pool outlives it in the process's ScratchCache while another pool of the
// process lives: the next communicator (a group rebuilt after a failure: an elastic view
// change, whose next communicator is being built when the last one goes) takes the memory its
// predecessor had faulted in instead of faulting in its own while the group waits (page faults
// were most of an elastic group's first collective in a new view). When the process's last pool
// goes, the cache is freed: a process that destroys its communicators gets their memory back.
//
// Thread safety: a ScratchPool has none (only its communicator's executor thread uses it); the
// ScratchCache is shared by every pool of the process and locks.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace lowcomm::collectives {

// Blocks indexed by size in 8-byte words.
using ScratchBlocks = std::multimap<uint64_t, std::unique_ptr<uint64_t[]>>;

class ScratchPool {
 public:
  struct Block {
    std::unique_ptr<uint64_t[]> mem;
    uint64_t words = 0;
  };

  ScratchPool();
  ~ScratchPool();  // the pooled blocks go to the process's ScratchCache
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;

  // A block of at least `bytes` (8-byte aligned): a pooled one no more than twice that size,
  // else one from the process's cache, else a new one.
  Block take(uint64_t bytes);
  // Returns a block; kept for reuse while the pool holds under kMaxPooledBytes, else freed.
  void give(Block block);

  static constexpr uint64_t kMaxPooledBytes = uint64_t{2} << 30;

 private:
  ScratchBlocks free_;
  uint64_t pooled_bytes_ = 0;
};

// What destroyed pools left, for the other pools of the process: at most kMaxCachedBytes (a
// block beyond that is freed), and nothing once no pool lives.
class ScratchCache {
 public:
  static ScratchCache& process();

  // A cached block of `words` to 2 * `words` words; empty if none.
  ScratchPool::Block take(uint64_t words);
  uint64_t cached_bytes() const;
  void clear();  // frees every cached block

  static constexpr uint64_t kMaxCachedBytes = uint64_t{1} << 30;

 private:
  friend class ScratchPool;
  void attach();  // a pool was made
  // A pool goes: its blocks are kept (freed instead if it was the process's last pool).
  void detach(ScratchBlocks& blocks);

  mutable std::mutex mu_;
  ScratchBlocks free_;
  uint64_t bytes_ = 0;
  int pools_ = 0;
};

}  // namespace lowcomm::collectives
