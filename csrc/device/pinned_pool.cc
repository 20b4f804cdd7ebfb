#include "device/pinned_pool.h"

#include <bit>
#include <iterator>
#include <string>

#include "core/log.h"

namespace lowcomm::device {

uint64_t pinned_class(uint64_t bytes) {
  if (bytes <= PinnedPool::kMinBlock) return PinnedPool::kMinBlock;
  return std::bit_ceil(bytes);
}

PinnedBlock& PinnedBlock::operator=(PinnedBlock&& o) noexcept {
  if (this != &o) {
    reset();
    pool_ = o.pool_;
    data_ = o.data_;
    capacity_ = o.capacity_;
    o.pool_ = nullptr;
    o.data_ = nullptr;
    o.capacity_ = 0;
  }
  return *this;
}

void PinnedBlock::reset() {
  if (pool_ != nullptr && data_ != nullptr) pool_->give_back(data_, capacity_);
  pool_ = nullptr;
  data_ = nullptr;
  capacity_ = 0;
}

PinnedPool::~PinnedPool() {
  for (auto& [cap, blocks] : free_)
    for (uint8_t* b : blocks) rt_.free_pinned(b);
}

Result<PinnedBlock> PinnedPool::acquire(uint64_t bytes) {
  if (bytes == 0) return PinnedBlock();
  const uint64_t cap = pinned_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = free_.find(cap); it != free_.end() && !it->second.empty()) {
    uint8_t* b = it->second.back();
    it->second.pop_back();
    in_use_ += cap;
    return PinnedBlock(this, b, cap);
  }
  if (in_use_ + cap > limit_)
    return Status(StatusCode::kSystem, "pinned staging pool: " + std::to_string(bytes) +
                                           " bytes needed (a " + std::to_string(cap) +
                                           "-byte block) with " + std::to_string(in_use_) +
                                           " of its limit of " + std::to_string(limit_) +
                                           " bytes in use (LOWCOMM_PINNED_BYTES)");
  // Full of idle blocks of other sizes: free the largest until this one fits. Freeing
  // page-locked memory synchronises the whole device, so only when the limit leaves no other
  // way (a change of sizes), never as routine.
  while (allocated_ + cap > limit_) {
    auto it = std::prev(free_.end());
    while (it->second.empty() && it != free_.begin()) --it;
    if (it->second.empty()) break;  // not reached: in_use_ + cap <= limit_
    rt_.free_pinned(it->second.back());
    it->second.pop_back();
    allocated_ -= it->first;
    ++frees_;
  }
  auto p = rt_.alloc_pinned(cap);
  if (!p) return p.status();
  allocated_ += cap;
  in_use_ += cap;
  ++allocations_;
  return PinnedBlock(this, static_cast<uint8_t*>(*p), cap);
}

Status PinnedPool::reserve(const std::vector<uint64_t>& sizes) {
  {
    // An operation running meanwhile holds blocks it gives back when it ends: then the run
    // takes what is missing (acquire).
    std::lock_guard<std::mutex> lock(mu_);
    if (in_use_ + pinned_bytes(sizes) > limit_) return Status::ok();
  }
  std::vector<PinnedBlock> held;
  for (uint64_t b : sizes) {
    auto blk = acquire(b);
    if (!blk) return blk.status();
    held.push_back(std::move(blk).value());
  }
  return Status::ok();  // given back: the free lists now hold these classes
}

uint64_t pinned_bytes(const std::vector<uint64_t>& sizes) {
  uint64_t total = 0;
  for (uint64_t b : sizes) total += b == 0 ? 0 : pinned_class(b);
  return total;
}

void PinnedPool::give_back(uint8_t* data, uint64_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  in_use_ -= capacity;
  free_[capacity].push_back(data);
}

uint64_t PinnedPool::allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}
uint64_t PinnedPool::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}
uint64_t PinnedPool::allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocations_;
}
uint64_t PinnedPool::frees() const {
  std::lock_guard<std::mutex> lock(mu_);
  return frees_;
}

}  // namespace lowcomm::device
