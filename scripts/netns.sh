#!/usr/bin/env bash
# A small network on this machine for fault tests: one network namespace per node (a
# foqsd host, a MariaDB server, an etcd member), each with its own address on a bridge,
# and partitions made with nftables inside the namespaces. Everything it starts it stops
# by pid; `down` removes every namespace, veth and the bridge it made. Needs root (CI runs
# as root); says so clearly where namespaces cannot be made.
#
#   bash scripts/netns.sh up NAME...              make nodes; prints "NAME ADDRESS" each
#   bash scripts/netns.sh addr NAME               a node's address
#   bash scripts/netns.sh run NAME CMD...         start CMD in the background inside NAME
#                                                 (its pid printed, and stopped by `down`)
#   bash scripts/netns.sh exec NAME CMD...        run CMD inside NAME, in the foreground
#   bash scripts/netns.sh cut FROM TO [--one-way] drop FROM's packets to TO (and TO's to
#                                                 FROM, unless --one-way)
#   bash scripts/netns.sh heal [NAME]             remove the cuts NAME made (all: every one)
#   bash scripts/netns.sh down                    stop what `run` started, remove it all
#   bash scripts/netns.sh check                   make two nodes, prove reach, a cut, a
#                                                 one-way cut and a heal, then remove them
#
# FOQS_NETNS_PREFIX (default foqs) names the namespaces, veths and bridge, so two stages
# can exist at once; FOQS_NETNS_SUBNET (default 10.77.0) is the /24 they use (the bridge
# is .1, nodes from .11 up).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

prefix=${FOQS_NETNS_PREFIX:-foqs}
subnet=${FOQS_NETNS_SUBNET:-10.77.0}
bridge="${prefix}-br"
state="$FOQS_RUN/netns-$prefix"
nodes="$state/nodes" # lines: NAME ADDRESS INDEX

die() {
  foqs_log "netns: $*"
  exit 1
}

need_tools() {
  [ "$(id -u)" = 0 ] || die "needs root to make network namespaces (run as root, as CI does)"
  command -v ip >/dev/null 2>&1 || foqs_apt_install iproute2 || die "iproute2 is missing"
  foqs_nftables_install || die "nftables is missing"
  mkdir -p "$state"
  touch "$nodes"
}

ns_of() { echo "${prefix}-$1"; }

addr_of() {
  local a
  a=$(awk -v n="$1" '$1 == n { print $2 }' "$nodes")
  [ -n "$a" ] || die "no node $1 (make it with: netns.sh up $1)"
  echo "$a"
}

ensure_bridge() {
  if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip link add "$bridge" type bridge ||
      die "cannot make a bridge here: network namespaces need CAP_NET_ADMIN (a privileged container or a VM)"
    ip addr add "$subnet.1/24" dev "$bridge"
    ip link set "$bridge" up
  fi
}

up() {
  ensure_bridge
  for name in "$@"; do
    if awk -v n="$name" '$1 == n { found = 1 } END { exit !found }' "$nodes"; then
      echo "$name $(addr_of "$name")"
      continue
    fi
    local idx ns veth addr
    idx=$(($(awk 'BEGIN { m = 10 } $3 > m { m = $3 } END { print m }' "$nodes") + 1))
    [ "$idx" -lt 255 ] || die "no address left in $subnet.0/24"
    ns=$(ns_of "$name")
    veth="${prefix:0:8}-v$idx"
    addr="$subnet.$idx"
    ip netns add "$ns" ||
      die "cannot make network namespace $ns: it needs CAP_SYS_ADMIN and CAP_NET_ADMIN (a privileged container or a VM)"
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    ip link set "$veth" master "$bridge" up
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" route add default via "$subnet.1"
    # One table per node for its cuts: dropping it heals them all.
    ip netns exec "$ns" nft add table inet foqs_cut
    ip netns exec "$ns" nft add chain inet foqs_cut out '{ type filter hook output priority 0 ; }'
    echo "$name $addr $idx" >>"$nodes"
    echo "$name $addr"
  done
}

run() {
  local name=$1
  shift
  addr_of "$name" >/dev/null
  mkdir -p "$state/logs"
  ip netns exec "$(ns_of "$name")" "$@" >>"$state/logs/$name.log" 2>&1 &
  local pid=$!
  echo "$pid" >>"$state/pids"
  echo "$pid"
}

