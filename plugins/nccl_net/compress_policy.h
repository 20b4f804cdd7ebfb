#pragma once
// CompressPolicy: per send comm, whether the next message is compressed.
//
// LOWCOMM_NCCL_COMPRESS=lz4|zstd[:level] compresses every message of at least kMinBytes.
// LOWCOMM_NCCL_COMPRESS=auto compresses only while it saves wall time on the link: encoding and
// the link work in a pipeline (NCCL keeps several steps in flight), so a message of n bytes
// costs max(n / E, n / (r L)) instead of n / L, with E the measured encode rate, r the measured
// ratio and L the link rate NCCL is told (LOWCOMM_NCCL_SPEED_MBPS or the emulated rate). That
// is a saving when E > L and r > 1; the policy asks for E > 1.25 L and r > 1.05 (decoding is
// faster than encoding for both codecs). When it does not pay, the next kProbeEvery messages go
// raw and then one is compressed again to re-measure (gradients change over training).
//
// Not thread-safe: used under its comm's mutex.

#include <cstddef>
#include <cstdint>

#include "lossless.h"

namespace lowcomm::nccl_net {

class CompressPolicy {
 public:
  static constexpr size_t kMinBytes = 4096;  // below, the frame overhead dominates
  static constexpr int kProbeEvery = 32;

  CompressPolicy(LosslessConfig config, bool adaptive, double link_bytes_per_s)
      : config_(config), adaptive_(adaptive), link_bytes_per_s_(link_bytes_per_s) {}

  // Whether messages are framed at all (compression configured).
  bool framed() const { return config_.method != LosslessMethod::kNone; }
  // The frame config for the next message of n bytes; method kNone: store it raw.
  LosslessConfig choose(size_t n);
  // After an encode with compression: n raw bytes became `wire` bytes in `seconds`.
  void observe(size_t n, size_t wire, double seconds);

  uint64_t raw_bytes() const { return raw_bytes_; }
  uint64_t wire_bytes() const { return wire_bytes_; }
  void count(size_t raw, size_t wire) {
    raw_bytes_ += raw;
    wire_bytes_ += wire;
  }

 private:
  bool pays() const;
  LosslessConfig config_;
  bool adaptive_;
  double link_bytes_per_s_;
  double ratio_ = 0;        // exponentially weighted, raw / wire
  double encode_rate_ = 0;  // exponentially weighted, raw bytes per second
  int raw_left_ = 0;        // messages to send raw before the next probe
  uint64_t raw_bytes_ = 0, wire_bytes_ = 0;
};

}  // namespace lowcomm::nccl_net
