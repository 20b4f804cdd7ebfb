#!/usr/bin/env bash
# Builds the frame decoder fuzzer (clang, libFuzzer, ASan + UBSan) in build-fuzz and runs it for
# a bounded time. Exits non-zero on any crash, sanitizer report or broken invariant; the
# offending input is left in build-fuzz/fuzz-artifacts/.
#
# Usage: scripts/fuzz.sh [seconds]      (default 60)
#   LOWCOMM_FUZZ_BUILD=dir  build directory (default build-fuzz)
#   LOWCOMM_FUZZ_ARGS=...   extra libFuzzer flags, e.g. "-jobs=2 -workers=2"
# The growing corpus lives in fuzz-corpus/decode (ignored by git) and is reused across runs.
set -euo pipefail

seconds=${1:-60}
if ! [[ $seconds =~ ^[0-9]+$ ]] || [[ $seconds -eq 0 ]]; then
  echo "usage: $0 [seconds > 0]" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
build=${LOWCOMM_FUZZ_BUILD:-$root/build-fuzz}

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DLOWCOMM_CUDA=OFF \
  -DLOWCOMM_SANITIZE=address,undefined -DLOWCOMM_FUZZ=ON \
  -DLOWCOMM_BUILD_TESTS=OFF -DLOWCOMM_BUILD_BENCH=OFF >/dev/null
ninja -C "$build" lowcomm_decode_fuzzer lowcomm_fuzz_seeds

seeds=$build/fuzz-seeds
corpus=$root/fuzz-corpus/decode
artifacts=$build/fuzz-artifacts
rm -rf "$seeds"
mkdir -p "$seeds" "$corpus" "$artifacts"
"$build/bin/lowcomm_fuzz_seeds" "$seeds"

echo "fuzzing parse_frame/decode_frame for ${seconds}s"
# shellcheck disable=SC2086
"$build/bin/lowcomm_decode_fuzzer" -max_total_time="$seconds" -timeout=20 -max_len=16384 \
  -print_final_stats=1 -artifact_prefix="$artifacts/" ${LOWCOMM_FUZZ_ARGS:-} "$corpus" "$seeds"
