// lowcomm-bench: collective benchmark in the manner of nccl-tests (docs/benchmarks-collectives.md).
//
//   build/bin/lowcomm-bench -n 4 -b 1M -e 256M -f 4 --codec none,q8,q4 --wan bw=1gbit,rtt=50ms
//   build/bin/lowcomm-bench -n 4 -b 256M -e 256M --codec none,q8,q4 --netns lc --baseline gloo
//   mpirun -n 4 build/bin/lowcomm-bench -b 1M -e 64M --id-file /shared/lc.id
//
// Three ways to run the ranks:
//   - launcher (default): `-n P` starts P worker processes of this program (re-executed from
//     /proc/self/exe, with `ip netns exec PREFIX<k>` in front under --netns); rank 0 creates the
//     UniqueId and writes it to an id file that the others poll;
//   - under mpirun (OMPI_COMM_WORLD_RANK/SIZE set): this process is that rank; rank 0 writes the
//     id to --id-file (tagged with the job id so a stale file is never used);
//   - worker (--rank/--nranks, used by the launcher).
// Rank 0 prints one table per codec, one row per size, and writes --csv; the launcher then runs
// the baselines (--baseline) and the plot (--plot).

#ifdef LOWCOMM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_model.h"
#include "collectives/reduce_common.h"
#include "core/params.h"
#include "lowcomm/codec.h"
#include "lowcomm/communicator.h"
#include "topology/shares.h"
#include "topology/sites.h"
#include "transport/peer_config.h"
#include "transport/wan_link.h"

#ifndef LOWCOMM_SOURCE_DIR
#define LOWCOMM_SOURCE_DIR "."
#endif

namespace {

using namespace lowcomm;
using bench::Collective;
using Clock = std::chrono::steady_clock;

struct Options {
  uint64_t min_bytes = 1 << 20;
  uint64_t max_bytes = 1 << 20;
  uint64_t factor = 2;
  Collective collective = Collective::kAllReduce;
  std::vector<std::string> codecs{"none"};
  bool ef = false;
  int ranks = 0;  // launcher: how many workers
  int rank = -1;  // worker: this rank
  int nranks = 0;
  std::string wan;
  std::string sites;                           // CommOptions::sites ("" = LOWCOMM_SITES / --wan)
  std::vector<std::string> schedules{"auto"};  // auto | flat | two-level, one table each
  std::string shares;                          // CommOptions::shares ("" = LOWCOMM_SHARES)
  std::string intra;                           // CommOptions::intra_site ("" = LOWCOMM_INTRA_SITE)
  std::string netns;                           // namespace prefix, "" = none
  int warmup = 1;
  int iters = 5;
  int streams = 0;
  int sockbuf = 0;  // CommOptions::socket_buffer_bytes: 0 default, -1 kernel autotuning
  std::string csv;
  std::string plot;
  std::string baseline;  // "", "mpi", "gloo"
  std::string id_file;
  uint64_t seed = 1;
  int timeout_s = 1800;
  bool back_to_back = false;  // no barrier before each timed call (one before the first)
  bool check = false;  // exit non-zero if a row's relative error exceeds the codec's sanity bound
  bool cuda = false;   // --device cuda: the buffers live on the GPU (MemoryKind::kCuda)
};

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "lowcomm-bench: error: %s\n", msg.c_str());
  std::exit(2);
}

