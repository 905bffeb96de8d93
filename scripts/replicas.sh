#!/usr/bin/env bash
# Replica sets of three private MariaDB servers each, one server per region (r1, r2, r3),
# replicating one another with MariaDB's own replication (GTID, semi-synchronous), for the
# replication tests and drills.
#
#   scripts/replicas.sh up     [--dir D] [--port P] [--sets K] [--tls CERTS]
#                                                      start K sets (default 1): set k
#                                                      (0-based) is servers 3k+1..3k+3 on
#                                                      ports P+3k..P+3k+2; its first server
#                                                      is its primary, in region r(k%3+1),
#                                                      its other two in the next regions;
#                                                      --tls: every server requires TLS
#                                                      (require_secure_transport, CERTS/
#                                                      {ca,server}.pem from scripts/certs.sh)
#                                                      and replicates over it
#   scripts/replicas.sh down   [--dir D]              stop them (by pid) and remove D
#   scripts/replicas.sh rejoin N PRIMARY_PORT [--dir D]
#                                                      kill -9 server N and start it again:
#                                                      it drops the transactions no replica
#                                                      acknowledged and replicates from the
#                                                      primary on PRIMARY_PORT
#   scripts/replicas.sh start N [--dir D]             start server N again (as a supervisor
#                                                      would after a crash): read-only,
#                                                      replicating from nobody until foqsd
#                                                      repoints it
#   scripts/replicas.sh kill N | stop N | cont N [--dir D]   kill -9, SIGSTOP, SIGCONT
#
# D defaults to .run/replicas, P to 3410. Every server:
# - a small footprint (an 8 MB buffer pool, 200 connections): nine of them fit beside the
#   load on a 2-core machine;
# - binlog in ROW format with GTIDs (domain 0, strict mode), `log_slave_updates`, and
#   `sync_binlog = 1` / `innodb_flush_log_at_trx_commit = 1` (what a reply promised is on disk);
# - semi-synchronous replication armed both ways (`AFTER_SYNC`, `wait_no_slave = ON`,
#   a one-hour timeout so that it never falls back to asynchronous unnoticed); the
#   primary's side is switched on only on the primary, by a promotion;
# - starts with `read_only = ON` (only a promotion turns it off) and `init_rpl_role =
#   SLAVE`, so that after a crash it discards the transactions no replica acknowledged.
# The sets are independent topologies (each its own GTID history in domain 0).
# Each set is set up by docs/replication.md's steps (scripts/replica-set/*.sql), so its accounts
# (created on each set's primary, replicated) are docs/replication.md's: `foqs`/`foqs` owns the
# databases `foqs%` and has neither SUPER nor READ ONLY ADMIN, so `read_only` stops its
# writes; `foqs_repl`/`foqs_repl` replicates; `foqs_admin`/`foqs_admin` has the admin
# grants docs/replication.md lists; root (no password, from 127.0.0.1) is there too.
# `D/servers` lists "N PORT REGION SET" per server.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

cmd=${1:-}
shift || true
dir="$FOQS_RUN/replicas"
port=3410
sets=1
tls=
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --sets) sets=$2; shift 2 ;;
    --tls) tls=$(cd "$2" && pwd); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done

mariadbd_bin() {
  command -v mariadbd 2>/dev/null || { [ -x /usr/sbin/mariadbd ] && echo /usr/sbin/mariadbd; } || echo ""
}

sql() { # sql PORT STATEMENTS
  mariadb --protocol=tcp -h127.0.0.1 -P"$1" -uroot --batch --skip-column-names -e "$2"
}

port_of() { awk -v n="$1" '$1 == n { print $2 }' "$dir/servers"; }

# The certificates folder the servers were started with (kept for restarts), if any.
tls_dir() { [ -n "$tls" ] && echo "$tls" || cat "$dir/tls" 2>/dev/null || true; }

