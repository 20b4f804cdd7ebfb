#!/usr/bin/env bash
# Everything lowcomm checks on a GPU, in one command on the GPU machine (docs/gpu.md):
#
#   scripts/gpu_check.sh --prepare   # here, on a development machine with nvcc: the carried build
#   scripts/gpu_check.sh             # there: checks and measurements into $OUT/gpu-check/
#   scripts/gpu_check.sh --dry-run   # anywhere: the plan and each stage's command, nothing run
#
# The GPU machine has no network, no GoogleTest, Google Benchmark, OpenSSL or xxHash headers, so
# --prepare builds here (Release, sm_90, static CUDA runtime, static GoogleTest, no UCX) what
# runs there and packs it into one file, build-gpu/gpu-carry.tar.gz, with the libraries the
# binaries load that are not in every Linux (found with ldd) and what the torch extension links
# (liblowcomm.a; libcrypto.a, libxxhash.a and libcudart_static.a). Without that file the check
# tries the same build there (it fails where those packages are missing, and says so).
#
# Stages, each under its own time limit, within GPU_CHECK_BUDGET_S (470 s) all together
# (GPU_CHECK_STAGES="cuda nccl" runs only those, after facts):
#   facts     nvidia-smi, driver, CUDA, torch, NCCL, compute-sanitizer, glibc, the carried build
#   cuda      every test labelled cuda (ctest -L cuda, listed at --prepare), run from its binary
#             with LOWCOMM_REQUIRE_CUDA=1 (no device is a failure), in shards side by side
#   memcheck  compute-sanitizer memcheck over the CUDA codec tests (all but the 4 GiB one);
#             skipped, saying why, where compute-sanitizer is missing or refuses the device
#   torch     pip install --no-deps --no-build-isolation ./plugins/torch against the carried
#             liblowcomm.a, then pytest on plugins/torch/tests/test_cuda*.py (or -k cuda)
#   kernels   lowcomm-codec-bench's cuda/ cases at 256 MiB against a D2D copy (alone on the GPU)
#   devpath   lowcomm-bench: a q4 all-reduce of 64 MiB over the emulated 1 Gbit/s, 50 ms link from
#             host buffers and from CUDA buffers (two ranks), into kernels.log
#   nccl      scripts/nccl_gpu.sh: the NCCL net plugin against NCCL's socket transport
# cuda and torch run side by side (the extension builds on the CPUs while the tests use the
# GPU); memcheck, kernels, devpath and nccl each alone after them.
# Output, at most 8 files in $OUT/gpu-check (or results/gpu-check-<time>/ without OUT):
# summary.md, facts.txt, cuda_tests.log, memcheck.log, torch.log, kernels.json, kernels.log,
# nccl.log. Exit status 0 when no stage failed (skips and missed performance targets included).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

MODE=check
case "${1:-}" in
  --prepare) MODE=prepare ;;
  --dry-run) MODE=dry ;;
  "") ;;
  -h | --help)
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "usage: $0 [--prepare | --dry-run | --help]" >&2
    exit 2
    ;;
esac

# ---- settings (environment) ----
PREP_BUILD=${GPU_CHECK_PREP_BUILD:-build-gpu}              # --prepare's build tree
TARBALL=${GPU_CHECK_TARBALL:-build-gpu/gpu-carry.tar.gz} # what travels (carry)
CARRY=${GPU_CHECK_CARRY:-build-gpu/carry}                # where it is unpacked
CARRY_LIMIT_MIB=${GPU_CHECK_CARRY_LIMIT_MIB:-48}         # the tree travels too: 64 MiB in all
BUDGET_S=${GPU_CHECK_BUDGET_S:-470}
# The stages to run (facts always runs); a rerun after a fix can name only what it needs.
STAGES=${GPU_CHECK_STAGES:-cuda memcheck torch kernels devpath nccl}
CAP_PARALLEL_S=${GPU_CHECK_CAP_PARALLEL_S:-200} # cuda and torch, side by side
CAP_MEMCHECK_S=${GPU_CHECK_CAP_MEMCHECK_S:-100}
CAP_KERNELS_S=${GPU_CHECK_CAP_KERNELS_S:-60}
CAP_NCCL_S=${GPU_CHECK_CAP_NCCL_S:-100}
CAP_DEVPATH_S=${GPU_CHECK_CAP_DEVPATH_S:-40}
CUDA_SHARDS=${GPU_CHECK_CUDA_SHARDS:-10}
# Seconds one torch test's world of ranks may run before it fails with its stacks.
TORCH_WORLD_S=${GPU_CHECK_TORCH_WORLD_S:-60}
MEMCHECK_SHARDS=${GPU_CHECK_MEMCHECK_SHARDS:-8}
# CPU threads of each test process's reference codec: the shards share the cores.
CODEC_THREADS=${GPU_CHECK_CODEC_THREADS:-1}
# nccl_gpu.sh's sizes, smaller than its defaults to fit the budget.
NCCL_SIZES=${GPU_CHECK_NCCL_SIZES:-1M,64M}
NCCL_WAN_SIZES=${GPU_CHECK_NCCL_WAN_SIZES:-64M}
NCCL_ITERS=${GPU_CHECK_NCCL_ITERS:-2}
# Targets built at --prepare beyond the test binaries labelled cuda, which are found in the
# CMake files (gtest_discover_tests(<target> ... LABELS cuda)).
BASE_TARGETS=(lowcomm-codec-bench lowcomm-bench lowcomm_static nccl_net_lowcomm nccl_net_allreduce)
read -r -a EXTRA_TARGETS <<<"${GPU_CHECK_TARGETS:-}"

