// The GPU-free driver of libnccl-net-lowcomm.so: the library is dlopened as NCCL opens it and
// driven through its exported tables the way NCCL's proxy threads drive a net plugin
// (connect/accept in loops, up to 32 requests in flight per comm, test() only on the oldest),
// from one process and from two forked ones, with data verified byte for byte.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <deque>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "driver_util.h"
#include "gradient_like.h"
#include "stream_rank.h"

namespace lowcomm::nccl_net::testing {
namespace {

class NcclNetPlugin : public ::testing::Test {
 protected:
  void SetUp() override { plugin_env(); }
};

// init() as NCCL 2.28+ calls it, once per communicator.
template <typename Net>
void* init_ctx(const Net* net, uint64_t comm_id = 1) {
  void* ctx = nullptr;
  abi::CommConfig config{-1};
  int rc = net->init(&ctx, comm_id, &config, driver_logger, nullptr);
  return rc == abi::kSuccess ? ctx : nullptr;
}

// A connected pair inside this process: comms from ctx_a to ctx_b.
template <typename Net>
bool local_pair(const Net* net, void* ctx_a, void* ctx_b, void** send, void** recv) {
  char handle[abi::kHandleMaxBytes] = {};
  void* listen = nullptr;
  if (net->listen(ctx_b, 0, handle, &listen) != abi::kSuccess || !listen) return false;
  int rc = 0;
  bool ok = connect_loop(net, ctx_a, handle, listen, send, recv, &rc);
  net->close_listen(listen);  // NCCL closes the listener right after accept
  return ok;
}

// One message through a connected pair; returns the size the receiver's test() reported.
template <typename Net>
int transfer(const Net* net, void* send, void* recv, size_t send_bytes, size_t posted,
             int* recv_rc = nullptr, uint64_t seed = 7) {
  std::vector<uint8_t> out(send_bytes), in(posted + 1, 0xEE);
  fill(out.data(), out.size(), seed);
  void* mh_s = nullptr;
  void* mh_r = nullptr;
  net->reg_mr(send, out.data(), out.size(), abi::kPtrHost, &mh_s);
  net->reg_mr(recv, in.data(), in.size(), abi::kPtrHost, &mh_r);
  void* rreq = reinterpret_cast<void*>(1);  // NCCL's LL hint: the plugin must overwrite it
  void* data = in.data();
  size_t size = posted;
  int tag = 0;
  int rc = net->irecv(recv, 1, &data, &size, &tag, &mh_r, nullptr, &rreq);
  void* sreq = nullptr;
  if (rc == abi::kSuccess) rc = net->isend(send, out.data(), out.size(), 0, mh_s, nullptr, &sreq);
  int got = -1, sent = -1, src = 0;
  if (rc == abi::kSuccess && sreq && rreq && rreq != reinterpret_cast<void*>(1)) {
    bool s_ok = wait_request(net, sreq, &sent, &src);
    bool r_ok = wait_request(net, rreq, &got, &rc);
    if (recv_rc) *recv_rc = rc;
    if (!s_ok || !r_ok)
      got = -2;
    else if (first_mismatch(in.data(), static_cast<size_t>(got), seed) != static_cast<size_t>(got))
      got = -3;
    else if (in[posted] != 0xEE || (static_cast<size_t>(got) < posted && in[got] != 0xEE))
      got = -4;  // written past the message
    else if (sent != static_cast<int>(send_bytes))
      got = -5;
  }
  net->dereg_mr(send, mh_s);
  net->dereg_mr(recv, mh_r);
  return got;
}

TEST_F(NcclNetPlugin, ExportsTheTablesEachNcclReleaseProbesFor) {
  PluginLib lib;
  ASSERT_NE(lib.v12(), nullptr);  // NCCL 2.30 (torch 2.15's nvidia-nccl-cu13 2.30.7)
  ASSERT_NE(lib.v11(), nullptr);  // NCCL 2.28-2.29 (the CUDA toolkit's 2.28.9)
  ASSERT_NE(lib.v10(), nullptr);  // NCCL 2.26-2.27
  EXPECT_STREQ(lib.v12()->name, "lowcomm");
  EXPECT_STREQ(lib.v11()->name, "lowcomm");
  EXPECT_STREQ(lib.v10()->name, "lowcomm");
  // NCCL probes newest first and stops at the first symbol found.
  const std::vector<std::pair<std::vector<int>, int>> probes = {
      {{12, 11, 10, 9, 8, 7, 6}, 12}, {{11, 10, 9, 8, 7, 6}, 11}, {{10, 9, 8, 7, 6}, 10}};
  for (const auto& [order, expect] : probes) {
    int found = 0;
    for (int v : order) {
      if (dlsym(lib.handle(), ("ncclNetPlugin_v" + std::to_string(v)).c_str())) {
        found = v;
        break;
      }
    }
    EXPECT_EQ(found, expect);
  }
  // Nothing else is visible: neither collNet/GIN tables nor internals.
  EXPECT_EQ(dlsym(lib.handle(), "ncclCollNetPlugin_v11"), nullptr);
  EXPECT_EQ(dlsym(lib.handle(), "ncclNetPlugin_v9"), nullptr);
  // Every function NCCL calls unconditionally is there, in each version.
  for (auto* t : {reinterpret_cast<const abi::NetV11*>(lib.v12()), lib.v11()}) {
    EXPECT_TRUE(t->init && t->devices && t->get_properties && t->listen && t->connect &&
                t->accept && t->reg_mr && t->dereg_mr && t->isend && t->irecv && t->iflush &&
                t->test && t->close_send && t->close_recv && t->close_listen && t->finalize);
  }
  const abi::NetV10* v10 = lib.v10();
  EXPECT_TRUE(v10->init && v10->devices && v10->get_properties && v10->listen && v10->connect &&
              v10->accept && v10->reg_mr && v10->dereg_mr && v10->isend && v10->irecv &&
              v10->iflush && v10->test && v10->close_send && v10->close_recv && v10->close_listen);
}

TEST_F(NcclNetPlugin, PropertiesTellTheTunerTheEmulatedLinkInEveryVersion) {
  ::setenv("LOWCOMM_WAN", "bw=1gbit,rtt=100ms", 1);
  PluginLib lib;
  forget_info();
  void* ctx = init_ctx(lib.v12());
  ASSERT_NE(ctx, nullptr) << take_last_warn();
  // The options in force reach NCCL's logger (NCCL_DEBUG=INFO shows them), variable by variable.
  for (const char* what : {"LOWCOMM_WAN", "rtt=100ms", "LOWCOMM_STREAMS", "LOWCOMM_SOCKET_BUFFER",
                           "secret from LOWCOMM_SECRET", "LOWCOMM_NCCL_EAGER_BYTES",
                           "LOWCOMM_NCCL_COMPRESS", "reported speed 1000 Mbit/s"})
    EXPECT_TRUE(logged_info(what)) << what;
  int ndev = 0;
  ASSERT_EQ(lib.v12()->devices(&ndev), abi::kSuccess);
  EXPECT_EQ(ndev, 1);

  abi::PropertiesV12 p12;
  std::memset(&p12, 0xA5, sizeof(p12));  // NCCL passes it uninitialised
  ASSERT_EQ(lib.v12()->get_properties(0, &p12), abi::kSuccess);
  EXPECT_EQ(std::string(p12.head.name).rfind("lowcomm-127.0.0.1", 0), 0u) << p12.head.name;
  EXPECT_EQ(p12.head.pci_path, nullptr);
  EXPECT_EQ(p12.head.ptr_support, abi::kPtrHost);
  EXPECT_EQ(p12.head.reg_is_global, 0);
  EXPECT_EQ(p12.head.force_flush, 0);
  EXPECT_EQ(p12.head.speed, 1000);              // Mbit/s: the emulated rate
  EXPECT_FLOAT_EQ(p12.head.latency, 50000.0f);  // us: the one-way delay
  EXPECT_EQ(p12.head.port, 0);
  EXPECT_GT(p12.head.max_comms, 0);
  EXPECT_EQ(p12.head.max_recvs, 1);
  EXPECT_EQ(p12.head.net_device_type, abi::kDeviceHost);
  EXPECT_EQ(p12.head.net_device_version, 0);
  EXPECT_EQ(p12.vprops.ndevs, 1);
  EXPECT_EQ(p12.vprops.devs[0], 0);
  for (int i = 1; i < 8; ++i) EXPECT_EQ(p12.vprops.devs[i], 0);
  EXPECT_EQ(p12.max_p2p_bytes, static_cast<size_t>(INT_MAX));  // test() reports int sizes
  EXPECT_EQ(p12.max_coll_bytes, static_cast<size_t>(INT_MAX));
  EXPECT_EQ(p12.max_multi_request_size, 1);
  EXPECT_EQ(p12.rail_id, -1);
  EXPECT_EQ(p12.plane_id, -1);

  abi::PropertiesV11 p11;
  std::memset(&p11, 0xA5, sizeof(p11));
  ASSERT_EQ(lib.v11()->get_properties(0, &p11), abi::kSuccess);
  EXPECT_EQ(p11.head.speed, 1000);
  EXPECT_EQ(p11.vprops.ndevs, 1);
  EXPECT_EQ(p11.max_p2p_bytes, static_cast<size_t>(INT_MAX));
  EXPECT_EQ(p11.max_multi_request_size, 1);

  abi::PropertiesV10 p10;
  std::memset(&p10, 0xA5, sizeof(p10));
  ASSERT_EQ(lib.v10()->get_properties(0, &p10), abi::kSuccess);
  EXPECT_EQ(p10.head.speed, 1000);
  EXPECT_EQ(p10.max_coll_bytes, static_cast<size_t>(INT_MAX));

  EXPECT_NE(lib.v12()->get_properties(1, &p12), abi::kSuccess);  // one device
  EXPECT_EQ(lib.v12()->finalize(ctx), abi::kSuccess);

  // Explicit values win over the emulated link's.
  ::setenv("LOWCOMM_NCCL_SPEED_MBPS", "25000", 1);
  ::setenv("LOWCOMM_NCCL_LATENCY_US", "12.5", 1);
  ctx = init_ctx(lib.v12());
  ASSERT_NE(ctx, nullptr);
  ASSERT_EQ(lib.v12()->get_properties(0, &p12), abi::kSuccess);
  EXPECT_EQ(p12.head.speed, 25000);
  EXPECT_FLOAT_EQ(p12.head.latency, 12.5f);
  lib.v12()->finalize(ctx);
  ::unsetenv("LOWCOMM_NCCL_SPEED_MBPS");
  ::unsetenv("LOWCOMM_NCCL_LATENCY_US");
}

TEST_F(NcclNetPlugin, InitRefusesToRunWithoutASecretAndSaysWhy) {
  PluginLib lib;
  ::unsetenv("LOWCOMM_SECRET");
  void* ctx = reinterpret_cast<void*>(1);
  abi::CommConfig config{-1};
  EXPECT_EQ(lib.v12()->init(&ctx, 1, &config, driver_logger, nullptr), abi::kInvalidUsage);
  EXPECT_EQ(ctx, nullptr);
  EXPECT_NE(take_last_warn().find("LOWCOMM_SECRET"), std::string::npos);
  EXPECT_EQ(lib.v12()->finalize(ctx), abi::kSuccess);  // NCCL finalizes a failed init too

  // A secret file readable by others is refused; mode 600 is taken.
  const std::string path = ::testing::TempDir() + "/lowcomm-secret-" + std::to_string(getpid());
  { std::ofstream(path) << kSecret << "\n"; }
  ::chmod(path.c_str(), 0644);
  ::setenv("LOWCOMM_SECRET_FILE", path.c_str(), 1);
  EXPECT_EQ(lib.v12()->init(&ctx, 1, &config, driver_logger, nullptr), abi::kInvalidUsage);
  EXPECT_NE(take_last_warn().find("chmod 600"), std::string::npos);
  ::chmod(path.c_str(), 0600);
  ASSERT_EQ(lib.v12()->init(&ctx, 1, &config, driver_logger, nullptr), abi::kSuccess);
  lib.v12()->finalize(ctx);
  ::unlink(path.c_str());
  // Bad option values name the variable.
  ::setenv("LOWCOMM_SECRET", kSecret, 1);
  ::unsetenv("LOWCOMM_SECRET_FILE");
  ::setenv("LOWCOMM_STREAMS", "0", 1);
  EXPECT_EQ(lib.v12()->init(&ctx, 1, &config, driver_logger, nullptr), abi::kInvalidUsage);
  EXPECT_NE(take_last_warn().find("LOWCOMM_STREAMS"), std::string::npos);
  ::unsetenv("LOWCOMM_STREAMS");
}

TEST_F(NcclNetPlugin, OneThreadDrivesBothEndsLikeNcclsBootstrap) {
  PluginLib lib;
  const abi::NetV12* net = lib.v12();
  void* a = init_ctx(net, 1);
  void* b = init_ctx(net, 2);
  ASSERT_TRUE(a && b);
  void *send = nullptr, *recv = nullptr;
  ASSERT_TRUE(local_pair(net, a, b, &send, &recv)) << take_last_warn();
  // A receive larger than the send reports the send's size; empty sends complete.
  EXPECT_EQ(transfer(net, send, recv, 1000, 4096), 1000);
  EXPECT_EQ(transfer(net, send, recv, 0, 16), 0);
  EXPECT_EQ(transfer(net, send, recv, 0, 0), 0);
  EXPECT_EQ(transfer(net, send, recv, 3 << 20, 3 << 20), 3 << 20);
  // A send larger than the posted receive is NCCL's "message truncated": an error, no write.
  int rc = 0;
  EXPECT_EQ(transfer(net, send, recv, 5000, 4000, &rc), -2);
  EXPECT_EQ(rc, abi::kInvalidUsage);
  EXPECT_NE(take_last_warn().find("length mismatch"), std::string::npos);
  // The connection carries on.
  EXPECT_EQ(transfer(net, send, recv, 777, 1024), 777);
  // irecv with several buffers is refused (maxRecvs is 1); iflush has nothing to do.
  void* bufs[2] = {nullptr, nullptr};
  size_t sizes[2] = {0, 0};
  int tags[2] = {0, 0};
  void* mh[2] = {nullptr, nullptr};
  void* req = nullptr;
  EXPECT_EQ(net->irecv(recv, 2, bufs, sizes, tags, mh, nullptr, &req), abi::kInternalError);
  int fsizes[1] = {0};
  EXPECT_EQ(net->iflush(recv, 1, bufs, fsizes, mh, &req), abi::kSuccess);
  EXPECT_EQ(req, nullptr);
  EXPECT_EQ(net->close_send(send), abi::kSuccess);
  EXPECT_EQ(net->close_recv(recv), abi::kSuccess);
  EXPECT_EQ(net->finalize(a), abi::kSuccess);
  EXPECT_EQ(net->finalize(b), abi::kSuccess);
}

TEST_F(NcclNetPlugin, CompressedMessagesArriveIntactWhateverTheSetting) {
  for (const char* setting : {"lz4", "zstd", "zstd:3", "auto"}) {
    for (const char* shuffle : {"0", "4"}) {
      ::setenv("LOWCOMM_NCCL_COMPRESS", setting, 1);
      ::setenv("LOWCOMM_NCCL_SHUFFLE", shuffle, 1);
      PluginLib lib;
      const abi::NetV12* net = lib.v12();
      void* a = init_ctx(net, 1);
      ASSERT_NE(a, nullptr) << take_last_warn();
      ::unsetenv("LOWCOMM_NCCL_COMPRESS");  // the receiver learns framing from the preamble
      ::unsetenv("LOWCOMM_NCCL_SHUFFLE");
      void* b = init_ctx(net, 2);
      void *send = nullptr, *recv = nullptr;
      ASSERT_TRUE(b && local_pair(net, a, b, &send, &recv));
      std::mt19937 rng(3);
      const int messages = std::clamp(transfers_each_way() / 125, 10, 40);
      for (int i = 0; i < messages; ++i) {
        const size_t n = i % 8 == 0 ? 0 : rng() % (3u << 20);
        const size_t posted = n + rng() % 100;
        auto out = i % 2 ? gradient_like(n, static_cast<uint32_t>(i))
                         : std::vector<uint8_t>(n, static_cast<uint8_t>(i));
        if (i % 5 == 0) fill(out.data(), n, static_cast<uint64_t>(i));  // incompressible
        std::vector<uint8_t> in(posted + 1, 0xEE);
        void* data = in.data();
        size_t size = posted;
        int tag = 0;
        void *rreq = nullptr, *sreq = nullptr;
        ASSERT_EQ(net->irecv(recv, 1, &data, &size, &tag, nullptr, nullptr, &rreq), 0);
        ASSERT_EQ(net->isend(send, out.data(), n, 0, nullptr, nullptr, &sreq), 0);
        int got = -1, sent = -1, rc = 0;
        ASSERT_TRUE(wait_request(net, sreq, &sent, &rc)) << take_last_warn();
        ASSERT_TRUE(wait_request(net, rreq, &got, &rc)) << take_last_warn();
        ASSERT_EQ(sent, static_cast<int>(n));
        ASSERT_EQ(got, static_cast<int>(n)) << setting << " message " << i;
        ASSERT_TRUE(std::equal(out.begin(), out.end(), in.begin())) << setting << " " << i;
        ASSERT_EQ(in[n], 0xEE);
      }
      net->close_send(send);
      net->close_recv(recv);
      net->finalize(a);
      net->finalize(b);
    }
  }
  ::setenv("LOWCOMM_NCCL_COMPRESS", "gzip", 1);
  PluginLib lib;
  EXPECT_EQ(init_ctx(lib.v12()), nullptr);
  EXPECT_NE(take_last_warn().find("LOWCOMM_NCCL_COMPRESS"), std::string::npos);
  ::unsetenv("LOWCOMM_NCCL_COMPRESS");
}

TEST_F(NcclNetPlugin, ConnectAndAcceptFromTwoThreadsAndTheV11AndV10Tables) {
  PluginLib lib;
  const abi::NetV11* net = lib.v11();
  void* a = init_ctx(net, 1);
  void* b = init_ctx(net, 2);
  ASSERT_TRUE(a && b);
  char handle[abi::kHandleMaxBytes] = {};
  void* listen = nullptr;
  ASSERT_EQ(net->listen(b, 0, handle, &listen), abi::kSuccess);
  void *send = nullptr, *recv = nullptr, *unused_s = nullptr, *unused_r = nullptr;
  int rc_s = 0, rc_r = 0;
  std::thread connector([&] { connect_loop(net, a, handle, nullptr, &send, &unused_s, &rc_s); });
  connect_loop(net, nullptr, nullptr, listen, &unused_r, &recv, &rc_r);
  connector.join();
  ASSERT_TRUE(send && recv) << rc_s << " " << rc_r;
  net->close_listen(listen);
  EXPECT_EQ(transfer(net, send, recv, 12345, 65536), 12345);
  net->close_send(send);
  net->close_recv(recv);
  net->finalize(a);
  net->finalize(b);

  // v10: one process-wide context from init(logger, profiler).
  const abi::NetV10* v10 = lib.v10();
  ASSERT_EQ(v10->init(driver_logger, nullptr), abi::kSuccess);
  ASSERT_EQ(v10->listen(0, handle, &listen), abi::kSuccess);
  abi::CommConfig config{-1};
  abi::DeviceHandle* dev = nullptr;
  send = recv = nullptr;
  for (int i = 0; i < 100000 && (!send || !recv); ++i) {
    if (!send) {
      ASSERT_EQ(v10->connect(0, &config, handle, &send, &dev), abi::kSuccess);
    }
    if (!recv) {
      ASSERT_EQ(v10->accept(listen, &recv, &dev), abi::kSuccess);
    }
    std::this_thread::yield();
  }
  ASSERT_TRUE(send && recv);
  v10->close_listen(listen);
  EXPECT_EQ(transfer(v10, send, recv, 4096, 4096), 4096);
  v10->close_send(send);
  v10->close_recv(recv);
}

TEST_F(NcclNetPlugin, TwoProcessesTenThousandRandomTransfersVerified) {
  const int n = transfers_each_way();
  auto [a, b] = run_two([n](Channel ch) { return stream_rank(ch, 0, n); },
                        [n](Channel ch) { return stream_rank(ch, 1, n); }, 600);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 0);
}

TEST_F(NcclNetPlugin, TwoProcessesCompressedStreamVerified) {
  auto compress = [] { ::setenv("LOWCOMM_NCCL_COMPRESS", "lz4", 1); };
  const int n = std::min(500, transfers_each_way());
  auto [a, b] = run_two([n](Channel ch) { return stream_rank(ch, 0, n); },
                        [n](Channel ch) { return stream_rank(ch, 1, n); }, 600, compress, compress);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 0);
}

