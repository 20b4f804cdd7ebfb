#pragma once
// The exact element-wise reductions of the collectives (everything but a codec's fp32
// decode-accumulate): every ReduceOp on every DType, in the accumulator type acc_dtype(dtype).
//
//   Floating point: fp64 in double; fp32, bf16 and fp16 in fp32, rounded to the dtype once at
//     the end. MIN and MAX propagate NaN (as torch.minimum/maximum). AVG is the sum divided by
//     the rank count.
//   Integers: two's-complement wrap-around for SUM and PRODUCT (as NCCL and torch); AVG is the
//     wrapped sum divided by the rank count, truncated toward zero (NCCL's integer ncclAvg).
//   Bool (one byte, any non-zero is true, results are 0 or 1): SUM, MAX and BOR are OR; PRODUCT,
//     MIN and BAND are AND; BXOR is XOR; AVG is refused.
// Bitwise reductions take integers and bool only. The order of contributions is fixed by the
// caller (rank order), so every rank computing the same reduction gets the same bits.

#include <cstdint>

#include "lowcomm/codec.h"
#include "lowcomm/communicator.h"
#include "lowcomm/status.h"

namespace lowcomm::collectives {

// kInvalidArgument naming `what` when `op` is not defined on `dtype`.
Status check_reduction(const char* what, DType dtype, ReduceOp op);

// fp32 for fp32/bf16/fp16, the dtype itself otherwise.
DType acc_dtype(DType dtype);

// acc (n elements of acc_dtype(dtype)) = the first contribution `src` (n elements of dtype).
void reduce_first(DType dtype, void* acc, const void* src, uint64_t n);
// acc = acc op src, element-wise; src holds n elements of dtype. `scratch` holds n fp32 when
// dtype is bf16 or fp16 (the contribution converted), and may be null otherwise.
void reduce_next(DType dtype, ReduceOp op, void* acc, const void* src, uint64_t n, float* scratch);
// Finishes the reduction of `ranks` contributions (AVG divides) and writes n elements of dtype
// to out (out may alias acc when the types have the same size).
void reduce_finish(DType dtype, ReduceOp op, int ranks, void* acc, void* out, uint64_t n);

}  // namespace lowcomm::collectives