log() { echo "gpu_check: $*" >&2; }

# ==== --prepare: build here, stage the carried files, pack them ====

# The test targets that the CMake files label cuda.
cuda_test_targets() {
  python3 - <<'EOF'
import pathlib, re
files = [pathlib.Path("CMakeLists.txt")]
for top in ("tests", "plugins", "bench"):
    files += sorted(pathlib.Path(top).rglob("CMakeLists.txt"))
seen = []
for p in files:
    text = re.sub(r"#[^\n]*", "", p.read_text())
    for m in re.finditer(r"gtest_discover_tests\(\s*([A-Za-z0-9_.+-]+)([^)]*)\)", text):
        if re.search(r"\bLABELS\b[^)]*\bcuda\b", m.group(2)) and m.group(1) not in seen:
            seen.append(m.group(1))
print("\n".join(seen))
EOF
}

# carry/cuda_tests.txt: one line per binary with tests labelled cuda (ctest -L cuda): the path
# under carry/, a tab, and a GoogleTest filter ('' when every test of the binary is labelled).
write_cuda_test_list() {
  local build=$1 out
  out=$(realpath -m "$2")
  (cd "$build" && ctest -N --show-only=json-v1 >"$out.all.json" &&
    ctest -N -L cuda --show-only=json-v1 >"$out.cuda.json") || return 1
  python3 - "$build" "$out" <<'EOF'
import json, os, sys
build, out = os.path.realpath(sys.argv[1]), sys.argv[2]
def tests(path):
    return json.load(open(path)).get("tests", [])
def key(t):
    cmd = t.get("command") or [""]
    filt = next((a.split("=", 1)[1] for a in cmd[1:] if a.startswith("--gtest_filter=")), None)
    return cmd[0], filt
count = {}
for t in tests(out + ".all.json"):
    exe, _ = key(t)
    count[exe] = count.get(exe, 0) + 1
by_exe, missing = {}, []
for t in tests(out + ".cuda.json"):
    exe, filt = key(t)
    if not exe.startswith(build + "/bin/") or not os.path.exists(exe) or filt is None:
        missing.append(t.get("name", "?"))
        continue
    by_exe.setdefault(exe, []).append(filt)
with open(out, "w") as f:
    for exe, filters in by_exe.items():
        rel = os.path.relpath(exe, build)
        f.write(f"{rel}\t{'' if len(filters) == count.get(exe) else ':'.join(filters)}\n")
for name in missing:
    print(f"gpu_check: not carried (no built GoogleTest binary in bin/): {name}", file=sys.stderr)
print(sum(len(v) for v in by_exe.values()))
EOF
  local rc=$?
  rm -f "$out.all.json" "$out.cuda.json"
  return $rc
}

# Libraries a carried ELF file loads that are not part of every Linux with a C++ runtime, nor
# NCCL (picked at run time): copied into carry/lib.
extra_shared_deps() {
  ldd "$@" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    grep -vE '^(linux-vdso|ld-linux|libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libnccl)\.so' |
    sort -u | awk '{print $2}'
}