TEST_F(NcclNetPlugin, ClosingWithRequestsInFlightNeitherCrashesNorHangs) {
  auto receiver = [](Channel ch) {
    RankComms c;
    if (connect_ranks(ch, c)) return 1;
    const abi::NetV12* net = c.net();
    std::vector<std::vector<uint8_t>> bufs(abi::kMaxRequests, std::vector<uint8_t>(1 << 20));
    std::vector<void*> reqs;
    for (auto& b : bufs) {
      void* r = nullptr;
      DRIVER_CHECK(post_recv(net, c.recv, b.data(), b.size(), &r) == 0 && r);
      reqs.push_back(r);
    }
    // The 33rd is refused with a null request (NCCL retries), not an error.
    void* data = bufs[0].data();
    size_t size = 16;
    int tag = 0;
    void* extra = reinterpret_cast<void*>(1);
    DRIVER_CHECK(net->irecv(c.recv, 1, &data, &size, &tag, nullptr, nullptr, &extra) == 0);
    DRIVER_CHECK(extra == nullptr);
    int size_got = 0, rc = 0;
    DRIVER_CHECK(wait_request(net, reqs[0], &size_got, &rc) && size_got == 1 << 20);
    char go = 1;
    ch.send(&go, 1);
    // 31 receives still posted, data arriving: close under them.
    DRIVER_CHECK(c.close() == 0);
    return 0;
  };
  auto sender = [](Channel ch) {
    RankComms c;
    if (connect_ranks(ch, c)) return 1;
    const abi::NetV12* net = c.net();
    std::vector<uint8_t> buf(1 << 20, 3);
    void* r = nullptr;
    DRIVER_CHECK(post_send(net, c.send, buf.data(), buf.size(), &r) == 0 && r);
    std::vector<void*> more;
    for (int i = 0; i < 8; ++i) {
      void* q = nullptr;
      DRIVER_CHECK(post_send(net, c.send, buf.data(), buf.size(), &q) == 0);
      if (q) more.push_back(q);
    }
    // NCCL's progress thread tests the oldest request until it is done (sends wait for the
    // receiver's credits and are posted by these calls).
    int sent = 0, rc = 0;
    DRIVER_CHECK(wait_request(net, r, &sent, &rc) && sent == 1 << 20);
    char go = 0;
    ch.recv(&go, 1);
    // Requests in flight (or done, unseen): close without testing them.
    DRIVER_CHECK(c.close() == 0);
    return 0;
  };
  auto [a, b] = run_two(receiver, sender, 60);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 0);
}

