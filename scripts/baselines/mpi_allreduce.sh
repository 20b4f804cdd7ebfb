#!/usr/bin/env bash
# Open MPI baseline: MPI_Allreduce (fp32) of P ranks, each in its own network namespace, over
# the tbf-shaped links of scripts/wan_netns.sh. Prints CSV rows and a summary.
#   sudo scripts/baselines/mpi_allreduce.sh [--ranks 4] [--rate 1gbit] [--prefix lc]
#        [-b 1M] [-e 256M] [-f 4] [-w 1] [-n 3] [--timeout 900] [--alg N]
# --alg N forces coll/tuned's all-reduce algorithm N (1 linear, 2 non-overlapping, 3 recursive
# doubling, 4 ring, 5 segmented ring, 6 Rabenseifner); without it Open MPI decides, as it does for
# its users (for 4 ranks and large messages it picks 6, which is slower here than 4: see the doc).
# The program is $LOWCOMM_MPI_BASELINE, default build-mpi/bin/lowcomm-mpi-allreduce-baseline
# (built here if missing). Why each mpirun setting: docs/wan-emulation.md.
set -euo pipefail
# shellcheck disable=SC2034  # read by common.sh
BL_NAME=mpi_allreduce
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
ALG="" rest=()
while [ $# -gt 0 ]; do
  if [ "$1" = --alg ]; then ALG=${2:?--alg needs a number}; shift 2; else rest+=("$1"); shift; fi
done
bl_parse_args ${rest[@]+"${rest[@]}"}
ALG_ARGS=() LIBRARY=openmpi
if [ -n "$ALG" ]; then
  [[ $ALG =~ ^[1-6]$ ]] || bl_die "--alg must be 1..6"
  ALG_ARGS=(--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm "$ALG")
  LIBRARY=openmpi-alg$ALG
fi

command -v mpirun >/dev/null || bl_die "mpirun not found; apt-get install openmpi-bin libopenmpi-dev"
BIN=${LOWCOMM_MPI_BASELINE:-$BL_ROOT/build-mpi/bin/lowcomm-mpi-allreduce-baseline}
if [ ! -x "$BIN" ]; then
  bl_note "building $BIN"
  cmake -S "$BL_ROOT" -B "$BL_ROOT/build-mpi" -G Ninja -DLOWCOMM_CUDA=OFF \
    -DLOWCOMM_BUILD_TESTS=OFF >/dev/null
  ninja -C "$BL_ROOT/build-mpi" lowcomm-mpi-allreduce-baseline >/dev/null
fi

bl_setup_links
OUT=$(mktemp)
bl_on_exit "rm -f '$OUT'"

before=$(bl_upload_bytes)
# - The PMIx server lives in mpirun, in the root namespace; ranks in other namespaces can reach
#   it only over the bridge, so it must accept remote connections there.
# - pml ob1 + btl tcp,self: no shared memory (vader) and no UCX, whose traffic would not cross
#   the shaped veths; btl_tcp_if_include names the namespaces' veth end.
# - mpi_yield_when_idle: 4 ranks on 2 cores; spinning ranks would steal the cores that the
#   ranks with data to move need.
PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include="${PREFIX}br0" \
  timeout --kill-after=10 "$TIMEOUT" \
  mpirun --allow-run-as-root --oversubscribe --bind-to none -n "$RANKS" \
  --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "${PREFIX}eth0" \
  --mca mpi_yield_when_idle 1 ${ALG_ARGS[@]+"${ALG_ARGS[@]}"} \
  "$BL_ROOT/scripts/baselines/mpi_rank_wrapper.sh" "$PREFIX" \
  "$BIN" -b "$MIN" -e "$MAX" -f "$FACTOR" -w "$WARMUP" -n "$ITERS" --library "$LIBRARY" >"$OUT" &
# In the background, so that a signal to this script runs its cleanup at once (bash delays traps
# until a foreground child exits); the cleanup stops mpirun, which stops its ranks.
mpi_pid=$!
bl_on_exit "kill $mpi_pid 2>/dev/null"
wait "$mpi_pid" || bl_die "mpirun failed (exit $?; its messages are above)"
after=$(bl_upload_bytes)
bl_summary "$OUT" "$before" "$after"