prepare() {
  local build=$1 stage=$1/carry targets t WORKLOG
  mkdir -p "$build" && WORKLOG=$build/gpu-check-configure.log
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || {
    log "no nvcc: --prepare needs the CUDA toolkit"
    return 1
  }
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOWCOMM_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLOWCOMM_STATIC_CUDART=ON -DLOWCOMM_UCX=OFF >"$WORKLOG" 2>&1 ||
    {
      tail -20 "$WORKLOG" >&2
      return 1
    }
  mapfile -t targets < <(cuda_test_targets)
  [ ${#targets[@]} -gt 0 ] || log "no test target labelled cuda found in the CMake files"
  targets+=("${BASE_TARGETS[@]}" "${EXTRA_TARGETS[@]}")
  log "building ${targets[*]} in $build"
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" || return 1

  rm -rf "$stage"
  mkdir -p "$stage/bin" "$stage/lib" "$stage/core/lib" "$stage/core/include/lowcomm" "$stage/deps"
  local ntests
  ntests=$(write_cuda_test_list "$build" "$stage/cuda_tests.txt") || return 1
  while IFS=$'\t' read -r t _; do cp "$build/$t" "$stage/bin/"; done <"$stage/cuda_tests.txt"
  for t in lowcomm-codec-bench lowcomm-bench nccl_net_allreduce; do
    if [ -x "$build/bin/$t" ]; then cp "$build/bin/$t" "$stage/bin/"; else log "not built: bin/$t"; fi
  done
  cp "$build/lib/libnccl-net-lowcomm.so" "$stage/lib/" || return 1
  while read -r t; do cp -L "$t" "$stage/lib/"; done < <(extra_shared_deps "$stage"/bin/* "$stage"/lib/*.so)
  # What plugins/torch/setup.py takes from LOWCOMM_CORE_BUILD: lib/liblowcomm.a, include/ and
  # lowcomm.pc (its Libs.private -L is pointed at deps/ on the GPU machine).
  cp "$build/lib/liblowcomm.a" "$stage/core/lib/" || return 1
  cp "$build/include/lowcomm/version.h" "$stage/core/include/lowcomm/"
  cp "$build/lowcomm.pc" "$stage/core/"
  # The archive's own dependencies, static: linked into the extension with their symbols hidden.
  local libdir cudalib
  libdir=$(dirname "$(readlink -f "$(gcc -print-file-name=libcrypto.a)")")
  cudalib=$(sed -n 's/.*-L\([^ ]*\) -lcudart_static.*/\1/p' "$build/lowcomm.pc")
  for t in "$libdir/libcrypto.a" "$(gcc -print-file-name=libxxhash.a)" "$cudalib/libcudart_static.a"; do
    if [ -f "$t" ]; then cp "$t" "$stage/deps/"; else log "not found: $t"; fi
  done
  {
    echo "prepared: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' + uncommitted changes')"
    echo "build_dir: $(readlink -f "$build")"
    echo "nvcc: $(nvcc --version 2>/dev/null | grep -o 'release .*')"
    echo "cuda_architectures: 90 (sm_90 machine code + compute_90 PTX), static cudart, UCX off"
    echo "host: $(ldd --version | head -1); libstdc++ needs up to $(objdump -T "$stage"/bin/* 2>/dev/null | grep -oE 'GLIBCXX_[0-9.]+' | sort -uV | tail -1), glibc up to $(objdump -T "$stage"/bin/* "$stage"/lib/* 2>/dev/null | grep -oE 'GLIBC_[0-9.]+' | sort -uV | tail -1)"
    echo "cuda_tests: $ntests tests in $(wc -l <"$stage/cuda_tests.txt") binaries"
  } >"$stage/manifest.txt"
  (cd "$stage" && find . -type f -printf '%P %s\n' | sort) >>"$stage/manifest.txt"
  tar -czf "$TARBALL" -C "$build" carry || return 1
  local bytes mib
  bytes=$(stat -c %s "$TARBALL")
  mib=$(((bytes + 1048575) / 1048576))
  log "$TARBALL: $mib MiB ($(du -sh "$stage" | cut -f1) unpacked)"
  if [ "$mib" -gt "$CARRY_LIMIT_MIB" ]; then
    log "over GPU_CHECK_CARRY_LIMIT_MIB=$CARRY_LIMIT_MIB"
    return 1
  fi
  cat <<EOF
Carry it to the GPU machine with the working tree (device tool 'run'):
  command: scripts/gpu_check.sh
  carry:   ["$TARBALL"]
  timeout_s: 570
EOF
}

if [ "$MODE" = prepare ]; then
  prepare "$PREP_BUILD"
  exit $?
fi

# ==== the check ====

if [ -n "${OUT:-}" ]; then RESULTS=$OUT/gpu-check; else RESULTS=results/gpu-check-$(date -u +%Y%m%dT%H%M%SZ); fi
mkdir -p "$RESULTS" || exit 2
RESULTS=$(readlink -f "$RESULTS")
WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
START=$SECONDS
DEADLINE=$((START + BUDGET_S))
log "results in $RESULTS, budget ${BUDGET_S}s"

# stage_result NAME pass|fail|skip|timeout DETAIL SECONDS
stage_result() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$4" "$3" >"$WORK/status.$1"; }

# cap WANT: seconds a stage may take, at most WANT and what the budget has left (at least 10).
cap() {
  local left=$((DEADLINE - SECONDS - 5))
  [ "$left" -lt "$1" ] || left=$1
  [ "$left" -ge 10 ] || left=10
  echo "$left"
}

# capped SECONDS LOG CMD...: runs CMD (its whole process group) under a time limit, appending
# its output to LOG; --dry-run only writes the command there. Returns CMD's status, 124 on
# timeout.
capped() {
  local secs=$1 out=$2
  shift 2
  if [ "$MODE" = dry ]; then
    {
      printf 'would run (limit %ss):' "$secs"
      printf ' %q' "$@"
      echo
    } >>"$out"
    return 0
  fi
  timeout -k 10 "$secs" "$@" >>"$out" 2>&1
}

# ---- a GPU? ----
GPU_REASON="" GPU_LINE=""
if ! command -v nvidia-smi >/dev/null 2>&1; then
  GPU_REASON="no GPU: nvidia-smi not found"
elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  GPU_REASON="no GPU: nvidia-smi lists none ($(nvidia-smi -L 2>&1 | head -1))"
else
  GPU_LINE=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)
fi

# ---- the build: carried, or made here ----
unpack_carry() {
  if [ -f "$CARRY/manifest.txt" ] && [ ! "$TARBALL" -nt "$CARRY/manifest.txt" ]; then return 0; fi
  [ -f "$TARBALL" ] || return 1
  rm -rf "$CARRY" && mkdir -p "$CARRY" &&
    tar -xzf "$TARBALL" -C "$CARRY" --strip-components=1
}
BUILD_NOTE=""
if unpack_carry; then
  BUILD_NOTE="carried ($TARBALL)"
elif [ "$MODE" = check ] && [ -z "$GPU_REASON" ] && [ "${GPU_CHECK_BUILD_HERE:-1}" = 1 ]; then
  log "no $TARBALL: building here (needs OpenSSL, xxHash, zstd, lz4, GoogleTest, Google Benchmark)"
  wanted=$TARBALL TARBALL=$WORK/gpu-carry.tar.gz
  limit=$(cap 300)
  timeout -k 10 "$limit" bash -c "$(declare -f log cuda_test_targets write_cuda_test_list extra_shared_deps prepare); $(declare -p BASE_TARGETS EXTRA_TARGETS TARBALL CARRY_LIMIT_MIB); prepare build-gpu-local" \
    >"$WORK/build.log" 2>&1
  rc=$?
  if [ $rc = 0 ] && unpack_carry; then
    BUILD_NOTE="built here (build-gpu-local)"
  elif [ $rc = 124 ] || [ $rc = 137 ]; then
    BUILD_NOTE="none: no $wanted was carried, and building here stopped at its limit (${limit}s)"
  else
    BUILD_NOTE="none: no $wanted was carried, and building here failed: $(grep -m1 -E 'Error|error|not found|FAILED' "$WORK/build.log" | cut -c1-200)"
  fi
else
  BUILD_NOTE="none: no $TARBALL (scripts/gpu_check.sh --prepare makes it)"
fi
HAVE_BUILD=0
[ -f "$CARRY/manifest.txt" ] && HAVE_BUILD=1 && CARRY=$(readlink -f "$CARRY")
BUILD_MISSING="no build: $BUILD_NOTE"

# ---- python with torch ----
PY=""
for p in "${PYTHON:-}" python3 /opt/torch/.venv/bin/python3; do
  if [ -n "$p" ] && "$p" -c 'import torch' >/dev/null 2>&1; then
    PY=$(command -v "$p")
    break
  fi
done

# ---- facts ----
SANITIZER=""
for s in compute-sanitizer "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
  "${CUDA_HOME:-/usr/local/cuda}/compute-sanitizer/compute-sanitizer"; do
  if command -v "$s" >/dev/null 2>&1; then
    SANITIZER=$(command -v "$s")
    break
  fi
done
t0=$SECONDS
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -n), kernel $(uname -r), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) memory"
  # shellcheck disable=SC1091
  echo "os: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"); $(ldd --version 2>/dev/null | head -1)"
  libstdcxx=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
  echo "libstdc++: ${libstdcxx:-?} up to $(strings "${libstdcxx:-/dev/null}" 2>/dev/null | grep -oE '^GLIBCXX_[0-9.]+$' | sort -uV | tail -1)"
  echo "== GPU"
  if [ -z "$GPU_REASON" ]; then
    nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total,clocks.max.sm,clocks.max.mem,compute_cap,persistence_mode,compute_mode --format=csv 2>&1
    nvidia-smi 2>&1 | sed -n '3p'
  else
    echo "$GPU_REASON"
  fi
  echo "== CUDA"
  echo "nvcc: $( (nvcc --version || "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" --version) 2>/dev/null | grep -o 'release .*')"
  echo "compute-sanitizer: ${SANITIZER:-not found} $([ -n "$SANITIZER" ] && "$SANITIZER" --version 2>/dev/null | grep -m1 -i version)"
  echo "cmake: $(cmake --version 2>/dev/null | head -1); ninja: $(ninja --version 2>/dev/null); gcc: $(gcc -dumpfullversion 2>/dev/null)"
  echo "== Python"
  if [ -n "$PY" ]; then
    "$PY" - <<'EOF' 2>&1
