#!/usr/bin/env bash
# Emulated WAN links from network namespaces, so that lowcomm and other libraries (Open MPI,
# Gloo) run over the same kernel-shaped links. Layout, tbf parameters and measurements:
# docs/wan-emulation.md.
#
#   scripts/wan_netns.sh up N --rate 1gbit [--delay 25ms] [--prefix lc] [--subnet 10.77.0]
#                              [--burst BYTES] [--limit BYTES] [--sites "0-3:1gbit,4-7:100mbit"]
#   scripts/wan_netns.sh down [--prefix lc]
#   scripts/wan_netns.sh status [--prefix lc]
#   scripts/wan_netns.sh exec [--prefix lc] K cmd...    # run cmd in namespace K
#   scripts/wan_netns.sh selftest [--rates "1gbit 100mbit"] [--seconds 5] [--delay 25ms]
#
# Layout for prefix P (default lc), subnet S (default 10.77.0), N ranks:
#   namespaces P0..P{N-1}; in namespace k the interface Peth0 = S.{k+1}/24 and lo, both up;
#   in the root namespace the bridge Pbr0 = S.254/24 and the other veth ends Ph0..Ph{N-1}.
#   tbf on Peth0 (egress: rank k's upload) and on Ph{k} (egress: rank k's download), so each
#   rank's link is limited to the rate in both directions, as an access link to the internet is.
#   --delay D adds a one-way delay D on Peth0 (RTT 2·D between any two ranks): netem where the
#   kernel has it, else lowcomm-wan-delay (bench/wan/wan_delay.cc, built with lowcomm where
#   libnetfilter_queue is installed; LOWCOMM_WAN_DELAY names another binary) behind an iptables
#   NFQUEUE rule in each namespace; without either it says so and shapes the rate only.
#   --sites "A-B:RATE,...": the ranks A..B form one site: their veths join the site's bridge
#   Ps{i} unshaped (the site's local network), and one veth pair joins Ps{i} to Pbr0 with tbf at
#   RATE on both ends: Pu{i} egress is the site's uplink, Pd{i} egress its downlink, shared by
#   all the site's ranks (queue: SITE_LIMIT_MS of the rate, default 400). Ranks in no site keep
#   their own --rate links.
#
# `up` reconciles: it creates what is missing, replaces the qdiscs, and removes namespaces of
# the same prefix numbered N or above, so it is safe to re-run with other settings.
set -euo pipefail

PROG=wan_netns
STATE_DIR=/run/lowcomm-wan

die() { echo "$PROG: error: $*" >&2; exit 1; }
note() { echo "$PROG: $*" >&2; }

usage() {
  sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

# ---- rates: tc's units (bit, kbit, mbit, gbit, tbit; SI, 1 kbit = 1000 bit) ----
rate_bits() {  # "1gbit" -> 1000000000
  local r=${1,,}
  [[ $r =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit|tbit)$ ]] ||
    die "rate '$1' not understood; use a number with bit, kbit, mbit, gbit or tbit (e.g. 1gbit, 100mbit)"
  local mult
  case ${BASH_REMATCH[3]} in
    bit) mult=1 ;; kbit) mult=1000 ;; mbit) mult=1000000 ;; gbit) mult=1000000000 ;;
    tbit) mult=1000000000000 ;;
  esac
  awk -v n="${BASH_REMATCH[1]}" -v m="$mult" 'BEGIN { printf "%.0f", n * m }'
}

delay_us() {  # "25ms" -> 25000
  local d=${1,,}
  [[ $d =~ ^([0-9]+(\.[0-9]+)?)(us|ms|s)$ ]] || die "delay '$1' not understood; use e.g. 25ms"
  local mult
  case ${BASH_REMATCH[3]} in us) mult=1 ;; ms) mult=1000 ;; s) mult=1000000 ;; esac
  awk -v n="${BASH_REMATCH[1]}" -v m="$mult" 'BEGIN { printf "%.0f", n * m }'
}

