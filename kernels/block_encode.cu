// Block-grouped encodes whose groups take one sweep (blocks of 32..256 elements, the common
// case); the kernel and its schedule are in block_encode.cuh. Larger blocks go to
// block_encode_sweeps.cu.

#include "block_encode.cuh"

namespace lowcomm::cuda {

cudaError_t launch_block_encode(const CodecJob& job, const BlockEncodePlan& plan,
                                cudaStream_t stream) {
  if (plan.sweeps > 1) return launch_block_encode_sweeps(job, plan, stream);
  return block_encode::launch_block_encode_sweeps<true>(job, plan, stream);
}

}  // namespace lowcomm::cuda
