// AVX2 path (placeholder until the vector kernels land).
#include "codec/cpu_kernels.h"

namespace lowcomm::cpu {
bool avx2_supported() { return false; }
bool avx2_range(const CodecJob&, uint64_t, uint64_t) { return false; }
}  // namespace lowcomm::cpu
