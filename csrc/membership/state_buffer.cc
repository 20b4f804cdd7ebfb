#include "membership/state_buffer.h"

#include <sys/mman.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace lowcomm::membership {

namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kChunk = 256 << 10;  // copied, then hashed while in cache

struct HashState {
  XXH3_state_t* s = XXH3_createState();
  HashState() { XXH3_64bits_reset(s); }
  ~HashState() { XXH3_freeState(s); }
};

}  // namespace

Result<std::shared_ptr<StateBuffer>> StateBuffer::allocate(uint64_t bytes) {
  const uint64_t mapped = std::max<uint64_t>((bytes + kPage - 1) / kPage * kPage, kPage);
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return Status(StatusCode::kInternal,
                  "mapping " + std::to_string(bytes) +
                      " bytes for a copy of the registered state: " + std::strerror(errno));
  std::memset(p, 0, mapped);  // faulted in here, not where it is written
  return std::shared_ptr<StateBuffer>(new StateBuffer(static_cast<uint8_t*>(p), bytes, mapped));
}

StateBuffer::~StateBuffer() {
  ::munmap(data_, mapped_);
}

uint64_t state_hash(const RegisteredState& state) {
  HashState h;
  for (const auto& [name, d] : state) {
    uint64_t len = d.second;
    XXH3_64bits_update(h.s, name.data(), name.size() + 1);
    XXH3_64bits_update(h.s, &len, sizeof(len));
    XXH3_64bits_update(h.s, d.first, d.second);
  }
  return XXH3_64bits_digest(h.s);
}

uint64_t copy_state(const RegisteredState& state, uint8_t* into) {
  HashState h;
  for (const auto& [name, d] : state) {
    uint64_t len = d.second;
    XXH3_64bits_update(h.s, name.data(), name.size() + 1);
    XXH3_64bits_update(h.s, &len, sizeof(len));
    const auto* from = static_cast<const uint8_t*>(d.first);
    for (uint64_t off = 0; off < len; off += kChunk) {
      const uint64_t n = std::min(kChunk, len - off);
      std::memcpy(into + off, from + off, n);
      XXH3_64bits_update(h.s, into + off, n);
    }
    into += len;
  }
  return XXH3_64bits_digest(h.s);
}

}  // namespace lowcomm::membership
