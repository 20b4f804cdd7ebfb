#pragma once
// Test bytes shaped like fp32 gradients: normal values of a narrow range, whose exponent bytes
// repeat and mantissas do not (compressible, the more so byte-shuffled).

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace lowcomm::nccl_net::testing {

inline std::vector<uint8_t> gradient_like(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1e-3f);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i + 4 <= n; i += 4) {
    float x = d(rng);
    std::memcpy(&v[i], &x, 4);
  }
  return v;
}

}  // namespace lowcomm::nccl_net::testing
