// Collectives on device buffers (MemoryKind::kCuda, collectives/device_op.h) driven through the
// host emulation of a device (emulated_device.h): bit-identical results against host buffers
// for the GPU-codec path and the staged one, in groups mixing host and device ranks; the bytes
// each way; stream ordering (an input written by work queued before the call, a result read by
// work queued after wait_on_stream, which waits on the host); error-feedback residuals kept on the
// device and brought back; refusals; the pinned staging pool. The same tests on a real GPU:
// tests/cuda_*.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>
#include <thread>

#include "collectives/device_op.h"
#include "collectives_test_util.h"
#include "device/pinned_pool.h"
#ifndef LOWCOMM_TEST_CUDA_DEVICE
#include "emulated_device.h"
#endif
#include "lowcomm/lowcomm.h"
#include "test_device.h"

namespace lowcomm::testing {
namespace {

using namespace std::chrono_literals;

// A device copy of a host tensor on `dev`, and back.
struct DeviceTensor {
  TestDevice& dev;
  uint64_t bytes;
  void* p;
  DeviceTensor(TestDevice& d, uint64_t b) : dev(d), bytes(b), p(d.device_alloc(b)) {
    std::vector<uint8_t> z(b, 0);
    dev.upload(p, z.data(), b);
  }
  DeviceTensor(TestDevice& d, const Tensor& t) : DeviceTensor(d, t.bytes.size()) {
    dev.upload(p, t.bytes.data(), bytes);
  }
  ~DeviceTensor() { dev.device_free(p); }
  std::vector<uint8_t> read() const {
    std::vector<uint8_t> out(bytes);
    dev.download(out.data(), p, bytes);
    return out;
  }
};

// Whether this binary has its device: always for the emulation; for CUDA, asked in a child
// process, so this one never initialises CUDA before it forks the ranks.
bool device_present(std::string* why) {
  if (emulated_device()) return true;
  auto res = run_ranks(1, [](int, const UniqueId&) -> std::string {
    std::string w;
    return install_device(&w) ? "ok" : "no CUDA device (" + w + ")";
  });
  *why = res[0].text;
  return res[0].ok();
}

// Skips a test where the binary has no device (LOWCOMM_REQUIRE_CUDA=1: fails it instead).
#define REQUIRE_DEVICE()                                                  \
  do {                                                                    \
    std::string why_;                                                     \
    if (!device_present(&why_)) {                                         \
      if (std::getenv("LOWCOMM_REQUIRE_CUDA") != nullptr) FAIL() << why_; \
      GTEST_SKIP() << why_;                                               \
    }                                                                     \
  } while (0)

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof(b), "%016llx", static_cast<unsigned long long>(v));
  return b;
}

#ifndef LOWCOMM_TEST_CUDA_DEVICE
// ---- the pinned staging pool ----

TEST(PinnedPool, ReusesBlocksAndKeepsItsLimit) {
  EmulatedDevice dev;
  device::PinnedPool pool(dev, 4 << 20);
  uint8_t* first = nullptr;
  {
    auto b = pool.acquire(1000000);
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    first = b->data();
    EXPECT_EQ(b->capacity(), 1u << 20);
    EXPECT_EQ(pool.in_use(), 1u << 20);
  }
  EXPECT_EQ(pool.in_use(), 0u);
  {
    auto b = pool.acquire(700000);  // the same class: the same block again
    ASSERT_TRUE(b.is_ok());
    EXPECT_EQ(b->data(), first);
    auto c = pool.acquire(1 << 20);  // a second block of the class while the first is lent
    ASSERT_TRUE(c.is_ok());
    EXPECT_NE(c->data(), first);
    EXPECT_EQ(pool.allocations(), 2u);
    // 2 MiB lent, 4 MiB limit: a 4 MiB block does not fit.
    auto d = pool.acquire(3 << 20);
    ASSERT_FALSE(d.is_ok());
    EXPECT_NE(d.status().message().find("LOWCOMM_PINNED_BYTES"), std::string::npos)
        << d.status().to_string();
  }
  // 2 MiB idle in another class and a 4 MiB limit: a 4 MiB block frees the idle ones to fit
  // (a change of sizes under a full pool); only blocks in use leave no room.
  EXPECT_EQ(pool.in_use(), 0u);
  EXPECT_EQ(pool.allocated(), 2u << 20);
  {
    auto e = pool.acquire(4 << 20);
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    EXPECT_EQ(pool.frees(), 2u);
    EXPECT_EQ(pool.allocated(), 4u << 20);
    auto f = pool.acquire(1);  // 4 MiB in use: nothing fits
    ASSERT_FALSE(f.is_ok());
    EXPECT_EQ(f.status().code(), StatusCode::kSystem);
    // reserve() while blocks are in use defers (they come back), allocating nothing.
    EXPECT_TRUE(pool.reserve({1 << 20}).is_ok());
    EXPECT_EQ(pool.allocated(), 4u << 20);
  }
  // reserve() grows the pool ahead with the blocks a call will hold at once, and leaves them
  // free: the next acquires take them without allocating.
  device::PinnedPool fresh(dev, 8 << 20);
  ASSERT_TRUE(fresh.reserve({3 << 20, 100000, 100000}).is_ok());
  EXPECT_EQ(fresh.allocations(), 3u);
  EXPECT_EQ(fresh.in_use(), 0u);
  {
    auto a = fresh.acquire(3 << 20), b = fresh.acquire(100000), c = fresh.acquire(70000);
    ASSERT_TRUE(a.is_ok() && b.is_ok() && c.is_ok());
    EXPECT_EQ(fresh.allocations(), 3u);
  }
  EXPECT_EQ(device::pinned_bytes({3 << 20, 100000, 0}), (4u << 20) + (128u << 10));
}

