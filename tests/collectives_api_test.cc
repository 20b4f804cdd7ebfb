// API contract at the edges: arguments that are wrong on one rank are refused at once, by the
// C++ and the C API, without breaking the group (the other ranks never hear of the call); and
// C API requests stay safe to wait on and test after their communicator is aborted or
// destroyed (the watchdog pattern: one thread waits while another aborts).

#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <future>
#include <limits>
#include <mutex>
#include <thread>

#include "collectives_test_util.h"
#include "lowcomm/lowcomm.h"
#include "lowcomm/version.h"

namespace lowcomm::testing {
namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

CommOptions short_timeout() {
  CommOptions o = test_options();
  o.timeout = std::chrono::milliseconds(10000);
  return o;
}

// The call must have been refused before it returned: complete, kInvalidArgument, a message
// with `part`, and the communicator not failed.
std::string expect_refused(const Communicator& comm, const Work& w, const std::string& part) {
  RANK_CHECK(w.test(), "not refused at once (queued): expected '" + part + "'");
  RANK_CHECK(w.refused(), "completed, but not marked refused: " + w.status().to_string());
  Status s = w.status();
  RANK_CHECK(s.code() == StatusCode::kInvalidArgument,
             "expected '" + part + "', got " + s.to_string());
  RANK_CHECK(contains(s.message(), part), "'" + part + "' missing from: " + s.message());
  RANK_CHECK(comm.status().is_ok(), "the communicator failed: " + comm.status().to_string());
  return "ok";
}

#define RANK_REFUSED(comm, work, part)                           \
  do {                                                           \
    std::string refused_ = expect_refused((comm), (work), part); \
    if (refused_ != "ok") return #work ": " + refused_;          \
  } while (0)

// Rank 0 alone makes every kind of rank-local mistake; then both ranks run collectives and
// point-to-point messages on the tags and sequence numbers they would have used anyway. Before
// the checks were hoisted out of the algorithm bodies each mistake was queued, failed on the
// executor and broke the group (a block size of 0 even raised SIGFPE on the caller's thread).
TEST(CollectivesArguments, RefusedAtOnceAndTheGroupStaysUsable) {
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 2, short_timeout());
    if (!c) return "init: " + c.status().to_string();
    Communicator& comm = **c;
    std::vector<float> x(64, static_cast<float>(rank + 1)), y(64, 0.0f);
    const uint64_t too_many = (uint64_t{1} << 56) + 1;
    const auto f32 = DType::kFloat32;
    const auto sum = ReduceOp::kSum;
    if (rank == 0) {
      // Point-to-point: peers, tags, buffers, counts.
      RANK_REFUSED(comm, comm.send(x.data(), 4, f32, 2), "peer 2 is not another rank");
      RANK_REFUSED(comm, comm.send(x.data(), 4, f32, -1), "peer -1");
      RANK_REFUSED(comm, comm.send(x.data(), 4, f32, 0), "peer 0 is not another rank");
      RANK_REFUSED(comm, comm.recv(y.data(), 4, f32, 2), "peer 2");
      RANK_REFUSED(comm, comm.recv(y.data(), 4, f32, 0), "peer 0");
      RANK_REFUSED(comm, comm.send(x.data(), 4, f32, 1, uint64_t{1} << 60), "tag");
      RANK_REFUSED(comm, comm.send(nullptr, 4, f32, 1), "null");
      RANK_REFUSED(comm, comm.recv(nullptr, 4, f32, 1), "null");
      RANK_REFUSED(comm, comm.send(x.data(), too_many, f32, 1), "2^56");
      RANK_REFUSED(comm, comm.send(x.data(), 4, static_cast<DType>(99), 1), "dtype");
      // Broadcast roots and buffers.
      RANK_REFUSED(comm, comm.broadcast(x.data(), y.data(), 4, f32, 2), "root 2");
      RANK_REFUSED(comm, comm.broadcast(x.data(), y.data(), 4, f32, -1), "root -1");
      RANK_REFUSED(comm, comm.broadcast(nullptr, y.data(), 4, f32, 0), "send buffer is null");
      RANK_REFUSED(comm, comm.broadcast(x.data(), nullptr, 4, f32, 1), "recv buffer is null");
      RANK_REFUSED(comm, comm.broadcast(x.data(), y.data(), too_many, f32, 0), "2^56");
      // All-reduce: buffers, counts, codecs, error feedback.
      RANK_REFUSED(comm, comm.all_reduce(nullptr, y.data(), 64, f32, sum), "send buffer is null");
      RANK_REFUSED(comm, comm.all_reduce(x.data(), nullptr, 64, f32, sum), "recv buffer is null");
      RANK_REFUSED(comm, comm.all_reduce(x.data(), y.data(), too_many, f32, sum), "2^56");
      RANK_REFUSED(comm, comm.all_reduce(x.data(), y.data(), 64, f32, static_cast<ReduceOp>(77)),
                   "reduction");
      AllReduceOptions block0;
      block0.codec = CodecSpec{
          .kind = CodecKind::kAbsmax, .bits = 4, .grouping = Grouping::kBlock, .block = 0};
      RANK_REFUSED(comm, comm.all_reduce(x.data(), y.data(), 64, f32, sum, block0),
                   "invalid codec");
      AllReduceOptions bits5;
      bits5.codec = CodecSpec{.kind = CodecKind::kAbsmax, .bits = 5, .grouping = Grouping::kBlock};
      RANK_REFUSED(comm, comm.all_reduce(x.data(), y.data(), 64, f32, sum, bits5), "not 5");
      AllReduceOptions col5;
      col5.codec = *parse_codec_spec("q4:col=5");
      RANK_REFUSED(comm, comm.all_reduce(x.data(), y.data(), 64, f32, sum, col5),
                   "multiple of col=5");
      AllReduceOptions ef;
      ef.error_feedback_key = "grads";
      RANK_REFUSED(comm, comm.all_reduce(x.data(), y.data(), 64, f32, sum, ef), "error feedback");
      ef.codec = *parse_codec_spec("none");
      RANK_REFUSED(comm, comm.all_reduce(x.data(), y.data(), 64, f32, sum, ef), "error feedback");
      // Reduce-scatter: recv_count * 2 wraps to 2; checked before multiplying.
      RANK_REFUSED(comm, comm.reduce_scatter(x.data(), y.data(), (uint64_t{1} << 63) + 1, f32, sum),
                   "2^56");
      RANK_REFUSED(comm, comm.reduce_scatter(nullptr, y.data(), 4, f32, sum),
                   "send buffer is null");
      // All-gather: send_count * size() must fit, buffers.
      RANK_REFUSED(comm, comm.all_gather(x.data(), y.data(), (uint64_t{1} << 55) + 1, f32), "2^56");
      RANK_REFUSED(comm, comm.all_gather(x.data(), nullptr, 4, f32), "recv buffer is null");
      // A non-root's send buffer is ignored, as documented: not refused.
    }
    // Both ranks, as if nothing had happened on rank 0.
    RANK_OK(comm.all_reduce(x.data(), y.data(), x.size(), f32, sum).wait());
    for (float v : y) RANK_CHECK(v == 3.0f, "plain all_reduce gave " + std::to_string(v));
    AllReduceOptions q8;
    q8.codec = *parse_codec_spec("q8");
    RANK_OK(comm.all_reduce(x.data(), y.data(), x.size(), f32, sum, q8).wait());
    for (float v : y)
      RANK_CHECK(std::fabs(v - 3.0f) < 0.05f, "q8 all_reduce gave " + std::to_string(v));
    std::vector<float> msg(16, 0.0f);
    if (rank == 0) {
      for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<float>(i);
      RANK_OK(comm.send(msg.data(), msg.size(), f32, 1).wait());
    } else {
      RANK_OK(comm.recv(msg.data(), msg.size(), f32, 0).wait());
      for (size_t i = 0; i < msg.size(); ++i)
        RANK_CHECK(msg[i] == static_cast<float>(i), "p2p payload");
    }
    std::vector<float> b(8, static_cast<float>(10 * (rank + 1)));
    RANK_OK(comm.broadcast(rank == 1 ? b.data() : nullptr, b.data(), b.size(), f32, 1).wait());
    for (float v : b) RANK_CHECK(v == 20.0f, "broadcast gave " + std::to_string(v));
    RANK_OK(comm.barrier().wait());
    RANK_CHECK(comm.status().is_ok(), comm.status().to_string());
    return "ok";
  }));
}