TEST_F(NcclNetPlugin, ASenderClosingRightAfterItsLastSendLosesNothing) {
  // Over the emulated WAN the sends complete when their bytes leave and run ahead of the
  // receiver's credits (eager window); the sender then closes at once, while the receiver posts
  // its receives late. Every message must still arrive intact.
  auto receiver = [](Channel ch) {
    RankComms c;
    if (connect_ranks(ch, c)) return 1;
    const abi::NetV12* net = c.net();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (int i = 0; i < 8; ++i) {
      std::vector<uint8_t> in(1 << 20);
      void* r = nullptr;
      int got = 0, rc = 0;
      DRIVER_CHECK(post_recv(net, c.recv, in.data(), in.size(), &r) == 0 && r);
      DRIVER_CHECK(wait_request(net, r, &got, &rc), "message %d: %s", i, take_last_warn().c_str());
      DRIVER_CHECK(got == 1 << 20 && first_mismatch(in.data(), in.size(), 50 + i) == in.size());
    }
    DRIVER_CHECK(c.close() == 0);
    return 0;
  };
  auto sender = [](Channel ch) {
    RankComms c;
    if (connect_ranks(ch, c)) return 1;
    const abi::NetV12* net = c.net();
    std::vector<std::vector<uint8_t>> out(8, std::vector<uint8_t>(1 << 20));
    for (int i = 0; i < 8; ++i) {
      fill(out[i].data(), out[i].size(), 50 + static_cast<uint64_t>(i));
      void* r = nullptr;
      DRIVER_CHECK(post_send(net, c.send, out[i].data(), out[i].size(), &r) == 0);
      int sent = 0, rc = 0;
      DRIVER_CHECK(r && wait_request(net, r, &sent, &rc));
    }
    DRIVER_CHECK(c.close() == 0);
    return 0;
  };
  auto wan = [] { ::setenv("LOWCOMM_WAN", "bw=1gbit,rtt=40ms", 1); };
  auto [a, b] = run_two(receiver, sender, 60, wan, wan);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 0);
}