cut() {
  local from=$1 to=$2 oneway=${3:-}
  local to_addr from_addr
  to_addr=$(addr_of "$to")
  from_addr=$(addr_of "$from")
  ip netns exec "$(ns_of "$from")" nft add rule inet foqs_cut out ip daddr "$to_addr" drop
  if [ "$oneway" != "--one-way" ]; then
    ip netns exec "$(ns_of "$to")" nft add rule inet foqs_cut out ip daddr "$from_addr" drop
  fi
}

heal() {
  local which=("$@")
  if [ ${#which[@]} = 0 ]; then
    mapfile -t which < <(awk '{ print $1 }' "$nodes")
  fi
  for name in "${which[@]}"; do
    addr_of "$name" >/dev/null
    ip netns exec "$(ns_of "$name")" nft flush chain inet foqs_cut out
  done
}

down() {
  if [ -f "$state/pids" ]; then
    while read -r pid; do
      kill "$pid" 2>/dev/null || true
    done <"$state/pids"
    for _ in $(seq 1 40); do
      local alive=0
      while read -r pid; do kill -0 "$pid" 2>/dev/null && alive=1; done <"$state/pids"
      [ "$alive" = 0 ] && break
      sleep 0.25
    done
    while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done <"$state/pids"
    rm -f "$state/pids"
  fi
  if [ -f "$nodes" ]; then
    while read -r name _ idx; do
      ip link del "${prefix:0:8}-v$idx" 2>/dev/null || true
      ip netns del "$(ns_of "$name")" 2>/dev/null || true
    done <"$nodes"
    rm -f "$nodes"
  fi
  ip link del "$bridge" 2>/dev/null || true
  rm -rf "$state"
}

# Whether node $1 can open a TCP connection to node $2's port $3 within a second.
reaches() {
  ip netns exec "$(ns_of "$1")" python3 - "$(addr_of "$2")" "$3" <<'PY'
import socket, sys
s = socket.socket()
s.settimeout(1)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
except OSError:
    sys.exit(1)
PY
}

# Whether a UDP datagram from node $1 arrives at node $2 (packets one way, no answer).
datagram_arrives() {
  local port=47001
  local got="$state/datagram"
  rm -f "$got"
  ip netns exec "$(ns_of "$2")" python3 - "$port" "$got" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.settimeout(2)
try:
    s.recv(16)
    open(sys.argv[2], "w").write("yes")
except OSError:
    pass
PY
  local listener=$!
  for _ in 1 2 3 4 5; do
    ip netns exec "$(ns_of "$1")" python3 -c "
import socket, sys
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('$(addr_of "$2")', $port))" \
      2>/dev/null || true # a cut refuses the send (EPERM): the datagram does not leave
    sleep 0.1
  done
  wait "$listener" || true
  [ -f "$got" ]
}

check() {
  trap down EXIT
  up check-a check-b >/dev/null
  run check-b python3 -m http.server --bind 0.0.0.0 47000 >/dev/null
  local ok=0
  for _ in $(seq 1 50); do reaches check-a check-b 47000 && { ok=1; break; }; sleep 0.1; done
  [ "$ok" = 1 ] || die "check: a cannot reach b before any cut"
  cut check-a check-b
  ! reaches check-a check-b 47000 || die "check: a still reaches b through a cut"
  heal
  reaches check-a check-b 47000 || die "check: a does not reach b after the heal"
  cut check-a check-b --one-way
  ! datagram_arrives check-a check-b || die "check: a's packets pass a one-way cut"
  datagram_arrives check-b check-a || die "check: b's packets do not reach a past a one-way cut of a"
  heal check-a
  reaches check-a check-b 47000 || die "check: a does not reach b after healing a"
  foqs_log "netns: two namespaces, reach, a cut, a one-way cut and heals all work"
}

cmd=${1:-}
[ -n "$cmd" ] || { sed -n '2,24p' "$0"; exit 2; }
shift
need_tools
case "$cmd" in
  up) up "$@" ;;
  addr) addr_of "$1" ;;
  run) run "$@" ;;
  exec)
    name=$1
    shift
    addr_of "$name" >/dev/null
    ip netns exec "$(ns_of "$name")" "$@"
    ;;
  cut) cut "$@" ;;
  heal) heal "$@" ;;
  down) down ;;
  check) check ;;
  *) die "unknown command $cmd (see the top of scripts/netns.sh)" ;;
esac