import sys, torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
try:
    print("torch's NCCL", ".".join(map(str, torch.cuda.nccl.version())))
except Exception as e:
    print("torch's NCCL: ?", e)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device 0: {p.name}, {p.multi_processor_count} SMs, {p.total_memory >> 20} MiB")
try:
    from importlib.metadata import version
    print("nvidia-nccl-cu13", version("nvidia-nccl-cu13"))
except Exception as e:
    print("nvidia-nccl-cu13: ?", e)
EOF
  else
    echo "no python3 with torch (tried \$PYTHON, python3, /opt/torch/.venv/bin/python3)"
  fi
  for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
    if [ -e "$d/libnccl.so.2" ]; then
      echo "toolkit's NCCL: $(readlink -f "$d/libnccl.so.2")"
      break
    fi
  done
  echo "== build"
  echo "$BUILD_NOTE"
  if [ -f "$WORK/build.log" ]; then
    echo "-- the end of the build's log here"
    tail -n 30 "$WORK/build.log"
  fi
  if [ $HAVE_BUILD = 1 ]; then
    sed -n '1,/^cuda_tests:/p' "$CARRY/manifest.txt"
    for f in "$CARRY"/bin/* "$CARRY"/lib/*.so; do
      miss=$(LD_LIBRARY_PATH=$CARRY/lib ldd "$f" 2>&1 | grep -E 'not found|version .* not found' | grep -v libnccl)
      [ -z "$miss" ] || echo "UNRESOLVED in ${f#"$CARRY"/}: $miss"
    done
  fi
} >"$RESULTS/facts.txt" 2>&1
stage_result facts pass "facts.txt" $((SECONDS - t0))
grep -q '^UNRESOLVED' "$RESULTS/facts.txt" && stage_result facts fail "carried binaries miss libraries (facts.txt)" $((SECONDS - t0))

GPU_SKIP=""
[ "$MODE" = dry ] || GPU_SKIP=$GPU_REASON
[ "$MODE" = dry ] && [ -z "$SANITIZER" ] && SANITIZER=compute-sanitizer

# ---- cuda: every test labelled cuda, from its binary ----
stage_cuda() {
  local log=$RESULTS/cuda_tests.log t0=$SECONDS limit rc=0 bin filter i
  : >"$log"
  if [ -n "$GPU_SKIP" ]; then stage_result cuda skip "$GPU_SKIP" 0 && return; fi
  if [ $HAVE_BUILD = 0 ]; then stage_result cuda fail "$BUILD_MISSING" 0 && return; fi
  limit=$(cap "$CAP_PARALLEL_S")
  local pids=() n=0
  while IFS=$'\t' read -r bin filter; do
    for ((i = 0; i < CUDA_SHARDS; i++)); do
      n=$((n + 1))
      GTEST_TOTAL_SHARDS=$CUDA_SHARDS GTEST_SHARD_INDEX=$i LOWCOMM_REQUIRE_CUDA=1 \
        LOWCOMM_CODEC_THREADS=$CODEC_THREADS LD_LIBRARY_PATH="$CARRY/lib" capped "$limit" "$WORK/cuda.$n.log" \
        "$CARRY/$bin" ${filter:+"--gtest_filter=$filter"} --gtest_color=no </dev/null &
      pids+=($!)
      echo "$bin shard $i/$CUDA_SHARDS" >"$WORK/cuda.$n.name"
    done
  done <"$CARRY/cuda_tests.txt"
  local timed_out=0
  for ((i = 0; i < ${#pids[@]}; i++)); do
    wait "${pids[$i]}"
    case $? in 0) ;; 124 | 137) timed_out=1 rc=1 ;; *) rc=1 ;; esac
  done
  for ((i = 1; i <= n; i++)); do
    { echo "==== $(cat "$WORK/cuda.$i.name")"; cat "$WORK/cuda.$i.log"; } >>"$log"
  done
  local passed failed skipped
  passed=$(grep -hoE '^\[  PASSED  \] [0-9]+' "$log" | awk '{s += $4} END {print s + 0}')
  failed=$(grep -hE '^\[  FAILED  \] [^0-9]' "$log" | sed 's/, where GetParam.*//; s/ ([0-9]* ms)$//' | sort -u | wc -l)
  skipped=$(grep -hoE '^\[  SKIPPED \] [0-9]+ test' "$log" | awk '{s += $4} END {print s + 0}')
  local detail nbin
  nbin=$(wc -l <"$CARRY/cuda_tests.txt")
  detail="$passed passed, $failed failed, $skipped skipped ($nbin binaries x $CUDA_SHARDS shards)"
  if [ $timed_out = 1 ]; then
    stage_result cuda timeout "$detail; stopped at ${limit}s" $((SECONDS - t0))
  elif [ $rc = 0 ]; then
    stage_result cuda pass "$detail" $((SECONDS - t0))
  else
    stage_result cuda fail "$detail: $(grep -hE '^\[  FAILED  \] [^0-9]' "$log" | sed 's/^.\{13\}//; s/, where GetParam.*//; s/ ([0-9]* ms)$//' | sort -u | head -3 | tr '\n' ' ')" $((SECONDS - t0))
  fi
}