uint64_t parse_bytes(const std::string& s) {
  if (s.empty()) die("empty size");
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  uint64_t mul = 1;
  std::string suf(end);
  if (suf == "K" || suf == "k")
    mul = 1ull << 10;
  else if (suf == "M" || suf == "m")
    mul = 1ull << 20;
  else if (suf == "G" || suf == "g")
    mul = 1ull << 30;
  else if (!suf.empty())
    die("bad size '" + s + "' (bytes, optional K/M/G suffix)");
  if (!(v > 0)) die("bad size '" + s + "'");
  return static_cast<uint64_t>(v * static_cast<double>(mul));
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

void usage() {
  std::printf(
      "usage: lowcomm-bench [options]\n"
      "  -b, --minbytes SIZE      smallest size (bytes, K/M/G suffix; default 1M)\n"
      "  -e, --maxbytes SIZE      largest size (default: the -b size)\n"
      "  -f, --stepfactor F       multiply the size by F each step (default 2)\n"
      "  -c, --collective NAME    allreduce | allgather | reducescatter | broadcast\n"
      "      --device host|cuda   where the buffers live (cuda: device buffers, the collectives'\n"
      "                           CUDA path, docs/collectives.md; default host)\n"
      "      --codec LIST         comma list of codec specs, one table each (default none;\n"
      "                           all-reduce only: e.g. none,q8,q4,q2,q4:block=64:sr)\n"
      "      --ef                 error feedback on the senders' quantization (all-reduce)\n"
      "  -n, --ranks P            launch P local ranks (not under mpirun)\n"
      "      --wan SPEC           lowcomm's link emulator, e.g. bw=1gbit,rtt=50ms (each rank's\n"
      "                           uplink and downlink, shared by its peers; model=pair: per pair)\n"
      "      --sites LABELS       which ranks share a site, one label per rank (0,0,0,0,1,1,1,1) "
      "or\n"
      "                           flat (default: LOWCOMM_SITES, else --wan's site= rules)\n"
      "      --shares MODE        auto | equal: owner shares of the flat all-reduce from the\n"
      "                           measured rates, or equal (default: the communicator's)\n"
      "      --intra MODE         tcp | ucx: the transport between ranks of one site or host\n"
      "                           (default: LOWCOMM_INTRA_SITE, else tcp)\n"
      "      --schedule LIST      auto,flat,two-level,ring: one table each (all-reduce; ring:\n"
      "                           the PCCL-style baseline, a ring over the sites in order);\n"
      "                           with flat and two-level, a summary against the bound\n"
      "      --netns PREFIX       rank k runs in namespace PREFIX<k> (scripts/wan_netns.sh up P)\n"
      "  -w, --warmup N           untimed calls per size (default 1)\n"
      "  -i, --iters N            timed calls per size (default 5)\n"
      "      --streams N          TCP streams per peer, all striped (default: LOWCOMM_STREAMS, "
      "else 4\n"
      "                           opened and as many striped as the path needs)\n"
      "      --sockbuf BYTES|auto socket buffer per stream (32M default; auto: the kernel's "
      "autotuning,\n"
      "                           i.e. a default TCP socket)\n"
      "      --csv FILE           write every row as CSV\n"
      "      --plot FILE.png      plot time against size per codec (python3-matplotlib)\n"
      "      --baseline mpi|gloo  also run scripts/baselines/{mpi,gloo}_allreduce.sh over the "
      "same\n"
      "                           namespaces and sizes, and print the speedups\n"
      "      --id-file FILE       where rank 0 writes the UniqueId (mpirun; default in /tmp)\n"
      "      --seed S             input seed (default 1)\n"
      "      --timeout S          deadline of init and of every operation (default 1800)\n"
      "      --back-to-back       time calls issued one after another (one barrier before the\n"
      "                           first): per-call latency without a barrier's skew, with\n"
      "                           its p50 and p99 on a line below each row\n"
      "      --check              exit 1 when a row's relative error is above the codec's bound\n"
      "      --print-env          print every LOWCOMM_* variable with the value in force, and "
      "exit\n"
      "Time is the slowest rank's time, median over the timed calls; each call starts after a\n"
      "barrier. Bandwidths in Gbit/s (10^9 bit/s, the unit of link rates).\n");
}

Options parse_args(int argc, char** argv) {
  Options o;
  bool have_max = false;
  auto need = [&](int& i) -> std::string {
    if (i + 1 >= argc) die(std::string("missing value for ") + argv[i]);
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage();
      std::exit(0);
    } else if (a == "--print-env") {
      std::fputs(params::describe().c_str(), stdout);
      Status s = params::check_all();
      if (!s) std::fprintf(stderr, "lowcomm-bench: %s\n", s.message().c_str());
      std::exit(s.is_ok() ? 0 : 2);
    } else if (a == "-b" || a == "--minbytes")
      o.min_bytes = parse_bytes(need(i));
    else if (a == "-e" || a == "--maxbytes") {
      o.max_bytes = parse_bytes(need(i));
      have_max = true;
    } else if (a == "-f" || a == "--stepfactor")
      o.factor = std::stoull(need(i));
    else if (a == "-c" || a == "--collective") {
      auto c = bench::parse_collective(need(i));
      if (!c) die("unknown collective (allreduce, allgather, reducescatter, broadcast)");
      o.collective = *c;
    } else if (a == "--codec")
      o.codecs = split(need(i), ',');
    else if (a == "--device") {
      const std::string d = need(i);
      if (d != "cuda" && d != "host") die("--device takes host or cuda");
      o.cuda = d == "cuda";
    } else if (a == "--ef")
      o.ef = true;
    else if (a == "-n" || a == "--ranks")
      o.ranks = std::stoi(need(i));
    else if (a == "--rank")
      o.rank = std::stoi(need(i));
    else if (a == "--nranks")
      o.nranks = std::stoi(need(i));
    else if (a == "--wan")
      o.wan = need(i);
    else if (a == "--netns")
      o.netns = need(i);
    else if (a == "--sites")
      o.sites = need(i);
    else if (a == "--schedule")
      o.schedules = split(need(i), ',');
    else if (a == "--shares")
      o.shares = need(i);
    else if (a == "--intra")
      o.intra = need(i);
    else if (a == "-w" || a == "--warmup")
      o.warmup = std::stoi(need(i));
    else if (a == "-i" || a == "--iters")
      o.iters = std::stoi(need(i));
    else if (a == "--streams")
      o.streams = std::stoi(need(i));
    else if (a == "--sockbuf") {
      std::string v = need(i);
      if (v == "auto") {
        o.sockbuf = -1;
      } else {
        auto b = transport::parse_buffer_bytes(v);
        if (!b || *b == 0) die("--sockbuf: expected a byte count such as 32M, or auto");
        o.sockbuf = *b;
      }
    } else if (a == "--csv")
      o.csv = need(i);
    else if (a == "--plot")
      o.plot = need(i);
    else if (a == "--baseline")
      o.baseline = need(i);
    else if (a == "--id-file")
      o.id_file = need(i);
    else if (a == "--seed")
      o.seed = std::stoull(need(i));
    else if (a == "--timeout")
      o.timeout_s = std::stoi(need(i));
    else if (a == "--back-to-back")
      o.back_to_back = true;
    else if (a == "--check")
      o.check = true;
    else
      die("unknown argument '" + a + "' (see --help)");
  }
  if (!have_max) o.max_bytes = std::max(o.max_bytes, o.min_bytes);
  if (o.max_bytes < o.min_bytes) die("-e is smaller than -b");
  if (o.factor < 2 && o.max_bytes > o.min_bytes) die("-f must be at least 2");
  if (o.iters < 1 || o.warmup < 0) die("-i must be >= 1 and -w >= 0");
  if (o.codecs.empty()) die("--codec needs at least one spec");
  if (o.cuda && std::find(o.schedules.begin(), o.schedules.end(), "ring") != o.schedules.end())
    die("--device cuda: the ring schedule takes host buffers");
  for (const auto& c : o.codecs) {
    auto spec = parse_codec_spec(c);
    if (!spec) die("--codec " + c + ": " + spec.status().message());
    if (c != "none" && o.collective != Collective::kAllReduce)
      die("codecs apply to allreduce only (" + std::string(bench::collective_name(o.collective)) +
          " is uncompressed)");
  }
  for (const auto& sc : o.schedules)
    if (sc != "auto" && sc != "flat" && sc != "two-level" && sc != "ring")
      die("--schedule: '" + sc + "' is not auto, flat, two-level or ring");
  for (const auto& sc : o.schedules)
    if (sc == "ring" && o.collective != Collective::kAllReduce)
      die("--schedule ring is an all-reduce");
  if (o.schedules.empty()) die("--schedule needs at least one of auto, flat, two-level");
  if (!o.baseline.empty() && o.baseline != "mpi" && o.baseline != "gloo")
    die("--baseline must be mpi or gloo");
  if (!o.baseline.empty() && o.collective != Collective::kAllReduce)
    die("--baseline compares all-reduce only");
  if (!o.wan.empty()) {
    auto w = transport::parse_wan_plan(o.wan);
    if (!w) die("--wan: " + w.status().message());
  }
  return o;
}

// ---- the netns layout (scripts/wan_netns.sh state file) ----

struct NetnsInfo {
  std::string subnet = "10.77.0";
  double rate_bits = 0;
  std::string rate;
  // wan_netns.sh up --sites: ranks [first, last] behind one link of rate bits/s, both ways.
  struct Site {
    int first = 0, last = 0;
    double rate_bits = 0;
  };
  std::vector<Site> sites;
};