TEST_F(NcclNetPlugin, AKilledPeerFailsTheRequestsInsteadOfHanging) {
  auto survivor = [](Channel ch) {
    RankComms c;
    if (connect_ranks(ch, c)) return 1;
    const abi::NetV12* net = c.net();
    // Two receives: the victim's one message may land in the first before it dies (how far
    // its send got is a race), but nothing is ever sent for the second, which must fail.
    std::vector<uint8_t> big(64 << 20), more(64 << 20);
    void* first = nullptr;
    DRIVER_CHECK(post_recv(net, c.recv, big.data(), big.size(), &first) == 0 && first);
    void* r = nullptr;
    DRIVER_CHECK(post_recv(net, c.recv, more.data(), more.size(), &r) == 0 && r);
    std::vector<uint8_t> out(8 << 20, 1);
    void* s = nullptr;
    DRIVER_CHECK(post_send(net, c.send, out.data(), out.size(), &s) == 0 && s);
    char go = 1;
    ch.send(&go, 1);  // the peer dies now
    int got = 0, rc = 0;
    auto t0 = Clock::now();
    (void)wait_request(net, first, &got, &rc, std::chrono::seconds(30));  // either way
    bool ok = wait_request(net, r, &got, &rc, std::chrono::seconds(30));
    double took = std::chrono::duration<double>(Clock::now() - t0).count();
    DRIVER_CHECK(!ok && rc != abi::kSuccess, "the receive %s", ok ? "completed" : "timed out");
    DRIVER_CHECK(took < 20, "noticed only after %.1f s", took);
    std::string why = take_last_warn();
    DRIVER_CHECK(why.find("peer") != std::string::npos, "WARN: %s", why.c_str());
    DRIVER_CHECK(c.close() == 0);
    return 0;
  };
  auto victim = [](Channel ch) {
    RankComms c;
    if (connect_ranks(ch, c)) return 1;
    const abi::NetV12* net = c.net();
    // Half a message out, then death.
    std::vector<uint8_t> out(64 << 20, 2);
    void* s = nullptr;
    DRIVER_CHECK(post_send(net, c.send, out.data(), 32 << 20, &s) == 0);
    char go = 0;
    ch.recv(&go, 1);
    ::raise(SIGKILL);
    return 1;
  };
  auto [a, b] = run_two(survivor, victim, 60);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 128 + SIGKILL);
}