// Options for C API ranks (which read the environment): light and bounded.
void c_api_environment() {
  ::setenv("LOWCOMM_STREAMS", "2", 1);
  ::setenv("LOWCOMM_TIMEOUT_S", "10", 1);
}

std::string c_init(int rank, const UniqueId& id, lowcommComm_t* comm) {
  c_api_environment();
  lowcommUniqueId cid;
  auto bytes = id.to_bytes();
  std::memcpy(cid.internal, bytes.data(), bytes.size());
  RANK_CHECK(lowcommCommInitRank(comm, 2, cid, rank) == lowcommSuccess,
             lowcommGetLastError(nullptr));
  return "ok";
}

// The C API returns lowcommInvalidArgument from the call itself, sets no request, and the
// communicator goes on working (as NCCL's ncclInvalidArgument).
// Work::on_complete: a callback registered before completion runs once, after the status is
// visible; one registered after completion, or on a refused Work, runs at once.
TEST(CollectivesWork, OnCompleteRunsOnceWithTheFinalStatus) {
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto c = Communicator::init(id, rank, 2, test_options());
    RANK_OK(c.status());
    Communicator& comm = **c;
    std::vector<float> x(1 << 20, 1.0f);
    std::mutex mu;
    std::condition_variable cv;
    int calls = 0;
    bool saw_done = false;
    Status got = internal_error("not called");
    Work w = comm.all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum);
    w.on_complete([&, w](const Status& s) {
      std::lock_guard<std::mutex> lock(mu);
      ++calls;
      got = s;
      saw_done = w.test() && w.status().is_ok() == s.is_ok();
      cv.notify_all();
    });
    RANK_OK(w.wait());
    {
      std::unique_lock<std::mutex> lock(mu);
      RANK_CHECK(cv.wait_for(lock, std::chrono::seconds(10), [&] { return calls > 0; }),
                 "callback never ran");
      RANK_CHECK(got.is_ok() && saw_done, got.to_string());
    }
    int late = 0;
    w.on_complete([&](const Status& s) { late += s.is_ok() ? 1 : 100; });
    RANK_CHECK(late == 1, "a callback on a complete Work runs at once");
    Work refused = comm.all_reduce(nullptr, nullptr, 4, DType::kFloat32, ReduceOp::kSum);
    StatusCode code = StatusCode::kOk;
    refused.on_complete([&](const Status& s) { code = s.code(); });
    RANK_CHECK(code == StatusCode::kInvalidArgument, "refused Work's callback");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::lock_guard<std::mutex> lock(mu);
    RANK_CHECK(calls == 1, "callback ran " + std::to_string(calls) + " times");
    return "ok";
  }));
}

