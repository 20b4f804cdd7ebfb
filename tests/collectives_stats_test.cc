// Per-operation statistics (Work::stats, Communicator::last_op_stats, lowcommWaitStats,
// lowcommCommGetLastOpStats) over real processes: the bytes on the wire are exactly what the
// algorithm sends (computed here from the partition and the codec's encoded sizes, with the
// transport's 64-byte header per 512 KiB chunk written out independently of the library), the
// compression ratio and the codec times follow the codec, and over an emulated link the
// efficiency against the link's limit is a fraction.

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "collectives/algorithms.h"
#include "collectives_test_util.h"
#include "lowcomm/lowcomm.h"
#include "topology/partition.h"

namespace lowcomm::testing {
namespace {

// docs/wire.md: every message is cut into chunks of 512 KiB, each behind a 64-byte header; an
// empty message is one header.
constexpr uint64_t kChunk = 512 << 10;
constexpr uint64_t kHeader = 64;
constexpr uint64_t kDescriptor = 64;

uint64_t on_wire(uint64_t len) {
  return len + std::max<uint64_t>(1, (len + kChunk - 1) / kChunk) * kHeader;
}

struct Expected {
  uint64_t sent = 0, received = 0, payload = 0, uncompressed = 0;
};

// What rank `me` of P sends and receives in an fp32 all-reduce of n elements (owner_reduce.cc):
// its descriptor to and from every peer; each segment of every other owner's chunk, encoded,
// to that owner, and each of its own chunk's segments from every peer; its reduced segments to
// every peer, and every other owner's from that owner.
Expected all_reduce_bytes(int P, int me, uint64_t n, const std::optional<CodecSpec>& codec,
                          uint64_t segment_bytes) {
  auto bytes = [&](uint64_t count) { return codec ? encoded_size(*codec, count) : count * 4; };
  const auto chunks = topology::owner_chunks(n, P, topology::granule(codec));
  const uint64_t seg = collectives::reduce_segment_elems(segment_bytes, DType::kFloat32, codec,
                                                         n / static_cast<uint64_t>(P));
  const auto peers = static_cast<uint64_t>(P - 1);
  Expected e;
  e.sent = e.received = peers * on_wire(kDescriptor);
  for (int j = 0; j < P; ++j) {
    for (const auto& s : topology::split_segments(chunks[static_cast<size_t>(j)], seg)) {
      const uint64_t times = j == me ? peers : 1;  // mine: results to all; theirs: contribution
      e.sent += times * on_wire(bytes(s.count));
      e.received += times * on_wire(bytes(s.count));
      e.payload += times * bytes(s.count);
      e.uncompressed += times * s.count * 4;
    }
  }
  return e;
}

// Reduce-scatter: step 1 only, over P equal chunks of recv_count.
Expected reduce_scatter_bytes(int P, int me, uint64_t recv_count,
                              const std::optional<CodecSpec>& codec, uint64_t segment_bytes) {
  auto bytes = [&](uint64_t count) { return codec ? encoded_size(*codec, count) : count * 4; };
  const uint64_t seg =
      collectives::reduce_segment_elems(segment_bytes, DType::kFloat32, codec, recv_count);
  const auto peers = static_cast<uint64_t>(P - 1);
  Expected e;
  e.sent = e.received = peers * on_wire(kDescriptor);
  for (int j = 0; j < P; ++j) {
    const topology::Range chunk{recv_count * static_cast<uint64_t>(j), recv_count};
    for (const auto& s : topology::split_segments(chunk, seg)) {
      if (j == me) {
        e.received += peers * on_wire(bytes(s.count));
      } else {
        e.sent += on_wire(bytes(s.count));
        e.payload += bytes(s.count);
        e.uncompressed += s.count * 4;
      }
    }
  }
  return e;
}

double ms(std::chrono::nanoseconds d) {
  return std::chrono::duration<double>(d).count() * 1e3;
}

std::string describe(const OpStats& s) {
  return s.kind + " #" + std::to_string(s.sequence) + " codec '" + s.codec + "': sent " +
         std::to_string(s.bytes_sent) + " received " + std::to_string(s.bytes_received) +
         " payload " + std::to_string(s.payload_bytes_sent) + " uncompressed " +
         std::to_string(s.uncompressed_bytes_sent) + " ratio " +
         std::to_string(s.compression_ratio) + " wall " + std::to_string(ms(s.wall)) +
         " ms encode " + std::to_string(ms(s.encode)) + " decode " + std::to_string(ms(s.decode)) +
         " wait " + std::to_string(ms(s.network_wait)) + " limit " +
         std::to_string(ms(s.link_limit)) + " efficiency " + std::to_string(s.link_efficiency);
}

// The byte counts, the ratio and the codec times of one completed all-reduce.
std::string check_all_reduce(const OpStats& s, const Expected& e, bool compressed) {
  const std::string d = describe(s);
  RANK_CHECK(s.kind == "all_reduce", d);
  RANK_CHECK(s.bytes_sent == e.sent, "expected sent " + std::to_string(e.sent) + ": " + d);
  RANK_CHECK(s.bytes_received == e.received,
             "expected received " + std::to_string(e.received) + ": " + d);
  RANK_CHECK(s.payload_bytes_sent == e.payload,
             "expected payload " + std::to_string(e.payload) + ": " + d);
  RANK_CHECK(s.uncompressed_bytes_sent == e.uncompressed,
             "expected uncompressed " + std::to_string(e.uncompressed) + ": " + d);
  RANK_CHECK(s.wall.count() > 0, d);
  // One executor thread does the codec work and the waiting in turn.
  RANK_CHECK(s.encode + s.decode + s.network_wait <= s.wall, d);
  RANK_CHECK(s.link_limit.count() == 0 && s.link_efficiency == 0.0, "unshaped: " + d);
  if (compressed) {
    // q4: 4 bits per element plus an fp32 scale per block of 64 or more: 32 / 4.x.
    RANK_CHECK(s.codec == "q4", d);
    RANK_CHECK(s.compression_ratio > 32.0 / 4.6 && s.compression_ratio < 8.0, d);
    RANK_CHECK(s.encode.count() > 0 && s.decode.count() > 0, d);
  } else {
    RANK_CHECK(s.codec.empty(), d);
    RANK_CHECK(s.compression_ratio == 1.0, d);
    RANK_CHECK(s.encode.count() == 0 && s.decode.count() == 0, d);
  }
  return "ok";
}

#define RANK_PASS(expr)              \
  do {                               \
    std::string pass_ = (expr);      \
    if (pass_ != "ok") return pass_; \
  } while (0)

// 3 ranks, n not a multiple of anything, several pipeline segments per owner (64 KiB).
TEST(CollectivesStats, AllReduceCountsExactlyTheAlgorithmsBytes) {
  expect_all_ok(run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    const CommOptions o = test_options();
    auto c = Communicator::init(id, rank, 3, o);
    if (!c) return "init: " + c.status().to_string();
    Communicator& comm = **c;
    const uint64_t n = 100003;
    Tensor x = make_input(DType::kFloat32, n, 7, rank);
    const CodecSpec q4 = *parse_codec_spec("q4");
    AllReduceOptions with_q4;
    with_q4.codec = q4;
    Work wq = comm.all_reduce(x.data(), x.data(), n, DType::kFloat32, ReduceOp::kSum, with_q4);
    Work wp = comm.all_reduce(x.data(), x.data(), n, DType::kFloat32, ReduceOp::kSum);
    RANK_OK(wq.wait());
    RANK_OK(wp.wait());
    auto sq = wq.stats();
    auto sp = wp.stats();
    RANK_OK(sq.status());
    RANK_OK(sp.status());
    RANK_CHECK(sq->sequence == 0 && sp->sequence == 1 && sq->count == n, describe(*sq));
    RANK_PASS(check_all_reduce(*sq, all_reduce_bytes(3, rank, n, q4, *o.segment_bytes), true));
    RANK_PASS(
        check_all_reduce(*sp, all_reduce_bytes(3, rank, n, std::nullopt, *o.segment_bytes), false));
    // The communicator's last operation is the uncompressed one.
    OpStats last = comm.last_op_stats();
    RANK_CHECK(last.sequence == 1 && last.bytes_sent == sp->bytes_sent && last.wall == sp->wall &&
                   last.network_wait == sp->network_wait,
               describe(last));
    // A q4 reduce-scatter sends each contribution once and re-quantizes nothing.
    const uint64_t rc = 40000;
    Tensor in = make_input(DType::kFloat32, 3 * rc, 9, rank);
    std::vector<float> out(rc);
    Work wr =
        comm.reduce_scatter(in.data(), out.data(), rc, DType::kFloat32, ReduceOp::kSum, with_q4);
    RANK_OK(wr.wait());
    auto sr = wr.stats();
    RANK_OK(sr.status());
    const Expected er = reduce_scatter_bytes(3, rank, rc, q4, *o.segment_bytes);
    RANK_CHECK(sr->kind == "reduce_scatter" && sr->count == rc && sr->codec == "q4", describe(*sr));
    RANK_CHECK(sr->bytes_sent == er.sent && sr->bytes_received == er.received &&
                   sr->payload_bytes_sent == er.payload &&
                   sr->uncompressed_bytes_sent == er.uncompressed,
               "expected sent " + std::to_string(er.sent) + " received " +
                   std::to_string(er.received) + ": " + describe(*sr));
    RANK_CHECK(sr->encode.count() > 0 && sr->decode.count() > 0, describe(*sr));
    return "ok";
  }));
}

