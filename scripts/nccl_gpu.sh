#!/usr/bin/env bash
# The NCCL net plugin with real NCCL, on a GPU machine, in one command (docs/nccl-plugin.md).
#
#   BUILD=build-gpu scripts/nccl_gpu.sh        # from the repository root
#
# Needs, in $BUILD, lib/libnccl-net-lowcomm.so and bin/nccl_net_allreduce, and optionally
# bin/nccl_net_plugin_test (the GPU-free driver, run here too), built on a development machine
# with the CUDA toolkit (the three are self-contained: copy just lib/ and bin/):
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOWCOMM_CUDA=ON \
#     -DCMAKE_CUDA_ARCHITECTURES=90 -DLOWCOMM_BUILD_BENCH=OFF
#   cmake --build build-gpu --target nccl_net_lowcomm nccl_net_allreduce nccl_net_plugin_test On the machine: a
# GPU, python3 with torch (its nvidia-nccl package is "torch's NCCL"), and optionally the CUDA
# toolkit's libnccl.so.2 ("the toolkit's NCCL").
#
# Two processes share GPU 0 and play two nodes (a different NCCL_HOSTID each, so NCCL uses its
# network transport). For each NCCL found and through torch's "nccl" process group it runs an
# all-reduce through the plugin (NCCL_NET=lowcomm: no silent fallback), unshaped and over the
# emulated 1 Gbit/s 100 ms link (LOWCOMM_WAN), and NCCL's built-in Socket transport for
# comparison; where `tc` can shape loopback (netem), Socket and the plugin also run over the
# same kernel-shaped link. Every result is checked element by element, and the logs must show
# NCCL selecting the plugin. Output: $OUT (or results/nccl-gpu-<time>/): per-case logs and
# JSON lines, summary.jsonl, summary.txt. Exits non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

BUILD=${BUILD:-build-gpu}
OUT=${OUT:-results/nccl-gpu-$(date -u +%Y%m%dT%H%M%SZ)}
SIZES=${SIZES:-1M,16M,256M}
WAN_SIZES=${WAN_SIZES:-16M,256M}
ITERS=${ITERS:-3}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
PLUGIN=$(readlink -f "$BUILD/lib/libnccl-net-lowcomm.so")
ALLREDUCE=$(readlink -f "$BUILD/bin/nccl_net_allreduce")
for f in "$PLUGIN" "$ALLREDUCE"; do
  [ -x "$f" ] || [ -f "$f" ] || { echo "missing $f (BUILD=$BUILD)"; exit 2; }
done
failures=0
fail() { echo "FAIL: $*" | tee -a "$OUT/summary.txt"; failures=$((failures + 1)); }

# ---- what is here ----
{
  echo "date: $(date -u)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  nvcc --version 2>/dev/null | tail -1
  $PYTHON -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' 2>&1
} | tee "$OUT/versions.txt"