# Defaults for tbf, from the rate (bits/s). Why these values: docs/wan-emulation.md.
#   burst: 2 ms of the rate, at least 64 KiB. The bucket must hold more than one
#     TSO/GSO super-packet (up to 64 KiB) or tbf has to split every one of them, and must cover
#     the wake-up jitter of the qdisc watchdog on a busy 2-core VM, or the link idles while the
#     bucket would have allowed sending; 2 ms is still short enough that the rate holds over any
#     interval that matters for a collective (1 MiB at 1 Gbit/s takes 8 ms).
#   limit: 10 ms of the rate, at least 256 KiB. The queue must absorb a TCP window's burst
#     (drops cost a single flow its rate on a short-RTT path), but a long queue only adds delay
#     (bufferbloat), which on a real WAN link is not there.
default_burst() { awk -v r="$1" 'BEGIN { b = r / 8 * 0.002; if (b < 65536) b = 65536; printf "%.0f", b }'; }
default_limit() { awk -v r="$1" 'BEGIN { l = r / 8 * 0.010; if (l < 262144) l = 262144; printf "%.0f", l }'; }

# ---- preconditions ----
need_tools() {
  local t
  for t in ip tc; do
    command -v "$t" >/dev/null 2>&1 ||
      die "'$t' not found; install iproute2 (apt-get install iproute2)"
  done
}
need_root() {
  [ "$(id -u)" -eq 0 ] ||
    die "must run as root (network namespaces, veth pairs and qdiscs need CAP_NET_ADMIN); try: sudo $0 ${ORIG_ARGS[*]}"
}

check_prefix() {
  # Interface names are at most 15 bytes: the longest is P + "eth0" / P + "h" + index.
  [[ $PREFIX =~ ^[a-z][a-z0-9]{0,7}$ ]] ||
    die "prefix '$PREFIX' must be 1 to 8 characters [a-z0-9], starting with a letter"
}

# Serializes concurrent invocations (two `up`s racing on the same bridge).
take_lock() {
  mkdir -p "$STATE_DIR"
  exec 9>"$STATE_DIR/lock"
  flock 9
}

ns_name() { echo "${PREFIX}$1"; }
ns_list() {  # this prefix's namespaces, by index
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+$" |
    sed "s/^${PREFIX}//" | sort -n || true
}
ns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$1"; }
link_exists() { ip link show dev "$1" >/dev/null 2>&1; }

# ---- qdiscs ----
NETEM_STATE=""  # "", "applied", "unavailable", "nfqueue"
NFQ_QUEUE=7     # the NFQUEUE number in each namespace (each namespace has its own queues)

delayer_bin() {
  local b=${LOWCOMM_WAN_DELAY:-$(cd "$(dirname "$0")/.." && pwd)/build/bin/lowcomm-wan-delay}
  [ -x "$b" ] && echo "$b"
}

# Stops namespace $1's delayer and removes its rule (both may be absent).
stop_delayer() {
  local ns=$1 dev=$2 pidf="$STATE_DIR/$1.delay.pid"
  if [ -f "$pidf" ]; then
    kill "$(cat "$pidf")" 2>/dev/null || true
    rm -f "$pidf"
  fi
  if ns_exists "$ns" && command -v iptables >/dev/null 2>&1; then
    while ip netns exec "$ns" iptables -t mangle -D PREROUTING -i "$dev" -j NFQUEUE \
      --queue-num "$NFQ_QUEUE" --queue-bypass 2>/dev/null; do :; done
  fi
}

# One-way delay $DELAY_US on namespace $1's device $2 without netem: every packet arriving on $2
# is queued to lowcomm-wan-delay, which lets it go on DELAY_US later, in order (on ingress: see
# bench/wan/wan_delay.cc for why not on egress). --queue-bypass: while no
# delayer holds the queue, packets pass undelayed rather than being dropped. Returns 1 (and
# changes nothing) without iptables or the binary.
start_delayer() {
  local ns=$1 dev=$2 bin
  bin=$(delayer_bin) || return 1
  command -v iptables >/dev/null 2>&1 || return 1
  stop_delayer "$ns" "$dev"
  ip netns exec "$ns" iptables -t mangle -A PREROUTING -i "$dev" -j NFQUEUE \
    --queue-num "$NFQ_QUEUE" --queue-bypass || return 1
  ip netns exec "$ns" setsid "$bin" --queue "$NFQ_QUEUE" --delay-us "$DELAY_US" \
    </dev/null >"$STATE_DIR/$ns.delay.log" 2>&1 9>&- &
  echo $! >"$STATE_DIR/$ns.delay.pid"
  # Bound to the queue before the caller measures anything through it.
  local i
  for ((i = 0; i < 100; i++)); do
    grep -q "queue $NFQ_QUEUE" "$STATE_DIR/$ns.delay.log" 2>/dev/null && return 0
    kill -0 "$(cat "$STATE_DIR/$ns.delay.pid")" 2>/dev/null || break
    sleep 0.02
  done
  note "lowcomm-wan-delay in $ns did not start: $(cat "$STATE_DIR/$ns.delay.log" 2>/dev/null)"
  stop_delayer "$ns" "$dev"
  return 1
}

