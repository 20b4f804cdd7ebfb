#pragma once
// Memory for a copy of the registered state (docs/membership.md, "Joining"): the snapshot a
// member serves to fresh members while its caller goes on changing the state, and the buffer a
// fresh member fetches the state into. Mapped on its own and faulted in when allocated: a member
// allocates its snapshot ahead (when the coordinator names the view it will admit joiners into),
// so that taking it is one copy fused with the state's hash, not a page fault per 4 KiB on the
// collective that the whole group waits for.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "lowcomm/status.h"

namespace lowcomm::membership {

class StateBuffer {
 public:
  // Maps `bytes` and faults them in, on the calling thread.
  static Result<std::shared_ptr<StateBuffer>> allocate(uint64_t bytes);
  ~StateBuffer();
  StateBuffer(const StateBuffer&) = delete;
  StateBuffer& operator=(const StateBuffer&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  StateBuffer(uint8_t* data, uint64_t size, uint64_t mapped)
      : data_(data), size_(size), mapped_(mapped) {}
  uint8_t* data_;
  uint64_t size_;
  uint64_t mapped_;
};

// The registered state: name -> (address, bytes), in name order.
using RegisteredState = std::map<std::string, std::pair<void*, uint64_t>>;

// The state's hash: every entry's name, length and bytes, in name order (XXH3-64).
uint64_t state_hash(const RegisteredState& state);
// Copies every entry into `into` (back to back, in name order) and returns state_hash(state),
// in one pass over the state.
uint64_t copy_state(const RegisteredState& state, uint8_t* into);

}  // namespace lowcomm::membership