TEST(PinnedPool, SizeClasses) {
  EXPECT_EQ(device::pinned_class(1), device::PinnedPool::kMinBlock);
  EXPECT_EQ(device::pinned_class(64 << 10), 64u << 10);
  EXPECT_EQ(device::pinned_class((64 << 10) + 1), 128u << 10);
  EXPECT_EQ(device::pinned_class(uint64_t{3} << 30), uint64_t{4} << 30);
}

#endif  // LOWCOMM_TEST_CUDA_DEVICE

// ---- refusals ----

TEST(CollectivesDevice, RefusedWithoutRuntimeOrForHostPointers) {
  REQUIRE_DEVICE();
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto comm = Communicator::init(id, rank, 2, test_options());
    RANK_OK(comm.status());
    std::vector<float> x(1000, 1.0f);
    AllReduceOptions o;
    o.memory = MemoryKind::kCuda;
    Work w;
    if (emulated_device()) {  // the real runtime cannot be taken away
      device::set_runtime_for_testing(nullptr);
      w = (*comm)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum, o);
      RANK_CHECK(w.refused() && w.status().code() == StatusCode::kUnsupported,
                 w.status().to_string());
    }
    // With a runtime, a host pointer passed as device memory is refused too.
    auto dev = install_device();
    w = (*comm)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum, o);
    RANK_CHECK(w.refused() && w.status().code() == StatusCode::kInvalidArgument,
               w.status().to_string());
    RANK_CHECK(w.status().message().find("device") != std::string::npos, w.status().to_string());
    // Nothing was sent: the group is still usable.
    RANK_OK(
        (*comm)->all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).wait());
    RANK_CHECK(x[0] == 2.0f, std::to_string(x[0]));
    return "ok";
  });
  expect_all_ok(res);
}

// A CUDA call that one rank cannot set up for a reason of its own is the group's failure, never
// a desynchronisation: it takes its sequence number and fails on every rank naming that rank
// and the reason, and the communicator is latched, so the next calls (two equal-size
// all-reduces of different data, which a refusal would have matched against each other) fail
// on every rank too, never a wrong sum. `local`: rank 1's reason, set up before its call.
void rank_local_refusal_fails_the_group(const std::function<void(TestDevice&)>& local,
                                        const char* reason) {
  auto res = run_ranks(3, [&](int rank, const UniqueId& id) -> std::string {
    CommOptions o = test_options();
    o.timeout = 20s;
    if (rank == 1 && std::string(reason) == "LOWCOMM_PINNED_BYTES")
      ::setenv("LOWCOMM_PINNED_BYTES", "1M", 1);  // this rank's pool only: too small
    auto comm = Communicator::init(id, rank, 3, o);
    RANK_OK(comm.status());
    auto dev = install_device();
    RANK_CHECK(dev != nullptr, "no device");
    if (rank == 1) local(*dev);
    const uint64_t n = 1 << 20;
    DeviceTensor x(*dev, n * 4), y(*dev, n * 4);
    std::vector<float> host(n, static_cast<float>(rank + 1));
    dev->upload(x.p, host.data(), n * 4);
    AllReduceOptions a;
    a.memory = MemoryKind::kCuda;
    a.codec = *parse_codec_spec("q4");
    auto t0 = Clock::now();
    Work w = (*comm)->all_reduce(x.p, x.p, n, DType::kFloat32, ReduceOp::kSum, a);
    RANK_CHECK(!w.refused(),
               "refused on rank " + std::to_string(rank) + " alone: " + w.status().to_string());
    Status s = w.wait();
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    RANK_CHECK(!s.is_ok(), "the call succeeded on rank " + std::to_string(rank));
    RANK_CHECK(s.message().find("rank 1") != std::string::npos, s.to_string());
    RANK_CHECK(s.message().find(reason) != std::string::npos, s.to_string());
    RANK_CHECK(took < 5, "took " + std::to_string(took) + " s: " + s.to_string());
    // Two more of the same size, different data: each fails everywhere (latched), none sums.
    for (int k = 0; k < 2; ++k) {
      std::vector<float> v(n, static_cast<float>(10 * k + rank));
      dev->upload(y.p, v.data(), n * 4);
      Status t = (*comm)->all_reduce(y.p, y.p, n, DType::kFloat32, ReduceOp::kSum, a).wait();
      RANK_CHECK(!t.is_ok(), "a later call succeeded: the group went on after the refusal");
      RANK_CHECK(t.message().find("rank 1") != std::string::npos, t.to_string());
    }
    return "ok (" + std::to_string(took) + " s) " + s.message();
  });
  expect_all_ok(res);
}

TEST(CollectivesDevice, PinnedPoolTooSmallOnOneRankFailsTheCallOnEveryRank) {
  REQUIRE_DEVICE();
  rank_local_refusal_fails_the_group([](TestDevice&) {}, "LOWCOMM_PINNED_BYTES");
}

