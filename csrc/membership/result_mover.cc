#include "membership/result_mover.h"

#include <algorithm>
#include <cstring>

namespace lowcomm {

ResultMover::ResultMover(const uint8_t* result, uint8_t* dst, uint8_t* backup, uint64_t bytes)
    : result_(result), dst_(dst), backup_(backup), bytes_(bytes) {
  thread_ = std::thread([this] { run(); });
}

ResultMover::~ResultMover() {
  if (!settled_) undo();
}

std::function<void(uint64_t, uint64_t)> ResultMover::hook() {
  return [this](uint64_t offset, uint64_t bytes) {
    if (bytes == 0 || offset > bytes_ || bytes > bytes_ - offset) return;  // not this buffer's
    std::lock_guard<std::mutex> g(mu_);
    queue_.emplace_back(offset, bytes);
    cv_.notify_one();
  };
}

void ResultMover::run() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left
    auto [off, n] = queue_.front();
    queue_.pop_front();
    const bool keep = keep_replaced_;
    lk.unlock();
    if (keep) std::memcpy(backup_ + off, dst_ + off, n);
    std::memcpy(dst_ + off, result_ + off, n);
    lk.lock();
    moved_.emplace_back(off, n);
    moved_bytes_ += n;
  }
}

void ResultMover::stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void ResultMover::commit(bool from_scratch) {
  {
    std::lock_guard<std::mutex> g(mu_);
    keep_replaced_ = false;  // parts still queued are moved without a backup
  }
  stop();
  settled_ = true;
  if (from_scratch) {
    std::memcpy(dst_, result_, bytes_);
    return;
  }
  // The gaps between the moved parts.
  std::sort(moved_.begin(), moved_.end());
  uint64_t at = 0;
  for (auto [off, n] : moved_) {
    if (off > at) std::memcpy(dst_ + at, result_ + at, off - at);
    at = std::max(at, off + n);
  }
  if (at < bytes_) std::memcpy(dst_ + at, result_ + at, bytes_ - at);
}

void ResultMover::undo() {
  stop();
  settled_ = true;
  for (auto [off, n] : moved_) std::memcpy(dst_ + off, backup_ + off, n);
}

}  // namespace lowcomm
