#pragma once
// ErrorFeedbackStore: the residuals of error feedback, kept across all-reduce calls under a
// user key (AllReduceOptions::error_feedback_key).
//
// Per key: the sender residual covers the whole tensor (n fp32 values: each rank quantizes
// every element once, its own chunk included) and does not depend on how the tensor is cut
// into owner chunks; the owner residual covers this rank's owner chunk [owner_begin,
// owner_begin + owner.size()) of the sum's re-quantization. A call whose element count differs
// from the key's is an error (a different tensor under the same key is a caller bug, and
// silently resetting would hide it); an owner range that changed (another codec's block size)
// restarts the owner residual at zero.
//
// Serialised form (save/restore): "LCEF", u32 version 1, u64 entries, then per entry: u32 key
// length, key bytes, u64 n, u64 owner_begin, u64 owner_count, n fp32 sender values (0 or n:
// u8 flag first), owner_count fp32 values; finally u64 FNV-1a 64 of everything before it.
// Little-endian; fp32 as their IEEE bits.
//
// Thread safety: none; the communicator calls it from its executor thread only.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lowcomm/status.h"

namespace lowcomm::collectives {

// A sender residual kept in device memory (an all-reduce of CUDA buffers encoded on the GPU,
// collectives/device_op.h): n fp32 values there, freed with it.
class DeviceResidual {
 public:
  virtual ~DeviceResidual() = default;
  virtual float* data() = 0;
  virtual int device() const = 0;
  virtual Status to_host(float* dst) = 0;  // n values; waits for the copy
};

struct ErrorFeedbackEntry {
  uint64_t n = 0;
  std::vector<float> sender;  // empty until first used, and while `device` holds it (but for
                              // save()'s copy)
  uint64_t owner_begin = 0;
  std::vector<float> owner;  // empty until first used
  // The sender residual, when the last call under this key encoded on a device: one copy of
  // it lives in one place. sender() brings it back to the host; device_residual() moves it.
  std::unique_ptr<DeviceResidual> device;
};

class ErrorFeedbackStore {
 public:
  // The entry for key, created with n elements of zero sender residual when new; a residual
  // kept on a device is copied back to the host first.
  Result<ErrorFeedbackEntry*> sender(const std::string& key, uint64_t n);
  // The entry for key as it stands (created empty when new): the device path takes its
  // residual from here (collectives/device_op.h, device_residual).
  Result<ErrorFeedbackEntry*> entry_for_device(const std::string& key, uint64_t n) {
    return entry(key, n);
  }
  // For save(): copies every residual kept on a device into the host's `sender` (the device's
  // stays the one in use), and drops those copies after.
  Status copy_device_residuals();
  void drop_host_copies();
  // The owner residual for [begin, begin + count) of key's tensor (zeroed when new or moved).
  Result<float*> owner(const std::string& key, uint64_t n, uint64_t begin, uint64_t count);

  // The names kept, sorted.
  std::vector<std::string> names() const;
  // Drops `name` and every name under it ("layer3" drops "layer3" and "layer3/w", not
  // "layer30"); "" drops all. Returns how many were dropped.
  size_t drop(const std::string& name);

  std::vector<uint8_t> save() const;
  Status restore(const uint8_t* bytes, size_t len);  // all-or-nothing

 private:
  Result<ErrorFeedbackEntry*> entry(const std::string& key, uint64_t n);
  std::map<std::string, ErrorFeedbackEntry> entries_;
};

}  // namespace lowcomm::collectives
