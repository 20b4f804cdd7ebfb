// install.consumers: a C++17 program built against an installed lowcomm through
// find_package(lowcomm CONFIG), once linking lowcomm::lowcomm (the .so) and once
// lowcomm::lowcomm_static. It checks the version three ways, encodes and decodes a vector with
// q8 within the codec's error bound (codec.h), and runs a two-rank all-reduce on loopback
// through communicator.h (rank 1 a fork()ed child). Exit status 0 when every check holds.

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "lowcomm/codec.h"
#include "lowcomm/communicator.h"
#include "lowcomm/lowcomm.h"
#include "lowcomm/version.h"
#ifdef CONSUMER_CUDA
#include "lowcomm/codec_cuda.h"
#endif

namespace {

int fail(const char* what, const lowcomm::Status& s) {
  std::fprintf(stderr, "main.cc: %s: %s\n", what, s.to_string().c_str());
  return 1;
}

int check_version() {
  int v = -1;
  if (lowcommGetVersion(&v) != lowcommSuccess || v != LOWCOMM_VERSION_CODE ||
      lowcomm::version() != LOWCOMM_VERSION_CODE) {
    std::fprintf(stderr, "main.cc: version: C %d, C++ %d, header %d\n", v, lowcomm::version(),
                 LOWCOMM_VERSION_CODE);
    return 1;
  }
  return 0;
}

// q8 (absmax, blocks of 128): every element within one step A/128 of its block's largest
// magnitude A (docs/codecs.md), and not all exact.
int check_codec() {
  auto spec = lowcomm::parse_codec_spec("q8");
  if (!spec) return fail("parse_codec_spec", spec.status());
  const uint64_t n = 10000;
  std::vector<float> x(n), y(n);
  for (uint64_t i = 0; i < n; ++i)
    x[i] = static_cast<float>(std::sin(0.001 * static_cast<double>(i * i)) *
                              (1.0 + static_cast<double>(i % 7)));
  std::vector<uint8_t> codes(lowcomm::encoded_size(*spec, n));
  if (codes.size() >= n * sizeof(float) / 3) {
    std::fprintf(stderr, "main.cc: q8 encodes %llu floats in %zu bytes\n",
                 static_cast<unsigned long long>(n), codes.size());
    return 1;
  }
  lowcomm::Status s =
      lowcomm::encode(*spec, lowcomm::DType::kFloat32, x.data(), n, codes.data(), codes.size());
  if (!s) return fail("encode", s);
  s = lowcomm::decode(*spec, codes.data(), codes.size(), n, lowcomm::DType::kFloat32, y.data());
  if (!s) return fail("decode", s);
  double worst = 0;
  for (uint64_t b = 0; b < n; b += 128) {
    uint64_t e = std::min(n, b + 128);
    float a = 0;
    for (uint64_t i = b; i < e; ++i) a = std::max(a, std::fabs(x[i]));
    for (uint64_t i = b; i < e; ++i) {
      double err = std::fabs(static_cast<double>(x[i]) - y[i]);
      if (!(err <= a / 128.0 * 1.0001)) {
        std::fprintf(stderr, "main.cc: q8 x[%llu] = %g decoded as %g (step %g)\n",
                     static_cast<unsigned long long>(i), x[i], y[i], a / 128.0);
        return 1;
      }
      worst = std::max(worst, err);
    }
  }
  if (worst == 0) {
    std::fprintf(stderr, "main.cc: q8 decoded every element exactly: not quantized?\n");
    return 1;
  }
  std::printf("main.cc: q8 round trip within one step (worst %g)\n", worst);
  return 0;
}

#ifdef CONSUMER_CUDA
// The library's CUDA codec links and answers (GPU or not): a call it must refuse on the host,
// before touching a device, and the device query.
int check_cuda() {
  auto spec = lowcomm::parse_codec_spec("q8");
  if (!spec) return fail("parse_codec_spec", spec.status());
  uint8_t codes[64];
  lowcomm::Status s = lowcomm::encode_cuda(*spec, lowcomm::DType::kFloat32, nullptr, 1000, codes,
                                           sizeof(codes), {}, nullptr);
  if (s.code() != lowcomm::StatusCode::kInvalidArgument) {
    std::fprintf(stderr, "main.cc: encode_cuda with a null input: %s\n", s.to_string().c_str());
    return 1;
  }
  std::printf("main.cc: CUDA codec linked, device available: %s\n",
              lowcomm::cuda_device_available() ? "yes" : "no");
  return 0;
}
#endif

int run_rank(const lowcomm::UniqueId& id, int rank) {
  auto comm = lowcomm::Communicator::init(id, rank, 2);
  if (!comm) return fail("Communicator::init", comm.status());
  const uint64_t n = 3000;
  std::vector<float> x(n);
  for (uint64_t i = 0; i < n; ++i) x[i] = static_cast<float>(rank + 1) * static_cast<float>(i);
  lowcomm::Status s =
      (*comm)
          ->all_reduce(x.data(), x.data(), n, lowcomm::DType::kFloat32, lowcomm::ReduceOp::kSum)
          .wait();
  if (!s) return fail("all_reduce", s);
  for (uint64_t i = 0; i < n; ++i) {
    if (x[i] != 3.0f * static_cast<float>(i)) {
      std::fprintf(stderr, "main.cc: rank %d: sum[%llu] = %g\n", rank,
                   static_cast<unsigned long long>(i), x[i]);
      return 1;
    }
  }
  std::printf("main.cc: rank %d of %d: all_reduce exact\n", (*comm)->rank(), (*comm)->size());
  std::fflush(stdout);  // rank 1 leaves through _exit
  return 0;             // ~Communicator says goodbye to the peer
}

int check_communicator() {
  auto id = lowcomm::create_unique_id("127.0.0.1");
  if (!id) return fail("create_unique_id", id.status());
  auto parsed = lowcomm::UniqueId::parse(id->to_string());
  if (!parsed) return fail("UniqueId::parse", parsed.status());
  if (parsed->root_address != id->root_address || parsed->secret != id->secret) {
    std::fprintf(stderr, "main.cc: UniqueId::parse(to_string()) differs from the id\n");
    return 1;
  }
  std::fflush(stdout);
  pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) _exit(run_rank(*id, 1));
  int rc = run_rank(*id, 0);
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "main.cc: rank 1 failed (status %d)\n", status);
    rc = 1;
  }
  return rc;
}

}  // namespace

int main() {
  if (check_version() != 0) return 1;
  if (check_codec() != 0) return 1;
#ifdef CONSUMER_CUDA
  if (check_cuda() != 0) return 1;
#endif
  return check_communicator();
}