// Over a 100 Mbit/s site link: the limit is the larger of the sent and received bits at that
// rate (no delay), and the efficiency a fraction of one (a little over allowed for the pacer's
// timer granularity).
TEST(CollectivesStats, LinkEfficiencyOverAnEmulatedLink) {
  expect_all_ok(run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.wan = "bw=100mbit";
    auto c = Communicator::init(id, rank, 3, o);
    if (!c) return "init: " + c.status().to_string();
    const uint64_t n = 3 * 65536;  // ~1 MB per rank on the wire: ~84 ms at 100 Mbit/s
    Tensor x = make_input(DType::kFloat32, n, 3, rank);
    Work w = (*c)->all_reduce(x.data(), x.data(), n, DType::kFloat32, ReduceOp::kSum);
    RANK_OK(w.wait());
    auto s = w.stats();
    RANK_OK(s.status());
    const Expected e = all_reduce_bytes(3, rank, n, std::nullopt, *o.segment_bytes);
    RANK_CHECK(s->bytes_sent == e.sent && s->bytes_received == e.received, describe(*s));
    // The link carries 66 bytes of TCP/IP framing per 1448-byte segment (frame= default).
    const double limit_s =
        static_cast<double>(std::max(e.sent, e.received)) * (1 + 66.0 / 1448) * 8.0 / 100e6;
    RANK_CHECK(std::abs(std::chrono::duration<double>(s->link_limit).count() - limit_s) < 1e-6,
               "expected limit " + std::to_string(limit_s * 1e3) + " ms: " + describe(*s));
    RANK_CHECK(s->link_efficiency > 0.0 && s->link_efficiency <= 1.05, describe(*s));
    const double wall_s = std::chrono::duration<double>(s->wall).count();
    RANK_CHECK(std::abs(s->link_efficiency - limit_s / wall_s) < 1e-3, describe(*s));
    return "ok";
  }));
}

