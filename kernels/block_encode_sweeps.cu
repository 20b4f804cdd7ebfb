// Block-grouped encodes whose groups take several sweeps (blocks of 512..4096 elements); the
// kernel and its schedule are in block_encode.cuh.

#include "block_encode.cuh"

namespace lowcomm::cuda {

cudaError_t launch_block_encode_sweeps(const CodecJob& job, const BlockEncodePlan& plan,
                                       cudaStream_t stream) {
  return block_encode::launch_block_encode_sweeps<false>(job, plan, stream);
}

}  // namespace lowcomm::cuda
