// Open MPI baseline for lowcomm's all-reduce: MPI_Allreduce (fp32, sum, out of place) over a
// size sweep. Per size: `warmup` untimed calls, then `iters` calls, each started after a barrier
// and timed alone (as scripts/baselines/gloo_allreduce.py times Gloo, so the two compare); the
// time reported is, as lowcomm-bench reports its own rows, the median over the calls of the
// slowest rank's time in each call (MPI_MAX over ranks), so a fast rank cannot flatter the result.
// Inputs are small integers, so the fp32 sum is exact whatever order MPI reduces in, and every
// element of the result is checked on every rank after the timed calls; a wrong element fails the
// run.
//
// Output (rank 0, stdout): one CSV row per size,
//   library,ranks,bytes,seconds,algbw_gbit_s,busbw_gbit_s
// algbw = bytes / seconds and busbw = algbw * 2 (P - 1) / P (nccl-tests' definitions), both in
// Gbit/s (1e9 bit/s) so they compare directly with a link rate such as tc's "1gbit".
//
// Run it across emulated WAN links with scripts/baselines/mpi_allreduce.sh (see
// docs/wan-emulation.md); it runs under any mpirun too:
//   mpirun -n 4 build/bin/lowcomm-mpi-allreduce-baseline -b 1M -e 256M -f 4 -w 1 -n 3

#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Options {
  uint64_t min_bytes = 1ull << 20;
  uint64_t max_bytes = 256ull << 20;
  uint64_t factor = 4;
  int warmup = 1;
  int iters = 3;
  bool header = true;
  std::string library = "openmpi";
};

// "256M" -> 268435456; K, M, G are binary (KiB, MiB, GiB), as nccl-tests reads -b/-e.
bool parse_size(const char* text, uint64_t* out) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text) return false;
  uint64_t mult = 1;
  switch (*end) {
    case '\0':
      break;
    case 'K':
    case 'k':
      mult = 1ull << 10;
      ++end;
      break;
    case 'M':
    case 'm':
      mult = 1ull << 20;
      ++end;
      break;
    case 'G':
    case 'g':
      mult = 1ull << 30;
      ++end;
      break;
    default:
      return false;
  }
  if (*end != '\0') return false;
  *out = v * mult;
  return true;
}

bool parse_int(const char* text, int* out) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < 0 || v > 1000000) return false;
  *out = static_cast<int>(v);
  return true;
}

void usage(const char* prog) {
  std::fprintf(stderr,
               "usage: %s [-b MIN_BYTES] [-e MAX_BYTES] [-f FACTOR] [-w WARMUP] [-n ITERS]\n"
               "          [--no-header] [--library NAME]\n"
               "  sizes take K/M/G (binary) suffixes; defaults -b 1M -e 256M -f 4 -w 1 -n 3\n",
               prog);
}

// Returns false (after printing why on rank 0) when the arguments are unusable.
bool parse_args(int argc, char** argv, int rank, Options* opt) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    bool ok = true;
    if (a == "--no-header") {
      opt->header = false;
      continue;
    }
    if (v == nullptr) {
      ok = false;
    } else if (a == "-b") {
      ok = parse_size(v, &opt->min_bytes);
    } else if (a == "-e") {
      ok = parse_size(v, &opt->max_bytes);
    } else if (a == "-f") {
      ok = parse_size(v, &opt->factor) && opt->factor >= 2;
    } else if (a == "-w") {
      ok = parse_int(v, &opt->warmup);
    } else if (a == "-n") {
      ok = parse_int(v, &opt->iters) && opt->iters >= 1;
    } else if (a == "--library") {
      opt->library = v;
    } else {
      ok = false;
    }
    if (!ok) {
      if (rank == 0) {
        std::fprintf(stderr, "mpi_allreduce_baseline: bad argument '%s'%s%s\n", a.c_str(),
                     v ? " " : "", v ? v : "");
        usage(argv[0]);
      }
      return false;
    }
    ++i;
  }
  if (opt->min_bytes < sizeof(float) || opt->min_bytes > opt->max_bytes ||
      opt->max_bytes / sizeof(float) > static_cast<uint64_t>(INT32_MAX)) {
    if (rank == 0) {
      std::fprintf(stderr,
                   "mpi_allreduce_baseline: need 4 <= -b <= -e and -e at most %" PRIu64
                   " bytes (MPI counts are int)\n",
                   static_cast<uint64_t>(INT32_MAX) * sizeof(float));
    }
    return false;
  }
  return true;
}