# tbf (and netem before it, if asked and available) on one device; $1: "" or "ip netns exec NS".
shape_dev() {
  local nsexec=$1 dev=$2 with_delay=$3
  # shellcheck disable=SC2086
  $nsexec tc qdisc del dev "$dev" root >/dev/null 2>&1 || true
  local tbf=(tbf rate "$RATE" burst "$BURST" limit "$LIMIT")
  local ns=${nsexec##* }
  [ -n "$nsexec" ] && stop_delayer "$ns" "$dev"
  if [ "$with_delay" = 1 ] && [ "$NETEM_STATE" != unavailable ] && [ "$NETEM_STATE" != nfqueue ]; then
    local err
    # netem as root, tbf as its child: the recipe of tc-netem(8). The netem queue must hold a
    # bandwidth-delay product of packets.
    local pkts
    pkts=$(awk -v r="$RATE_BITS" -v d="$DELAY_US" 'BEGIN { p = 2 * r / 8 * d / 1e6 / 1500; if (p < 1000) p = 1000; printf "%.0f", p }')
    # shellcheck disable=SC2086
    if err=$($nsexec tc qdisc add dev "$dev" root handle 1: netem delay "$DELAY" limit "$pkts" 2>&1); then
      # shellcheck disable=SC2086
      $nsexec tc qdisc add dev "$dev" parent 1:1 handle 10: "${tbf[@]}"
      NETEM_STATE=applied
      return
    fi
    NETEM_STATE=unavailable
    if [ -n "$nsexec" ] && start_delayer "$ns" "$dev"; then
      NETEM_STATE=nfqueue
    else
      note "netem is not available on this kernel ($(uname -r): ${err//$'\n'/ }), nor"
      note "lowcomm-wan-delay with iptables (build lowcomm with libnetfilter-queue-dev installed)."
      note "--delay $DELAY is NOT applied: the links are rate-limited only (no added delay)."
      note "For delay use lowcomm's own emulator: LOWCOMM_WAN=\"bw=$RATE,rtt=$((2 * DELAY_US / 1000))ms\"."
    fi
  elif [ "$with_delay" = 1 ] && [ "$NETEM_STATE" = nfqueue ]; then
    start_delayer "$ns" "$dev" || die "lowcomm-wan-delay failed in $ns"
  fi
  # shellcheck disable=SC2086
  $nsexec tc qdisc add dev "$dev" root handle 10: "${tbf[@]}"
}

# tbf at rate $2 (bits/s $3) on one root-namespace device: a site link. The queue holds
# SITE_LIMIT_MS (default 400) of the rate: every rank of the site sends through it at once (4
# ranks x 4 flows). With the per-rank links' 10 ms the flows' losses held the link to 75% of
# its rate; with 50 ms, 2 sites x 4 ranks at 1 Gbit/s and 100 Mbit/s, the fast site's ranks
# retransmitted 500-3,700 segments per 4 all-reduces and two levels ran 25-45% slower than the
# emulator, whose site link is a lossless FIFO, varying from run to run; at 400 ms about 30
# and 4-6% (docs/sites.md). A smaller SITE_LIMIT_MS studies shallow buffers.
shape_site_dev() {
  local dev=$1 rate=$2 bits=$3
  local limit
  limit=$(awk -v r="$bits" -v ms="${SITE_LIMIT_MS:-400}" \
    'BEGIN { l = r / 8 * ms / 1000; if (l < 262144) l = 262144; printf "%.0f", l }')
  tc qdisc del dev "$dev" root >/dev/null 2>&1 || true
  tc qdisc add dev "$dev" root handle 10: tbf rate "$rate" burst "$(default_burst "$bits")" \
    limit "$limit"
}

# --sites "0-3:1gbit,4-7:100mbit" -> SITE_FIRST/SITE_LAST/SITE_RATE arrays; checked against N.
parse_sites() {
  SITE_FIRST=() SITE_LAST=() SITE_RATE=()
  [ -n "$SITES" ] || return 0
  local item first last rate i items
  IFS=',' read -ra items <<<"$SITES"
  for item in "${items[@]}"; do
    [[ $item =~ ^([0-9]+)(-([0-9]+))?:(.+)$ ]] ||
      die "--sites: '$item' is not FIRST-LAST:RATE (e.g. 0-3:1gbit)"
    first=${BASH_REMATCH[1]} last=${BASH_REMATCH[3]:-${BASH_REMATCH[1]}} rate=${BASH_REMATCH[4]}
    [ "$last" -ge "$first" ] || die "--sites: '$item': range backwards"
    [ "$last" -lt "$N" ] || die "--sites: '$item' names rank $last, beyond the $N namespaces"
    rate_bits "$rate" >/dev/null
    for ((i = 0; i < ${#SITE_FIRST[@]}; i++)); do
      if [ "$first" -le "${SITE_LAST[$i]}" ] && [ "${SITE_FIRST[$i]}" -le "$last" ]; then
        die "--sites: '$item' overlaps site ${SITE_FIRST[$i]}-${SITE_LAST[$i]}"
      fi
    done
    SITE_FIRST+=("$first") SITE_LAST+=("$last") SITE_RATE+=("$rate")
  done
  [ ${#SITE_FIRST[@]} -le 99 ] || die "--sites: at most 99 sites"
}
site_of() {  # rank -> site index, or -1
  local i
  for ((i = 0; i < ${#SITE_FIRST[@]}; i++)); do
    if [ "$1" -ge "${SITE_FIRST[$i]}" ] && [ "$1" -le "${SITE_LAST[$i]}" ]; then echo "$i"; return; fi
  done
  echo -1
}

# ---- commands ----
cmd_up() {
  [ -n "$N" ] || die "up needs the number of namespaces: up N --rate 1gbit"
  if ! [[ $N =~ ^[0-9]+$ ]] || [ "$N" -lt 1 ] || [ "$N" -gt 200 ]; then die "N must be 1..200, got '$N'"; fi
  [ -n "$RATE" ] || die "up needs --rate (e.g. --rate 1gbit)"
  RATE_BITS=$(rate_bits "$RATE")
  [ -n "$BURST" ] || BURST=$(default_burst "$RATE_BITS")
  [ -n "$LIMIT" ] || LIMIT=$(default_limit "$RATE_BITS")
  [[ $BURST =~ ^[0-9]+$ && $LIMIT =~ ^[0-9]+$ ]] || die "--burst and --limit are byte counts"
  [ "$BURST" -ge 2048 ] || die "--burst must be at least 2048 bytes (one full-size frame)"
  if [ -n "$DELAY" ]; then DELAY_US=$(delay_us "$DELAY"); fi
  parse_sites
  take_lock

  local br="${PREFIX}br0" ifn="${PREFIX}eth0"
  if ! link_exists "$br"; then
    ip link add "$br" type bridge
  fi
  # No STP, no forwarding delay: ports forward as soon as they are up.
  ip link set "$br" type bridge stp_state 0 forward_delay 0 2>/dev/null || true
  ip addr replace "$SUBNET.254/24" dev "$br"
  ip link set "$br" up

  # Sites: a bridge each, joined to $br by a veth pair shaped both ways (the site's WAN link).
  local i sbr up dn sbits l
  for ((i = 0; i < ${#SITE_FIRST[@]}; i++)); do
    sbr="${PREFIX}s$i" up="${PREFIX}u$i" dn="${PREFIX}d$i"
    link_exists "$sbr" || ip link add "$sbr" type bridge
    ip link set "$sbr" type bridge stp_state 0 forward_delay 0 2>/dev/null || true
    ip link set "$sbr" up
    if ! link_exists "$up"; then
      link_exists "$dn" && ip link del "$dn"
      ip link add "$up" type veth peer name "$dn"
    fi
    ip link set "$up" master "$sbr"
    ip link set "$dn" master "$br"
    ip link set "$up" up
    ip link set "$dn" up
    sbits=$(rate_bits "${SITE_RATE[$i]}")
    shape_site_dev "$up" "${SITE_RATE[$i]}" "$sbits"  # egress from the site: its uplink
    shape_site_dev "$dn" "${SITE_RATE[$i]}" "$sbits"  # egress into the site: its downlink
  done

  local k ns host site
  for ((k = 0; k < N; k++)); do
    ns=$(ns_name "$k") host="${PREFIX}h$k"
    site=$(site_of "$k")
    ns_exists "$ns" || ip netns add "$ns"
    if ! ip netns exec "$ns" ip link show dev "$ifn" >/dev/null 2>&1; then
      link_exists "$host" && ip link del "$host"  # a half-built pair from an interrupted run
      ip link add "$host" type veth peer name "${PREFIX}n$k"
      ip link set "${PREFIX}n$k" netns "$ns"
      ip netns exec "$ns" ip link set "${PREFIX}n$k" name "$ifn"
    fi
    if [ "$site" -ge 0 ]; then
      ip link set "$host" master "${PREFIX}s$site"
    else
      ip link set "$host" master "$br"
    fi
    ip link set "$host" up
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip addr replace "$SUBNET.$((k + 1))/24" dev "$ifn"
    ip netns exec "$ns" ip link set "$ifn" up
    if [ "$site" -ge 0 ]; then
      # Inside a site: the local network, unshaped (the site link is shaped instead).
      ip netns exec "$ns" tc qdisc del dev "$ifn" root >/dev/null 2>&1 || true
      tc qdisc del dev "$host" root >/dev/null 2>&1 || true
    else
      shape_dev "ip netns exec $ns" "$ifn" "$([ -n "$DELAY" ] && echo 1 || echo 0)"
      shape_dev "" "$host" 0
    fi
  done
  # Sites of an earlier `up` beyond this one's.
  for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
    grep -E "^${PREFIX}(s|u|d)[0-9]+$" || true); do
    i=${l#"${PREFIX}"}
    i=${i:1}
    if [ "$i" -ge ${#SITE_FIRST[@]} ]; then ip link del "$l" 2>/dev/null || true; fi
  done
  # Namespaces of this prefix beyond N, from an earlier, larger `up`.
  for k in $(ns_list); do
    if [ "$k" -ge "$N" ]; then
      stop_delayer "$(ns_name "$k")" "${PREFIX}eth0"
      ip netns del "$(ns_name "$k")"
      link_exists "${PREFIX}h$k" && ip link del "${PREFIX}h$k"
    fi
  done

  local sites_conf="" sep=""
  for ((i = 0; i < ${#SITE_FIRST[@]}; i++)); do
    sites_conf+="$sep${SITE_FIRST[$i]}-${SITE_LAST[$i]}:$(rate_bits "${SITE_RATE[$i]}")"
    sep=,
  done
  local delay_state=none
  [ -n "$DELAY" ] && delay_state="$DELAY:${NETEM_STATE:-applied}"
  cat >"$STATE_DIR/$PREFIX.conf" <<EOF
N=$N
RATE=$RATE
RATE_BITS=$RATE_BITS
BURST=$BURST
LIMIT=$LIMIT
SUBNET=$SUBNET
DELAY=$delay_state
SITES=$sites_conf
EOF
  note "up: $N namespaces ${PREFIX}0..${PREFIX}$((N - 1)) on $br ($SUBNET.254), addresses $SUBNET.1..$SUBNET.$N on $ifn, tbf rate $RATE burst $BURST limit $LIMIT both ways${DELAY:+, delay $delay_state}${SITES:+, sites $SITES (one shaped link each, unshaped inside)}"
}

cmd_down() {
  take_lock
  local k removed=0
  for k in $(ns_list); do
    stop_delayer "$(ns_name "$k")" "${PREFIX}eth0"
    ip netns del "$(ns_name "$k")" && removed=$((removed + 1))
  done
  # Deleting a namespace deletes its veth end, and with it the pair; sweep any leftovers.
  local l
  for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
    grep -E "^${PREFIX}(h|n|u|d|s)[0-9]+$" || true); do
    ip link del "$l" 2>/dev/null || true
  done
  local bridge="no bridge"
  if link_exists "${PREFIX}br0"; then ip link del "${PREFIX}br0" && bridge="bridge ${PREFIX}br0"; fi
  rm -f "$STATE_DIR/$PREFIX.conf"
  note "down: removed $removed namespaces and $bridge (prefix $PREFIX)"
}

cmd_status() {
  local br="${PREFIX}br0" ifn="${PREFIX}eth0"
  if [ -f "$STATE_DIR/$PREFIX.conf" ]; then
    echo "== settings ($STATE_DIR/$PREFIX.conf)"
    sed 's/^/  /' "$STATE_DIR/$PREFIX.conf"
  fi
  if ! link_exists "$br" && [ -z "$(ns_list)" ]; then
    echo "no namespaces with prefix '$PREFIX' (run: $0 up N --rate 1gbit --prefix $PREFIX)"
    return 0
  fi
  echo "== bridge $br (root namespace)"
  ip -br addr show dev "$br" 2>/dev/null | sed 's/^/  /' || echo "  (missing)"
  local k ns
  for k in $(ns_list); do
    ns=$(ns_name "$k")
    echo "== namespace $ns"
    ip netns exec "$ns" ip -br addr show dev "$ifn" 2>/dev/null | sed 's/^/  /' || echo "  $ifn missing"
    echo "  upload   ($ns:$ifn egress):"
    ip netns exec "$ns" tc qdisc show dev "$ifn" 2>/dev/null | sed 's/^/    /'
    echo "  download (root:${PREFIX}h$k egress):"
    tc qdisc show dev "${PREFIX}h$k" 2>/dev/null | sed 's/^/    /'
  done
}

cmd_exec() {
  [ $# -ge 2 ] || die "exec needs a namespace index and a command: exec K cmd..."
  local k=$1
  shift
  [[ $k =~ ^[0-9]+$ ]] || die "namespace index must be a number, got '$k'"
  ns_exists "$(ns_name "$k")" || die "namespace $(ns_name "$k") does not exist (run: $0 up N --rate ...)"
  exec ip netns exec "$(ns_name "$k")" "$@"
}

# Two namespaces with a private prefix and subnet, one TCP flow each way per rate; removed on exit.
cmd_selftest() {
  local rates=${SELFTEST_RATES:-"1gbit 100mbit"} secs=${SELFTEST_SECONDS:-5} delay=$DELAY
  PREFIX=lcst SUBNET=10.78.0
  trap 'PREFIX=lcst; cmd_down >/dev/null 2>&1 || true' EXIT
  trap 'exit 130' INT TERM
  local have_iperf=0
  command -v iperf3 >/dev/null 2>&1 && have_iperf=1
  [ $have_iperf = 1 ] || note "iperf3 not found; using a Python socket test (apt-get install iperf3 for iperf3)"
  echo "rate,delay,direction,tool,seconds,measured_mbit_s,percent_of_rate"
  local r dir
  for r in $rates; do
    N=2 RATE=$r BURST="" LIMIT="" DELAY=$delay
    cmd_up 2>/dev/null
    for dir in "ns1->ns0" "ns0->ns1"; do
      local bps
      if [ $have_iperf = 1 ]; then
        ip netns exec lcst0 iperf3 -s -1 -B "$SUBNET.1" >/dev/null 2>&1 &
        local spid=$!
        sleep 0.5
        local rev=()
        [ "$dir" = "ns0->ns1" ] && rev=(-R)
        # Bits per second received, over the whole run (omitting the first second of slow start).
        bps=$(ip netns exec lcst1 iperf3 -c "$SUBNET.1" -t "$secs" -O 1 -J "${rev[@]}" |
          /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])')
        wait "$spid" || true
      else
        local src=1 dst=0
        [ "$dir" = "ns0->ns1" ] && src=0 dst=1
        bps=$(selftest_python "lcst$dst" "lcst$src" "$SUBNET.$((dst + 1))" "$secs")
      fi
      awk -v r="$r" -v d="$dir" -v t="$([ $have_iperf = 1 ] && echo iperf3 || echo python)" \
        -v s="$secs" -v b="$bps" -v rb="$RATE_BITS" -v dl="${delay:-0}" \
        'BEGIN { printf "%s,%s,%s,%s,%s,%.1f,%.1f\n", r, dl, d, t, s, b / 1e6, 100 * b / rb }'
    done
  done
}

# One TCP flow from namespace $2 to a receiver in $1 at address $3 for $4 seconds; prints bits/s
# of payload received over the last ($4 - 1) seconds.
selftest_python() {
  local rx_ns=$1 tx_ns=$2 addr=$3 secs=$4
  ip netns exec "$tx_ns" /usr/bin/python3 - "$addr" "$secs" <<'EOF' >/dev/null 2>&1 &
import socket, sys, time
addr, secs = sys.argv[1], float(sys.argv[2])
for _ in range(100):
    try:
        s = socket.create_connection((addr, 5299)); break
    except OSError:
        time.sleep(0.05)
buf = bytes(1 << 20); end = time.time() + secs
while time.time() < end:
    s.sendall(buf)
s.close()
EOF
  ip netns exec "$rx_ns" /usr/bin/python3 - "$addr" <<'EOF'
import socket, sys, time
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((sys.argv[1], 5299)); ls.listen(1); c, _ = ls.accept()
buf = bytearray(1 << 20); t0 = time.time(); start = None; n = 0
while True:
    k = c.recv_into(buf)
    if not k: break
    now = time.time()
    if now - t0 >= 1.0:
        if start is None: start = now
        else: n += k
print(8 * n / (time.time() - start))
EOF
  wait || true
}

# ---- arguments ----
[ $# -ge 1 ] || usage
ORIG_ARGS=("$@")
CMD=$1
shift
PREFIX=lc SUBNET=10.77.0 N="" RATE="" DELAY="" BURST="" LIMIT="" SITES=""
ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --prefix) PREFIX=${2:?--prefix needs a value}; shift 2 ;;
    --rate) RATE=${2:?--rate needs a value}; shift 2 ;;
    --delay) DELAY=${2:?--delay needs a value}; shift 2 ;;
    --subnet) SUBNET=${2:?--subnet needs a value}; shift 2 ;;
    --burst) BURST=${2:?--burst needs a value}; shift 2 ;;
    --limit) LIMIT=${2:?--limit needs a value}; shift 2 ;;
    --sites) SITES=${2:?--sites needs a value}; shift 2 ;;
    --rates) SELFTEST_RATES=${2:?--rates needs a value}; shift 2 ;;
    --seconds) SELFTEST_SECONDS=${2:?--seconds needs a value}; shift 2 ;;
    -h | --help) usage 0 ;;
    *)
      if [ "$CMD" = exec ]; then ARGS=("$@"); break; fi
      ARGS+=("$1"); shift ;;
  esac
done
[[ $SUBNET =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "--subnet takes three octets, e.g. 10.77.0"

case $CMD in
  up) need_tools; need_root; check_prefix; N=${ARGS[0]:-}; [ ${#ARGS[@]} -le 1 ] || die "unexpected arguments: ${ARGS[*]:1}"; cmd_up ;;
  down) need_tools; need_root; check_prefix; [ ${#ARGS[@]} -eq 0 ] || die "unexpected arguments: ${ARGS[*]}"; cmd_down ;;
  status) need_tools; need_root; check_prefix; cmd_status ;;
  exec) need_tools; need_root; check_prefix; cmd_exec "${ARGS[@]}" ;;
  selftest) need_tools; need_root; cmd_selftest ;;
  -h | --help | help) usage 0 ;;
  *) echo "$PROG: unknown command '$CMD'" >&2; usage ;;
esac