#ifndef LOWCOMM_TEST_CUDA_DEVICE
// A count-0 all-reduce of device buffers with a codec named (q4) has no buffer and so no
// device: it completes without allocating device memory or synchronising any stream (it once
// encoded an empty tensor on the GPU-codec path, on device 0).
TEST(CollectivesDevice, CountZeroCallTouchesNoDevice) {
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto comm = Communicator::init(id, rank, 2, test_options());
    RANK_OK(comm.status());
    auto dev = install_device();
    auto& emu = static_cast<EmulatedDevice&>(*dev);
    AllReduceOptions a;
    a.memory = MemoryKind::kCuda;
    a.codec = *parse_codec_spec("q4");
    const uint64_t allocs = emu.device_allocations(), syncs = emu.synchronizations();
    RANK_OK((*comm)->all_reduce(nullptr, nullptr, 0, DType::kFloat32, ReduceOp::kSum, a).wait());
    RANK_CHECK(emu.device_allocations() == allocs,
               std::to_string(emu.device_allocations() - allocs) + " device allocations");
    RANK_CHECK(emu.synchronizations() == syncs,
               std::to_string(emu.synchronizations() - syncs) + " synchronisations");
    return "ok";
  });
  expect_all_ok(res);
}

// An operation on CUDA buffers makes their device current on the thread that runs it. A
// caller's thread that ran one inline (a small collective its wait() ran) gets its own device
// back; the executor stays on the last one (restoring its initial device 0 would make a
// context on GPU 0 in every rank). First the mechanism, then through the communicator with
// buffers on device 1 and a caller on device 0.
TEST(CollectivesDevice, InlineRunGivesTheCallersDeviceBack) {
  {
    EmulatedDevice emu;
    collectives::DeviceContext ctx(emu, 1 << 20);
    collectives::DeviceCall call;
    call.rt = &emu;
    call.device = 1;
    call.ready = *emu.create_event();
    ASSERT_TRUE(emu.record(call.ready, nullptr).is_ok());
    for (bool restore : {true, false}) {
      ASSERT_TRUE(emu.set_device(0).is_ok());
      collectives::OpCounters counters;
      {
        collectives::DeviceOp d(ctx, call, counters, restore);
        ASSERT_TRUE(d.begin("staged").is_ok());
        EXPECT_EQ(*emu.current_device(), 1);
      }
      EXPECT_EQ(*emu.current_device(), restore ? 0 : 1) << "restore_device=" << restore;
    }
  }
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto comm = Communicator::init(id, rank, 2, test_options());
    RANK_OK(comm.status());
    auto dev = install_device();
    auto& emu = static_cast<EmulatedDevice&>(*dev);
    const uint64_t n = 1024;  // 4 KiB: under the inline threshold
    RANK_OK(emu.set_device(1));
    DeviceTensor x(*dev, n * 4);
    RANK_OK(emu.set_device(0));
    RANK_CHECK(*emu.device_of(x.p) == 1, "not on device 1");
    AllReduceOptions a;
    a.memory = MemoryKind::kCuda;
    for (int k = 0; k < 20; ++k) {
      std::vector<float> v(n, static_cast<float>(k + rank));
      dev->upload(x.p, v.data(), n * 4);
      RANK_OK((*comm)->all_reduce(x.p, x.p, n, DType::kFloat32, ReduceOp::kSum, a).wait());
      RANK_CHECK(*emu.current_device() == 0, "call " + std::to_string(k) +
                                                 " left the caller on device " +
                                                 std::to_string(*emu.current_device()));
      dev->download(v.data(), x.p, n * 4);
      RANK_CHECK(v[0] == static_cast<float>(2 * k + 1) && v[n - 1] == v[0],
                 "call " + std::to_string(k) + ": " + std::to_string(v[0]));
    }
    return "ok";
  });
  expect_all_ok(res);
}

TEST(CollectivesDevice, DeviceOutOfMemoryOnOneRankFailsTheCallOnEveryRank) {
  rank_local_refusal_fails_the_group(
      [](TestDevice& d) { static_cast<EmulatedDevice&>(d).fail_next_device_allocs(1000); },
      "out of memory");
}
// An allocator that refuses every request: a device out of memory as the caller's allocator
// reports it.
void* refuse_alloc(uint64_t, void*, void*) {
  return nullptr;
}
void never_release(void*, void*, void*) {}

TEST(CollectivesDevice, InstalledAllocatorOutOfMemoryOnOneRankFailsTheCallOnEveryRank) {
  rank_local_refusal_fails_the_group(
      [](TestDevice&) {
        set_device_allocator({&refuse_alloc, &never_release, nullptr});
      },
      "out of memory");
}

// The device memory of CUDA-buffer calls (the GPU-codec path's codes, the error-feedback
// residual, the preload's buffers) comes from the allocator installed before the
// communicator's first CUDA call (the torch backend installs torch's caching allocator), never
// from the runtime's own, and all of it goes back there by the communicator's end.
struct CountingAllocator {
  TestDevice* dev = nullptr;
  std::atomic<int64_t> live{0};
  std::atomic<uint64_t> calls{0};
  static void* alloc(uint64_t bytes, void*, void* self) {
    auto* a = static_cast<CountingAllocator*>(self);
    ++a->calls;
    ++a->live;
    return a->dev->device_alloc(bytes);
  }
  static void release(void* p, void*, void* self) {
    auto* a = static_cast<CountingAllocator*>(self);
    --a->live;
    a->dev->device_free(p);
  }
};