// A completion callback may call the library (torch's `fut.then(lambda _: dist.all_reduce(y))`,
// a DDP hook that waits): a collective issued and waited for inside it, on the executor's
// thread or on a thread that ran a small collective inline, completes; so does a wait inside a
// callback for an operation issued after the one whose callback it is, whether that operation
// was issued before or after the callback started.
TEST(CollectivesWork, CallbacksMayIssueAndWaitForCollectives) {
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.timeout = std::chrono::seconds(20);
    auto c = Communicator::init(id, rank, 2, o);
    RANK_OK(c.status());
    Communicator& comm = **c;
    // Waits up to 15 s for a callback's verdict: "" until it runs.
    struct Verdict {
      std::mutex mu;
      std::condition_variable cv;
      std::string text;
      void set(std::string t) {
        std::lock_guard<std::mutex> lock(mu);
        text = std::move(t);
        cv.notify_all();
      }
      std::string get() {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait_for(lock, std::chrono::seconds(15), [&] { return !text.empty(); });
        return text.empty() ? "the callback did not finish within 15 s" : text;
      }
    };
    auto sum_of = [&](std::vector<float>& v, float want) {
      return v.front() == want && v.back() == want;
    };
    for (uint64_t n : {uint64_t{1} << 20, uint64_t{16}}) {  // the executor's, and inline
      // 1. A collective issued and waited for inside the callback.
      std::vector<float> x(n, 1.0f), y(n, 2.0f);
      Verdict inner;
      Work a = comm.all_reduce(x.data(), x.data(), n, DType::kFloat32, ReduceOp::kSum);
      a.on_complete([&](const Status& s) {
        if (!s) return inner.set("outer: " + s.to_string());
        Status t = comm.all_reduce(y.data(), y.data(), n, DType::kFloat32, ReduceOp::kSum).wait();
        inner.set(!t ? "inner: " + t.to_string() : sum_of(y, 4.0f) ? "ok" : "inner sum wrong");
      });
      RANK_OK(a.wait());
      std::string v = inner.get();
      RANK_CHECK(v == "ok", "n " + std::to_string(n) + ": " + v);
      RANK_CHECK(sum_of(x, 2.0f), "outer sum wrong");

      // 2. A wait inside the callback on an operation issued later by this thread.
      std::vector<float> z(n, 3.0f);
      std::promise<Work> later_p;
      std::shared_future<Work> later = later_p.get_future().share();
      Verdict waited;
      Work b = comm.all_reduce(x.data(), x.data(), n, DType::kFloat32, ReduceOp::kSum);
      b.on_complete([&, later](const Status&) {
        Status t = later.get().wait();
        waited.set(!t ? t.to_string() : sum_of(z, 6.0f) ? "ok" : "later sum wrong");
      });
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      later_p.set_value(comm.all_reduce(z.data(), z.data(), n, DType::kFloat32, ReduceOp::kSum));
      RANK_OK(b.wait());
      v = waited.get();
      RANK_CHECK(v == "ok", "n " + std::to_string(n) + ", later op: " + v);
      RANK_OK(later.get().wait());
    }
    return "ok";
  }));
}