NetnsInfo read_netns(const std::string& prefix) {
  NetnsInfo info;
  std::ifstream f("/run/lowcomm-wan/" + prefix + ".conf");
  if (!f)
    die("no /run/lowcomm-wan/" + prefix + ".conf: run scripts/wan_netns.sh up P --prefix " +
        prefix + " first");
  std::string line;
  while (std::getline(f, line)) {
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (k == "SUBNET")
      info.subnet = v;
    else if (k == "RATE_BITS")
      info.rate_bits = std::strtod(v.c_str(), nullptr);
    else if (k == "RATE")
      info.rate = v;
    else if (k == "SITES")
      for (const std::string& item : split(v, ',')) {
        NetnsInfo::Site st;
        if (std::sscanf(item.c_str(), "%d-%d:%lf", &st.first, &st.last, &st.rate_bits) != 3)
          die("/run/lowcomm-wan/" + prefix + ".conf: SITES entry '" + item + "' is malformed");
        info.sites.push_back(st);
      }
  }
  return info;
}

// ---- inputs: a seeded pseudo-gradient, a pure function of (seed, rank, index) ----

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Bell-shaped values (sum of two uniforms) whose scale changes every 64 Ki elements over two
// decades, as the tensors of a model's pseudo-gradient do.
struct InputGen {
  uint64_t seed;
  float value(int rank, uint64_t i) const {
    uint64_t base = mix64(seed * 0x100000001b3ull + static_cast<uint64_t>(rank) + 1);
    uint64_t h = mix64(base ^ i);
    uint64_t hb = mix64(seed ^ ((i >> 16) * 0x9e3779b97f4a7c15ull));  // scale: same on all ranks
    float scale =
        std::pow(10.0f, -4.0f + 2.0f * static_cast<float>(hb >> 40) / static_cast<float>(1 << 24));
    float u1 = static_cast<float>(h >> 40) / static_cast<float>(1 << 24);
    float u2 = static_cast<float>((h >> 16) & 0xffffff) / static_cast<float>(1 << 24);
    return (u1 + u2 - 1.0f) * scale;
  }
  void fill(int rank, uint64_t begin, uint64_t n, float* out) const {
    float scale = 0;
    uint64_t block = ~0ull;
    uint64_t base = mix64(seed * 0x100000001b3ull + static_cast<uint64_t>(rank) + 1);
    for (uint64_t k = 0; k < n; ++k) {
      uint64_t i = begin + k;
      if ((i >> 16) != block) {
        block = i >> 16;
        uint64_t hb = mix64(seed ^ (block * 0x9e3779b97f4a7c15ull));
        scale = std::pow(10.0f,
                         -4.0f + 2.0f * static_cast<float>(hb >> 40) / static_cast<float>(1 << 24));
      }
      uint64_t h = mix64(base ^ i);
      float u1 = static_cast<float>(h >> 40) / static_cast<float>(1 << 24);
      float u2 = static_cast<float>((h >> 16) & 0xffffff) / static_cast<float>(1 << 24);
      out[k] = (u1 + u2 - 1.0f) * scale;
    }
  }
};

double cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto tv = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}

// ---- one rank ----

std::string job_token() {
  for (const char* k : {"OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
                        "LCBENCH_JOB_TOKEN"})
    if (const char* v = std::getenv(k)) return v;
  return "none";
}

