#pragma once
// StreamSocket: one authenticated data stream as the handshake hands it over: the
// non-blocking socket and the keys its payloads are guarded with (payload_guard.h).

#include "core/unique_fd.h"
#include "transport/payload_guard.h"

namespace lowcomm::transport {

struct StreamSocket {
  UniqueFd fd;
  StreamKeys keys;
};

}  // namespace lowcomm::transport
