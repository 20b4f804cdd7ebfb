#pragma once
// The error-feedback state as Communicator::save_error_feedback serialises it, read to list
// its keys and to drop some: the communicator has no call for either (yet), so the backend
// saves the state, filters it here and restores the rest. The layout (docs/collectives.md,
// "Error feedback state"): "LCEF", u32 version 1, u64 entries, then per entry u32 key length,
// key bytes, u64 n, u64 owner_begin, u64 owner_count, u8 flag, n fp32 when the flag is 1,
// owner_count fp32; finally u64 FNV-1a 64 of everything before it; little-endian. Anything
// else (another version, damage) is refused with an error, never guessed at.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lowcomm::torch_backend {

// The keys of a saved state, in its order (the core's: sorted).
std::vector<std::string> ef_state_keys(const std::vector<uint8_t>& state);

// The saved state without the entries whose key `drop` selects; `*dropped`: how many.
std::vector<uint8_t> ef_state_without(const std::vector<uint8_t>& state,
                                      const std::function<bool(const std::string&)>& drop,
                                      size_t* dropped);

// Whether `key` is `name` or lies below it ("name/..."); "" holds every key.
bool ef_key_under(const std::string& key, const std::string& name);

}  // namespace lowcomm::torch_backend
