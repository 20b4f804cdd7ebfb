# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables set here are read by the launchers that source this
# Shared by the baseline launchers (sourced, not run): argument parsing, the namespaces the run
# needs, and the summary. See docs/wan-emulation.md.
#
# Options every launcher takes:
#   --ranks P (4)  --rate R (1gbit, used when the launcher creates the namespaces)
#   --prefix lc    -b 1M -e 256M -f 4 (sizes, K/M/G binary)  -w 1 (warm-up)  -n 3 (iterations)
#   --timeout S (900: the whole run is killed after S seconds)
# If namespaces PREFIX0..PREFIX{P-1} exist (scripts/wan_netns.sh up ...), they are used as they
# are; otherwise the launcher creates them at --rate and removes them on exit.

BL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BL_WAN="$BL_ROOT/scripts/wan_netns.sh"
BL_STATE_DIR=/run/lowcomm-wan

# Cleanup actions, run in reverse order on exit, whatever the exit.
BL_CLEANUP=()
bl_on_exit() { BL_CLEANUP+=("$1"); }
bl_cleanup() {
  local i
  for ((i = ${#BL_CLEANUP[@]} - 1; i >= 0; i--)); do eval "${BL_CLEANUP[i]}" || true; done
}
trap bl_cleanup EXIT
trap 'exit 130' INT TERM

bl_die() { echo "$BL_NAME: error: $*" >&2; exit 1; }
bl_note() { echo "$BL_NAME: $*" >&2; }

bl_parse_args() {
  RANKS=4 RATE="" PREFIX=lc MIN=1M MAX=256M FACTOR=4 WARMUP=1 ITERS=3 TIMEOUT=900
  while [ $# -gt 0 ]; do
    case $1 in
      --ranks) RANKS=${2:?}; shift 2 ;;
      --rate) RATE=${2:?}; shift 2 ;;
      --prefix) PREFIX=${2:?}; shift 2 ;;
      -b) MIN=${2:?}; shift 2 ;;
      -e) MAX=${2:?}; shift 2 ;;
      -f) FACTOR=${2:?}; shift 2 ;;
      -w) WARMUP=${2:?}; shift 2 ;;
      -n) ITERS=${2:?}; shift 2 ;;
      --timeout) TIMEOUT=${2:?}; shift 2 ;;
      -h | --help) sed -n '3,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
      *) bl_die "unknown argument '$1' (see --help)" ;;
    esac
  done
  if ! [[ $RANKS =~ ^[0-9]+$ ]] || [ "$RANKS" -lt 2 ]; then bl_die "--ranks must be at least 2"; fi
  [ "$(id -u)" -eq 0 ] || bl_die "must run as root (ranks run in network namespaces)"
}

# Uses PREFIX0..PREFIX{RANKS-1} if they exist, else creates them and removes them on exit.
# Sets LINK_RATE (tc units) and LINK_BITS (bit/s) from the namespaces' settings.
bl_setup_links() {
  local have=1 k
  for ((k = 0; k < RANKS; k++)); do
    ip netns list | awk '{print $1}' | grep -qx "$PREFIX$k" || have=0
  done
  if [ $have = 0 ]; then
    bl_on_exit "'$BL_WAN' down --prefix '$PREFIX' >/dev/null 2>&1"
    "$BL_WAN" up "$RANKS" --rate "${RATE:-1gbit}" --prefix "$PREFIX"
  else
    bl_note "using the existing namespaces ${PREFIX}0..${PREFIX}$((RANKS - 1)) as they are"
  fi
  [ -f "$BL_STATE_DIR/$PREFIX.conf" ] || bl_die "no $BL_STATE_DIR/$PREFIX.conf: bring the links up with $BL_WAN"
  LINK_RATE=$(sed -n 's/^RATE=//p' "$BL_STATE_DIR/$PREFIX.conf")
  LINK_BITS=$(sed -n 's/^RATE_BITS=//p' "$BL_STATE_DIR/$PREFIX.conf")
  if [ -n "$RATE" ] && [ "$RATE" != "$LINK_RATE" ]; then
    bl_die "--rate $RATE, but the existing namespaces are shaped at $LINK_RATE; run '$BL_WAN up $RANKS --rate $RATE --prefix $PREFIX' first, or leave --rate out"
  fi
}

# Bytes sent so far through the tbf on every rank's upload (its veth end in its namespace).
bl_upload_bytes() {
  local k total=0 b
  for ((k = 0; k < RANKS; k++)); do
    b=$(ip netns exec "$PREFIX$k" tc -s qdisc show dev "${PREFIX}eth0" |
      awk '/^qdisc tbf/ { t = 1 } t && /Sent/ { print $2; exit }')
    total=$((total + ${b:-0}))
  done
  echo "$total"
}

# Reads the CSV rows (library,ranks,bytes,seconds,...) from $1; prints them, then a summary:
# per size the ring link limit 2 (P-1)/P * bytes * 8 / rate and time / limit; and the bytes that
# crossed the shaped uploads ($2 = before, $3 = after) against what a ring must send.
bl_summary() {
  local csv=$1 before=$2 after=$3
  cat "$csv"
  awk -F, -v bits="$LINK_BITS" -v rate="$LINK_RATE" -v calls=$((WARMUP + ITERS)) \
    -v sent=$((after - before)) -v name="$BL_NAME" '
    NR == 1 || $1 == "" { next }
    {
      p = $2; b = $3; s = $4
      limit = 2 * (p - 1) / p * b * 8 / bits
      printf "# %s: %d ranks, %9.3f MiB: %8.4f s, ring link limit at %s %8.4f s, time/limit %.2f\n",
        $1, p, b / 1048576, s, rate, limit, s / limit
      need += 2 * (p - 1) * b * calls
    }
    END {
      if (need > 0)
        printf "# %s: %.3f GB crossed the shaped uploads; a ring all-reduce of these calls sends at least %.3f GB (ratio %.2f)\n",
          name, sent / 1e9, need / 1e9, sent / need
    }' "$csv"
}
