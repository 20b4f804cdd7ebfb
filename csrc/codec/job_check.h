#pragma once
// The argument checks every codec back end (CPU, CUDA) runs before it touches a buffer, so a
// job one back end refuses is refused by the other with the same message.

#include <cstdint>

#include "codec/codec_job.h"

namespace lowcomm {

// `data` is the job's main tensor (x for encodes, out for decodes, m for delta decode);
// `codes_bytes` the capacity of the payload buffer.
Status check_codec_job(const CodecJob& job, const void* data, uint64_t codes_bytes);

}  // namespace lowcomm