start_server() { # start_server N PORT
  local n=$1 p=$2 s="$dir/s$1"
  local user t
  user=$(id -un)
  local tls_args=()
  t=$(tls_dir)
  if [ -n "$t" ]; then
    tls_args=(--ssl-ca="$t/ca.pem" --ssl-cert="$t/server.pem" --ssl-key="$t/server.key" --require-secure-transport=ON)
  fi
  "$(mariadbd_bin)" --no-defaults \
    --datadir="$s/data" --port="$p" --bind-address=127.0.0.1 --socket="$s/sock" \
    --pid-file="$s/pid" --user="$user" --skip-name-resolve --log-error="$s/error.log" \
    --innodb-buffer-pool-size=8M --max-connections=200 --innodb-log-buffer-size=1M \
    --key-buffer-size=1M --table-open-cache=200 \
    --server-id="$n" --log-bin="$s/binlog" --binlog-format=ROW --log-slave-updates \
    --gtid-strict-mode=ON --gtid-domain-id=0 --sync-binlog=1 --innodb-flush-log-at-trx-commit=1 \
    --read-only=ON --init-rpl-role=SLAVE \
    --rpl-semi-sync-slave-enabled=ON --rpl-semi-sync-master-wait-point=AFTER_SYNC \
    --rpl-semi-sync-master-wait-no-slave=ON --rpl-semi-sync-master-timeout=3600000 \
    --slave-net-timeout=1 --rpl-semi-sync-slave-kill-conn-timeout=1 \
    --slave-parallel-threads=0 "${tls_args[@]}" \
    >/dev/null 2>&1 &
  local i
  for i in $(seq 1 240); do
    foqs_port_open 127.0.0.1 "$p" && return 0
    sleep 0.25
  done
  foqs_log "server $n did not start on port $p; see $s/error.log"
  return 1
}

replicate_from() { # replicate_from PORT PRIMARY_PORT POS_KIND
  # Retried: foqsd may repoint the same server at the same moment (a demoted primary that
  # answers again is repointed by the host that leads its replica set).
  local i t ssl=
  t=$(tls_dir)
  [ -n "$t" ] && ssl=", MASTER_SSL=1, MASTER_SSL_CA='$t/ca.pem', MASTER_SSL_VERIFY_SERVER_CERT=1"
  local change="STOP SLAVE; CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=$2, MASTER_USER='foqs_repl', MASTER_PASSWORD='foqs_repl', MASTER_USE_GTID=$3, MASTER_CONNECT_RETRY=1, MASTER_HEARTBEAT_PERIOD=0.25$ssl; START SLAVE;"
  for i in 1 2 3 4 5; do
    sql "$1" "$change" 2>/dev/null && return 0
    sleep 0.2
  done
  sql "$1" "$change"
}

up() {
  [ -n "$(mariadbd_bin)" ] || foqs_apt_install mariadb-server
  local total=$((3 * sets))
  if [ -f "$dir/servers" ]; then
    local all=1 n p r k
    [ "$(wc -l <"$dir/servers")" = "$total" ] || all=0
    while read -r n p r k; do foqs_port_open 127.0.0.1 "$p" || all=0; done <"$dir/servers"
    if [ $all = 1 ]; then foqs_log "replicas already up in $dir"; cat "$dir/servers"; return 0; fi
    down
  fi
  mkdir -p "$dir"
  if [ -n "$tls" ]; then echo "$tls" >"$dir/tls"; else rm -f "$dir/tls"; fi
  local n p
  for n in $(seq 1 "$total"); do
    p=$((port + n - 1))
    if foqs_port_open 127.0.0.1 "$p"; then foqs_log "port $p is taken; choose another with --port"; return 1; fi
    mkdir -p "$dir/s$n/tmp"
    TMPDIR="$dir/s$n/tmp" mariadb-install-db --no-defaults --datadir="$dir/s$n/data" --user="$(id -un)" \
      --auth-root-authentication-method=normal --skip-test-db >"$dir/s$n/install.log" 2>&1 &
  done
  wait
  : >"$dir/servers"
  for n in $(seq 1 "$total"); do
    p=$((port + n - 1))
    start_server "$n" "$p" &
  done
  wait
  for n in $(seq 1 "$total"); do
    p=$((port + n - 1))
    foqs_port_open 127.0.0.1 "$p" || { foqs_log "server $n did not start"; return 1; }
    local k=$(((n - 1) / 3)) j=$(((n - 1) % 3))
    echo "$n $p r$(((k + j) % 3 + 1)) $k" >>"$dir/servers"
    sql "$p" "RESET MASTER;"
  done
  local k
  for k in $(seq 0 $((sets - 1))); do
    up_set "$k" &
  done
  wait
  for k in $(seq 0 $((sets - 1))); do
    [ "$(sql $((port + 3 * k)) "SHOW STATUS LIKE 'Rpl_semi_sync_master_clients'" | awk '{print $2}')" = 2 ] ||
      foqs_log "set $k: not every replica acknowledges yet"
  done
  foqs_log "replicas up in $dir: $sets set(s); set k's primary is 127.0.0.1:$port+3k (region r(k%3+1))"
  cat "$dir/servers"
}

