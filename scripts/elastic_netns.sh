#!/usr/bin/env bash
# Elastic groups across network namespaces (docs/membership.md): creates four namespaces behind
# 1 Gbit/s links (scripts/wan_netns.sh, prefix lce, subnet 10.78.0), runs one program in them,
# and removes the namespaces again.
#
#   scripts/elastic_netns.sh [BUILD_DIR] [partition] [args...]
#       lowcomm-elastic-partition: 2|2, no side commits; 3|1, the three go on, the one fences,
#       and a joiner takes its place once healed
#   scripts/elastic_netns.sh BUILD_DIR chaos [args...]
#       lowcomm-elastic-chaos with partitions among its events (e.g. --events 40 --rounds 3000)
#
# LCE_PREFIX and LCE_SUBNET (default lce, 10.78.0) choose the namespaces, so that two runs (the
# suite's and a soak) do not share them.
#
# Exit status 77 (skipped) where this machine cannot create namespaces or has no nft: it needs
# root (CAP_NET_ADMIN), iproute2 and nftables (scripts/deps.sh installs both).
set -uo pipefail
PREFIX=${LCE_PREFIX:-lce}
SUBNET=${LCE_SUBNET:-10.78.0}
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=${1:-$HERE/../build}
shift || true
MODE=partition
if [ $# -gt 0 ] && { [ "$1" = partition ] || [ "$1" = chaos ]; }; then MODE=$1; shift; fi
BIN=$BUILD/bin/lowcomm-elastic-$MODE
[ -x "$BIN" ] || { echo "elastic_netns: $BIN not built" >&2; exit 1; }
if [ "$(id -u)" -ne 0 ] || ! command -v nft >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1; then
  echo "elastic_netns: SKIPPED: needs root, iproute2 and nftables" >&2
  exit 77
fi
if ! ip netns add ${PREFIX}_probe 2>/dev/null; then
  echo "elastic_netns: SKIPPED: this machine cannot create network namespaces" >&2
  exit 77
fi
ip netns del ${PREFIX}_probe
cleanup() { "$HERE/wan_netns.sh" down --prefix "$PREFIX" >/dev/null 2>&1 || true; }
trap cleanup EXIT
"$HERE/wan_netns.sh" up 4 --rate 1gbit --prefix "$PREFIX" --subnet "$SUBNET" >/dev/null || exit 1
EXTRA=()
[ "$MODE" = chaos ] && EXTRA=(--namespaces 4)
"$BIN" --netns "$PREFIX" --subnet "$SUBNET" "${EXTRA[@]}" "$@"