TEST(CollectivesDevice, DeviceMemoryComesFromTheInstalledAllocator) {
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto dev = install_device();
    auto& emu = static_cast<EmulatedDevice&>(*dev);
    CountingAllocator counting;
    counting.dev = dev.get();
    set_device_allocator({&CountingAllocator::alloc, &CountingAllocator::release, &counting});
    const uint64_t n = 1 << 18;
    {
      auto comm = Communicator::init(id, rank, 2, test_options());
      RANK_OK(comm.status());
      DeviceTensor x(*dev, n * 4);
      const uint64_t runtime_allocs = emu.device_allocations();
      AllReduceOptions a;
      a.memory = MemoryKind::kCuda;
      a.codec = *parse_codec_spec("q4");
      a.error_feedback_key = "g";
      AllReduceOptions h = a;  // the same call on host buffers: the same bytes
      h.memory = MemoryKind::kHost;
      h.error_feedback_key = "h";
      for (int k = 0; k < 3; ++k) {
        std::vector<float> v(n), want(n);
        for (uint64_t i = 0; i < n; ++i)
          v[i] = want[i] = std::sin(0.001f * static_cast<float>(i) + static_cast<float>(k + rank));
        dev->upload(x.p, v.data(), n * 4);
        Work w = (*comm)->all_reduce(x.p, x.p, n, DType::kFloat32, ReduceOp::kSum, a);
        RANK_OK(w.wait());
        auto st = w.stats();
        RANK_OK(st.status());
        RANK_CHECK(st->device_path == "gpu-codec", st->device_path);
        RANK_OK((*comm)
                    ->all_reduce(want.data(), want.data(), n, DType::kFloat32, ReduceOp::kSum, h)
                    .wait());
        dev->download(v.data(), x.p, n * 4);
        RANK_CHECK(std::memcmp(v.data(), want.data(), n * 4) == 0,
                   "call " + std::to_string(k) + ": not the host buffers' bytes");
      }
      RANK_CHECK(emu.device_allocations() == runtime_allocs,
                 std::to_string(emu.device_allocations() - runtime_allocs) +
                     " allocations from the runtime's own allocator");
      RANK_CHECK(counting.calls.load() > 0, "the installed allocator was never called");
      RANK_CHECK(counting.live.load() >= 1, "no residual kept on the device");
    }
    RANK_CHECK(counting.live.load() == 0,
               std::to_string(counting.live.load()) + " allocations never given back");
    set_device_allocator({});
    return "ok (" + std::to_string(counting.calls.load()) + " allocations)";
  });
  expect_all_ok(res);
}

#endif

// A full pinned pool never ends a job: under LOWCOMM_PINNED_BYTES=4M, an exact all-reduce of
// 1.5 MiB (a 2 MiB block) and then one of 3 MiB (a 4 MiB block, which fits only once the idle
// 2 MiB block is freed) both succeed; and a q4 all-reduce of 8 MiB, whose GPU-codec path takes
// two 2 MiB blocks of codes and no block of the tensor's size, is not refused.
TEST(CollectivesDevice, FullPinnedPoolMakesRoomAcrossSizes) {
  REQUIRE_DEVICE();
  auto res = run_ranks(2, [&](int rank, const UniqueId& id) -> std::string {
    ::setenv("LOWCOMM_PINNED_BYTES", "4M", 1);
    auto comm = Communicator::init(id, rank, 2, test_options());
    RANK_OK(comm.status());
    auto dev = install_device();
    RANK_CHECK(dev != nullptr, "no device");
    for (const char* codec : {"", "", "q4"}) {
      static int step = 0;
      const uint64_t n = step == 0 ? (3 << 19) / 4 : step == 1 ? (3 << 20) / 4 : (8 << 20) / 4;
      ++step;
      DeviceTensor x(*dev, n * 4);
      std::vector<float> host(n, static_cast<float>(rank + 1));
      dev->upload(x.p, host.data(), n * 4);
      AllReduceOptions a;
      a.memory = MemoryKind::kCuda;
      if (*codec) a.codec = *parse_codec_spec(codec);
      Work w = (*comm)->all_reduce(x.p, x.p, n, DType::kFloat32, ReduceOp::kSum, a);
      RANK_OK(w.wait());
      // The same call on host buffers gives the same bytes (exact: 3 everywhere).
      std::vector<float> want(n, static_cast<float>(rank + 1));
      AllReduceOptions h = a;
      h.memory = MemoryKind::kHost;
      RANK_OK((*comm)
                  ->all_reduce(want.data(), want.data(), n, DType::kFloat32, ReduceOp::kSum, h)
                  .wait());
      dev->download(host.data(), x.p, n * 4);
      RANK_CHECK(host == want && (*codec || host.front() == 3.0f),
                 std::string(codec) + " n " + std::to_string(n) + ": " + std::to_string(host[0]));
    }
    return "ok";
  });
  expect_all_ok(res);
}

// ---- bit-identical results, mixed groups ----

struct MixedCase {
  std::string codec;  // "" exact
  DType dtype;
  bool error_feedback;
};

