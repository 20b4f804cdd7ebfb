#include "compress_policy.h"

namespace lowcomm::nccl_net {

bool CompressPolicy::pays() const {
  return encode_rate_ > 1.25 * link_bytes_per_s_ && ratio_ > 1.05;
}

LosslessConfig CompressPolicy::choose(size_t n) {
  LosslessConfig raw = config_;
  raw.method = LosslessMethod::kNone;
  if (!framed() || n < kMinBytes) return raw;
  if (!adaptive_ || ratio_ == 0) return config_;  // fixed, or nothing measured yet
  if (raw_left_ > 0) {
    --raw_left_;
    return raw;
  }
  return config_;  // a probe, or it pays
}

void CompressPolicy::observe(size_t n, size_t wire, double seconds) {
  if (n == 0 || wire == 0 || seconds <= 0) return;
  const double r = static_cast<double>(n) / static_cast<double>(wire);
  const double e = static_cast<double>(n) / seconds;
  constexpr double kWeight = 0.25;
  ratio_ = ratio_ == 0 ? r : (1 - kWeight) * ratio_ + kWeight * r;
  encode_rate_ = encode_rate_ == 0 ? e : (1 - kWeight) * encode_rate_ + kWeight * e;
  if (adaptive_ && !pays()) raw_left_ = kProbeEvery;
}

}  // namespace lowcomm::nccl_net