# docs/replication.md's steps for a new replica set (scripts/replica-set/*.sql, shown there as they
# are), with this machine's values: every account from 127.0.0.1, its password its name.
steps() { # steps FILE PRIMARY_PORT
  sed -e "s/@CLIENTS@/127.0.0.1/g" -e "s/@FOQS_PASSWORD@/foqs/g" -e "s/@REPL_PASSWORD@/foqs_repl/g" \
    -e "s/@ADMIN_PASSWORD@/foqs_admin/g" -e "s/@PRIMARY_HOST@/127.0.0.1/g" \
    -e "s/@PRIMARY_PORT@/$2/g" -e "s|@CA_FILE@|$(tls_dir)/ca.pem|g" \
    "$(dirname "$0")/replica-set/$1"
}

up_set() { # up_set K: the users on the set's primary, its replicas pointed at it, promoted
  local primary=$((port + 3 * $1))
  sql "$primary" "$(steps 1-users.sql "$primary")"
  local j
  for j in 1 2; do
    sql $((primary + j)) "$(steps 2-replica.sql "$primary")"
    [ -n "$(tls_dir)" ] && sql $((primary + j)) "$(steps 2-replica-tls.sql "$primary")"
  done
  sql "$primary" "$(steps 3-promote.sql "$primary")"
  local i
  for i in $(seq 1 40); do
    [ "$(sql "$primary" "SHOW STATUS LIKE 'Rpl_semi_sync_master_clients'" | awk '{print $2}')" = 2 ] && break
    sleep 0.25
  done
}

down() {
  [ -d "$dir" ] || return 0
  local n pid
  for n in $(cd "$dir" && ls -d s* 2>/dev/null | sed 's/^s//'); do
    pid=$(live_pid "$n")
    [ -n "$pid" ] || continue
    kill -CONT "$pid" 2>/dev/null || true
    kill -9 "$pid" 2>/dev/null || true
  done
  sleep 0.2
  rm -rf "$dir"
}

# The pid of server N while it runs, from its pid file; nothing when the file is stale.
# A server killed with -9 leaves its pid file behind, and pids wrap (pid_max is 32768
# here; the suite starts thousands of processes): the pid may by now be another process's,
# perhaps another test's MariaDB. So a pid is only used while its command line still names
# this server's datadir.
live_pid() { # live_pid N
  local pid
  [ -f "$dir/s$1/pid" ] || return 0
  pid=$(cat "$dir/s$1/pid")
  if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--datadir=$dir/s$1/data"; then
    echo "$pid"
  fi
}

signal() { # signal SIG N
  local pid
  pid=$(live_pid "$2")
  [ -n "$pid" ] || { echo "server $2 is not running" >&2; return 1; }
  kill "-$1" "$pid"
}

rejoin() { # rejoin N PRIMARY_PORT
  local n=$1 primary=$2 p pid
  p=$(port_of "$n")
  pid=$(live_pid "$n")
  if [ -n "$pid" ]; then
    kill -CONT "$pid" 2>/dev/null || true
    kill -9 "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  fi
  rm -f "$dir/s$n/pid"
  start_server "$n" "$p"
  # Crash recovery as a replica discarded what no replica acknowledged: its binlog is a
  # prefix of the primary's, and it goes on from its own last transaction.
  sql "$p" "SET GLOBAL rpl_semi_sync_master_enabled = OFF;"
  replicate_from "$p" "$primary" current_pos
  foqs_log "server $n (port $p) rejoined as a replica of 127.0.0.1:$primary"
}

case "$cmd" in
  up) up ;;
  down) down ;;
  rejoin) rejoin "${args[0]}" "${args[1]}" ;;
  start) start_server "${args[0]}" "$(port_of "${args[0]}")" ;;
  kill) signal 9 "${args[0]}" ;;
  stop) signal STOP "${args[0]}" ;;
  cont) signal CONT "${args[0]}" ;;
  *) echo "usage: $0 up [--sets K]|down|rejoin N PRIMARY_PORT|start N|kill N|stop N|cont N [--dir D] [--port P]" >&2; exit 2 ;;
esac