// Rank r holds its tensor on the device when `on_device[r]`. Returns the hash of every result
// (and of the saved error-feedback state) so runs can be compared.
std::string mixed_rank(int rank, const UniqueId& id, int P, const MixedCase& c,
                       const std::vector<bool>& on_device) {
  auto dev = install_device();
  auto comm = Communicator::init(id, rank, P, test_options());
  RANK_OK(comm.status());
  const bool device = on_device[static_cast<size_t>(rank)];
  const uint64_t n = 3 * 40000 + 77;
  std::string out = "ok";
  for (int step = 0; step < 3; ++step) {
    Tensor x = make_input(c.dtype, n, 11 + static_cast<uint64_t>(step), rank);
    Tensor y(c.dtype, n);
    AllReduceOptions o;
    if (!c.codec.empty()) o.codec = *parse_codec_spec(c.codec);
    if (c.error_feedback) o.error_feedback_key = "g";
    // Random-k: the owner schedule over its shared positions, named (auto follows measured
    // times, so two runs may differ); topk always gathers.
    if (o.codec && o.codec->kind == CodecKind::kRandk)
      o.sparse_schedule = AllReduceOptions::SparseSchedule::kOwner;
    // all-reduce
    if (device) {
      DeviceTensor dx(*dev, x), dy(*dev, y.bytes.size());
      o.memory = MemoryKind::kCuda;
      Work w = (*comm)->all_reduce(dx.p, dy.p, n, c.dtype, ReduceOp::kAverage, o);
      RANK_OK(w.wait());
      y.bytes = dy.read();
      OpStats s = *w.stats();
      if (!c.codec.empty() && o.codec->kind == CodecKind::kRandk) {
        // The owner schedule over shared positions: staged.
        RANK_CHECK(s.device_path == "staged", s.device_path);
        RANK_CHECK(s.device_to_host_bytes == x.bytes.size(),
                   std::to_string(s.device_to_host_bytes));
      } else if (!c.codec.empty() && o.codec->sparse()) {
        // Gather-all (one hop): encoded on the device, the sum formed on the host.
        const uint64_t enc = encoded_size(*o.codec, n);
        RANK_CHECK(s.device_path == "gpu-encode", s.device_path);
        RANK_CHECK(s.device_to_host_bytes == enc && s.host_to_device_bytes == y.bytes.size(),
                   std::to_string(s.device_to_host_bytes) + " / " +
                       std::to_string(s.host_to_device_bytes) + " vs " + std::to_string(enc));
      } else if (!c.codec.empty()) {
        // The codes, each segment's padded to 16 bytes (< 1% here), down and up.
        const uint64_t enc = encoded_size(*o.codec, n);
        RANK_CHECK(s.device_path == "gpu-codec", s.device_path);
        RANK_CHECK(s.device_to_host_bytes >= enc && s.device_to_host_bytes <= enc + enc / 100 &&
                       s.host_to_device_bytes == s.device_to_host_bytes,
                   std::to_string(s.device_to_host_bytes) + " / " +
                       std::to_string(s.host_to_device_bytes) + " vs " + std::to_string(enc));
      } else {
        RANK_CHECK(s.device_path == "staged", s.device_path);
        RANK_CHECK(
            s.device_to_host_bytes == x.bytes.size() && s.host_to_device_bytes == x.bytes.size(),
            std::to_string(s.device_to_host_bytes));
      }
    } else {
      RANK_OK((*comm)->all_reduce(x.data(), y.data(), n, c.dtype, ReduceOp::kAverage, o).wait());
      RANK_CHECK((*comm)->last_op_stats().device_to_host_bytes == 0, "host bytes counted");
    }
    out += " ar" + hex(fnv64(y.bytes));
    if (o.codec && o.codec->sparse()) continue;  // reduce-scatter takes dense codecs only
    // reduce-scatter (no error feedback: its own key would be another tensor)
    AllReduceOptions rs;
    rs.codec = o.codec;
    const uint64_t rc = n / static_cast<uint64_t>(P);
    Tensor z(c.dtype, rc);
    if (device) {
      DeviceTensor dx(*dev, x), dz(*dev, z.bytes.size());
      rs.memory = MemoryKind::kCuda;
      Work w = (*comm)->reduce_scatter(dx.p, dz.p, rc, c.dtype, ReduceOp::kSum, rs);
      RANK_OK(w.wait());
      z.bytes = dz.read();
      OpStats s = *w.stats();
      if (!c.codec.empty()) {
        RANK_CHECK(s.device_path == "gpu-codec", s.device_path);
        RANK_CHECK(s.host_to_device_bytes == z.bytes.size(),
                   std::to_string(s.host_to_device_bytes));
        // The contributions' codes: each owner chunk encoded on its own (the chunks of a
        // reduce-scatter are not cut on scale groups, so a little more than the whole tensor's).
        uint64_t enc = 0;
        for (int j = 0; j < P; ++j) enc += encoded_size(*rs.codec, rc);
        RANK_CHECK(s.device_to_host_bytes >= enc && s.device_to_host_bytes <= enc + enc / 100,
                   std::to_string(s.device_to_host_bytes) + " vs " + std::to_string(enc));
        RANK_CHECK(s.device_to_host_bytes < x.bytes.size() / 3, "uncompressed bytes crossed");
      }
    } else {
      RANK_OK((*comm)->reduce_scatter(x.data(), z.data(), rc, c.dtype, ReduceOp::kSum, rs).wait());
    }
    out += " rs" + hex(fnv64(z.bytes));
  }
  auto saved = (*comm)->save_error_feedback();
  RANK_OK(saved.status());
  out += " ef" + hex(fnv64(*saved));
  // all-gather and broadcast (staged)
  Tensor g = make_input(c.dtype, 5000, 3, rank);
  Tensor ga(c.dtype, 5000 * static_cast<uint64_t>(P));
  Tensor b = make_input(c.dtype, 7001, 4, rank);
  if (device) {
    DeviceTensor dg(*dev, g), dga(*dev, ga.bytes.size()), db(*dev, b);
    BufferOptions where{MemoryKind::kCuda, nullptr};
    Work w = (*comm)->all_gather(dg.p, dga.p, 5000, c.dtype, where);
    RANK_OK(w.wait());
    RANK_CHECK(w.stats()->device_to_host_bytes == g.bytes.size() &&
                   w.stats()->host_to_device_bytes == ga.bytes.size(),
               "all_gather bytes");
    RANK_OK((*comm)->broadcast(db.p, db.p, 7001, c.dtype, 1, where).wait());
    ga.bytes = dga.read();
    b.bytes = db.read();
  } else {
    RANK_OK((*comm)->all_gather(g.data(), ga.data(), 5000, c.dtype).wait());
    RANK_OK((*comm)->broadcast(b.data(), b.data(), 7001, c.dtype, 1).wait());
  }
  out += " ag" + hex(fnv64(ga.bytes)) + " bc" + hex(fnv64(b.bytes));
  return out;
}