// Point-to-point: a send is its descriptor and its data, a recv receives both; stats() of a
// Work still running is an error; a refused call has zero counters.
TEST(CollectivesStats, PointToPointInFlightAndRefused) {
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 2, test_options());
    if (!c) return "init: " + c.status().to_string();
    Communicator& comm = **c;
    std::vector<float> buf(200000, 1.0f);  // 800 KB: two chunks
    const uint64_t bytes = buf.size() * 4;
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 1 looks meanwhile
      Work w = comm.send(buf.data(), buf.size(), DType::kFloat32, 1, 5);
      RANK_OK(w.wait());
      auto s = w.stats();
      RANK_OK(s.status());
      RANK_CHECK(s->kind == "send" && s->bytes_received == 0, describe(*s));
      RANK_CHECK(s->bytes_sent == on_wire(kDescriptor) + on_wire(bytes), describe(*s));
      RANK_CHECK(s->payload_bytes_sent == bytes && s->compression_ratio == 1.0, describe(*s));
    } else {
      Work w = comm.recv(buf.data(), buf.size(), DType::kFloat32, 0, 5);
      auto early = w.stats();
      RANK_CHECK(!early.is_ok() && early.status().code() == StatusCode::kInternal,
                 "stats() of a Work in flight: " + early.status().to_string());
      RANK_OK(w.wait());
      auto s = w.stats();
      RANK_OK(s.status());
      RANK_CHECK(s->kind == "recv" && s->bytes_sent == 0 && s->payload_bytes_sent == 0,
                 describe(*s));
      RANK_CHECK(s->bytes_received == on_wire(kDescriptor) + on_wire(bytes), describe(*s));
      RANK_CHECK(s->network_wait.count() > 0, describe(*s));
    }
    Work bad = comm.send(buf.data(), buf.size(), DType::kFloat32, 7);
    RANK_CHECK(bad.refused(), "a send to rank 7 was not refused");
    auto z = bad.stats();
    RANK_OK(z.status());
    RANK_CHECK(z->kind.empty() && z->bytes_sent == 0 && z->wall.count() == 0 &&
                   z->compression_ratio == 0.0,
               describe(*z));
    RANK_CHECK(comm.last_op_stats().kind == (rank == 0 ? "send" : "recv"),
               "the refused call became the last operation");
    RANK_CHECK(!Work().stats().is_ok(), "an empty Work has stats");
    return "ok";
  }));
}

