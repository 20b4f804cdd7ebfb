#pragma once
// The connection handle listen() fills and NCCL carries to the connecting peer (at most
// NCCL_NET_HANDLE_MAXSIZE bytes): where the listener is. It carries no secret and no pointer;
// the peer proves the secret in the handshake.

#include <cstdint>
#include <cstring>
#include <string>

#include "nccl_net_abi.h"

namespace lowcomm::nccl_net {

struct ConnectionHandle {
  static constexpr uint32_t kMagic = 0x484e434cu;  // "LCNH"
  static constexpr uint16_t kVersion = 1;
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  char address[88];  // SocketAddress::to_string(), NUL-terminated

  // Whether `bytes` hold a handle of this version with a terminated address.
  static bool valid(const void* bytes) {
    ConnectionHandle h;
    std::memcpy(&h, bytes, sizeof(h));
    return h.magic == kMagic && h.version == kVersion &&
           std::memchr(h.address, '\0', sizeof(h.address)) != nullptr;
  }
};
static_assert(sizeof(ConnectionHandle) <= abi::kHandleMaxBytes);

}  // namespace lowcomm::nccl_net