TEST(CollectivesCApi, InvalidArgumentsReturnAtOnceWithoutARequest) {
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    lowcommComm_t comm = nullptr;
    if (std::string s = c_init(rank, id, &comm); s != "ok") return s;
    std::vector<float> x(64, static_cast<float>(rank + 1)), y(64, 0.0f);
    if (rank == 0) {
      struct Case {
        const char* what;
        std::function<lowcommResult_t(lowcommRequest_t*)> call;
        const char* part;
      };
      std::vector<Case> cases = {
          {"send to rank 2",
           [&](lowcommRequest_t* r) {
             return lowcommSend(x.data(), 4, lowcommFloat32, 2, comm, r);
           },
           "peer 2"},
          {"recv from self",
           [&](lowcommRequest_t* r) {
             return lowcommRecv(y.data(), 4, lowcommFloat32, 0, comm, r);
           },
           "peer 0"},
          {"send NULL",
           [&](lowcommRequest_t* r) { return lowcommSend(nullptr, 4, lowcommFloat32, 1, comm, r); },
           "null"},
          {"broadcast root 5",
           [&](lowcommRequest_t* r) {
             return lowcommBroadcast(x.data(), y.data(), 4, lowcommFloat32, 5, comm, r);
           },
           "root 5"},
          {"reduce_scatter overflow",
           [&](lowcommRequest_t* r) {
             return lowcommReduceScatter(x.data(), y.data(), (size_t{1} << 63) + 1, lowcommFloat32,
                                         lowcommSum, nullptr, comm, r);
           },
           "2^56"},
          {"all_gather NULL",
           [&](lowcommRequest_t* r) {
             return lowcommAllGather(x.data(), nullptr, 4, lowcommFloat32, comm, r);
           },
           "null"},
          {"all_reduce q4:col=5",
           [&](lowcommRequest_t* r) {
             return lowcommAllReduce(x.data(), y.data(), 64, lowcommFloat32, lowcommSum, "q4:col=5",
                                     comm, r);
           },
           "col=5"},
      };
      for (const Case& c : cases) {
        for (bool async : {true, false}) {
          lowcommRequest_t req = nullptr;
          lowcommResult_t r = c.call(async ? &req : nullptr);
          std::string tag = std::string(c.what) + (async ? " (async)" : " (blocking)");
          RANK_CHECK(r == lowcommInvalidArgument, tag + ": returned " + lowcommGetErrorString(r));
          RANK_CHECK(req == nullptr, tag + ": handed out a request");
          RANK_CHECK(contains(lowcommGetLastError(comm), c.part),
                     tag + ": '" + c.part + "' missing from: " + lowcommGetLastError(comm));
          lowcommResult_t async_error = lowcommInternalError;
          RANK_CHECK(lowcommCommGetAsyncError(comm, &async_error) == lowcommSuccess &&
                         async_error == lowcommSuccess,
                     tag + ": the communicator failed: " + lowcommGetLastError(comm));
        }
      }
    }
    lowcommRequest_t req = nullptr;
    RANK_CHECK(lowcommAllReduce(x.data(), y.data(), x.size(), lowcommFloat32, lowcommSum, nullptr,
                                comm, &req) == lowcommSuccess,
               lowcommGetLastError(comm));
    RANK_CHECK(lowcommWait(req) == lowcommSuccess, lowcommGetLastError(comm));
    for (float v : y) RANK_CHECK(v == 3.0f, "all_reduce gave " + std::to_string(v));
    std::vector<float> msg(16, static_cast<float>(rank == 0 ? 7 : 0));
    lowcommResult_t r = rank == 0
                            ? lowcommSend(msg.data(), msg.size(), lowcommFloat32, 1, comm, nullptr)
                            : lowcommRecv(msg.data(), msg.size(), lowcommFloat32, 0, comm, nullptr);
    RANK_CHECK(r == lowcommSuccess, lowcommGetLastError(comm));
    for (float v : msg) RANK_CHECK(v == 7.0f, "p2p payload " + std::to_string(v));
    // NCCL's datatype and reduction values: int64 max, uint8 bitwise or, fp64 product.
    std::vector<int64_t> i64(8, rank == 0 ? -5 : int64_t{1} << 40);
    RANK_CHECK(lowcommAllReduce(i64.data(), i64.data(), i64.size(), lowcommInt64, lowcommMax,
                                nullptr, comm, nullptr) == lowcommSuccess,
               lowcommGetLastError(comm));
    for (int64_t v : i64) RANK_CHECK(v == int64_t{1} << 40, "int64 max " + std::to_string(v));
    std::vector<uint8_t> u8(8, static_cast<uint8_t>(rank == 0 ? 0x0F : 0xF0));
    RANK_CHECK(lowcommAllReduce(u8.data(), u8.data(), u8.size(), lowcommUint8, lowcommBor, nullptr,
                                comm, nullptr) == lowcommSuccess,
               lowcommGetLastError(comm));
    for (uint8_t v : u8) RANK_CHECK(v == 0xFF, "uint8 bor " + std::to_string(v));
    std::vector<double> f64(8, rank == 0 ? 1.5 : -4.0);
    RANK_CHECK(lowcommAllReduce(f64.data(), f64.data(), f64.size(), lowcommFloat64, lowcommProd,
                                nullptr, comm, nullptr) == lowcommSuccess,
               lowcommGetLastError(comm));
    for (double v : f64) RANK_CHECK(v == -6.0, "fp64 product " + std::to_string(v));
    // Compressed reduce-scatter through the C API: 2 x 256 elements, q8.
    std::vector<float> rs(512, 1.0f), slice(256);
    RANK_CHECK(lowcommReduceScatter(rs.data(), slice.data(), slice.size(), lowcommFloat32,
                                    lowcommSum, "q8", comm, nullptr) == lowcommSuccess,
               lowcommGetLastError(comm));
    // One q8 step (absmax/128) per contribution: ones come back as 127/128.
    for (float v : slice)
      RANK_CHECK(std::fabs(v - 2.0f) <= 2.0f / 128 + 1e-6f && v != 0.0f,
                 "q8 reduce_scatter of ones " + std::to_string(v));
    RANK_CHECK(lowcommCommDestroy(comm) == lowcommSuccess, "destroy");
    return "ok";
  }));
}