# ---- memcheck: compute-sanitizer over the CUDA codec tests ----
stage_memcheck() {
  local log=$RESULTS/memcheck.log t0=$SECONDS limit i rc=0 timed_out=0
  : >"$log"
  if [ -n "$GPU_SKIP" ]; then stage_result memcheck skip "$GPU_SKIP" 0 && return; fi
  if [ -z "$SANITIZER" ]; then stage_result memcheck skip "compute-sanitizer not found" 0 && return; fi
  if [ $HAVE_BUILD = 0 ] || [ ! -x "$CARRY/bin/lowcomm_cuda_test" ]; then
    stage_result memcheck fail "$BUILD_MISSING" 0 && return
  fi
  local bin=$CARRY/bin/lowcomm_cuda_test
  # Does it take the device at all? (On gVisor it refused: "Device not supported", error 999.)
  LOWCOMM_REQUIRE_CUDA=1 capped 60 "$WORK/memcheck.probe" "$SANITIZER" --tool memcheck \
    --error-exitcode 99 "$bin" --gtest_filter=CudaDevice.Present --gtest_color=no
  rc=$?
  if [ "$MODE" = check ] && [ $rc -ne 0 ]; then
    cat "$WORK/memcheck.probe" >>"$log"
    if [ $rc -ne 99 ] && grep -qiE 'not supported|error 999|unknown error|initialization error|Target application terminated before first instrumented' "$WORK/memcheck.probe"; then
      stage_result memcheck skip "compute-sanitizer refuses the device: $(grep -m1 -iE 'not supported|error' "$WORK/memcheck.probe" | cut -c1-160)" $((SECONDS - t0))
    else
      stage_result memcheck fail "the probe (CudaDevice.Present) failed, status $rc" $((SECONDS - t0))
    fi
    return
  fi
  limit=$(cap $((CAP_MEMCHECK_S - (SECONDS - t0))))
  local pids=()
  for ((i = 0; i < MEMCHECK_SHARDS; i++)); do
    GTEST_TOTAL_SHARDS=$MEMCHECK_SHARDS GTEST_SHARD_INDEX=$i LOWCOMM_REQUIRE_CUDA=1 \
      LOWCOMM_CODEC_THREADS=$CODEC_THREADS capped "$limit" "$WORK/memcheck.$i.log" "$SANITIZER" --tool memcheck --leak-check no \
      --error-exitcode 99 --print-limit 20 "$bin" '--gtest_filter=-*MoreThan2Pow31Elements*' \
      --gtest_color=no </dev/null &
    pids+=($!)
  done
  rc=0
  for ((i = 0; i < MEMCHECK_SHARDS; i++)); do
    wait "${pids[$i]}"
    case $? in 0) ;; 124 | 137) timed_out=1 ;; *) rc=1 ;; esac
  done
  for ((i = 0; i < MEMCHECK_SHARDS; i++)); do
    { echo "==== shard $i/$MEMCHECK_SHARDS"; cat "$WORK/memcheck.$i.log"; } >>"$log"
  done
  local errors ran
  errors=$(grep -hoE 'ERROR SUMMARY: [0-9]+' "$log" | awk '{s += $3} END {print s + 0}')
  ran=$(grep -cE '^\[       OK \]' "$log")
  local detail="$ran tests ran under memcheck, $errors errors reported"
  if [ $rc = 1 ] || [ "$errors" -gt 0 ]; then
    stage_result memcheck fail "$detail" $((SECONDS - t0))
  elif [ $timed_out = 1 ]; then
    stage_result memcheck timeout "$detail; stopped at ${limit}s before every shard finished" $((SECONDS - t0))
  else
    stage_result memcheck pass "$detail" $((SECONDS - t0))
  fi
}

