// nccl_net_allreduce: NCCL's own all-reduce between processes on one GPU machine, for checking
// the net plugin with real NCCL (scripts/nccl_gpu.sh). One process per rank; every rank uses
// CUDA device 0; with a different NCCL_HOSTID per process NCCL treats them as separate nodes
// and sends through its network transport (the plugin, or NCCL's Socket with NCCL_NET=Socket).
//
//   nccl_net_allreduce --rank R --nranks 2 --id-file /tmp/id [--bytes 1M,16M,256M] [--iters 5]
//                      [--dtype fp32|bf16]
//
// Inputs are small integers (rank + 1 + i % 7), so every sum is exact in fp32 and bf16 and the
// result is checked element by element. Prints one JSON line per size (rank 0): NCCL's version,
// seconds per all-reduce (median of --iters after one warm-up), algbw and busbw in GB/s
// (nccl-tests conventions: busbw = algbw * 2 (n - 1) / n).

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

#define CHECK_CUDA(call)                                                                       \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "rank %d: %s failed: %s\n", g_rank, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)
#define CHECK_NCCL(call)                                                                           \
  do {                                                                                             \
    ncclResult_t r_ = (call);                                                                      \
    if (r_ != ncclSuccess) {                                                                       \
      std::fprintf(stderr, "rank %d: %s failed: %s (%s)\n", g_rank, #call, ncclGetErrorString(r_), \
                   ncclGetLastError(nullptr));                                                     \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

int g_rank = -1;

size_t parse_bytes(const std::string& t) {
  size_t v = std::strtoull(t.c_str(), nullptr, 10);
  switch (t.empty() ? 0 : t.back()) {
    case 'K':
      return v << 10;
    case 'M':
      return v << 20;
    case 'G':
      return v << 30;
    default:
      return v;
  }
}

std::vector<size_t> parse_list(const std::string& t) {
  std::vector<size_t> out;
  size_t start = 0;
  while (start <= t.size()) {
    size_t comma = t.find(',', start);
    if (comma == std::string::npos) comma = t.size();
    if (comma > start) out.push_back(parse_bytes(t.substr(start, comma - start)));
    start = comma + 1;
  }
  return out;
}

// bf16 from a small integer (exact), and back.
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  int nranks = 2, iters = 5;
  std::string id_file, dtype = "fp32", sizes_text = "1M,16M,256M";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--rank")
      g_rank = std::atoi(v.c_str());
    else if (k == "--nranks")
      nranks = std::atoi(v.c_str());
    else if (k == "--id-file")
      id_file = v;
    else if (k == "--bytes")
      sizes_text = v;
    else if (k == "--iters")
      iters = std::atoi(v.c_str());
    else if (k == "--dtype")
      dtype = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (g_rank < 0 || g_rank >= nranks || id_file.empty() || iters < 1 ||
      (dtype != "fp32" && dtype != "bf16")) {
    std::fprintf(stderr,
                 "usage: %s --rank R --nranks N --id-file F [--bytes L] [--iters K] "
                 "[--dtype fp32|bf16]\n",
                 argv[0]);
    return 2;
  }
  const bool bf16 = dtype == "bf16";
  const size_t elem = bf16 ? 2 : 4;
  const ncclDataType_t type = bf16 ? ncclBfloat16 : ncclFloat32;

  ncclUniqueId id;
  if (g_rank == 0) {
    CHECK_NCCL(ncclGetUniqueId(&id));
    const std::string tmp = id_file + ".tmp";
    std::ofstream(tmp, std::ios::binary).write(reinterpret_cast<const char*>(&id), sizeof(id));
    std::rename(tmp.c_str(), id_file.c_str());
  } else {
    for (int waited = 0;; ++waited) {
      std::ifstream in(id_file, std::ios::binary);
      if (in.read(reinterpret_cast<char*>(&id), sizeof(id))) break;
      if (waited > 6000) {
        std::fprintf(stderr, "rank %d: no id in %s after 60 s\n", g_rank, id_file.c_str());
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  CHECK_CUDA(cudaSetDevice(0));
  ncclComm_t comm;
  CHECK_NCCL(ncclCommInitRank(&comm, nranks, id, g_rank));
  int version = 0;
  CHECK_NCCL(ncclGetVersion(&version));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));

  int failures = 0;
  for (size_t bytes : parse_list(sizes_text)) {
    const size_t count = bytes / elem;
    std::vector<uint8_t> host(count * elem), back(count * elem);
    for (size_t i = 0; i < count; ++i) {
      const float v = static_cast<float>(g_rank + 1 + static_cast<int>(i % 7));
      if (bf16) {
        const uint16_t h = to_bf16(v);
        std::memcpy(&host[i * 2], &h, 2);
      } else {
        std::memcpy(&host[i * 4], &v, 4);
      }
    }
    void *send = nullptr, *recv = nullptr;
    CHECK_CUDA(cudaMalloc(&send, host.size() + 1));
    CHECK_CUDA(cudaMalloc(&recv, host.size() + 1));
    CHECK_CUDA(cudaMemcpy(send, host.data(), host.size(), cudaMemcpyHostToDevice));
    std::vector<double> times;
    for (int it = 0; it <= iters; ++it) {
      auto t0 = std::chrono::steady_clock::now();
      CHECK_NCCL(ncclAllReduce(send, recv, count, type, ncclSum, comm, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      if (it > 0)
        times.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    CHECK_CUDA(cudaMemcpy(back.data(), recv, back.size(), cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      const float want =
          static_cast<float>(nranks * (nranks + 1) / 2 + nranks * static_cast<int>(i % 7));
      float got;
      if (bf16) {
        uint16_t h;
        std::memcpy(&h, &back[i * 2], 2);
        got = from_bf16(h);
      } else {
        std::memcpy(&got, &back[i * 4], 4);
      }
      if (got != want) ++wrong;
    }
    std::sort(times.begin(), times.end());
    const double s = times[times.size() / 2];
    const double algbw = static_cast<double>(bytes) / s / 1e9;
    if (g_rank == 0)
      std::printf(
          "{\"nccl_version\": %d, \"dtype\": \"%s\", \"bytes\": %zu, \"ranks\": %d, "
          "\"seconds\": %.6f, \"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f, "
          "\"wrong_elements\": %zu}\n",
          version, dtype.c_str(), bytes, nranks, s, algbw, algbw * 2.0 * (nranks - 1) / nranks,
          wrong);
    std::fflush(stdout);
    if (wrong) {
      std::fprintf(stderr, "rank %d: %zu of %zu elements wrong at %zu bytes\n", g_rank, wrong,
                   count, bytes);
      ++failures;
    }
    CHECK_CUDA(cudaFree(send));
    CHECK_CUDA(cudaFree(recv));
  }
  CHECK_NCCL(ncclCommDestroy(comm));
  CHECK_CUDA(cudaStreamDestroy(stream));
  if (g_rank == 0) std::remove(id_file.c_str());
  return failures ? 1 : 0;
}
