#include "transport/shared_clocks.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/unique_fd.h"

namespace lowcomm::transport {
namespace {

struct SharedClocks {
  std::atomic<int64_t> up{0};
  std::atomic<int64_t> down{0};
};
static_assert(std::atomic<int64_t>::is_always_lock_free, "site clocks need lock-free atomics");

}  // namespace

Result<std::shared_ptr<LinkClocks>> open_shared_clocks(const std::string& name,
                                                       double down_bits_per_second) {
  UniqueFd fd(::shm_open(name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid())
    return Status(StatusCode::kSystem,
                  "shm_open " + name + " (emulated site links): " + std::strerror(errno));
  // A new segment reads as zeros: both clocks free since the epoch, as a fresh LinkClock.
  if (::ftruncate(fd.get(), sizeof(SharedClocks)) != 0)
    return Status(StatusCode::kSystem, "ftruncate " + name + ": " + std::strerror(errno));
  void* p = ::mmap(nullptr, sizeof(SharedClocks), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED)
    return Status(StatusCode::kSystem, "mmap " + name + ": " + std::strerror(errno));
  auto* clocks = static_cast<SharedClocks*>(p);
  std::shared_ptr<void> mapping(p, [](void* q) { ::munmap(q, sizeof(SharedClocks)); });
  auto site = std::make_shared<LinkClocks>();
  site->up.ns = &clocks->up;
  site->down.clock.ns = &clocks->down;
  site->down.bits_per_second = down_bits_per_second;
  site->mapping = std::move(mapping);
  return site;
}

void unlink_shared_clocks(const std::string& name) {
  (void)::shm_unlink(name.c_str());
}

}  // namespace lowcomm::transport