// A failed operation reports what it issued before failing (its descriptors, at least); the
// next one fails at once, never runs, and has zero counters.
TEST(CollectivesStats, FailedOperationsKeepTheirStats) {
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.timeout = std::chrono::milliseconds(5000);
    auto c = Communicator::init(id, rank, 2, o);
    if (!c) return "init: " + c.status().to_string();
    Communicator& comm = **c;
    std::vector<float> x(2000, 1.0f);
    const uint64_t n = rank == 0 ? 1000 : 1001;  // mismatched counts
    Work w = comm.all_reduce(x.data(), x.data(), n, DType::kFloat32, ReduceOp::kSum);
    RANK_CHECK(!w.wait().is_ok(), "a mismatched all_reduce succeeded");
    auto s = w.stats();
    RANK_OK(s.status());
    RANK_CHECK(s->kind == "all_reduce" && s->count == n, describe(*s));
    RANK_CHECK(s->bytes_sent >= on_wire(kDescriptor) && s->bytes_received >= on_wire(kDescriptor) &&
                   s->wall.count() > 0,
               describe(*s));
    Work after = comm.barrier();
    RANK_CHECK(!after.wait().is_ok(), "a barrier after the failure succeeded");
    auto z = after.stats();
    RANK_OK(z.status());
    RANK_CHECK(z->kind == "barrier" && z->sequence == 1 && z->bytes_sent == 0 &&
                   z->bytes_received == 0 && z->compression_ratio == 0.0,
               describe(*z));
    RANK_CHECK(comm.last_op_stats().kind == "barrier", describe(comm.last_op_stats()));
    return "ok";
  }));
}

// The C API: the same numbers through lowcommWaitStats and lowcommCommGetLastOpStats, with the
// default 4 MiB segments (so an uncompressed owner chunk, 800 KB, is two transport chunks).
TEST(CollectivesStats, CApiReportsTheSameNumbers) {
  expect_all_ok(run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    ::setenv("LOWCOMM_STREAMS", "2", 1);
    ::setenv("LOWCOMM_TIMEOUT_S", "10", 1);
    lowcommUniqueId cid;
    auto raw = id.to_bytes();
    std::memcpy(cid.internal, raw.data(), raw.size());
    lowcommComm_t comm = nullptr;
    RANK_CHECK(lowcommCommInitRank(&comm, 3, cid, rank) == lowcommSuccess,
               lowcommGetLastError(nullptr));
    lowcommOpStats none = LOWCOMM_OP_STATS_INIT;
    RANK_CHECK(lowcommCommGetLastOpStats(comm, &none) == lowcommSuccess, "before any operation");
    RANK_CHECK(none.kind[0] == '\0' && none.bytesSent == 0, "stats before any operation");
    const uint64_t n = 600000;
    const CodecSpec q4 = *parse_codec_spec("q4");
    const uint64_t segment = 4u << 20;
    for (const char* codec : {"q4", static_cast<const char*>(nullptr)}) {
      Tensor x = make_input(DType::kFloat32, n, 11, rank);
      lowcommRequest_t req = nullptr;
      RANK_CHECK(lowcommAllReduce(x.data(), x.data(), n, lowcommFloat32, lowcommSum, codec, comm,
                                  &req) == lowcommSuccess,
                 lowcommGetLastError(comm));
      RANK_CHECK(lowcommWaitStats(req, nullptr) == lowcommInvalidArgument, "NULL stats");
      lowcommOpStats s = LOWCOMM_OP_STATS_INIT;
      RANK_CHECK(lowcommWaitStats(nullptr, &s) == lowcommInvalidArgument, "NULL request");
      RANK_CHECK(lowcommWaitStats(req, &s) == lowcommSuccess, lowcommGetLastError(comm));
      const Expected e = all_reduce_bytes(
          3, rank, n, codec ? std::optional<CodecSpec>(q4) : std::nullopt, segment);
      const std::string d = std::string(s.kind) + " codec '" + s.codec + "' sent " +
                            std::to_string(s.bytesSent) + " expected " + std::to_string(e.sent);
      RANK_CHECK(std::string(s.kind) == "all_reduce" && s.count == n, d);
      RANK_CHECK(std::string(s.codec) == (codec ? "q4" : ""), d);
      RANK_CHECK(s.bytesSent == e.sent && s.bytesReceived == e.received, d);
      RANK_CHECK(s.payloadBytesSent == e.payload && s.uncompressedBytesSent == e.uncompressed, d);
      RANK_CHECK(s.compressionRatio ==
                     static_cast<double>(e.uncompressed) / static_cast<double>(e.payload),
                 d);
      RANK_CHECK(codec ? s.encodeNs > 0 && s.decodeNs > 0 : s.encodeNs == 0 && s.decodeNs == 0, d);
      RANK_CHECK(s.wallNs > 0 && s.encodeNs + s.decodeNs + s.networkWaitNs <= s.wallNs, d);
      RANK_CHECK(s.linkLimitNs == 0 && s.linkEfficiency == 0.0, d);
      lowcommOpStats last = LOWCOMM_OP_STATS_INIT;
      RANK_CHECK(lowcommCommGetLastOpStats(comm, &last) == lowcommSuccess, "last");
      RANK_CHECK(std::memcmp(&last, &s, sizeof(s)) == 0, "last op stats differ from the Wait's");
    }
    RANK_CHECK(lowcommCommGetLastOpStats(comm, nullptr) == lowcommInvalidArgument, "NULL");
    RANK_CHECK(lowcommCommGetLastOpStats(nullptr, &none) == lowcommInvalidArgument, "NULL comm");
    RANK_CHECK(lowcommCommDestroy(comm) == lowcommSuccess, lowcommGetLastError(nullptr));
    return "ok";
  }));
}