class CollectivesDeviceMixed : public ::testing::TestWithParam<MixedCase> {};

TEST_P(CollectivesDeviceMixed, SameBitsAsHostBuffers) {
  REQUIRE_DEVICE();
  const MixedCase c = GetParam();
  const int P = 3;
  auto run = [&](std::vector<bool> on_device) {
    auto res = run_ranks(
        P, [&](int rank, const UniqueId& id) { return mixed_rank(rank, id, P, c, on_device); });
    expect_all_ok(res);
    std::vector<std::string> out;
    for (auto& r : res) out.push_back(r.text);
    return out;
  };
  auto host = run({false, false, false});
  auto mixed = run({true, false, true});
  auto all = run({true, true, true});
  for (int r = 0; r < P; ++r) {
    EXPECT_EQ(mixed[r], host[r]) << "rank " << r;
    EXPECT_EQ(all[r], host[r]) << "rank " << r;
  }
  // Every rank ends an all-reduce with the same bits (the ar hashes agree across ranks).
  auto ar = [](const std::string& t) { return t.substr(t.find(" ar"), 19); };
  EXPECT_EQ(ar(host[0]), ar(host[1]));
  EXPECT_EQ(ar(host[0]), ar(host[2]));
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, CollectivesDeviceMixed,
    ::testing::Values(MixedCase{"", DType::kFloat32, false}, MixedCase{"q4", DType::kFloat32, true},
                      MixedCase{"q2:sr", DType::kBFloat16, true},
                      MixedCase{"minmax4", DType::kFloat16, false},
                      MixedCase{"q8", DType::kFloat32, false},
                      MixedCase{"topk:32/4096+q2:decay=0.9", DType::kFloat32, true},
                      MixedCase{"randk:64/4096+q4", DType::kFloat32, true}),
    [](const ::testing::TestParamInfo<MixedCase>& i) {
      std::string name = i.param.codec.empty() ? "exact" : i.param.codec;
      for (char& ch : name)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return name + "_" + std::string(dtype_name(i.param.dtype)) +
             (i.param.error_feedback ? "_ef" : "");
    });

// ---- stream ordering ----

// The input is written by a slow "kernel" queued on the caller's stream just before the call;
// the result is read by one queued after wait_on_stream, which returns once the operation has
// completed (the host waits: device/runtime.h says why), the peer being late. Both paths (GPU
// codec, staged).
TEST(CollectivesDevice, OrderedOnTheCallersStream) {
  REQUIRE_DEVICE();
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto dev = install_device();
    auto comm = Communicator::init(id, rank, 2, test_options());
    RANK_OK(comm.status());
    auto stream = dev->runtime().create_stream();
    RANK_OK(stream.status());
    const uint64_t n = 50000;
    for (const char* codec : {"q8", ""}) {
      DeviceTensor x(*dev, n * 4), y(*dev, n * 4);
      std::vector<float> seen(n, -1.0f);
      if (rank == 1) std::this_thread::sleep_for(400ms);  // rank 0 waits for it
      // Written only once the stream gets there, 200 ms after the call returns.
      dev->launch(*stream, [&] {
        std::this_thread::sleep_for(200ms);
        std::vector<float> v(n, 1.5f);
        std::memcpy(x.p, v.data(), n * 4);
      });
      AllReduceOptions o;
      if (*codec) o.codec = *parse_codec_spec(codec);
      o.memory = MemoryKind::kCuda;
      o.cuda_stream = *stream;
      Work w = (*comm)->all_reduce(x.p, y.p, n, DType::kFloat32, ReduceOp::kSum, o);
      RANK_CHECK(!w.refused(), w.status().to_string());
      RANK_OK(w.wait_on_stream(*stream));
      RANK_CHECK(w.test(), "wait_on_stream returned before the operation completed");
      dev->launch(*stream, [&] { std::memcpy(seen.data(), y.p, n * 4); });
      RANK_OK(dev->runtime().synchronize(*stream));
      RANK_OK(w.status());
      for (uint64_t i = 0; i < n; ++i)
        // 0 if the input was read before the kernel wrote it, -1 if read before the result was
        // in place; 3 (q8: within its two quantizations) otherwise.
        RANK_CHECK(
            std::fabs(seen[i] - 3.0f) <= (*codec ? 0.1f : 0.0f),
            std::string(codec) + " element " + std::to_string(i) + ": " + std::to_string(seen[i]));
      // A completed operation: nothing to wait for.
      RANK_OK(w.wait_on_stream(*stream));
    }
    dev->runtime().destroy_stream(*stream);
    return "ok";
  });
  expect_all_ok(res);
}

