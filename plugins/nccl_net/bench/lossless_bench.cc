// nccl_net_lossless_bench: what the plugin's lossless frames achieve on real gradient bytes.
// For each file (e.g. from dump_gradients.py) and each codec setting, compresses it message by
// message as the plugin does (--message bytes, NCCL's step size), single-threaded, and prints
// one JSON line: ratio (raw / wire), encode and decode MB/s, and the time to move 256 MiB over
// links of 0.1, 1 and 10 Gbit/s raw and compressed (codec and link pipelined: the slowest of
// encode, link and decode sets the pace).
//
//   nccl_net_lossless_bench --message 512K DIR/grads_fp32.bin DIR/grads_bf16.bin ...

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "lossless.h"

using lowcomm::nccl_net::LosslessConfig;
using lowcomm::nccl_net::LosslessMethod;
namespace ln = lowcomm::nccl_net;

namespace {

using Clock = std::chrono::steady_clock;

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

// Element width from the file name (…fp32… / …bf16…), for the shuffle.
int width_of(const std::string& path) {
  if (path.find("bf16") != std::string::npos || path.find("fp16") != std::string::npos) return 2;
  return 4;
}

}  // namespace

int main(int argc, char** argv) {
  size_t message = 512u << 10;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--message" && i + 1 < argc) {
      std::string v = argv[++i];
      message = std::strtoull(v.c_str(), nullptr, 10) * (v.back() == 'K'   ? 1024u
                                                         : v.back() == 'M' ? 1024u * 1024u
                                                                           : 1u);
    } else {
      files.push_back(a);
    }
  }
  if (files.empty() || message == 0) {
    std::fprintf(stderr, "usage: %s [--message 512K] FILE...\n", argv[0]);
    return 2;
  }
  for (const auto& path : files) {
    const auto data = read_file(path);
    if (data.empty()) {
      std::fprintf(stderr, "%s: empty or unreadable\n", path.c_str());
      return 1;
    }
    const int width = width_of(path);
    std::vector<LosslessConfig> configs;
    for (int shuffle : {0, width}) {
      configs.push_back({LosslessMethod::kLz4, 1, shuffle});
      configs.push_back({LosslessMethod::kZstd, 1, shuffle});
      configs.push_back({LosslessMethod::kZstd, 3, shuffle});
    }
    for (const auto& c : configs) {
      std::vector<uint8_t> frame(ln::lossless_bound(message)), back(message);
      size_t wire = 0;
      double enc_s = 0, dec_s = 0;
      for (size_t off = 0; off < data.size(); off += message) {
        const size_t n = std::min(message, data.size() - off);
        auto t0 = Clock::now();
        auto k = ln::lossless_encode(c, data.data() + off, n, frame.data(), frame.size());
        auto t1 = Clock::now();
        if (!k) return 1;
        auto m = ln::lossless_decode(frame.data(), *k, back.data(), back.size());
        auto t2 = Clock::now();
        if (!m || *m != n || std::memcmp(back.data(), data.data() + off, n) != 0) {
          std::fprintf(stderr, "round trip failed\n");
          return 1;
        }
        wire += *k;
        enc_s += std::chrono::duration<double>(t1 - t0).count();
        dec_s += std::chrono::duration<double>(t2 - t1).count();
      }
      const double raw = static_cast<double>(data.size());
      const double ratio = raw / static_cast<double>(wire);
      const double enc = raw / enc_s, dec = raw / dec_s;  // bytes per second
      std::printf(
          "{\"file\": \"%s\", \"codec\": \"%s\", \"message\": %zu, \"ratio\": %.4f, "
          "\"encode_MBps\": %.1f, \"decode_MBps\": %.1f",
          path.substr(path.find_last_of('/') + 1).c_str(), ln::to_string(c).c_str(), message, ratio,
          enc / 1e6, dec / 1e6);
      const double bytes = 256.0 * (1 << 20);
      for (double gbit : {0.1, 1.0, 10.0}) {
        const double link = gbit * 1e9 / 8;
        const double plain = bytes / link;
        const double packed = std::max({bytes / ratio / link, bytes / enc, bytes / dec});
        std::printf(", \"s_256MiB_%gGbit_raw\": %.3f, \"s_256MiB_%gGbit_compressed\": %.3f", gbit,
                    plain, gbit, packed);
      }
      std::printf("}\n");
      std::fflush(stdout);
    }
  }
  return 0;
}