// Watchdog pattern: rank 0's main thread waits on a receive that never completes while a second
// thread aborts the communicator. The wait returns the failure with its text in the waiting
// thread's last error; it used to write that text into the freed communicator (ASan: heap use
// after free).
TEST(CollectivesCApi, WaitWhileAnotherThreadAbortsIsSafe) {
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    lowcommComm_t comm = nullptr;
    if (std::string s = c_init(rank, id, &comm); s != "ok") return s;
    if (rank == 1) {
      // Rank 1 never sends; it learns of rank 0's abort in its barrier.
      lowcommResult_t r = lowcommBarrier(comm, nullptr);
      RANK_CHECK(r == lowcommRemoteError, std::string("barrier: ") + lowcommGetErrorString(r));
      RANK_CHECK(contains(lowcommGetLastError(comm), "rank 0"), lowcommGetLastError(comm));
      RANK_CHECK(lowcommCommDestroy(comm) == lowcommSuccess, "destroy");
      return "ok";
    }
    std::vector<float> buf(1024);
    lowcommRequest_t req = nullptr;
    RANK_CHECK(lowcommRecv(buf.data(), buf.size(), lowcommFloat32, 1, comm, &req) == lowcommSuccess,
               lowcommGetLastError(comm));
    lowcommResult_t aborted = lowcommSuccess;
    std::thread watchdog([comm, &aborted] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      aborted = lowcommCommAbort(comm);
    });
    lowcommResult_t r = lowcommWait(req);
    std::string text = lowcommGetLastError(nullptr);
    watchdog.join();
    RANK_CHECK(aborted == lowcommSuccess, "abort failed");
    // kAborted, or kRemoteError when rank 1's reaction (it fails and closes) reaches the receive
    // before our own abort does.
    RANK_CHECK(r == lowcommAborted || r == lowcommRemoteError,
               std::string("wait returned ") + lowcommGetErrorString(r) + ": " + text);
    RANK_CHECK(contains(text, "recv #0"), "last error of the waiting thread: '" + text + "'");
    return "ok";
  }));
}