// The shape that deadlocked on the first GPU run (docs/gpu.md, "Second session"): the result
// read by a blocking copy to pageable memory on the caller's stream right after
// wait_on_stream (torch: `dist.all_reduce(t)`, then `t.cpu()`), and blocking copies on the
// caller's stream while the operation still runs (its peer late). Such a copy holds the
// driver's lock while it waits for its stream (the emulation models that); had wait_on_stream
// left a device-side wait on the stream, the copy would wait for the executor and the
// executor's next CUDA call for the lock, and the ranks would time out here.
TEST(CollectivesDevice, BlockingCopiesOnTheCallersStreamDoNotDeadlock) {
  REQUIRE_DEVICE();
  auto res = run_ranks(
      2,
      [](int rank, const UniqueId& id) -> std::string {
        auto dev = install_device();
        auto comm = Communicator::init(id, rank, 2, test_options());
        RANK_OK(comm.status());
        auto stream = dev->runtime().create_stream();
        RANK_OK(stream.status());
        const uint64_t n = 50000;
        for (const char* codec : {"q8", ""}) {
          DeviceTensor x(*dev, n * 4), y(*dev, n * 4);
          std::vector<float> v(n, 1.5f), seen(n, -1.0f), input(n, -1.0f);
          dev->upload(x.p, v.data(), n * 4);
          if (rank == 1) std::this_thread::sleep_for(300ms);  // rank 0's operation waits for it
          AllReduceOptions o;
          if (*codec) o.codec = *parse_codec_spec(codec);
          o.memory = MemoryKind::kCuda;
          o.cuda_stream = *stream;
          Work w = (*comm)->all_reduce(x.p, y.p, n, DType::kFloat32, ReduceOp::kSum, o);
          RANK_CHECK(!w.refused(), w.status().to_string());
          // While it runs: the caller reads its own input back, blocking (an `.item()` of another
          // tensor on the same stream).
          for (int i = 0; i < 5 && !w.test(); ++i) {
            dev->download_blocking(input.data(), x.p, n * 4, *stream);
            RANK_CHECK(input[n - 1] == 1.5f, "input read back: " + std::to_string(input[n - 1]));
            std::this_thread::sleep_for(20ms);
          }
          RANK_OK(w.wait_on_stream(*stream));
          dev->download_blocking(seen.data(), y.p, n * 4, *stream);
          RANK_OK(w.status());
          for (uint64_t i = 0; i < n; ++i)
            RANK_CHECK(std::fabs(seen[i] - 3.0f) <= (*codec ? 0.1f : 0.0f),
                       std::string(codec) + " element " + std::to_string(i) + ": " +
                           std::to_string(seen[i]));
        }
        dev->runtime().destroy_stream(*stream);
        return "ok";
      },
      /*timeout_s=*/20);
  expect_all_ok(res);
}

// A failed operation leaves the device outputs untouched; wait_on_stream returns once it has
// failed.
TEST(CollectivesDevice, FailureLeavesOutputsUntouched) {
  REQUIRE_DEVICE();
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto dev = install_device();
    CommOptions opts = test_options();
    opts.timeout = std::chrono::milliseconds(1500);
    auto comm = Communicator::init(id, rank, 2, opts);
    RANK_OK(comm.status());
    if (rank == 1) {
      std::this_thread::sleep_for(3s);  // never calls: rank 0's operation times out
      return "ok";
    }
    const uint64_t n = 20000;
    for (const char* codec : {"q4", ""}) {
      DeviceTensor x(*dev, n * 4), y(*dev, n * 4);
      std::vector<float> seven(n, 7.0f);
      dev->upload(y.p, seven.data(), n * 4);
      AllReduceOptions o;
      if (*codec) o.codec = *parse_codec_spec(codec);
      o.memory = MemoryKind::kCuda;
      Work w = (*comm)->all_reduce(x.p, y.p, n, DType::kFloat32, ReduceOp::kSum, o);
      RANK_OK(w.wait_on_stream(nullptr));
      RANK_CHECK(!w.wait().is_ok(), "completed without its peer");
      RANK_OK(dev->runtime().synchronize(nullptr));
      auto after = y.read();
      RANK_CHECK(std::memcmp(after.data(), seven.data(), n * 4) == 0,
                 std::string(codec) + ": output written by a failed operation");
      if (!*codec) break;  // the communicator has failed: later calls fail at once
    }
    return "ok";
  });
  expect_all_ok(res);
}