// A frozen peer (SIGSTOP: its sockets stay open) fails the receives waiting on it within
// seconds (LOWCOMM_FAILURE_TIMEOUT_MS), where NCCL would otherwise wait for torch's watchdog.
TEST_F(NcclNetPlugin, AFrozenPeerFailsTheRequestsWithinSeconds) {
  auto survivor = [](Channel ch) {
    RankComms c;
    if (connect_ranks(ch, c)) return 1;
    const abi::NetV12* net = c.net();
    std::vector<uint8_t> in(1 << 20);
    void* r = nullptr;
    DRIVER_CHECK(post_recv(net, c.recv, in.data(), in.size(), &r) == 0 && r);
    char go = 1;
    ch.send(&go, 1);
    pid_t frozen = 0;
    ch.recv(&frozen, sizeof(frozen));  // it stops itself right after
    int got = 0, rc = 0;
    auto t0 = Clock::now();
    bool ok = wait_request(net, r, &got, &rc, std::chrono::seconds(30));
    double took = std::chrono::duration<double>(Clock::now() - t0).count();
    ::kill(frozen, SIGKILL);
    DRIVER_CHECK(!ok && rc != abi::kSuccess, "the receive %s", ok ? "completed" : "timed out");
    DRIVER_CHECK(took < 10, "noticed only after %.1f s", took);
    std::string why = take_last_warn();
    DRIVER_CHECK(why.find("frozen or cut off") != std::string::npos, "WARN: %s", why.c_str());
    DRIVER_CHECK(c.close() == 0);
    return 0;
  };
  auto victim = [](Channel ch) {
    RankComms c;
    if (connect_ranks(ch, c)) return 1;
    char go = 0;
    ch.recv(&go, 1);
    pid_t me = ::getpid();
    ch.send(&me, sizeof(me));
    ::raise(SIGSTOP);  // until the survivor kills it
    return 1;
  };
  auto fast = [] { ::setenv("LOWCOMM_FAILURE_TIMEOUT_MS", "600", 1); };
  auto [a, b] = run_two(survivor, victim, 60, fast, fast);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 128 + SIGKILL);
}