# ---- torch: the extension against this torch, then its CUDA tests ----
stage_torch() {
  local log=$RESULTS/torch.log t0=$SECONDS limit rc
  : >"$log"
  if [ -n "$GPU_SKIP" ]; then stage_result torch skip "$GPU_SKIP" 0 && return; fi
  if [ -z "$PY" ] && [ "$MODE" = check ]; then stage_result torch skip "no python3 with torch" 0 && return; fi
  if [ $HAVE_BUILD = 0 ]; then stage_result torch fail "$BUILD_MISSING" 0 && return; fi
  # The carried core: setup.py links lib/liblowcomm.a with lowcomm.pc's Libs.private, whose -L
  # (this machine's CUDA library folder at --prepare) is pointed at deps/ (libcudart_static.a,
  # libcrypto.a, libxxhash.a). LIBRARY_PATH finds the last two for -lcrypto -lxxhash; LDFLAGS
  # keeps their symbols inside lowcomm._C.
  [ "$MODE" = dry ] || sed -i "s#^\(Libs.private:.*\)-L[^ ]* #\1-L$CARRY/deps #" "$CARRY/core/lowcomm.pc"
  limit=$(cap "$CAP_PARALLEL_S")
  echo "== pip install --no-deps --no-build-isolation ./plugins/torch (LOWCOMM_CORE_BUILD=$CARRY/core)" >>"$log"
  LOWCOMM_CORE_BUILD=$CARRY/core LIBRARY_PATH="$CARRY/deps${LIBRARY_PATH:+:$LIBRARY_PATH}" \
    LDFLAGS="-Wl,--exclude-libs,libcrypto.a:libxxhash.a" MAX_JOBS=$(nproc) \
    capped "$limit" "$WORK/torch-build.log" "${PY:-python3}" -m pip install -v --no-deps \
    --no-build-isolation --no-index --no-cache-dir ./plugins/torch
  rc=$?
  tail -n 60 "$WORK/torch-build.log" >>"$log"
  if [ $rc -ne 0 ]; then
    grep -E 'error|Error' "$WORK/torch-build.log" | head -20 >>"$log"
    stage_result torch fail "the extension did not build (status $rc; torch.log)" $((SECONDS - t0))
    return
  fi
  local tests=()
  mapfile -t tests < <(ls plugins/torch/tests/test_cuda*.py 2>/dev/null)
  local args=(-q -p no:cacheprovider -rs)
  if [ ${#tests[@]} -gt 0 ]; then
    args+=("${tests[@]}")
  else
    args+=(plugins/torch/tests -k cuda --continue-on-collection-errors)
  fi
  args+=(--durations=0)
  echo "== pytest ${args[*]} (each world of ranks at most ${TORCH_WORLD_S}s)" >>"$log"
  # A hung test fails at LOWCOMM_TEST_SPAWN_TIMEOUT_S and leaves its ranks' Python and native
  # stacks (plugins/torch/tests/_spawn.py); the next test runs.
  mkdir -p "$WORK/stacks"
  LOWCOMM_REQUIRE_CUDA=1 PYTHONUNBUFFERED=1 LOWCOMM_TEST_SPAWN_TIMEOUT_S=$TORCH_WORLD_S \
    LOWCOMM_TEST_STACKS_DIR="$WORK/stacks" \
    capped "$(cap $((CAP_PARALLEL_S - (SECONDS - t0))))" "$WORK/pytest.log" \
    "${PY:-python3}" -m pytest "${args[@]}"
  rc=$?
  cat "$WORK/pytest.log" >>"$log"
  for f in "$WORK"/stacks/stacks-*.txt; do
    [ -f "$f" ] || continue
    echo "== ${f##*/}: a rank still running at its timeout" >>"$log"
    head -n 400 "$f" >>"$log"
  done
  local line skip
  line=$(grep -E '(passed|failed|skipped|error|no tests ran)' "$WORK/pytest.log" | tail -1)
  skip=$(grep -m1 '^SKIPPED' "$log" | cut -c1-160)
  case $rc in
    0) stage_result torch pass "${#tests[@]} test_cuda*.py files: $line${skip:+; first skip: $skip}" $((SECONDS - t0)) ;;
    5) stage_result torch skip "no torch test selected (${#tests[@]} test_cuda*.py files)" $((SECONDS - t0)) ;;
    124 | 137) stage_result torch timeout "pytest stopped at its limit: $line" $((SECONDS - t0)) ;;
    *) stage_result torch fail "pytest status $rc: $line" $((SECONDS - t0)) ;;
  esac
}

