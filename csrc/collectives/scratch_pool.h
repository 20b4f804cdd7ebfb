#pragma once
// Scratch memory reused from one operation to the next. A fresh multi-MiB allocation per call
// costs a page fault per 4 KiB (and zeroing by the kernel) on every all-reduce: for 256 MiB over
// 4 ranks that is ~200 MiB of faults per rank per call on a machine whose cores are also doing
// the TCP work. Blocks are not zero-initialised.
//
// Thread safety: none; only the communicator's executor thread uses it (one operation at a time).

#include <cstdint>
#include <map>
#include <memory>

namespace lowcomm::collectives {

class ScratchPool {
 public:
  struct Block {
    std::unique_ptr<uint64_t[]> mem;
    uint64_t words = 0;
  };

  // A block of at least `bytes` (8-byte aligned): a pooled one no more than twice that size,
  // else a new one.
  Block take(uint64_t bytes);
  // Returns a block; kept for reuse while the pool holds under kMaxPooledBytes, else freed.
  void give(Block block);

  static constexpr uint64_t kMaxPooledBytes = uint64_t{2} << 30;

 private:
  std::multimap<uint64_t, std::unique_ptr<uint64_t[]>> free_;  // size in words -> block
  uint64_t pooled_bytes_ = 0;
};

}  // namespace lowcomm::collectives
