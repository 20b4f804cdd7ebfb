#pragma once
// Argument checks of the public operations, each naming the call ("all_reduce: ..."): what is
// wrong on this rank alone. Communicator's methods run them before a sequence number is taken
// or anything is queued, so a bad call is refused and the group stays usable (NCCL's
// ncclInvalidArgument); the algorithm bodies run them again as a defence.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lowcomm/communicator.h"

namespace lowcomm::collectives {

inline constexpr uint64_t kMaxElements = uint64_t{1} << 56;

Status check_dtype(const char* what, DType dtype);
Status check_op(const char* what, DType dtype, ReduceOp op);
Status check_codec(const char* what, const std::optional<CodecSpec>& codec, uint64_t count,
                   DType dtype, ReduceOp op);
Status check_error_feedback_key(const char* what, const std::optional<CodecSpec>& codec,
                                DType dtype, const std::string& error_feedback_key);
Status check_elements(const char* what, uint64_t count, uint64_t per = 1);
Status check_buffer(const char* what, const char* name, const void* buf, uint64_t count);
Status check_peer(const char* what, int peer, int rank, int size);
// A receive from any rank: the group has another rank, and check_p2p's checks but the peer's.
Status check_recv_any(const void* buf, uint64_t count, DType dtype, uint64_t tag, int rank,
                      int size);
Status check_p2p(const char* what, const void* buf, uint64_t count, DType dtype, int peer,
                 uint64_t tag, int rank, int size);
Status check_all_reduce(const void* send, void* recv, uint64_t count, DType dtype, ReduceOp op,
                        const std::optional<CodecSpec>& codec,
                        const std::string& error_feedback_key);
Status check_reduce_scatter(const void* send, void* recv, uint64_t recv_count, DType dtype,
                            ReduceOp op, int size, const std::optional<CodecSpec>& codec,
                            const std::string& error_feedback_key);
Status check_all_gather(const void* send, void* recv, uint64_t send_count, DType dtype, int size);
Status check_root(const char* what, int root, int size);
Status check_reduce(const void* send, void* recv, uint64_t count, DType dtype, ReduceOp op,
                    int root, int rank, int size, const std::optional<CodecSpec>& codec,
                    const std::string& error_feedback_key);
Status check_rooted(const char* what, const void* send, void* recv, uint64_t count, DType dtype,
                    int root, int rank, int size, bool root_holds_all);
Status check_all_to_all(const void* send, const std::vector<uint64_t>& send_counts,
                        const std::vector<uint64_t>& send_offsets, void* recv,
                        const std::vector<uint64_t>& recv_counts,
                        const std::vector<uint64_t>& recv_offsets, DType dtype, int rank, int size);
Status check_broadcast(const void* send, void* recv, uint64_t count, DType dtype, int root,
                       int rank, int size);

}  // namespace lowcomm::collectives
