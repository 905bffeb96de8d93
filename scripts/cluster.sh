#!/usr/bin/env bash
# A local 3-host foqs cluster for demos: `scripts/cluster.sh start` builds foqsd, makes
# sure MySQL and etcd answer (starting private ones when they do not), and starts hosts
# h1, h2, h3 on 127.0.0.1:9091-9093 with conf/cluster.toml (8 shards, etcd manager).
# `scripts/cluster.sh status` shows each host's shards; `scripts/cluster.sh stop` stops
# the hosts (SIGTERM) and whatever private etcd/MariaDB `start` started.
# Logs and pids: .run/cluster/.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
dir="$FOQS_RUN/cluster"
hosts="h1:9091 h2:9092 h3:9093"

start() {
  foqs_cargo_check
  mkdir -p "$dir"
  foqs_mysql_ensure
  [ -n "$FOQS_PRIVATE_MYSQL_STARTED" ] && touch "$dir/mariadb-started"
  foqs_etcd_ensure
  cargo build --release --bin foqsd --bin foqsctl
  local hostport=${FOQS_MYSQL_URL#mysql://root@}
  sed -e "s#mysql://root@127.0.0.1:3306/#mysql://root@$hostport/#" \
    -e "s#\"127.0.0.1:23790\"#\"$FOQS_ETCD_ENDPOINT\"#" conf/cluster.toml >"$dir/cluster.toml"
  local h id port
  for h in $hosts; do
    id=${h%%:*} port=${h##*:}
    if [ -f "$dir/$id.pid" ] && kill -0 "$(cat "$dir/$id.pid")" 2>/dev/null; then
      foqs_log "$id already running"
      continue
    fi
    FOQS__SERVER__HOST_ID=$id RUST_LOG=${RUST_LOG:-info} ./target/release/foqsd \
      --config "$dir/cluster.toml" --listen "127.0.0.1:$port" >"$dir/$id.log" 2>&1 &
    echo $! >"$dir/$id.pid"
  done
  for h in $hosts; do
    port=${h##*:}
    foqs_wait_port "$port" 30 || { foqs_log "host on $port did not start; see $dir"; exit 1; }
  done
  foqs_log "cluster up: 127.0.0.1:9091, :9092, :9093 (logs in $dir); shards settle within seconds"
  foqs_log "try: target/release/foqsctl --host 127.0.0.1:9092 host-info"
}

stop() {
  local h id pid
  for h in $hosts; do
    id=${h%%:*}
    [ -f "$dir/$id.pid" ] || continue
    pid=$(cat "$dir/$id.pid")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    rm -f "$dir/$id.pid"
    foqs_log "stopped $id"
  done
  foqs_etcd_stop
  if [ -f "$dir/mariadb-started" ]; then
    FOQS_PRIVATE_MYSQL_STARTED=1 foqs_mysql_stop
    rm -f "$dir/mariadb-started"
  fi
}

status() {
  local h
  for h in $hosts; do
    ./target/release/foqsctl --host "127.0.0.1:${h##*:}" host-info || true
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
