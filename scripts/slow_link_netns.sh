#!/usr/bin/env bash
# Liveness over a kernel-shaped slow link (docs/collectives.md, "Failure semantics"): creates two
# namespaces behind 20 Mbit/s tbf links (scripts/wan_netns.sh, prefix lcs, subnet 10.75.0), runs
# lowcomm-slow-link-check in them (a sealed 32 MiB broadcast and send with no false failure, a
# rank frozen mid-transfer failed within 3 s), and removes the namespaces again.
#
#   scripts/slow_link_netns.sh [BUILD_DIR] [args...]
#
# LCS_PREFIX, LCS_SUBNET and LCS_RATE (default lcs, 10.75.0, 20mbit) choose the namespaces.
# Exit status 77 (skipped) where this machine cannot create namespaces: it needs root
# (CAP_NET_ADMIN) and iproute2 (scripts/deps.sh installs it).
set -uo pipefail
PREFIX=${LCS_PREFIX:-lcs}
SUBNET=${LCS_SUBNET:-10.75.0}
RATE=${LCS_RATE:-20mbit}
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=${1:-$HERE/../build}
shift || true
BIN=$BUILD/bin/lowcomm-slow-link-check
[ -x "$BIN" ] || { echo "slow_link_netns: $BIN not built" >&2; exit 1; }
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
  echo "slow_link_netns: SKIPPED: needs root and iproute2" >&2
  exit 77
fi
if ! ip netns add "${PREFIX}_probe" 2>/dev/null; then
  echo "slow_link_netns: SKIPPED: this machine cannot create network namespaces" >&2
  exit 77
fi
ip netns del "${PREFIX}_probe"
cleanup() { "$HERE/wan_netns.sh" down --prefix "$PREFIX" >/dev/null 2>&1 || true; }
trap cleanup EXIT
"$HERE/wan_netns.sh" up 2 --rate "$RATE" --prefix "$PREFIX" --subnet "$SUBNET" >/dev/null || exit 1
"$BIN" --netns "$PREFIX" --subnet "$SUBNET" "$@"
