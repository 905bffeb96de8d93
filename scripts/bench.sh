#!/usr/bin/env bash
# Reproduces the README's performance table: foqsd (release build, conf/foqsd.toml's four
# shards, fresh databases foqs_bench_0..3) on the local MySQL, driven by foqs-bench.
#
#   scripts/bench.sh            3 runs of the throughput workload, then the medians
#   scripts/bench.sh latency    single-item latency at half the single-item peak rate
#
# Throughput workload (the issue's): 200k items of 100 bytes, 4 producers, 4 consumers,
# batches of 100; phases enqueue, drain (dequeue + ack), mixed.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
foqs_cargo_check
foqs_mysql_ensure
cargo build --release --bins >&2
mode=${1:-throughput}
config="$FOQS_RUN/bench.toml"
mkdir -p "$FOQS_RUN"
foqs_config_for_mysql "$config" foqs_bench_
client=$(command -v mariadb || command -v mysql)
hostport=${FOQS_MYSQL_URL#mysql://root@}
listen="127.0.0.1:${FOQS_BENCH_LISTEN_PORT:-9192}"
foqsd_pid=""
cleanup() {
  [ -n "$foqsd_pid" ] && kill "$foqsd_pid" 2>/dev/null && wait "$foqsd_pid" 2>/dev/null
  foqs_mysql_stop
}
trap cleanup EXIT

fresh_foqsd() {
  [ -n "$foqsd_pid" ] && { kill "$foqsd_pid"; wait "$foqsd_pid" || true; }
  for s in 0 1 2 3; do
    "$client" -h"${hostport%:*}" -P"${hostport##*:}" -uroot -e "DROP DATABASE IF EXISTS foqs_bench_$s"
  done
  RUST_LOG=warn ./target/release/foqsd --config "$config" --listen "$listen" >/dev/null 2>&1 &
  foqsd_pid=$!
  for _ in $(seq 1 300); do foqs_port_open 127.0.0.1 "${listen##*:}" && return 0; sleep 0.2; done
  foqs_log "foqsd did not start"; return 1
}

bench() { ./target/release/foqs-bench --host "$listen" "$@"; }

if [ "$mode" = latency ]; then
  fresh_foqsd
  peak=$(bench --phases mixed --batch 1 --items 20000 --producers 4 --consumers 4 |
    sed -E 's/.*"mixed_items_per_s":([0-9]+).*/\1/')
  foqs_log "single-item mixed peak: $peak items/s; measuring at half of it"
  fresh_foqsd
  bench --phases mixed --batch 1 --items 20000 --producers 4 --consumers 4 --rate $((peak / 2))
  exit 0
fi

runs=()
for i in 1 2 3; do
  fresh_foqsd
  line=$(bench --items 200000)
  echo "$line"
  runs+=("$line")
done
printf '%s\n' "${runs[@]}" | python3 -c '
import json, sys, statistics
rows = [json.loads(l) for l in sys.stdin]
med = {k: statistics.median(r[k] for r in rows) for k in ("enqueue_items_per_s", "drain_items_per_s", "mixed_items_per_s")}
print(json.dumps({"median_of": len(rows), **{k: round(v) for k, v in med.items()}}))'