# ---- kernels: the CUDA codec benchmarks, alone on the GPU ----
stage_kernels() {
  local log=$RESULTS/kernels.log t0=$SECONDS rc
  : >"$log"
  if [ -n "$GPU_SKIP" ]; then stage_result kernels skip "$GPU_SKIP" 0 && return; fi
  if [ $HAVE_BUILD = 0 ] || [ ! -x "$CARRY/bin/lowcomm-codec-bench" ]; then
    stage_result kernels fail "$BUILD_MISSING" 0 && return
  fi
  LD_LIBRARY_PATH="$CARRY/lib" capped "$(cap "$CAP_KERNELS_S")" "$log" \
    "$CARRY/bin/lowcomm-codec-bench" '--benchmark_filter=^cuda/' \
    --benchmark_counters_tabular=true \
    "--benchmark_out=$WORK/kernels_raw.json" --benchmark_out_format=json
  rc=$?
  [ "$MODE" = dry ] && stage_result kernels pass "dry run" 0 && return
  if ! "${PY:-python3}" bench/kernels_report.py "$WORK/kernels_raw.json" "$RESULTS/kernels.json" \
    "$WORK/kernels.md" 2>>"$log"; then
    stage_result kernels fail "no results (bench status $rc; kernels.log)" $((SECONDS - t0))
    return
  fi
  local met total errors
  read -r met total errors < <("${PY:-python3}" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["met"], r["cases_run"], len(r["errors"]))' "$RESULTS/kernels.json")
  local detail="$total cases, $errors errors; targets met by $met of $total"
  case $rc in
    0)
      if [ "$errors" = 0 ]; then
        stage_result kernels pass "$detail" $((SECONDS - t0))
      else
        stage_result kernels fail "$detail" $((SECONDS - t0))
      fi
      ;;
    124 | 137) stage_result kernels timeout "$detail; stopped at its limit" $((SECONDS - t0)) ;;
    *) stage_result kernels fail "bench status $rc; $detail" $((SECONDS - t0)) ;;
  esac
}

# ---- devpath: the collectives' CUDA path against host buffers on the same emulated link ----
stage_devpath() {
  local log=$RESULTS/kernels.log t0=$SECONDS rc=0 d
  if [ -n "$GPU_SKIP" ]; then stage_result devpath skip "$GPU_SKIP" 0 && return; fi
  if [ $HAVE_BUILD = 0 ] || [ ! -x "$CARRY/bin/lowcomm-bench" ]; then
    stage_result devpath fail "$BUILD_MISSING" 0 && return
  fi
  for d in host cuda; do
    echo "## lowcomm-bench --device $d" >>"$log"
    LD_LIBRARY_PATH="$CARRY/lib" capped "$(cap $((CAP_DEVPATH_S / 2)))" "$WORK/devpath.$d" \
      "$CARRY/bin/lowcomm-bench" -n 2 -b 64M -e 64M --codec none,q4 --ef \
      --wan bw=1gbit,rtt=50ms -w 1 -i 3 --device "$d" || rc=$?
    cat "$WORK/devpath.$d" >>"$log"
  done
  [ "$MODE" = dry ] && stage_result devpath pass "dry run" 0 && return
  # The q4 row's time (column 3) from each run: cuda / host.
  local th tc
  th=$(awk '/^# codec q4/{f=1} f && $1 ~ /^[0-9]+$/ {print $3; exit}' "$WORK/devpath.host")
  tc=$(awk '/^# codec q4/{f=1} f && $1 ~ /^[0-9]+$/ {print $3; exit}' "$WORK/devpath.cuda")
  if [ "$rc" != 0 ] || [ -z "$th" ] || [ -z "$tc" ]; then
    stage_result devpath fail "status $rc (kernels.log)" $((SECONDS - t0))
    return
  fi
  stage_result devpath pass "q4 64 MiB at 1 Gbit/s: host ${th} s, cuda ${tc} s, ratio $(awk -v a="$tc" -v b="$th" 'BEGIN{printf "%.3f", a/b}') (target <= 1.05)" $((SECONDS - t0))
}

# ---- nccl: scripts/nccl_gpu.sh, the plugin against NCCL's socket transport ----
stage_nccl() {
  local log=$RESULTS/nccl.log t0=$SECONDS rc
  : >"$log"
  if [ -n "$GPU_SKIP" ]; then stage_result nccl skip "$GPU_SKIP" 0 && return; fi
  if [ -z "$PY" ] && [ "$MODE" = check ]; then stage_result nccl skip "no python3 with torch" 0 && return; fi
  if [ $HAVE_BUILD = 0 ]; then stage_result nccl fail "$BUILD_MISSING" 0 && return; fi
  # The GPU-free driver (nccl_net_plugin_test) runs in every build's ctest, not here.
  BUILD=$CARRY OUT=$WORK/nccl SIZES=$NCCL_SIZES WAN_SIZES=$NCCL_WAN_SIZES ITERS=$NCCL_ITERS \
    PYTHON=${PY:-python3} capped "$(cap "$CAP_NCCL_S")" "$WORK/nccl.out" scripts/nccl_gpu.sh
  rc=$?
  # A shaping left behind by a run stopped at its limit.
  if [ "$MODE" = check ] && tc qdisc show dev lo 2>/dev/null | grep -q netem; then
    tc qdisc del dev lo root 2>/dev/null
  fi
  {
    echo "== scripts/nccl_gpu.sh (SIZES=$NCCL_SIZES WAN_SIZES=$NCCL_WAN_SIZES ITERS=$NCCL_ITERS): status $rc"
    cat "$WORK/nccl.out"
    echo "== summary.jsonl"
    cat "$WORK/nccl/summary.jsonl" 2>/dev/null
    for f in "$WORK"/nccl/*/rank0.log; do
      [ -f "$f" ] || continue
      local name=${f%/rank0.log}
      name=${name##*/}
      grep -q "^ok: $name\$" "$WORK/nccl/summary.txt" 2>/dev/null && continue
      echo "== $name (not ok): rank logs, last 30 lines each"
      tail -n 30 "${f%/rank0.log}"/rank*.log "${f%/rank0.log}"/rank*.out 2>/dev/null
    done
  } >>"$log" 2>&1
  [ "$MODE" = dry ] && stage_result nccl pass "dry run" 0 && return
  # The plugin over Socket on the same link, by size: lo (unshaped), and the tc-shaped link.
  "${PY:-python3}" - "$WORK/nccl/summary.jsonl" >"$WORK/nccl.md" 2>>"$log" <<'EOF'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
