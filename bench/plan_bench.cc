// The time to plan owner shares (topology/shares.h): plan_shares over P ranks' rates (the
// bisection and the integer parts), and one SharePlanner::observe (plan, hysteresis, hash), at
// P = 4 .. 256. Every rank runs it after each large flat all-reduce whose rates it may use.
//   build/bin/lowcomm-plan-bench

#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "topology/shares.h"

namespace lowcomm::topology {
namespace {

// Rates spread over a decade, a few ranks 4x slower (bytes/s).
std::vector<double> rates(int64_t P) {
  std::vector<double> r(static_cast<size_t>(P));
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (auto& v : r) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = 1.25e7 * (1 + static_cast<double>(x % 1000) / 111.0);
  }
  r[0] /= 4;
  return r;
}

void BM_PlanShares(benchmark::State& state) {
  const auto r = rates(state.range(0));
  for (auto _ : state) {
    SharePlan p = plan_shares(r);
    benchmark::DoNotOptimize(p.parts.data());
  }
}
BENCHMARK(BM_PlanShares)->Arg(4)->Arg(8)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

void BM_ObserveReplan(benchmark::State& state) {
  const auto r = rates(state.range(0));
  std::vector<uint16_t> a, b;
  for (double v : r) {
    a.push_back(encode_rate(v));
    b.push_back(encode_rate(v * 1.5));
  }
  b[1] = encode_rate(r[1] / 8);  // another slow rank: a real re-plan each time
  for (auto _ : state) {
    SharePlanner s;
    benchmark::DoNotOptimize(s.observe(a));
    benchmark::DoNotOptimize(s.observe(b));
  }
}
BENCHMARK(BM_ObserveReplan)->Arg(4)->Arg(64)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace lowcomm::topology

BENCHMARK_MAIN();