UniqueId exchange_id(const Options& o, int rank, const std::string& bind) {
  const std::string token = job_token();
  if (rank == 0) {
    auto id = create_unique_id(bind);
    if (!id) die("create_unique_id(" + bind + "): " + id.status().to_string());
    std::string tmp = o.id_file + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream f(tmp);
      f << token << "\n" << id->to_string() << "\n";
    }
    ::chmod(tmp.c_str(), 0600);
    if (std::rename(tmp.c_str(), o.id_file.c_str()) != 0) die("cannot write " + o.id_file);
    return *id;
  }
  auto until = Clock::now() + std::chrono::seconds(std::min(o.timeout_s, 120));
  while (Clock::now() < until) {
    std::ifstream f(o.id_file);
    std::string tok, text;
    if (f && std::getline(f, tok) && std::getline(f, text) && tok == token) {
      auto id = UniqueId::parse(text);
      if (id) return *id;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  die("rank " + std::to_string(rank) + ": no id from rank 0 in " + o.id_file);
}

struct Row {
  std::string codec;
  uint64_t bytes = 0;
  double time_s = 0;
  double algbw = 0, busbw = 0;
  uint64_t wire = 0;
  double ratio = 1;
  double rel_err = 0;
  double limit_s = 0;  // 0: no link model
  double cpu_ns_per_byte = 0;
};

// After a flat all-reduce's table row: the owner shares it ran with and this rank's measured
// rate (OpStats), and, when --wan gives ranks different rates, the model of the flat all-reduce
// with equal shares and with shares sized from the configured rates: the least time any shares
// allow (topology/shares.h), the bound for this schedule.
void print_shares(const OpStats& st, const bench::LinkModel& link,
                  const std::optional<transport::WanPlan>& wplan, int P, double encoded) {
  std::printf("#   owner shares %s; rank 0's rate estimate %.1f Mbit/s\n",
              topology::shares_to_string(st.shares).c_str(), st.rate_estimate * 8 / 1e6);
  if (!wplan || link.kind != bench::LinkModel::kSite) return;
  std::vector<double> rates;  // bytes/s of the wire, the slower direction of each rank's link
  for (int r = 0; r < P; ++r) {
    auto l = wplan->link(r, -1);
    if (!l) return;
    double bps = l->bits_per_second;
    if (l->down_bits_per_second > 0 && (bps == 0 || l->down_bits_per_second < bps))
      bps = l->down_bits_per_second;
    if (bps <= 0) return;
    rates.push_back(bps / 8);
  }
  if (*std::min_element(rates.begin(), rates.end()) ==
      *std::max_element(rates.begin(), rates.end()))
    return;
  const double wire = encoded * (1 + link.frame_bytes / 1448);
  const auto plan = topology::plan_shares(rates);
  std::printf(
      "#   per-rank links: model with equal shares %.4f s, with shares from the links (the "
      "bound) %.4f s: %s\n",
      topology::predicted_time({}, rates) * wire + link.one_way_delay_s,
      topology::predicted_time(plan, rates) * wire + link.one_way_delay_s,
      plan.to_string().c_str());
}

// The PCCL-style baseline: a ring all-reduce over `order` (the best ring over sites crosses
// each site's link once: the ranks of a site next to each other), built on lowcomm's
// point-to-point and codec calls. Reduce-scatter: P-1 steps, each rank re-quantizing its running
// partial of one chunk and sending it to the next rank, which decode-accumulates it into its own
// (P-1 quantizations of an element, not two); then the owner of each reduced chunk quantizes it
// once and the codes go round unchanged (P-1 steps), every rank decoding the same bytes. One
// chunk per step, no pipelining within a step: 2 (P-1) one-way delays.
Status ring_all_reduce(Communicator& c, const float* send, float* recv, uint64_t n,
                       const std::optional<CodecSpec>& spec, const std::vector<int>& order) {
  const int P = c.size();
  const int pos = static_cast<int>(std::find(order.begin(), order.end(), c.rank()) - order.begin());
  const int next = order[static_cast<size_t>((pos + 1) % P)];
  const int prev = order[static_cast<size_t>((pos + P - 1) % P)];
  const CodecSpec wire = spec ? *spec : collectives::passthrough(DType::kFloat32);
  const auto chunks = topology::owner_chunks(n, P, topology::granule(spec));
  auto chunk = [&](int i) { return chunks[static_cast<size_t>(((i % P) + P) % P)]; };
  std::memcpy(recv, send, n * sizeof(float));
  uint64_t most = 0;
  for (const auto& r : chunks) most = std::max(most, encoded_size(wire, r.count));
  std::vector<uint8_t> out(most), in(most);
  auto exchange = [&](uint64_t tag, uint64_t out_bytes, uint64_t in_bytes) -> Status {
    Work r = c.recv(in.data(), in_bytes, DType::kUInt8, prev, tag);
    Work w = c.send(out.data(), out_bytes, DType::kUInt8, next, tag);
    LOWCOMM_CHECK(w.wait());
    return r.wait();
  };
  for (int st = 0; st < P - 1; ++st) {  // reduce-scatter
    const auto cs = chunk(pos - st), cr = chunk(pos - st - 1);
    const uint64_t ob = encoded_size(wire, cs.count), ib = encoded_size(wire, cr.count);
    LOWCOMM_CHECK(encode(wire, DType::kFloat32, recv + cs.begin, cs.count, out.data(), ob));
    LOWCOMM_CHECK(exchange(7000 + static_cast<uint64_t>(st), ob, ib));
    LOWCOMM_CHECK(
        decode_accumulate(wire, in.data(), ib, cr.count, DType::kFloat32, recv + cr.begin));
  }
  // This rank's reduced chunk: pos + 1. Quantized once; the same bytes decoded everywhere.
  auto own = chunk(pos + 1);
  uint64_t ob = encoded_size(wire, own.count);
  LOWCOMM_CHECK(encode(wire, DType::kFloat32, recv + own.begin, own.count, out.data(), ob));
  LOWCOMM_CHECK(decode(wire, out.data(), ob, own.count, DType::kFloat32, recv + own.begin));
  for (int st = 0; st < P - 1; ++st) {  // all-gather: forward the codes unchanged
    const auto cr = chunk(pos - st);
    const uint64_t ib = encoded_size(wire, cr.count);
    LOWCOMM_CHECK(exchange(8000 + static_cast<uint64_t>(st), ob, ib));
    LOWCOMM_CHECK(decode(wire, in.data(), ib, cr.count, DType::kFloat32, recv + cr.begin));
    std::swap(out, in);
    ob = ib;
  }
  return Status::ok();
}

// --device cuda's buffers: device copies of a size's send and recv (none for --device host).
struct DeviceBuffers {
  void* send = nullptr;
  void* recv = nullptr;
  DeviceBuffers(bool cuda, const std::vector<float>& s, const std::vector<float>& r) {
    if (!cuda) return;
#ifdef LOWCOMM_HAVE_CUDA
    if (cudaMalloc(&send, std::max<size_t>(1, s.size() * 4)) != cudaSuccess ||
        cudaMalloc(&recv, std::max<size_t>(1, r.size() * 4)) != cudaSuccess ||
        cudaMemcpy(send, s.data(), s.size() * 4, cudaMemcpyHostToDevice) != cudaSuccess)
      die("--device cuda: cudaMalloc/cudaMemcpy failed (is there a GPU?)");
#else
    (void)s;
    (void)r;
    die("--device cuda: this build has no CUDA");
#endif
  }
  void copy_back(std::vector<float>& r) const {
#ifdef LOWCOMM_HAVE_CUDA
    if (recv != nullptr &&
        cudaMemcpy(r.data(), recv, r.size() * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
      die("--device cuda: copying the result back failed");
#else
    (void)r;
#endif
  }
  ~DeviceBuffers() {
#ifdef LOWCOMM_HAVE_CUDA
    if (send != nullptr) cudaFree(send);
    if (recv != nullptr) cudaFree(recv);
#endif
  }
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
};

int run_rank(const Options& o, int rank, int P) {
  std::optional<NetnsInfo> ns;
  std::string bind = "127.0.0.1", listen = "127.0.0.1";
  if (!o.netns.empty()) {
    ns = read_netns(o.netns);
    bind = ns->subnet + ".1";
    listen = ns->subnet + "." + std::to_string(rank + 1);
  } else if (std::getenv("OMPI_COMM_WORLD_RANK") != nullptr) {
    bind = "";  // across hosts: LOWCOMM_SOCKET_IFNAME or the first interface
    listen = "";
  }
  UniqueId id = exchange_id(o, rank, bind);

  CommOptions co;
  if (o.streams > 0) co.streams = o.streams;
  if (o.sockbuf != 0) co.socket_buffer_bytes = std::max(o.sockbuf, 0);  // -1 (auto): 0
  co.wan = o.wan;
  co.sites = o.sites;
  co.shares = o.shares;
  co.intra_site = o.intra;
  // Namespaces behind site links (wan_netns.sh up --sites): each rank has an address of its own,
  // so the communicator is told the sites (unless --sites or LOWCOMM_SITES says otherwise).
  std::vector<int> ns_labels;  // by rank: its netns site, or a site alone
  if (ns && !ns->sites.empty()) {
    for (int r = 0; r < P; ++r) {
      int label = 1000000 + r;
      for (size_t i = 0; i < ns->sites.size(); ++i)
        if (r >= ns->sites[i].first && r <= ns->sites[i].last) label = static_cast<int>(i);
      ns_labels.push_back(label);
    }
    if (co.sites.empty() && !params::text("LOWCOMM_SITES"))
      for (int r = 0; r < P; ++r)
        co.sites += (r ? "," : "") + std::to_string(ns_labels[static_cast<size_t>(r)]);
  }
  co.timeout = std::chrono::seconds(o.timeout_s);
  co.listen_address = listen;
  auto comm_r = Communicator::init(id, rank, P, co);
  if (!comm_r) die("rank " + std::to_string(rank) + ": init: " + comm_r.status().to_string());
  std::unique_ptr<Communicator> comm = std::move(comm_r.value());
  // The segment size in force (init has checked the variable), for the traffic model.
  auto segment_env = params::bytes("LOWCOMM_SEGMENT_BYTES");
  const uint64_t segment_bytes =
      segment_env.is_ok() ? segment_env->value_or(uint64_t{4} << 20) : uint64_t{4} << 20;
  auto check = [&](const Status& s, const char* what) {
    if (!s) die("rank " + std::to_string(rank) + ": " + what + ": " + s.to_string());
  };

  // The link model: the emulator's site (or per-pair) links, or the rank's tbf access link.
  // Per-rank and per-pair sections of --wan: the busiest rank's own link is not known here,
  // so the model takes rank 0's defaults.
  bench::LinkModel link;
  std::optional<transport::WanPlan> wplan_all;  // --wan, for the per-rank rates
  if (!o.wan.empty()) wplan_all = *transport::parse_wan_plan(o.wan);
  if (!o.wan.empty()) {
    auto plan = *transport::parse_wan_plan(o.wan);
    auto w = *transport::parse_wan(plan.defaults);
    link.kind = w.model == transport::WanModel::kPair ? bench::LinkModel::kPerPeer
                                                      : bench::LinkModel::kSite;
    link.bits_per_second = w.bits_per_second;
    link.down_bits_per_second = w.down_bits_per_second;
    link.one_way_delay_s = w.one_way_delay_s;
    link.frame_bytes = w.frame_bytes;
  } else if (ns) {
    link.kind = bench::LinkModel::kAccess;
    link.bits_per_second = ns->rate_bits;
  }

  // Sites, as the communicator sees them (--sites, LOWCOMM_SITES, --wan's site= rules), and
  // their links from --wan: the limit of each schedule and the two-level bound.
  std::optional<bench::SiteLinkModel> sites_model;
  topology::SitePlan site_plan;
  {
    std::string text = !o.sites.empty() ? o.sites : params::text("LOWCOMM_SITES").value_or("");
    std::optional<transport::WanPlan> wplan;
    if (!o.wan.empty()) wplan = *transport::parse_wan_plan(o.wan);
    if (!text.empty()) {
      auto p = topology::parse_sites(text, P);
      if (!p) die("--sites: " + p.status().message());
      site_plan = *p;
    } else if (!ns_labels.empty()) {
      site_plan = topology::plan_from_labels(ns_labels);
    } else if (wplan) {
      site_plan = topology::plan_from_groups(wplan->site_labels(P));
    }
    // Each site's link: a namespace site's tbf (the framing counted, no netem), or the
    // emulator's site link with its delay.
    if (site_plan.sites() > 1 && site_plan.sites() < P && (!ns_labels.empty() || wplan)) {
      bench::SiteLinkModel m;
      if (ns_labels.empty()) {
        auto d = *transport::parse_wan(wplan->defaults);
        m.one_way_delay_s = d.one_way_delay_s;
        m.frame_bytes = d.frame_bytes;
      }
      for (const auto& members : site_plan.members) {
        double up = ns ? ns->rate_bits : 0, down = up;
        if (!ns_labels.empty()) {
          for (const auto& st : ns->sites)
            if (members.front() >= st.first && members.front() <= st.last) up = down = st.rate_bits;
        } else {
          auto l = *wplan->link(members.front(), -1);
          up = l.bits_per_second;
          down = l.down_bits_per_second;
        }
        m.site_size.push_back(static_cast<int>(members.size()));
        m.up_bps.push_back(up);
        m.down_bps.push_back(down);
      }
      sites_model = m;
    }
  }

  std::FILE* csv = nullptr;
  if (rank == 0 && !o.csv.empty()) {
    csv = std::fopen(o.csv.c_str(), "w");
    if (!csv) die("cannot write " + o.csv);
    std::fprintf(
        csv,
        "library,collective,codec,ef,ranks,bytes,time_s,algbw_gbit_s,busbw_gbit_s,"
        "wire_bytes_per_rank,compression_ratio,rel_err,limit_s,efficiency,cpu_ns_per_byte,link\n");
  }
  if (rank == 0) {
    auto intra_set = params::choice("LOWCOMM_INTRA_SITE");  // init has checked it
    const std::string intra_env = intra_set.is_ok() ? intra_set->value_or("tcp") : "tcp";
    std::printf(
        "# lowcomm-bench: %s, %d ranks, fp32 sum, warm-up %d, iterations %d, streams %s, socket "
        "buffers %s, inside a site %s\n",
        bench::collective_name(o.collective), P, o.warmup, o.iters,
        o.streams ? std::to_string(o.streams).c_str() : "default (adaptive)",
        o.sockbuf < 0   ? "kernel autotuning"
        : o.sockbuf > 0 ? std::to_string(o.sockbuf).c_str()
                        : "default",
        !o.intra.empty() ? o.intra.c_str() : intra_env.c_str());
    std::printf("# link: %s\n", link.describe(o.wan, ns ? o.netns + "0.." + o.netns +
                                                              std::to_string(P - 1) + " " + ns->rate
                                                        : "")
                                    .c_str());
    std::printf(
        "# time: slowest rank, median of the timed calls; algbw/busbw in Gbit/s; wire: payload "
        "bytes\n"
        "# sent per rank per call; limit: lower bound, max(wire time + one-way delay, rounds x "
        "delay + the last round's wire time); eff = limit/time\n");
  }

  InputGen gen{o.seed};
  int bad = 0;
  double cpu_total = 0, bytes_total = 0;
  // (schedule, codec, bytes) -> time, for the summary of flat against two levels.
  std::map<std::tuple<std::string, std::string, uint64_t>, double> times;
  std::map<std::pair<std::string, uint64_t>, double> bounds;
  for (const auto& schedule : o.schedules)
    for (const auto& codec_text : o.codecs) {
      std::optional<CodecSpec> spec;
      if (codec_text != "none") spec = *parse_codec_spec(codec_text);
      if (rank == 0) {
        std::printf(
            "#\n# codec %s%s%s\n", codec_text.c_str(),
            o.ef && spec && spec->quantized() ? " + error feedback" : "",
            site_plan.sites() > 1 || schedule != "auto"
                ? (", schedule " + schedule + " (sites " + site_plan.to_string() + ")").c_str()
                : "");
        std::printf("#%13s %12s %10s %9s %9s %13s %7s %10s %9s %6s %8s %9s\n", "bytes", "count",
                    "time(s)", "algbw", "busbw", "wire/rank(B)", "ratio", "rel_err", "limit(s)",
                    "eff", "cpu ns/B", "bound(s)");
      }
      for (uint64_t size = o.min_bytes; size <= o.max_bytes; size *= o.factor) {
        bench::Shape sh = bench::shape(o.collective, size, P);
        if (sh.total_elems == 0) {
          if (size * o.factor <= size) break;
          continue;
        }
        // Buffers: send holds what this rank contributes, recv what it gets.
        std::vector<float> send(sh.send_elems), recv(sh.recv_elems);
        if (o.collective == Collective::kBroadcast) {
          if (rank == 0) gen.fill(0, 0, sh.send_elems, send.data());
        } else if (o.collective == Collective::kAllGather) {
          gen.fill(rank, static_cast<uint64_t>(rank) * sh.send_elems, sh.send_elems, send.data());
        } else {
          gen.fill(rank, 0, sh.send_elems, send.data());
        }
        // --device cuda: the same buffers on the GPU (copied there once; recv copied back
        // after the timed calls for the error check).
        DeviceBuffers dev(o.cuda, send, recv);
        void* send_p = o.cuda ? dev.send : send.data();
        void* recv_p = o.cuda ? dev.recv : recv.data();
        const BufferOptions where{o.cuda ? MemoryKind::kCuda : MemoryKind::kHost, nullptr};
        AllReduceOptions ar;
        ar.codec = spec;
        ar.memory = where.memory;
        ar.schedule = schedule == "flat"        ? AllReduceOptions::Schedule::kFlat
                      : schedule == "two-level" ? AllReduceOptions::Schedule::kTwoLevel
                                                : AllReduceOptions::Schedule::kAuto;
        if (o.ef && spec && spec->quantized())
          ar.error_feedback_key = "bench:" + codec_text + ":" + std::to_string(size);
        auto launch = [&]() -> Work {
          switch (o.collective) {
            case Collective::kAllReduce:
              return comm->all_reduce(send_p, recv_p, sh.send_elems, DType::kFloat32,
                                      ReduceOp::kSum, ar);
            case Collective::kAllGather:
              return comm->all_gather(send_p, recv_p, sh.send_elems, DType::kFloat32, where);
            case Collective::kReduceScatter: {
              AllReduceOptions rs;
              rs.memory = where.memory;
              return comm->reduce_scatter(send_p, recv_p, sh.recv_elems, DType::kFloat32,
                                          ReduceOp::kSum, rs);
            }
            case Collective::kBroadcast:
              return comm->broadcast(send_p, recv_p, sh.send_elems, DType::kFloat32, 0, where);
          }
          return {};
        };
        std::vector<int> ring_order;  // site by site: the ring crosses each site's link once
        for (const auto& members : site_plan.members)
          ring_order.insert(ring_order.end(), members.begin(), members.end());
        if (ring_order.empty())
          for (int r = 0; r < P; ++r) ring_order.push_back(r);
        Work last;  // the last timed operation: its stats name the owner shares it ran with
        auto run_once = [&]() -> Status {
          if (schedule == "ring")
            return ring_all_reduce(*comm, send.data(), recv.data(), sh.send_elems, spec,
                                   ring_order);
          last = launch();
          return last.wait();
        };
        for (int w = 0; w < o.warmup; ++w) check(run_once(), "warm-up");
        std::vector<double> mine(static_cast<size_t>(o.iters) + 1);
        double cpu0 = cpu_seconds();
        if (o.back_to_back) check(comm->barrier().wait(), "barrier");
        for (int it = 0; it < o.iters; ++it) {
          if (!o.back_to_back) check(comm->barrier().wait(), "barrier");
          auto t0 = Clock::now();
          check(run_once(), bench::collective_name(o.collective));
          mine[static_cast<size_t>(it)] = std::chrono::duration<double>(Clock::now() - t0).count();
        }
        mine.back() = cpu_seconds() - cpu0;
        dev.copy_back(recv);
        // Gather every rank's times and CPU seconds (doubles, carried bit for bit as fp32 pairs).
        const uint64_t per = mine.size() * 2;
        std::vector<float> all(per * static_cast<uint64_t>(P));
        std::vector<float> mine_f(per);
        std::memcpy(mine_f.data(), mine.data(), mine.size() * sizeof(double));
        check(comm->all_gather(mine_f.data(), all.data(), per, DType::kFloat32).wait(),
              "gathering results");

        if (rank == 0) {
          std::vector<double> per_iter(static_cast<size_t>(o.iters), 0.0);
          double cpu = 0;
          for (int r = 0; r < P; ++r) {
            std::vector<double> d(mine.size());
            std::memcpy(d.data(), all.data() + per * static_cast<uint64_t>(r),
                        d.size() * sizeof(double));
            for (int it = 0; it < o.iters; ++it)
              per_iter[static_cast<size_t>(it)] =
                  std::max(per_iter[static_cast<size_t>(it)], d[static_cast<size_t>(it)]);
            cpu += d.back();
          }
          std::sort(per_iter.begin(), per_iter.end());
          size_t m = per_iter.size();
          double t = m % 2 ? per_iter[m / 2] : 0.5 * (per_iter[m / 2 - 1] + per_iter[m / 2]);

          bench::Traffic tr = bench::traffic(o.collective, sh, P, spec, segment_bytes);
          bench::Traffic plain = bench::traffic(o.collective, sh, P, std::nullopt, segment_bytes);
          Row row;
          row.codec = codec_text;
          row.bytes = sh.total_elems * 4;
          row.time_s = t;
          row.algbw = static_cast<double>(row.bytes) * 8 / t / 1e9;
          row.busbw = row.algbw * bench::bus_factor(o.collective, P);
          row.wire = tr.max_rank_bytes;
          row.ratio = static_cast<double>(plain.max_rank_bytes) /
                      static_cast<double>(std::max<uint64_t>(tr.max_rank_bytes, 1));
          row.limit_s = link.limit_seconds(tr, bench::rounds(o.collective, sh, P));
          double bound_s = 0;
          if (sites_model && o.collective == Collective::kAllReduce) {
            const CodecSpec wire_spec = spec ? *spec : collectives::passthrough(DType::kFloat32);
            const double encoded = static_cast<double>(encoded_size(wire_spec, sh.total_elems));
            const bool two = schedule == "two-level" ||
                             (schedule == "auto" &&
                              topology::use_two_level(site_plan, sh.total_elems, DType::kFloat32,
                                                      ReduceOp::kSum, spec));
            row.limit_s = schedule == "ring" ? sites_model->ring_limit(encoded)
                                             : sites_model->limit(two, encoded);
            bound_s = sites_model->limit(true, encoded);
            bounds[{codec_text, sh.total_elems * 4}] = bound_s;
          }
          times[{schedule, codec_text, sh.total_elems * 4}] = t;
          double sent = static_cast<double>(tr.total_bytes) * o.iters;
          row.cpu_ns_per_byte = sent > 0 ? cpu / sent * 1e9 : 0;
          cpu_total += cpu;
          bytes_total += sent;

          // Relative L2 error of rank 0's output against the fp64 reference from every rank's
          // input.
          double num = 0, den = 0;
          const uint64_t chunk = 1 << 16;
          std::vector<float> tmp(chunk);
          std::vector<double> ref(chunk);
          // Which global elements rank 0's recv holds, and how its reference is formed.
          uint64_t out_begin = 0, out_n = sh.recv_elems;
          for (uint64_t off = 0; off < out_n; off += chunk) {
            uint64_t n = std::min(chunk, out_n - off);
            std::fill(ref.begin(), ref.begin() + static_cast<long>(n), 0.0);
            if (o.collective == Collective::kAllReduce ||
                o.collective == Collective::kReduceScatter) {
              for (int r = 0; r < P; ++r) {
                gen.fill(r, out_begin + off, n, tmp.data());
                for (uint64_t k = 0; k < n; ++k) ref[k] += tmp[k];
              }
            } else if (o.collective == Collective::kAllGather) {
              uint64_t g = out_begin + off;  // global index = owner * send_elems + local
              for (uint64_t k = 0; k < n; ++k) {
                int owner = static_cast<int>((g + k) / sh.send_elems);
                ref[k] = gen.value(owner, g + k);
              }
            } else {
              gen.fill(0, out_begin + off, n, tmp.data());
              for (uint64_t k = 0; k < n; ++k) ref[k] = tmp[k];
            }
            for (uint64_t k = 0; k < n; ++k) {
              double e = static_cast<double>(recv[off + k]) - ref[k];
              num += e * e;
              den += ref[k] * ref[k];
            }
          }
          row.rel_err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
          if (o.check && !(row.rel_err <= bench::error_bound(spec))) {
            std::fprintf(stderr,
                         "lowcomm-bench: %s %llu B: relative error %.3g above the bound %.3g\n",
                         codec_text.c_str(), static_cast<unsigned long long>(row.bytes),
                         row.rel_err, bench::error_bound(spec));
            bad = 1;
          }

          if (o.collective == Collective::kAllReduce && last.valid())
            print_shares(
                *last.stats(), link, wplan_all, P,
                static_cast<double>(encoded_size(
                    spec ? *spec : collectives::passthrough(DType::kFloat32), sh.total_elems)));
          char limit[32] = "-", eff[32] = "-";
          if (row.limit_s > 0) {
            std::snprintf(limit, sizeof limit, "%.4f", row.limit_s);
            std::snprintf(eff, sizeof eff, "%.2f", row.limit_s / row.time_s);
          }
          char bound[32] = "-";
          if (bound_s > 0) std::snprintf(bound, sizeof bound, "%.4f", bound_s);
          std::printf(" %13llu %12llu %10.4f %9.3f %9.3f %13llu %7.2f %10.3e %9s %6s %8.2f %9s\n",
                      static_cast<unsigned long long>(row.bytes),
                      static_cast<unsigned long long>(sh.total_elems), row.time_s, row.algbw,
                      row.busbw, static_cast<unsigned long long>(row.wire), row.ratio, row.rel_err,
                      limit, eff, row.cpu_ns_per_byte, bound);
          if (o.back_to_back) {
            // Latency: the tail of the per-call times too (nearest rank; bench/torch_bench.py
            // prints the same for calls through torch.distributed).
            auto pct = [&](double q) {
              const size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(m)));
              return per_iter[std::min(m, std::max<size_t>(k, 1)) - 1] * 1e6;
            };
            std::printf("#   per call (slowest rank), %zu calls: p50 %.1f us, p99 %.1f us\n", m,
                        pct(0.5), pct(0.99));
          }
          std::fflush(stdout);
          if (csv) {
            std::fprintf(
                csv, "lowcomm,%s,%s,%d,%d,%llu,%.6f,%.4f,%.4f,%llu,%.4f,%.4e,%.6f,%.4f,%.3f,%s\n",
                bench::collective_name(o.collective), codec_text.c_str(),
                ar.error_feedback_key.empty() ? 0 : 1, P,
                static_cast<unsigned long long>(row.bytes), row.time_s, row.algbw, row.busbw,
                static_cast<unsigned long long>(row.wire), row.ratio, row.rel_err, row.limit_s,
                row.limit_s > 0 ? row.limit_s / row.time_s : 0.0, row.cpu_ns_per_byte,
                link.kind == bench::LinkModel::kPerPeer || link.kind == bench::LinkModel::kSite
                    ? "wan"
                : link.kind == bench::LinkModel::kAccess ? "netns"
                                                         : "none");
            std::fflush(csv);
          }
        }
        if (size * o.factor <= size) break;  // overflow
      }
    }
  if (rank == 0 && sites_model) {
    // Flat against two levels, measured in this run, and the two-level bound.
    std::printf("#\n# sites %s: flat vs two-level (same run)\n", site_plan.to_string().c_str());
    for (const auto& [key, bound_s] : bounds) {
      auto flat = times.find({"flat", key.first, key.second});
      auto two = times.find({"two-level", key.first, key.second});
      auto ring = times.find({"ring", key.first, key.second});
      if (flat == times.end() || two == times.end()) continue;
      std::printf(
          "# %s %llu B: flat %.3f s, two-level %.3f s (%.2fx faster), bound %.3f s "
          "(two-level at %.2fx of it)",
          key.first.c_str(), static_cast<unsigned long long>(key.second), flat->second, two->second,
          flat->second / two->second, bound_s, two->second / bound_s);
      if (ring != times.end())
        std::printf("; ring %.3f s (two-level %.2fx faster)", ring->second,
                    ring->second / two->second);
      std::printf("\n");
    }
  }
  if (rank == 0) {
    double nspb = bytes_total > 0 ? cpu_total / bytes_total * 1e9 : 0;
    std::printf(
        "#\n# CPU: %.2f ns (user+sys, all ranks' threads) per payload byte sent; a rank sending at "
        "1 Gbit/s would use %.1f%% of one core\n",
        nspb, nspb * 0.125e9 / 1e9 * 100);
    if (csv) std::fclose(csv);
  }
  comm.reset();
  return bad;
}

// ---- the launcher ----

std::vector<char*> cargv(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

int launch_ranks(const Options& o, int argc, char** argv) {
  char exe[4096];
  ssize_t len = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len <= 0) die("cannot find /proc/self/exe");
  exe[len] = '\0';
  std::string token =
      std::to_string(::getpid()) + "-" + std::to_string(Clock::now().time_since_epoch().count());
  ::setenv("LCBENCH_JOB_TOKEN", token.c_str(), 1);
  std::string id_file = o.id_file.empty() ? "/tmp/lowcomm-bench-" + token + ".id" : o.id_file;
  std::remove(id_file.c_str());
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < o.ranks; ++r) {
    std::vector<std::string> args;
    if (!o.netns.empty()) args = {"ip", "netns", "exec", o.netns + std::to_string(r)};
    args.push_back(exe);
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--plot" || a == "--baseline" || a == "--id-file" || a == "-n" || a == "--ranks") {
        ++i;
        continue;
      }
      args.push_back(a);
    }
    for (const std::string& s : {std::string("--rank"), std::to_string(r), std::string("--nranks"),
                                 std::to_string(o.ranks), std::string("--id-file"), id_file})
      args.push_back(s);
    pid_t pid = ::fork();
    if (pid < 0) die("fork failed");
    if (pid == 0) {
      auto av = cargv(args);
      ::execvp(av[0], av.data());
      std::fprintf(stderr, "lowcomm-bench: exec %s failed: %s\n", av[0], std::strerror(errno));
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  int rc = 0;
  size_t left = pids.size();
  while (left > 0) {
    int st = 0;
    pid_t p = ::wait(&st);
    if (p < 0) break;
    --left;
    bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (!ok) {
      if (WIFEXITED(st) && WEXITSTATUS(st) == 1 && o.check) {
        rc = std::max(rc, 1);
        continue;
      }
      if (rc == 2) continue;  // stopped by us after the first failure
      auto it = std::find(pids.begin(), pids.end(), p);
      std::fprintf(stderr, "lowcomm-bench: rank %ld failed (%s %d); stopping the others\n",
                   static_cast<long>(it - pids.begin()), WIFEXITED(st) ? "exit" : "signal",
                   WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      for (pid_t q : pids)
        if (q != p) ::kill(q, SIGTERM);
      rc = 2;
    }
  }
  std::remove(id_file.c_str());
  return rc;
}

struct CsvRow {
  std::string library, codec;
  uint64_t bytes = 0;
  double time_s = 0;
};

std::vector<CsvRow> read_lowcomm_csv(const std::string& path) {
  std::vector<CsvRow> rows;
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);  // header
  while (std::getline(f, line)) {
    auto c = split(line, ',');
    if (c.size() < 7) continue;
    rows.push_back({c[0], c[2], std::stoull(c[5]), std::stod(c[6])});
  }
  return rows;
}

