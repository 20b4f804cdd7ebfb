#pragma once
// A chunk on its way out (peer_core.h): one piece of an isend, its header, and where its bytes
// are. Shared by PeerCore and the link emulator, which holds chunks between submit and write.

#include <cstdint>
#include <memory>
#include <string>

#include "transport/chunk_header.h"
#include "transport/pacer.h"
#include "transport/request.h"

namespace lowcomm::transport {

// One isend: completes when its last chunk is written (emulated: has departed).
struct SendOp {
  std::shared_ptr<RequestState> req;
  std::string what;  // "isend tag T (N bytes)"
  uint64_t chunks_left = 0;
  uint64_t departs_left = 0;  // emulated: chunks that have not yet left the sender's end
  uint64_t retained = 0;      // chunks kept for a re-send that still point into its buffer
};

struct OutChunk {
  std::shared_ptr<SendOp> op;
  ChunkHeader fields;  // written out, with its check, when queued on a stream
  uint8_t header[kChunkHeaderBytes];
  const uint8_t* data = nullptr;
  uint32_t len = 0;
  uint64_t written = 0;              // of header + data
  PaceClock::time_point depart{};    // emulated: when its bytes leave the sender's end
  PaceClock::time_point release{};   // emulated: when it reaches the far end (is written)
  std::unique_ptr<uint8_t[]> owned;  // a copy: emulated, made at departure; sealed, the
                                     // ciphertext
  bool protected_ = false;           // header and check written (sealed emulated: at departure)
  int stream = -1;  // emulated: the pacer's choice; -1: the least busy striped stream
};

}  // namespace lowcomm::transport