// A request that fails and is waited on only after lowcommCommDestroy (which finishes the
// queue) reports its failure without touching the freed communicator; so does lowcommTest.
TEST(CollectivesCApi, WaitAndTestAfterDestroyReportTheFailure) {
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    lowcommComm_t comm = nullptr;
    if (std::string s = c_init(rank, id, &comm); s != "ok") return s;
    if (rank == 1) {
      RANK_CHECK(lowcommCommAbort(comm) == lowcommSuccess, "abort");
      return "ok";
    }
    std::vector<float> a(256), b(256);
    lowcommRequest_t ra = nullptr, rb = nullptr;
    RANK_CHECK(lowcommRecv(a.data(), a.size(), lowcommFloat32, 1, comm, &ra) == lowcommSuccess,
               lowcommGetLastError(comm));
    RANK_CHECK(lowcommRecv(b.data(), b.size(), lowcommFloat32, 1, comm, &rb) == lowcommSuccess,
               lowcommGetLastError(comm));
    RANK_CHECK(lowcommCommDestroy(comm) == lowcommSuccess, "destroy");
    lowcommResult_t r = lowcommWait(ra);
    RANK_CHECK(r != lowcommSuccess, "a receive from an aborted rank succeeded");
    RANK_CHECK(contains(lowcommGetLastError(nullptr), "rank 1"),
               std::string("wait: ") + lowcommGetErrorString(r) + ": '" +
                   lowcommGetLastError(nullptr) + "'");
    int done = 0;
    r = lowcommTest(rb, &done);
    RANK_CHECK(done == 1, "a request was still pending after destroy");
    RANK_CHECK(r != lowcommSuccess, "the second receive succeeded");
    RANK_CHECK(contains(lowcommGetLastError(nullptr), "failed"),
               std::string("test: ") + lowcommGetErrorString(r) + ": '" +
                   lowcommGetLastError(nullptr) + "'");
    return "ok";
  }));
}

// As ncclGetVersion: the version the library was built as, in the header's encoding.
TEST(CollectivesCApi, GetVersionMatchesTheHeader) {
  static_assert(LOWCOMM_VERSION(1, 2, 3) == 10203);
  static_assert(LOWCOMM_VERSION_CODE ==
                LOWCOMM_VERSION(LOWCOMM_MAJOR, LOWCOMM_MINOR, LOWCOMM_PATCH));
  int v = -1;
  EXPECT_EQ(lowcommGetVersion(&v), lowcommSuccess);
  EXPECT_EQ(v, LOWCOMM_VERSION_CODE);
  EXPECT_EQ(v, lowcomm::version());
  EXPECT_EQ(lowcommGetVersion(nullptr), lowcommInvalidArgument);
  EXPECT_TRUE(contains(lowcommGetLastError(nullptr), "NULL version"))
      << lowcommGetLastError(nullptr);
}

}  // namespace
}  // namespace lowcomm::testing