TORCH_NCCL_DIR=$($PYTHON -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
TOOLKIT_NCCL_DIR=""
for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
  if [ -e "$d/libnccl.so.2" ]; then TOOLKIT_NCCL_DIR=$d; break; fi
done
echo "torch's NCCL: ${TORCH_NCCL_DIR:-none}; toolkit's NCCL: ${TOOLKIT_NCCL_DIR:-none}" | tee -a "$OUT/versions.txt"

# ---- kernel shaping of loopback, if this machine allows it ----
SHAPED=0
if command -v tc >/dev/null 2>&1 && tc qdisc add dev lo root netem delay 50ms rate 1gbit 2>"$OUT/tc.err"; then
  tc qdisc del dev lo root 2>/dev/null
  SHAPED=1
fi
echo "kernel shaping of lo (tc netem): $([ $SHAPED = 1 ] && echo available || echo "not available: $(cat "$OUT/tc.err" 2>/dev/null)")" | tee -a "$OUT/versions.txt"

export LOWCOMM_SECRET=${LOWCOMM_SECRET:-nccl-gpu-recipe-$$}
export NCCL_SOCKET_IFNAME=lo LOWCOMM_SOCKET_IFNAME="=lo"
# NCCL logs to stdout unless NCCL_DEBUG_FILE names a file: each rank's goes to nccl<rank>.log, so
# that rank<rank>.out holds only the driver's JSON lines.
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET

# run_case NAME KIND(plugin|socket) RUNNER(c|torch) NCCL_DIR SIZES [VAR=VALUE ...]; DTYPE=bf16
# in the caller's environment for bf16.
run_case() {
  local name=$1 kind=$2 runner=$3 nccl_dir=$4 sizes=$5
  shift 5
  local dir="$OUT/$name"
  mkdir -p "$dir"
  local env_common=("$@")
  if [ "$kind" = plugin ]; then
    env_common+=(NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=lowcomm)
  else
    env_common+=(NCCL_NET=Socket NCCL_NET_PLUGIN=none)
  fi
  [ -n "$nccl_dir" ] && env_common+=(LD_LIBRARY_PATH="$nccl_dir:${LD_LIBRARY_PATH:-}")
  local rendezvous="$dir/rendezvous"
  rm -f "$rendezvous"
  local pids=()
  for r in 0 1; do
    local host=node$r
    if [ "$runner" = c ]; then
      env "${env_common[@]}" NCCL_HOSTID=$host NCCL_DEBUG_FILE="$dir/nccl$r.log" \
        "$ALLREDUCE" --rank $r --nranks 2 --id-file "$rendezvous" --bytes "$sizes" \
        --iters "$ITERS" --dtype "${DTYPE:-fp32}" >"$dir/rank$r.out" 2>"$dir/rank$r.log" &
    else
      env "${env_common[@]}" NCCL_HOSTID=$host NCCL_DEBUG_FILE="$dir/nccl$r.log" \
        $PYTHON plugins/nccl_net/gpu/torch_nccl_allreduce.py --rank $r --world 2 \
        --init-file "$rendezvous" --bytes "$sizes" --iters "$ITERS" \
        --dtype "${DTYPE:-fp32}" >"$dir/rank$r.out" 2>"$dir/rank$r.log" &
    fi
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  if [ $rc -ne 0 ]; then fail "$name: a rank failed (logs in $dir)"; return; fi
  if [ "$kind" = plugin ] && ! grep -qE "Loaded net plugin lowcomm|Using network lowcomm|NET plugin lowcomm|NET/lowcomm" "$dir/nccl0.log"; then
    fail "$name: NCCL's log does not show the lowcomm plugin selected"
    return
  fi
  if grep -q '"wrong_elements": [1-9]' "$dir/rank0.out"; then fail "$name: wrong results"; return; fi
  sed "s/^{/{\"case\": \"$name\", /" "$dir/rank0.out" >>"$OUT/summary.jsonl"
  echo "ok: $name" | tee -a "$OUT/summary.txt"
}

WAN=("LOWCOMM_WAN=bw=1gbit,rtt=100ms")
# What a WAN user should set on NCCL's side (docs/nccl-plugin.md).
NCCL_WAN=(NCCL_BUFFSIZE=33554432 NCCL_MIN_NCHANNELS=2 NCCL_PROTO=Simple)
SOCKET_TUNED=(NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4 NCCL_BUFFSIZE=33554432)

for nccl in toolkit torch; do
  dir=$([ $nccl = toolkit ] && echo "$TOOLKIT_NCCL_DIR" || echo "$TORCH_NCCL_DIR")
  [ -n "$dir" ] || { echo "skip: no $nccl NCCL" | tee -a "$OUT/summary.txt"; continue; }
  run_case "plugin-$nccl-lo" plugin c "$dir" "$SIZES"
  run_case "socket-$nccl-lo" socket c "$dir" "$SIZES"
  run_case "plugin-$nccl-wan" plugin c "$dir" "$WAN_SIZES" "${WAN[@]}"
  run_case "plugin-$nccl-wan-tuned" plugin c "$dir" "$WAN_SIZES" "${WAN[@]}" "${NCCL_WAN[@]}"
done
run_case plugin-torchpg-lo plugin torch "" "$SIZES"
run_case plugin-torchpg-wan plugin torch "" "$WAN_SIZES" "${WAN[@]}"
# bf16 over the emulated WAN with lossless compression where it saves time.
DTYPE=bf16 run_case plugin-torchpg-wan-bf16 plugin torch "" "$WAN_SIZES" "${WAN[@]}"
DTYPE=bf16 run_case plugin-torchpg-wan-bf16-auto plugin torch "" "$WAN_SIZES" "${WAN[@]}" \
  LOWCOMM_NCCL_COMPRESS=auto LOWCOMM_NCCL_SHUFFLE=2

if [ $SHAPED = 1 ]; then
  # The same kernel-shaped link for both: 1 Gbit/s, 50 ms each way on lo.
  tc qdisc add dev lo root netem delay 50ms rate 1gbit
  run_case socket-shaped-default socket c "$TORCH_NCCL_DIR" "$WAN_SIZES"
  run_case socket-shaped-tuned socket c "$TORCH_NCCL_DIR" "$WAN_SIZES" "${SOCKET_TUNED[@]}"
  run_case plugin-shaped plugin c "$TORCH_NCCL_DIR" "$WAN_SIZES"
  run_case plugin-shaped-tuned plugin c "$TORCH_NCCL_DIR" "$WAN_SIZES" "${NCCL_WAN[@]}"
  tc qdisc del dev lo root
fi

if [ -x "$BUILD/bin/nccl_net_plugin_test" ]; then
  "$BUILD/bin/nccl_net_plugin_test" >"$OUT/driver.log" 2>&1 && echo "ok: GPU-free driver" | tee -a "$OUT/summary.txt" ||
    fail "the GPU-free driver (driver.log)"
fi

echo "== $OUT/summary.jsonl (algbw GB/s by case and size)"
$PYTHON - "$OUT/summary.jsonl" <<'EOF' | tee -a "$OUT/summary.txt"
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
for r in rows:
    print(f"{r['case']:28} nccl {r['nccl_version']}  {r.get('dtype','fp32')}  {r['bytes']:>10}  "
          f"{r['seconds']:.4f} s  algbw {r['algbw_GBps']:.4f} GB/s")
EOF
echo "failures: $failures" | tee -a "$OUT/summary.txt"
exit $((failures > 0))