bw = {(r["case"], r["bytes"]): r["algbw_GBps"] for r in rows}
pairs = [("plugin-torch-lo", "socket-torch-lo"), ("plugin-toolkit-lo", "socket-toolkit-lo"),
         ("plugin-shaped", "socket-shaped-default"), ("plugin-shaped-tuned", "socket-shaped-tuned")]
out = ["| plugin case | socket case | bytes | plugin GB/s | socket GB/s | plugin / socket |",
       "|---|---|---:|---:|---:|---:|"]
for p, s in pairs:
    for (case, size), v in sorted(bw.items(), key=lambda kv: kv[0][1]):
        if case == p and (s, size) in bw and bw[(s, size)] > 0:
            out.append(f"| {p} | {s} | {size} | {v:.3f} | {bw[(s, size)]:.3f} | {v / bw[(s, size)]:.2f} |")
if len(out) == 2:
    out.append("| (no pair of plugin and socket runs on the same link) | | | | | |")
print("\n".join(out))
EOF
  cat "$WORK/nccl.md" >>"$log"
  local ok bad
  ok=$(grep -c '^ok:' "$WORK/nccl/summary.txt" 2>/dev/null)
  bad=$(grep -c '^FAIL:' "$WORK/nccl/summary.txt" 2>/dev/null)
  local detail shaping
  shaping=$(grep -m1 'kernel shaping' "$WORK/nccl/versions.txt" 2>/dev/null | cut -c1-80)
  detail="${ok:-0} cases ok, ${bad:-0} failed; $shaping"
  case $rc in
    0) stage_result nccl pass "$detail" $((SECONDS - t0)) ;;
    124 | 137) stage_result nccl timeout "$detail; stopped at its limit" $((SECONDS - t0)) ;;
    *) stage_result nccl fail "status $rc; $detail" $((SECONDS - t0)) ;;
  esac
}

# ---- run ----
if [ "$MODE" = dry ]; then
  log "dry run: GPU ${GPU_REASON:-present}; python with torch: ${PY:-none}; build: $BUILD_NOTE"
fi
# run_stage NAME: the stage, unless GPU_CHECK_STAGES leaves it out.
run_stage() {
  case " ${STAGES//,/ } " in
    *" $1 "*) "stage_$1" ;;
    *) stage_result "$1" skip "not asked for (GPU_CHECK_STAGES=$STAGES)" 0 ;;
  esac
}
run_stage cuda &
p1=$!
run_stage torch &
p3=$!
wait $p1 $p3
run_stage memcheck
run_stage kernels
run_stage devpath
run_stage nccl

# ---- summary.md ----
{
  echo "# lowcomm GPU check"
  echo
  echo "$(sed -n '1p' "$RESULTS/facts.txt"); GPU: ${GPU_LINE:-$GPU_REASON}"
  echo "build: $BUILD_NOTE$([ $HAVE_BUILD = 1 ] && sed -n 's/^commit: /, commit /p' "$CARRY/manifest.txt")"
  [ "$MODE" = dry ] && echo "**dry run: nothing was run; each log holds the commands**"
  echo
  echo "| stage | result | seconds | detail |"
  echo "|---|---|---:|---|"
  for s in facts cuda memcheck torch kernels devpath nccl; do
    if [ -f "$WORK/status.$s" ]; then
      IFS=$'\t' read -r name result secs detail <"$WORK/status.$s"
      [ "$MODE" = dry ] && [ "$s" != facts ] && [ "$result" = pass ] && result="dry run" detail="commands in the log"
      echo "| $name | $result | $secs | ${detail//|/\\|} |"
    else
      echo "| $s | fail | | no result (the stage did not finish) |"
    fi
  done
  echo
  echo "Total: $((SECONDS - START)) s of a ${BUDGET_S} s budget."
  if [ -s "$WORK/kernels.md" ]; then
    echo
    echo "## Kernels at 256 MiB against the D2D copy (kernels.json)"
    echo
    cat "$WORK/kernels.md"
  fi
  if [ -s "$WORK/nccl.md" ]; then
    echo
    echo "## NCCL: the lowcomm plugin against Socket on the same link (nccl.log)"
    echo
    cat "$WORK/nccl.md"
  fi
} >"$RESULTS/summary.md"
cat "$RESULTS/summary.md"
failed=$(cat "$WORK"/status.* 2>/dev/null | awk -F'\t' '$2 == "fail" || $2 == "timeout"' | wc -l)
rm -rf "$WORK"
exit $((failed > 0))
