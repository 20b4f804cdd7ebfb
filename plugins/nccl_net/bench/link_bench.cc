// nccl_net_link_bench: what the plugin moves over a link, driven as NCCL drives it. Two forked
// processes dlopen libnccl-net-lowcomm.so; rank 0 sends `--bytes` to rank 1 as messages of
// `--step` bytes with `--inflight` requests posted at a time (NCCL: NCCL_BUFFSIZE / 8 per step,
// 8 in flight per connection; --step 0: one message), test() on the oldest only. The link is
// whatever the environment sets (LOWCOMM_WAN=bw=1gbit,rtt=100ms for the emulated WAN).
// Prints one JSON line per repetition: seconds, Gbit/s of payload, and the fraction of
// --link-gbit.
//
//   LOWCOMM_WAN=bw=1gbit,rtt=100ms nccl_net_link_bench --bytes 256M --step 4M --inflight 8
//   ... --data grads_bf16.bin       (send those bytes, tiled; with LOWCOMM_NCCL_COMPRESS=...)

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <string>
#include <vector>

#include "core/params.h"
#include "driver_util.h"

using namespace lowcomm::nccl_net::testing;  // NOLINT: a program of its own

namespace {

size_t parse_bytes(const char* text) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  switch (*end) {
    case 'K':
      v *= 1024;
      break;
    case 'M':
      v *= 1024 * 1024;
      break;
    case 'G':
      v *= 1024.0 * 1024 * 1024;
      break;
    default:
      break;
  }
  return static_cast<size_t>(v);
}

struct Args {
  size_t bytes = 256u << 20;
  size_t step = 0;
  int inflight = 8;
  int repeat = 3;
  double link_gbit = 1.0;
  std::string data;  // a file whose bytes are sent (tiled), e.g. gradients; default: random
};

// The bytes rank 0 sends: the --data file tiled to --bytes, or a random pattern.
std::vector<uint8_t> payload(const Args& a) {
  std::vector<uint8_t> buf(a.bytes);
  if (a.data.empty()) {
    fill(buf.data(), buf.size(), 99);
    return buf;
  }
  std::ifstream in(a.data, std::ios::binary);
  std::vector<uint8_t> src((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (src.empty()) return {};
  for (size_t off = 0; off < buf.size(); off += src.size())
    std::memcpy(buf.data() + off, src.data(), std::min(src.size(), buf.size() - off));
  return buf;
}

int run_rank(Channel ch, int rank, const Args& a) {
  RankComms c;
  if (connect_ranks(ch, c, std::chrono::seconds(60))) return 1;
  const abi::NetV12* net = c.net();
  const std::vector<uint8_t> expect = payload(a);
  DRIVER_CHECK(expect.size() == a.bytes, "cannot read --data %s", a.data.c_str());
  std::vector<uint8_t> buf = expect;
  const size_t step = a.step ? a.step : a.bytes;
  for (int rep = 0; rep < a.repeat; ++rep) {
    char sync = 0;  // start together
    if (rank == 0) {
      DRIVER_CHECK(ch.recv(&sync, 1));
    } else {
      DRIVER_CHECK(ch.send(&sync, 1));
    }
    auto t0 = Clock::now();
    std::deque<void*> reqs;
    size_t posted = 0;
    while (posted < a.bytes || !reqs.empty()) {
      while (posted < a.bytes && static_cast<int>(reqs.size()) < a.inflight) {
        size_t n = std::min(step, a.bytes - posted);
        void* req = nullptr;
        if (rank == 0) {
          DRIVER_CHECK(post_send(net, c.send, buf.data() + posted, n, &req) == 0);
        } else {
          DRIVER_CHECK(post_recv(net, c.recv, buf.data() + posted, n, &req) == 0);
        }
        if (!req) break;
        reqs.push_back(req);
        posted += n;
      }
      int done = 0, size = 0;
      DRIVER_CHECK(net->test(reqs.front(), &done, &size) == 0, "%s", take_last_warn().c_str());
      if (done) reqs.pop_front();
    }
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (std::getenv("BENCH_DEBUG"))
      std::fprintf(stderr, "rank %d rep %d done after %.3f s\n", rank, rep, s);
    if (rank == 1) {
      DRIVER_CHECK(buf == expect, "corrupt data");
      const double gbit = static_cast<double>(a.bytes) * 8 / s / 1e9;
      std::printf(
          "{\"bytes\": %zu, \"step\": %zu, \"inflight\": %d, \"seconds\": %.4f, "
          "\"gbit_per_s\": %.4f, \"fraction_of_link\": %.4f}\n",
          a.bytes, step, a.inflight, s, gbit, gbit / a.link_gbit);
      std::fflush(stdout);
      std::fill(buf.begin(), buf.end(), 0);  // the next repetition must write it all again
    }
  }
  DRIVER_CHECK(c.close() == 0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--bytes")
      a.bytes = parse_bytes(argv[i + 1]);
    else if (k == "--step")
      a.step = parse_bytes(argv[i + 1]);
    else if (k == "--inflight")
      a.inflight = std::atoi(argv[i + 1]);
    else if (k == "--repeat")
      a.repeat = std::atoi(argv[i + 1]);
    else if (k == "--link-gbit")
      a.link_gbit = std::atof(argv[i + 1]);
    else if (k == "--data")
      a.data = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (!lowcomm::params::text("LOWCOMM_SECRET") && !lowcomm::params::text("LOWCOMM_SECRET_FILE"))
    ::setenv("LOWCOMM_SECRET", "link-bench", 1);
  if (a.inflight < 1 || a.inflight > abi::kMaxRequests || a.bytes == 0) {
    std::fprintf(stderr, "--inflight 1..32, --bytes > 0\n");
    return 2;
  }
  auto [r0, r1] = run_two([&](Channel ch) { return run_rank(ch, 0, a); },
                          [&](Channel ch) { return run_rank(ch, 1, a); }, 1800);
  return r0 == 0 && r1 == 0 ? 0 : 1;
}
