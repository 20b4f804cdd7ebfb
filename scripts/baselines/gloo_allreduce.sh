#!/usr/bin/env bash
# Gloo baseline: torch.distributed all_reduce (backend gloo, the repository's .venv torch) of P ranks,
# each in its own network namespace, over the tbf-shaped links of scripts/wan_netns.sh. Prints
# CSV rows and a summary.
#   sudo scripts/baselines/gloo_allreduce.sh [--ranks 4] [--rate 1gbit] [--prefix lc]
#        [-b 1M] [-e 256M] [-f 4] [-w 1] [-n 3] [--timeout 900]
# Rank r runs in namespace PREFIX<r> with GLOO_SOCKET_IFNAME=PREFIXeth0; the TCP store listens on
# rank 0's address. $LOWCOMM_PYTHON picks the interpreter (default: .venv/bin/python, the torch
# from PyPI that scripts/deps.sh installs and the torch backend uses). Details:
# docs/wan-emulation.md.
set -euo pipefail
# shellcheck disable=SC2034  # read by common.sh
BL_NAME=gloo_allreduce
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
bl_parse_args "$@"

PY=${LOWCOMM_PYTHON:-$BL_ROOT/.venv/bin/python}
"$PY" -c 'import torch.distributed as d; assert d.is_available() and d.is_gloo_available()' 2>/dev/null ||
  bl_die "$PY cannot import torch.distributed with Gloo; run scripts/deps.sh (or set LOWCOMM_PYTHON)"
PORT=${LOWCOMM_GLOO_PORT:-29500}

bl_setup_links
SUBNET=$(sed -n 's/^SUBNET=//p' "$BL_STATE_DIR/$PREFIX.conf")
OUT=$(mktemp)
bl_on_exit "rm -f '$OUT'"

before=$(bl_upload_bytes)
pids=()
# A failed or interrupted run must not leave ranks behind, waiting for their peers.
# shellcheck disable=SC2016  # expanded when the cleanup runs
bl_on_exit 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done'
for ((r = 0; r < RANKS; r++)); do
  out=/dev/null
  [ $r -eq 0 ] && out=$OUT
  GLOO_SOCKET_IFNAME="${PREFIX}eth0" OMP_NUM_THREADS=1 \
    timeout --kill-after=10 "$TIMEOUT" \
    ip netns exec "$PREFIX$r" "$PY" "$BL_ROOT/scripts/baselines/gloo_allreduce.py" \
    --rank "$r" --world-size "$RANKS" --master-addr "$SUBNET.1" --master-port "$PORT" \
    -b "$MIN" -e "$MAX" -f "$FACTOR" -w "$WARMUP" -n "$ITERS" --timeout-s "$TIMEOUT" >"$out" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
pids=()
[ $rc -eq 0 ] || bl_die "a rank failed (see its messages above)"
after=$(bl_upload_bytes)
bl_summary "$OUT" "$before" "$after"