int run_baseline(const Options& o, const std::string& csv) {
  std::string script =
      std::string(LOWCOMM_SOURCE_DIR) + "/scripts/baselines/" + o.baseline + "_allreduce.sh";
  auto fmt = [](uint64_t b) { return std::to_string(b); };
  std::string cmd = "'" + script + "' --ranks " + std::to_string(o.ranks) + " --prefix " +
                    (o.netns.empty() ? std::string("lc") : o.netns) + " -b " + fmt(o.min_bytes) +
                    " -e " + fmt(o.max_bytes) + " -f " + std::to_string(o.factor) + " -w " +
                    std::to_string(o.warmup) + " -n " + std::to_string(o.iters);
  std::printf("#\n# baseline: %s\n", cmd.c_str());
  if (o.netns.empty())
    std::printf(
        "# note: lowcomm ran %s, the baseline runs over tbf-shaped namespaces: not the same "
        "links\n",
        o.wan.empty() ? "unshaped" : "over its own emulator");
  std::fflush(stdout);
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) die("cannot run " + script);
  std::map<uint64_t, double> base;
  std::string lib;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) {
    std::string line(buf);
    std::fputs(("#   " + line).c_str(), stdout);
    auto c = split(line, ',');
    if (c.size() == 6 && c[0] != "library" && line[0] != '#') {
      try {
        base[std::stoull(c[2])] = std::stod(c[3]);
        lib = c[0];
      } catch (...) {
      }
    }
  }
  int st = ::pclose(p);
  if (st != 0 || base.empty()) {
    std::fprintf(stderr, "lowcomm-bench: the %s baseline failed (status %d)\n", o.baseline.c_str(),
                 st);
    return 2;
  }
  std::printf(
      "#\n# speedup of lowcomm over %s (both: median over the calls of the slowest rank's time)\n",
      lib.c_str());
  std::printf("#%13s %-14s %10s %10s %8s\n", "bytes", "codec", "lowcomm(s)", "base(s)", "speedup");
  for (const auto& r : read_lowcomm_csv(csv)) {
    auto it = base.find(r.bytes);
    if (it == base.end()) continue;
    std::printf(" %13llu %-14s %10.4f %10.4f %7.2fx\n", static_cast<unsigned long long>(r.bytes),
                r.codec.c_str(), r.time_s, it->second, it->second / r.time_s);
  }
  return 0;
}

