// The plugin driver's two-process random-transfer stream with bits flipped in received payload
// bytes (tests/tools/recv_bitflip.cc, linked in: it interposes recv(2) for the dlopened plugin
// too): 1% of each process's payload reads get one bit flipped after the kernel delivered them.
// Every altered chunk fails its check and is sent again (docs/transport.md, "Re-sends"), so
// every message of the stream arrives byte for byte as sent and no request fails.

#include <gtest/gtest.h>

#include <cstdint>

#include "driver_util.h"
#include "stream_rank.h"

extern "C" void lowcomm_test_flip_configure(double rate, uint64_t seed);
extern "C" uint64_t lowcomm_test_flip_count();

namespace lowcomm::nccl_net::testing {
namespace {

// A stream rank whose payload reads are flipped once its connections stand: fails (non-zero)
// if any message is lost or altered, or if no flip happened (the test would prove nothing).
int flipped_stream_rank(Channel ch, int me, int count) {
  lowcomm_test_flip_configure(0.01, 4242 + static_cast<uint64_t>(me));
  const int rc = stream_rank(ch, me, count);
  const uint64_t flips = lowcomm_test_flip_count();
  lowcomm_test_flip_configure(0, 0);
  std::fprintf(stderr, "[driver %d] rank %d: %llu payload reads flipped\n",
               static_cast<int>(getpid()), me, static_cast<unsigned long long>(flips));
  DRIVER_CHECK(rc == 0);
  DRIVER_CHECK(flips > 0, "no read was flipped");
  return 0;
}

TEST(NcclNetPluginBitFlip, FlippedPayloadReadsAreSentAgainAndEveryTransferArrivesExact) {
  plugin_env();
  const int n = std::min(500, transfers_each_way());
  auto [a, b] = run_two([n](Channel ch) { return flipped_stream_rank(ch, 0, n); },
                        [n](Channel ch) { return flipped_stream_rank(ch, 1, n); }, 600);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 0);
}

}  // namespace
}  // namespace lowcomm::nccl_net::testing
