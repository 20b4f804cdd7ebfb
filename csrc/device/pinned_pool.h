#pragma once
// PinnedPool: page-locked host memory for staging device buffers, reused across operations
// (Gloo's pattern, without its per-call allocations: cudaHostAlloc costs milliseconds and
// cudaFreeHost synchronises the whole device).
//
// Blocks come in power-of-two size classes from 64 KiB; a released block goes back to its
// class's free list and is handed out again. The pool's total (blocks in use and free) is
// bounded by `limit`: a request that the idle blocks of its class cannot meet and that would
// pass the limit frees idle blocks of other classes, largest first, until it fits (freeing
// page-locked memory synchronises the whole device, the user's work included: only when the
// sizes change under a full pool); only a request that the blocks in use leave no room for
// fails (kSystem, naming LOWCOMM_PINNED_BYTES). reserve() grows the pool ahead, on the caller's
// thread at the call, so the executor finds its blocks already there and allocates no
// page-locked memory (a device-wide wait) while it runs operations. Thread-safe.

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "device/runtime.h"

namespace lowcomm::device {

class PinnedPool;

// A block lent by the pool; returned when destroyed.
class PinnedBlock {
 public:
  PinnedBlock() = default;
  PinnedBlock(PinnedPool* pool, uint8_t* data, uint64_t capacity)
      : pool_(pool), data_(data), capacity_(capacity) {}
  PinnedBlock(PinnedBlock&& o) noexcept { *this = std::move(o); }
  PinnedBlock& operator=(PinnedBlock&& o) noexcept;
  PinnedBlock(const PinnedBlock&) = delete;
  PinnedBlock& operator=(const PinnedBlock&) = delete;
  ~PinnedBlock() { reset(); }

  uint8_t* data() const { return data_; }
  uint64_t capacity() const { return capacity_; }
  void reset();

 private:
  PinnedPool* pool_ = nullptr;
  uint8_t* data_ = nullptr;
  uint64_t capacity_ = 0;
};

class PinnedPool {
 public:
  static constexpr uint64_t kMinBlock = 64 << 10;

  PinnedPool(Runtime& rt, uint64_t limit) : rt_(rt), limit_(limit) {}
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;
  ~PinnedPool();  // every block must have been returned

  // A block of at least `bytes` (0 gives an empty block).
  Result<PinnedBlock> acquire(uint64_t bytes);
  // Makes sure blocks for `sizes`, all at once, are in the pool (allocating what is missing),
  // and leaves them free; nothing (ok) while the blocks in use leave no room for them.
  Status reserve(const std::vector<uint64_t>& sizes);

  uint64_t limit() const { return limit_; }
  uint64_t allocated() const;  // bytes held from the runtime, in use or free
  uint64_t in_use() const;
  uint64_t allocations() const;  // alloc_pinned calls made, over the pool's life
  uint64_t frees() const;        // idle blocks freed to make room for another size

 private:
  friend class PinnedBlock;
  void give_back(uint8_t* data, uint64_t capacity);

  Runtime& rt_;
  const uint64_t limit_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::vector<uint8_t*>> free_;  // by capacity
  uint64_t allocated_ = 0;
  uint64_t in_use_ = 0;
  uint64_t allocations_ = 0;
  uint64_t frees_ = 0;
};

// The size class of `bytes`: the next power of two, at least kMinBlock.
uint64_t pinned_class(uint64_t bytes);
// The pool bytes blocks of `sizes` take (their classes, summed).
uint64_t pinned_bytes(const std::vector<uint64_t>& sizes);

}  // namespace lowcomm::device