// Rank r contributes (r + 1) * (i % 7 + 1) at element i; the sum over P ranks is
// P (P + 1) / 2 * (i % 7 + 1), exact in fp32 for any P this benchmark will see.
float input_value(int rank, uint64_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
}
float expected_value(int nranks, uint64_t i) {
  return static_cast<float>(nranks * (nranks + 1) / 2 * static_cast<int>(i % 7 + 1));
}

// Runs one size; returns false if any rank saw a wrong element.
bool run_size(const Options& opt, int rank, int nranks, uint64_t bytes) {
  const uint64_t count = bytes / sizeof(float);
  bytes = count * sizeof(float);
  const int n = static_cast<int>(count);
  std::vector<float> send(count), recv(count, 0.0f);
  for (uint64_t i = 0; i < count; ++i) send[i] = input_value(rank, i);

  for (int w = 0; w < opt.warmup; ++w) {
    MPI_Allreduce(send.data(), recv.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  std::fill(recv.begin(), recv.end(), 0.0f);
  std::vector<double> mine(static_cast<size_t>(opt.iters));
  for (int it = 0; it < opt.iters; ++it) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    MPI_Allreduce(send.data(), recv.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    mine[static_cast<size_t>(it)] = MPI_Wtime() - t0;
  }
  std::vector<double> per_call(mine.size(), 0.0);  // each call's slowest rank
  MPI_Reduce(mine.data(), per_call.data(), opt.iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  std::sort(per_call.begin(), per_call.end());
  const size_t mid = per_call.size() / 2;
  const double slowest =
      per_call.size() % 2 ? per_call[mid] : 0.5 * (per_call[mid - 1] + per_call[mid]);

  uint64_t wrong = 0, first_wrong = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (recv[i] != expected_value(nranks, i)) {
      if (wrong == 0) first_wrong = i;
      ++wrong;
    }
  }
  if (wrong != 0) {
    std::fprintf(stderr,
                 "mpi_allreduce_baseline: rank %d: %" PRIu64 " of %" PRIu64
                 " elements wrong at %" PRIu64 " bytes; first at %" PRIu64
                 ": got %g, expected %g\n",
                 rank, wrong, count, bytes, first_wrong, static_cast<double>(recv[first_wrong]),
                 static_cast<double>(expected_value(nranks, first_wrong)));
  }
  unsigned long long wrong_all = 0, wrong_mine = wrong;
  MPI_Allreduce(&wrong_mine, &wrong_all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);

  if (rank == 0 && wrong_all == 0) {
    const double algbw = static_cast<double>(bytes) * 8.0 / slowest / 1e9;
    const double busbw = algbw * 2.0 * (nranks - 1) / nranks;
    std::printf("%s,%d,%" PRIu64 ",%.6f,%.4f,%.4f\n", opt.library.c_str(), nranks, bytes, slowest,
                algbw, busbw);
    std::fflush(stdout);
  }
  return wrong_all == 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  Options opt;
  if (!parse_args(argc, argv, rank, &opt)) {
    MPI_Finalize();
    return 2;
  }
  if (rank == 0 && opt.header) {
    std::printf("library,ranks,bytes,seconds,algbw_gbit_s,busbw_gbit_s\n");
    std::fflush(stdout);
  }
  int rc = 0;
  for (uint64_t bytes = opt.min_bytes; bytes <= opt.max_bytes; bytes *= opt.factor) {
    if (!run_size(opt, rank, nranks, bytes)) {
      rc = 1;
      break;
    }
    if (bytes > opt.max_bytes / opt.factor) break;  // the next size would overflow or pass -e
  }
  MPI_Finalize();
  return rc;
}
