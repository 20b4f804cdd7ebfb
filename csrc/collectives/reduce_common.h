#pragma once
// What the reduction algorithms (owner_reduce.cc, one_hop_reduce.cc) share: the stochastic
// rounding seeds and the passthrough spec of a dtype.

#include <cstdint>

#include "lowcomm/codec.h"

namespace lowcomm::collectives {

// SplitMix64 finaliser: spreads (seed, step, rank, role) over the 64-bit stochastic-rounding
// seed space, so the sender and owner quantizations of every rank and step draw independent
// random numbers, and the same inputs reproduce the same bits.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Roles: 1 a rank's own contribution, 2 an owner's re-quantization.
inline uint64_t rounding_seed(uint64_t seed, uint64_t step, int rank, uint64_t role) {
  return mix(mix(mix(seed) ^ step) ^ (static_cast<uint64_t>(rank) << 8 | role));
}

// A codec dtype's own bytes as a codec: what the fp32 accumulator is rounded into. (Other
// dtypes are never encoded: their reductions are typed, collectives/reduce_kernels.h.)
inline CodecSpec passthrough(DType dtype) {
  CodecSpec s;
  s.kind = CodecKind::kNone;
  s.bits = static_cast<int>(dtype_size(dtype) * 8);
  s.wire_dtype = dtype;
  return s;
}

}  // namespace lowcomm::collectives
