// The per-core rate of the transport's payload checks (payload_guard.h), on the 512 KiB chunks
// the transport sends: XXH3-128 (integrity, always on) and AES-256-GCM (LOWCOMM_ENCRYPT=1), the
// sender's protect() and the receiver's update()+finish(). bytes_per_second is payload bytes.
//   build/bin/lowcomm-payload-guard-bench

#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "transport/chunk_header.h"
#include "transport/payload_guard.h"

namespace lowcomm::transport {
namespace {

constexpr size_t kChunk = 512 << 10;

StreamKeys keys(bool sealed) {
  StreamKeys k;
  k.sealed = sealed;
  for (size_t i = 0; i < k.send.size(); ++i) k.send[i] = k.recv[i] = static_cast<uint8_t>(i * 7);
  return k;
}

void BM_Protect(benchmark::State& state) {
  const bool sealed = state.range(0) != 0;
  PayloadSealer tx;
  if (!tx.init(keys(sealed))) state.SkipWithError("init failed");
  std::vector<uint8_t> in(kChunk, 0x5A), out(kChunk);
  uint8_t header[kChunkHeaderBytes];
  write_chunk_header({static_cast<uint32_t>(kChunk), 1, 0, kChunk, 0, sealed ? 1u : 0u}, header);
  for (auto _ : state) {
    if (!tx.protect(header, in.data(), out.data(), kChunk)) state.SkipWithError("protect failed");
    benchmark::DoNotOptimize(header);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(kChunk));
  state.SetLabel(sealed ? "aes-256-gcm seal" : "xxh3-128");
}

void BM_Open(benchmark::State& state) {
  const bool sealed = state.range(0) != 0;
  PayloadSealer tx;
  PayloadOpener rx;
  if (!tx.init(keys(sealed)) || !rx.init(keys(sealed))) state.SkipWithError("init failed");
  std::vector<uint8_t> plain(kChunk, 0x5A), wire(kChunk), buf(kChunk);
  uint8_t header[kChunkHeaderBytes];
  write_chunk_header({static_cast<uint32_t>(kChunk), 1, 0, kChunk, 0, sealed ? 1u : 0u}, header);
  // One sealed record per iteration: the nonce advances on both sides in step.
  for (auto _ : state) {
    state.PauseTiming();
    if (!tx.protect(header, plain.data(), wire.data(), kChunk)) state.SkipWithError("protect");
    buf = sealed ? wire : plain;
    state.ResumeTiming();
    if (!rx.begin(header) || !rx.update(buf.data(), kChunk)) state.SkipWithError("open failed");
    auto ok = rx.finish();
    if (!ok || !*ok) state.SkipWithError("check failed");
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(kChunk));
  state.SetLabel(sealed ? "aes-256-gcm open" : "xxh3-128 verify");
}

BENCHMARK(BM_Protect)->Arg(0)->Arg(1)->ArgName("sealed");
BENCHMARK(BM_Open)->Arg(0)->Arg(1)->ArgName("sealed");

}  // namespace
}  // namespace lowcomm::transport

BENCHMARK_MAIN();
