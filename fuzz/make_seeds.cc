// Writes a seed corpus for decode_fuzzer: one valid frame per (codec, dtype, count) below,
// so the fuzzer starts from frames that parse and mutates from there.
// Usage: lowcomm_fuzz_seeds <directory>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "frame/frame.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <seed directory>\n", argv[0]);
    return 2;
  }
  const char* specs[] = {"none",    "bf16",     "fp16",         "q1",      "q2",
                         "q3",      "q4:sr",    "q8:block=32",  "minmax2", "minmax4:sr",
                         "minmax8", "q4:col=8", "minmax2:col=4"};
  const uint64_t counts[] = {0, 1, 9, 64, 200};
  const lowcomm::DType dtypes[] = {lowcomm::DType::kFloat32, lowcomm::DType::kBFloat16};
  int written = 0;
  for (const char* text : specs) {
    lowcomm::CodecSpec spec = *lowcomm::parse_codec_spec(text);
    for (lowcomm::DType dtype : dtypes) {
      for (uint64_t n : counts) {
        if (!lowcomm::check_count(spec, n)) continue;
        std::vector<float> x(n);
        for (uint64_t i = 0; i < n; ++i) x[i] = std::sin(static_cast<float>(i) * 0.7f) * 3.0f;
        // bf16 seeds from the high halves of the fp32 values.
        std::vector<uint16_t> h(n);
        for (uint64_t i = 0; i < n; ++i) {
          uint32_t u;
          std::memcpy(&u, &x[i], 4);
          h[i] = static_cast<uint16_t>(u >> 16);
        }
        const void* input = dtype == lowcomm::DType::kFloat32 ? static_cast<const void*>(x.data())
                                                              : static_cast<const void*>(h.data());
        std::vector<uint8_t> frame(lowcomm::frame::framed_size(spec, n));
        lowcomm::Status s =
            lowcomm::frame::encode_frame(spec, dtype, input, n, frame.data(), frame.size(), {n, 0});
        if (!s) {
          std::fprintf(stderr, "%s: %s\n", text, s.to_string().c_str());
          return 1;
        }
        std::string name = std::string(argv[1]) + "/" + text + "-" + lowcomm::dtype_name(dtype) +
                           "-" + std::to_string(n);
        for (char& ch : name) {
          if (ch == ':' || ch == '=') ch = '_';
        }
        FILE* f = std::fopen(name.c_str(), "wb");
        if (f == nullptr || std::fwrite(frame.data(), 1, frame.size(), f) != frame.size() ||
            std::fclose(f) != 0) {
          std::perror(name.c_str());
          return 1;
        }
        ++written;
      }
    }
  }
  std::printf("wrote %d seed frames to %s\n", written, argv[1]);
  return 0;
}
