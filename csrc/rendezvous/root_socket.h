#pragma once
// The listening socket create_unique_id() opens for rank 0, kept in a process-wide registry
// until Communicator::init(rank 0) takes it. Opening it when the id is made (as NCCL's
// ncclGetUniqueId starts its root) means the port in the id is really ours: no other process
// can take it between id creation and init. A fork() inherits the registry and the descriptor,
// so a test (or launcher) may create the id and fork the ranks.
//
// Thread safety: both functions may be called from any thread (one internal mutex).

#include <string>

#include "core/unique_fd.h"

namespace lowcomm::rendezvous {

void register_root_socket(const std::string& id_text, UniqueFd fd);
// The socket registered for this id, or an invalid fd (rank 0 then binds the address itself).
UniqueFd take_root_socket(const std::string& id_text);

}  // namespace lowcomm::rendezvous