// lowcommOpStats is versioned by structSize: the fields of the struct, (offset, size) in
// order after structSize, written out here independently of the library's own table.
#define STATS_FIELD(f) \
  { offsetof(lowcommOpStats, f), sizeof(lowcommOpStats::f) }
const std::pair<size_t, size_t> kStatsFields[] = {STATS_FIELD(kind),
                                                  STATS_FIELD(codec),
                                                  STATS_FIELD(sequence),
                                                  STATS_FIELD(count),
                                                  STATS_FIELD(wallNs),
                                                  STATS_FIELD(bytesSent),
                                                  STATS_FIELD(bytesReceived),
                                                  STATS_FIELD(payloadBytesSent),
                                                  STATS_FIELD(uncompressedBytesSent),
                                                  STATS_FIELD(compressionRatio),
                                                  STATS_FIELD(encodeNs),
                                                  STATS_FIELD(decodeNs),
                                                  STATS_FIELD(networkWaitNs),
                                                  STATS_FIELD(linkLimitNs),
                                                  STATS_FIELD(linkEfficiency),
                                                  STATS_FIELD(density),
                                                  STATS_FIELD(indexBytesSent),
                                                  STATS_FIELD(valueBytesSent),
                                                  STATS_FIELD(deviceToHostBytes),
                                                  STATS_FIELD(hostToDeviceBytes),
                                                  STATS_FIELD(chunksResent)};
#undef STATS_FIELD

// What a caller built against the first fields only would declare (the struct as it might have
// been before later fields were appended), followed in memory by other data of its own.
struct OlderCallerStats {
  size_t structSize;
  char kind[16];
  char codec[48];
  uint64_t sequence;
  uint64_t count;
};
struct OlderCaller {
  OlderCallerStats stats;
  unsigned char after[64];  // the caller's next bytes: must stay as they were
};
static_assert(sizeof(OlderCallerStats) == offsetof(lowcommOpStats, wallNs));

constexpr unsigned char kGuard = 0xA5;