namespace lowcomm::testing {
namespace {

// Error feedback through the C API: the running sum of q2 all-reduces under a key tracks the
// truth far better than without; reset drops the key and the keys under it; a call without a
// key, or with a key and an exact codec, is refused at the call.
TEST(CollectivesCApi, ErrorFeedbackByKeyAndReset) {
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    lowcommComm_t comm = nullptr;
    if (std::string s = c_init(rank, id, &comm); s != "ok") return s;
    constexpr size_t n = 4096;
    std::vector<float> x(n), y(n);
    std::vector<double> with(n, 0), without(n, 0), truth(n, 0);
    for (size_t i = 0; i < n; ++i)
      x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + rank)) * 0.9f + 0.05f;
    for (int t = 0; t < 12; ++t) {
      RANK_CHECK(lowcommAllReduceErrorFeedback(x.data(), y.data(), n, lowcommFloat32, lowcommSum,
                                               "q2", "grads", 1, comm, nullptr) == lowcommSuccess,
                 lowcommGetLastError(comm));
      for (size_t i = 0; i < n; ++i) with[i] += y[i];
      RANK_CHECK(lowcommAllReduce(x.data(), y.data(), n, lowcommFloat32, lowcommSum, "q2", comm,
                                  nullptr) == lowcommSuccess,
                 lowcommGetLastError(comm));
      for (size_t i = 0; i < n; ++i) without[i] += y[i];
      for (size_t i = 0; i < n; ++i)
        for (int r = 0; r < 2; ++r)
          truth[i] +=
              static_cast<float>(std::sin(0.37 * static_cast<double>(i) + r)) * 0.9f + 0.05f;
    }
    double e_with = 0, e_without = 0;
    for (size_t i = 0; i < n; ++i) {
      e_with = std::max(e_with, std::fabs(with[i] - truth[i]));
      e_without = std::max(e_without, std::fabs(without[i] - truth[i]));
    }
    RANK_CHECK(e_with * 3 < e_without, "EF error " + std::to_string(e_with) +
                                           " not well below plain " + std::to_string(e_without));
    RANK_CHECK(
        lowcommAllReduceErrorFeedback(x.data(), y.data(), n, lowcommFloat32, lowcommSum, "q2",
                                      nullptr, 0, comm, nullptr) == lowcommInvalidArgument,
        "a call without a key was accepted");
    RANK_CHECK(
        lowcommAllReduceErrorFeedback(x.data(), y.data(), n, lowcommFloat32, lowcommSum, "none",
                                      "grads", 0, comm, nullptr) == lowcommInvalidArgument,
        "a key with an exact codec was accepted");
    size_t dropped = 0;
    RANK_CHECK(lowcommResetErrorFeedback(comm, "grads", &dropped) == lowcommSuccess,
               lowcommGetLastError(comm));
    RANK_CHECK(dropped == 1, "reset dropped " + std::to_string(dropped));
    // The key is free again: a tensor of another size may take it.
    RANK_CHECK(lowcommAllReduceErrorFeedback(x.data(), y.data(), n / 2, lowcommFloat32, lowcommSum,
                                             "q2", "grads", 0, comm, nullptr) == lowcommSuccess,
               lowcommGetLastError(comm));
    RANK_CHECK(lowcommCommDestroy(comm) == lowcommSuccess, "destroy");
    return "ok";
  }));
}

// AllReduceOptions::on_result: the flat all-reduce reports every part of recv once, as it takes
// its final value: what a part holds when reported is what it holds when the call completes.
// Compressed (average) and plain (sum), in place and not; three ranks, several segments each.
TEST(CollectivesApi, OnResultReportsEachPartOnceWithItsFinalValue) {
  expect_all_ok(run_ranks(3, [](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.segment_bytes = 64 << 10;  // several segments per owner chunk
    auto c = Communicator::init(id, rank, 3, o);
    RANK_OK(c.status());
    const uint64_t n = (1 << 20) + 160;  // owner chunks cut on q4's scale groups
    for (const char* codec : {"q4", "none"}) {
      for (bool in_place : {true, false}) {
        std::vector<float> x(n), y(n, -1.0f);
        for (uint64_t i = 0; i < n; ++i)
          x[i] = std::sin(0.001f * static_cast<float>(i) + static_cast<float>(rank));
        float* recv = in_place ? x.data() : y.data();
        std::vector<uint8_t> seen(n * 4), covered(n * 4, 0);
        int twice = 0, calls = 0;
        AllReduceOptions ar;
        ar.codec = *parse_codec_spec(codec);
        ar.on_result = [&](uint64_t off, uint64_t bytes) {
          ++calls;
          std::memcpy(seen.data() + off, reinterpret_cast<const uint8_t*>(recv) + off, bytes);
          for (uint64_t b = off; b < off + bytes; ++b) twice += covered[b]++ ? 1 : 0;
        };
        const ReduceOp op = std::string(codec) == "q4" ? ReduceOp::kAverage : ReduceOp::kSum;
        RANK_OK((*c)->all_reduce(x.data(), recv, n, DType::kFloat32, op, ar).wait());
        const std::string what = std::string(codec) + (in_place ? " in place" : " out of place");
        RANK_CHECK(twice == 0, what + ": " + std::to_string(twice) + " bytes reported twice");
        RANK_CHECK(calls > 3, what + ": only " + std::to_string(calls) + " reports");
        for (uint64_t b = 0; b < n * 4; ++b) {
          RANK_CHECK(covered[b] == 1, what + ": byte " + std::to_string(b) + " never reported");
          if (seen[b] != reinterpret_cast<const uint8_t*>(recv)[b])
            return what + ": byte " + std::to_string(b) + " changed after it was reported";
        }
      }
    }
    return "ok";
  }));
}