TEST_F(NcclNetPlugin, AWrongSecretIsRefusedOnBothSides) {
  auto listener = [](Channel ch) {
    PluginLib lib;
    const abi::NetV12* net = lib.v12();
    void* ctx = init_ctx(net);
    DRIVER_CHECK(ctx);
    char handle[abi::kHandleMaxBytes] = {};
    void* listen = nullptr;
    DRIVER_CHECK(net->listen(ctx, 0, handle, &listen) == 0);
    DRIVER_CHECK(ch.send(handle, sizeof(handle)));
    void *recv = nullptr, *unused = nullptr;
    int rc = 0;
    auto t0 = Clock::now();
    bool ok =
        connect_loop(net, nullptr, nullptr, listen, &unused, &recv, &rc, std::chrono::seconds(20));
    double took = std::chrono::duration<double>(Clock::now() - t0).count();
    DRIVER_CHECK(!ok && rc == abi::kRemoteError && !recv, "accept: ok %d rc %d", ok, rc);
    DRIVER_CHECK(took < 10, "refused only after %.1f s", took);
    std::string why = take_last_warn();
    DRIVER_CHECK(why.find("LOWCOMM_SECRET") != std::string::npos, "WARN: %s", why.c_str());
    net->close_listen(listen);
    net->finalize(ctx);
    return 0;
  };
  auto intruder = [](Channel ch) {
    PluginLib lib;
    const abi::NetV12* net = lib.v12();
    void* ctx = init_ctx(net);
    DRIVER_CHECK(ctx);
    char handle[abi::kHandleMaxBytes] = {};
    DRIVER_CHECK(ch.recv(handle, sizeof(handle)));
    void *send = nullptr, *unused = nullptr;
    int rc = 0;
    bool ok = connect_loop(net, ctx, handle, nullptr, &send, &unused, &rc);
    DRIVER_CHECK(!ok && rc != abi::kSuccess && !send, "connect: ok %d rc %d", ok, rc);
    std::string why = take_last_warn();
    DRIVER_CHECK(why.find("authentic") != std::string::npos, "WARN: %s", why.c_str());
    net->finalize(ctx);
    return 0;
  };
  auto [a, b] = run_two(
      listener, intruder, 60, [] { ::setenv("LOWCOMM_HANDSHAKE_TIMEOUT_S", "2", 1); },
      [] { ::setenv("LOWCOMM_SECRET", "not-the-secret", 1); });
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 0);
}