// The C API's *OnStream calls: each returns once its operation has completed, no request
// needed; a process without a device runtime is refused with lowcommUnsupported and the
// communicator stays usable.
TEST(CollectivesDevice, CApiOnStream) {
  REQUIRE_DEVICE();
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    lowcommUniqueId cid;
    RANK_CHECK(lowcommUniqueIdFromString(id.to_string().c_str(), &cid) == lowcommSuccess, "id");
    lowcommComm_t comm = nullptr;
    RANK_CHECK(lowcommCommInitRank(&comm, 2, cid, rank) == lowcommSuccess,
               lowcommGetLastError(nullptr));
    const uint64_t n = 30000;
    std::vector<float> host(n, 1.0f);
    if (emulated_device()) {  // the real runtime cannot be taken away
      device::set_runtime_for_testing(nullptr);
      RANK_CHECK(
          lowcommAllReduceOnStream(host.data(), host.data(), n, lowcommFloat32, lowcommSum, "q4",
                                   nullptr, comm, nullptr, nullptr) == lowcommUnsupported,
          lowcommGetLastError(comm));
    }
    auto dev = install_device();
    DeviceTensor x(*dev, n * 4), y(*dev, n * 4), g(*dev, 2 * n * 4);
    dev->upload(x.p, host.data(), n * 4);
    auto stream = dev->runtime().create_stream();
    RANK_OK(stream.status());
    auto* s = static_cast<cudaStream_t>(*stream);
    RANK_CHECK(lowcommAllReduceOnStream(x.p, y.p, n, lowcommFloat32, lowcommSum, "q8", "g", comm, s,
                                        nullptr) == lowcommSuccess,
               lowcommGetLastError(comm));
    RANK_CHECK(
        lowcommAllGatherOnStream(y.p, g.p, n, lowcommFloat32, comm, s, nullptr) == lowcommSuccess,
        lowcommGetLastError(comm));
    lowcommRequest_t req = nullptr;
    RANK_CHECK(
        lowcommBroadcastOnStream(x.p, x.p, n, lowcommFloat32, 1, comm, s, &req) == lowcommSuccess,
        lowcommGetLastError(comm));
    std::vector<float> seen(2 * n, -1.0f);
    dev->launch(*stream, [&] { std::memcpy(seen.data(), g.p, 2 * n * 4); });
    RANK_OK(dev->runtime().synchronize(*stream));
    lowcommOpStats st = LOWCOMM_OP_STATS_INIT;
    RANK_CHECK(lowcommWaitStats(req, &st) == lowcommSuccess, lowcommGetLastError(comm));
    RANK_CHECK(st.deviceToHostBytes == (rank == 1 ? n * 4 : 0) && st.hostToDeviceBytes == n * 4,
               std::to_string(st.deviceToHostBytes) + " " + std::to_string(st.hostToDeviceBytes));
    for (uint64_t i = 0; i < 2 * n; ++i)
      RANK_CHECK(std::fabs(seen[i] - 2.0f) < 0.1f, std::to_string(seen[i]));  // q8, twice
    lowcommResult_t async = lowcommInternalError;
    RANK_CHECK(lowcommCommGetAsyncError(comm, &async) == lowcommSuccess && async == lowcommSuccess,
               "async error");
    RANK_CHECK(lowcommCommDestroy(comm) == lowcommSuccess, "destroy");
    dev->runtime().destroy_stream(*stream);
    return "ok";
  });
  expect_all_ok(res);
}

// Reduce-scatter chunks are not cut on scale groups: with q2 and 1,000 fp32 per rank a chunk's
// codes end 2 bytes past a 4-byte boundary, and the next must still start aligned for the
// kernels. And reduce to a root, staged. Both against host buffers on the other rank.
TEST(CollectivesDevice, CodesOfAnyLengthAndReduce) {
  REQUIRE_DEVICE();
  auto res = run_ranks(2, [](int rank, const UniqueId& id) -> std::string {
    auto dev = install_device();
    auto comm = Communicator::init(id, rank, 2, test_options());
    RANK_OK(comm.status());
    std::string out = "ok";
    for (const char* codec : {"q2", "q3", "q1"}) {
      for (bool on_device : {false, true}) {
        const uint64_t rc = 1000;
        Tensor x = make_input(DType::kFloat32, 2 * rc, 7, rank);
        Tensor z(DType::kFloat32, rc);
        AllReduceOptions o;
        o.codec = *parse_codec_spec(codec);
        // Rank 0 alternates host and device; rank 1 stays on the host: same bits either way.
        if (on_device && rank == 0) {
          DeviceTensor dx(*dev, x), dz(*dev, z.bytes.size());
          o.memory = MemoryKind::kCuda;
          RANK_OK(
              (*comm)->reduce_scatter(dx.p, dz.p, rc, DType::kFloat32, ReduceOp::kSum, o).wait());
          z.bytes = dz.read();
        } else {
          RANK_OK((*comm)
                      ->reduce_scatter(x.data(), z.data(), rc, DType::kFloat32, ReduceOp::kSum, o)
                      .wait());
        }
        out += " " + hex(fnv64(z.bytes));
      }
    }
    Tensor x = make_input(DType::kFloat32, 4099, 8, rank);
    Tensor r(DType::kFloat32, 4099);
    AllReduceOptions o;
    o.codec = *parse_codec_spec("q4");
    if (rank == 0) {
      DeviceTensor dx(*dev, x), dr(*dev, r.bytes.size());
      o.memory = MemoryKind::kCuda;
      Work w = (*comm)->reduce(dx.p, dr.p, 4099, DType::kFloat32, ReduceOp::kSum, 0, o);
      RANK_OK(w.wait());
      RANK_CHECK(w.stats()->device_path == "staged", w.stats()->device_path);
      r.bytes = dr.read();
      Tensor h(DType::kFloat32, 4099);
      AllReduceOptions ho;
      ho.codec = o.codec;
      RANK_OK(
          (*comm)->reduce(x.data(), h.data(), 4099, DType::kFloat32, ReduceOp::kSum, 0, ho).wait());
      RANK_CHECK(r.bytes == h.bytes, "reduce: device and host results differ");
    } else {
      RANK_OK(
          (*comm)->reduce(x.data(), nullptr, 4099, DType::kFloat32, ReduceOp::kSum, 0, o).wait());
      RANK_OK(
          (*comm)->reduce(x.data(), nullptr, 4099, DType::kFloat32, ReduceOp::kSum, 0, o).wait());
    }
    return out;
  });
  expect_all_ok(res);
  // Each rank's slices: the device run equals the host run, codec by codec.
  for (const auto& r : res) {
    std::istringstream in(r.text.substr(2));
    std::string host, device;
    while (in >> host >> device) EXPECT_EQ(host, device) << r.text;
  }
}

}  // namespace
}  // namespace lowcomm::testing