// LOWCOMM_SEGMENT_BYTES decides where segment_bytes is not given: a value below 4096 fails init;
// ranks that set different values cut different segments and fail the descriptor check, naming
// it. A segment_bytes given beats the variable, even when it is the default's 4 MiB (until
// options had one "unset", an explicit 4 MiB was taken for unset and replaced).
TEST(CollectivesApi, SegmentBytesFromTheEnvironment) {
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    ::setenv("LOWCOMM_SEGMENT_BYTES", "1000", 1);
    CommOptions o = test_options();
    o.segment_bytes.reset();  // not given: the variable decides
    auto bad = Communicator::init(id, rank, 2, o);
    RANK_CHECK(!bad.status().is_ok() &&
                   bad.status().message().find("LOWCOMM_SEGMENT_BYTES") != std::string::npos,
               bad.status().to_string());
    return "ok";
  }));
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    ::setenv("LOWCOMM_SEGMENT_BYTES", rank == 0 ? "64K" : "1048576", 1);
    CommOptions o = test_options();
    o.segment_bytes.reset();
    auto c = Communicator::init(id, rank, 2, o);
    RANK_OK(c.status());
    std::vector<float> x(1 << 20, 1.0f);
    Status s =
        (*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait();
    RANK_CHECK(s.code() == StatusCode::kInvalidArgument &&
                   s.to_string().find("mismatched operations") != std::string::npos,
               s.to_string());
    return "ok";
  }));
  expect_all_ok(run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    ::setenv("LOWCOMM_SEGMENT_BYTES", rank == 0 ? "64K" : "1M", 1);
    CommOptions o = test_options();
    o.segment_bytes = uint64_t{4} << 20;  // given: the variables differ, the ranks do not
    auto c = Communicator::init(id, rank, 2, o);
    RANK_OK(c.status());
    std::vector<float> x(1 << 20, 1.0f);
    RANK_OK((*c)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait());
    RANK_CHECK(x[0] == 2.0f, "sum " + std::to_string(x[0]));
    return "ok";
  }));
}

// The other byte counts from the environment fail init with the variable's name where they are
// not decimal counts (trailing text, negative, out of range), before any peer is contacted.
TEST(CollectivesApi, ByteCountVariablesRejectWhatIsNotACount) {
  const std::pair<const char*, const char*> cases[] = {
      {"LOWCOMM_DIRECT_BYTES", "12x"},
      {"LOWCOMM_DIRECT_BYTES", "-1"},
      {"LOWCOMM_INLINE_BYTES", "99999999999999999999"},
      {"LOWCOMM_INLINE_BYTES", " "},
  };
  for (const auto& [name, value] : cases) {
    expect_all_ok(run_ranks(1, [name, value](int rank, const UniqueId& id) -> std::string {
      ::setenv(name, value, 1);
      auto bad = Communicator::init(id, rank, 1, test_options());
      RANK_CHECK(!bad.status().is_ok() && bad.status().message().find(name) != std::string::npos,
                 std::string(name) + "=" + value + ": " + bad.status().to_string());
      return "ok";
    }));
  }
}
}  // namespace
}  // namespace lowcomm::testing