// An "older caller" (structSize covering only the first fields) gets exactly those fields and
// nothing past them, whether the size ends on a field boundary or inside a field; sizes larger
// than this library's struct get its fields and nothing more; structSize 0 or below the first
// field is refused with lowcommInvalidArgument before anything is written (lowcommWaitStats:
// before the request is waited for or freed).
TEST(CollectivesStats, CApiWritesOnlyTheFieldsWithinStructSize) {
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    lowcommUniqueId cid;
    auto raw = id.to_bytes();
    std::memcpy(cid.internal, raw.data(), raw.size());
    lowcommComm_t comm = nullptr;
    RANK_CHECK(lowcommCommInitRank(&comm, 2, cid, rank) == lowcommSuccess,
               lowcommGetLastError(nullptr));
    const uint64_t n = 70000;
    Tensor x = make_input(DType::kFloat32, n, 3, rank);
    lowcommRequest_t req = nullptr;
    RANK_CHECK(lowcommAllReduce(x.data(), x.data(), n, lowcommFloat32, lowcommSum, "q4", comm,
                                &req) == lowcommSuccess,
               lowcommGetLastError(comm));
    // A refused structSize leaves the request alone: it is waited for afterwards.
    for (size_t bad : {size_t{0}, sizeof(size_t), size_t{LOWCOMM_OP_STATS_MIN_SIZE} - 1}) {
      unsigned char buf[sizeof(lowcommOpStats) + 64];
      std::memset(buf, kGuard, sizeof(buf));
      std::memcpy(buf, &bad, sizeof(bad));
      auto* p = reinterpret_cast<lowcommOpStats*>(buf);
      const std::string what = "structSize " + std::to_string(bad);
      RANK_CHECK(lowcommWaitStats(req, p) == lowcommInvalidArgument, what + ": not refused");
      RANK_CHECK(
          std::string(lowcommGetLastError(comm))
                  .find(bad == 0 ? "structSize is 0" : "below the smallest") != std::string::npos,
          what + ": " + lowcommGetLastError(comm));
      RANK_CHECK(lowcommCommGetLastOpStats(comm, p) == lowcommInvalidArgument, what);
      for (size_t i = sizeof(size_t); i < sizeof(buf); ++i)
        RANK_CHECK(buf[i] == kGuard, what + ": byte " + std::to_string(i) + " written");
    }
    lowcommOpStats full = LOWCOMM_OP_STATS_INIT;
    RANK_CHECK(lowcommWaitStats(req, &full) == lowcommSuccess, lowcommGetLastError(comm));
    RANK_CHECK(std::string(full.kind) == "all_reduce" && std::string(full.codec) == "q4" &&
                   full.count == n && full.bytesSent > 0 && full.compressionRatio > 1.0,
               "the full struct");
    RANK_CHECK(full.structSize == sizeof(lowcommOpStats), "structSize was written");

    // The older caller, as it would declare its struct.
    OlderCaller older;
    std::memset(&older, kGuard, sizeof(older));
    older.stats.structSize = sizeof(OlderCallerStats);
    RANK_CHECK(lowcommCommGetLastOpStats(comm, reinterpret_cast<lowcommOpStats*>(&older.stats)) ==
                   lowcommSuccess,
               lowcommGetLastError(comm));
    RANK_CHECK(std::string(older.stats.kind) == "all_reduce" &&
                   std::string(older.stats.codec) == "q4" &&
                   older.stats.sequence == full.sequence && older.stats.count == n,
               "the older caller's fields");
    for (unsigned char b : older.after) RANK_CHECK(b == kGuard, "written past the older struct");

    // Every size from the smallest to past the struct: the fields that end within it are the
    // library's bytes, every other byte stays as the caller left it.
    for (size_t size = LOWCOMM_OP_STATS_MIN_SIZE; size <= sizeof(lowcommOpStats) + 8; ++size) {
      unsigned char buf[sizeof(lowcommOpStats) + 64];
      std::memset(buf, kGuard, sizeof(buf));
      std::memcpy(buf, &size, sizeof(size));
      RANK_CHECK(
          lowcommCommGetLastOpStats(comm, reinterpret_cast<lowcommOpStats*>(buf)) == lowcommSuccess,
          "structSize " + std::to_string(size) + ": " + lowcommGetLastError(comm));
      size_t end = sizeof(size_t);
      for (const auto& [offset, bytes] : kStatsFields)
        if (offset + bytes <= size) end = offset + bytes;
      const auto* want = reinterpret_cast<const unsigned char*>(&full);
      for (size_t i = 0; i < sizeof(buf); ++i) {
        const unsigned char expected = i < sizeof(size_t) ? buf[i] : (i < end ? want[i] : kGuard);
        RANK_CHECK(buf[i] == expected, "structSize " + std::to_string(size) + ": byte " +
                                           std::to_string(i) +
                                           (i < end ? " not the library's" : " written"));
      }
      size_t written;
      std::memcpy(&written, buf, sizeof(written));
      RANK_CHECK(written == size, "structSize changed");
    }
    RANK_CHECK(lowcommCommDestroy(comm) == lowcommSuccess, lowcommGetLastError(nullptr));
    return "ok";
  }));
}

}  // namespace
}  // namespace lowcomm::testing