TEST_F(NcclNetPlugin, ALaggingReceiverHoldsTheSenderBackBeyondTheEagerWindow) {
  ::setenv("LOWCOMM_NCCL_EAGER_BYTES", "8M", 1);
  PluginLib lib;
  const abi::NetV12* net = lib.v12();
  void* a = init_ctx(net, 1);
  void* b = init_ctx(net, 2);
  ::unsetenv("LOWCOMM_NCCL_EAGER_BYTES");
  void *send = nullptr, *recv = nullptr;
  ASSERT_TRUE(a && b && local_pair(net, a, b, &send, &recv));
  constexpr int kMessages = 8;
  constexpr size_t kBytes = 4u << 20;
  std::vector<std::vector<uint8_t>> out(kMessages, std::vector<uint8_t>(kBytes));
  std::vector<void*> sends(kMessages, nullptr);
  for (int i = 0; i < kMessages; ++i) {
    fill(out[i].data(), kBytes, static_cast<uint64_t>(i));
    ASSERT_EQ(net->isend(send, out[i].data(), kBytes, 0, nullptr, nullptr, &sends[i]), 0);
    ASSERT_NE(sends[i], nullptr);
  }
  // No receive posted: two messages (8 MiB) go ahead; the third waits for a credit. Tested
  // oldest first, as NCCL does.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int done_sends = 0;
  for (; done_sends < kMessages; ++done_sends) {
    int done = 0, size = 0;
    ASSERT_EQ(net->test(sends[done_sends], &done, &size), 0) << take_last_warn();
    if (!done) break;
  }
  EXPECT_EQ(done_sends, 2);
  // The receiver catches up: everything arrives, intact and in order.
  std::vector<std::vector<uint8_t>> in(kMessages, std::vector<uint8_t>(kBytes));
  std::vector<void*> recvs(kMessages, nullptr);
  for (int i = 0; i < kMessages; ++i) {
    void* data = in[i].data();
    size_t size = kBytes;
    int tag = 0;
    ASSERT_EQ(net->irecv(recv, 1, &data, &size, &tag, nullptr, nullptr, &recvs[i]), 0);
  }
  for (int i = 0; i < kMessages; ++i) {
    int got = 0, rc = 0;
    if (i >= done_sends) {
      ASSERT_TRUE(wait_request(net, sends[i], &got, &rc)) << rc;
    }
    ASSERT_TRUE(wait_request(net, recvs[i], &got, &rc)) << rc;
    EXPECT_EQ(got, static_cast<int>(kBytes));
    EXPECT_EQ(first_mismatch(in[i].data(), kBytes, static_cast<uint64_t>(i)), kBytes);
  }
  net->close_send(send);
  net->close_recv(recv);
  net->finalize(a);
  net->finalize(b);
}