int run_plot(const Options& o, const std::string& csv) {
  std::string cmd = "/usr/bin/python3 '" + std::string(LOWCOMM_SOURCE_DIR) +
                    "/bench/plot_bench.py' '" + csv + "' '" + o.plot + "'";
  int st = std::system(cmd.c_str());
  if (st != 0) std::fprintf(stderr, "lowcomm-bench: plotting failed (%s)\n", cmd.c_str());
  return st == 0 ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse_args(argc, argv);
  const char* ompi_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* ompi_size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (o.rank >= 0) {
    if (o.nranks < 2 || o.rank >= o.nranks) die("--rank needs --nranks >= 2 and rank < nranks");
    if (o.id_file.empty()) die("--rank needs --id-file");
    return run_rank(o, o.rank, o.nranks);
  }
  if (ompi_rank && ompi_size) {
    Options m = o;
    int r = std::atoi(ompi_rank), p = std::atoi(ompi_size);
    if (m.id_file.empty()) m.id_file = "/tmp/lowcomm-bench-" + job_token() + ".id";
    if (!m.baseline.empty()) die("--baseline is for the launcher (-n P), not under mpirun");
    int rc = run_rank(m, r, p);
    if (r == 0 && !m.plot.empty() && !m.csv.empty()) rc = std::max(rc, run_plot(m, m.csv));
    return rc;
  }
  if (o.ranks < 2) die("give -n P (P >= 2) or run under mpirun");
  std::string csv = o.csv;
  std::string tmp_csv;
  std::vector<std::string> args(argv, argv + argc);
  if (csv.empty() && (!o.plot.empty() || !o.baseline.empty())) {
    tmp_csv = "/tmp/lowcomm-bench-" + std::to_string(::getpid()) + ".csv";
    csv = tmp_csv;
    args.push_back("--csv");
    args.push_back(csv);
  }
  auto av = cargv(args);
  int rc = launch_ranks(o, static_cast<int>(args.size()), av.data());
  if (rc < 2 && !o.plot.empty()) rc = std::max(rc, run_plot(o, csv));
  if (rc < 2 && !o.baseline.empty()) rc = std::max(rc, run_baseline(o, csv));
  if (!tmp_csv.empty()) std::remove(tmp_csv.c_str());
  return rc;
}