TEST_F(NcclNetPlugin, RepeatedInitFinalizeAndDlcloseLeaveNoThreadBehind) {
  const int baseline = count_threads();
  for (int round = 0; round < 12; ++round) {
    {
      PluginLib lib;
      void* a = nullptr;
      void* b = nullptr;
      void *send = nullptr, *recv = nullptr;
      if (round % 2 == 0) {
        a = init_ctx(lib.v12(), 1);
        b = init_ctx(lib.v12(), 2);
        ASSERT_TRUE(a && b && local_pair(lib.v12(), a, b, &send, &recv));
        EXPECT_EQ(transfer(lib.v12(), send, recv, 100000, 100000), 100000);
      } else {
        a = init_ctx(lib.v11(), 1);
        b = init_ctx(lib.v11(), 2);
        ASSERT_TRUE(a && b && local_pair(lib.v11(), a, b, &send, &recv));
        EXPECT_EQ(transfer(lib.v11(), send, recv, 100000, 100000), 100000);
      }
      lib.v12()->close_send(send);
      lib.v12()->close_recv(recv);
      lib.v12()->finalize(a);
      EXPECT_GT(count_threads(), baseline);  // b still holds the engine
      lib.v12()->finalize(b);
      EXPECT_EQ(count_threads_settled(baseline), baseline) << "round " << round;  // joined
    }
  }
  {
    // v10 has no finalize: unloading the library ends its context and thread.
    PluginLib lib;
    ASSERT_EQ(lib.v10()->init(driver_logger, nullptr), abi::kSuccess);
    EXPECT_GT(count_threads(), baseline);
  }
  EXPECT_EQ(count_threads_settled(baseline), baseline);
}

TEST_F(NcclNetPlugin, ManyCommunicatorsFromManyThreadsAtOnce) {
  PluginLib lib;
  const abi::NetV12* net = lib.v12();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      void* a = init_ctx(net, 100 + static_cast<uint64_t>(t));
      void* b = init_ctx(net, 200 + static_cast<uint64_t>(t));
      void *send = nullptr, *recv = nullptr;
      if (!a || !b || !local_pair(net, a, b, &send, &recv)) {
        ++failures;
        return;
      }
      std::mt19937 rng(static_cast<uint32_t>(t));
      for (int i = 0; i < 60; ++i) {
        size_t n = rng() % (1u << 20);
        if (transfer(net, send, recv, n, n + rng() % 64, nullptr, rng()) != static_cast<int>(n))
          ++failures;
      }
      net->close_send(send);
      net->close_recv(recv);
      net->finalize(a);
      net->finalize(b);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace lowcomm::nccl_net::testing
