#!/usr/bin/env bash
# Reproduces the README's performance table: foqsd (release build, conf/foqsd.toml's four
# shards, fresh databases foqs_bench_0..3) on the local MySQL, driven by foqs-bench.
#
#   scripts/bench.sh            3 runs of the throughput workload, then the medians; when
#                               RabbitMQ answers on 127.0.0.1:5672 (guest), each foqs run is
#                               followed by the same workload on RabbitMQ's durable priority
#                               queue, and its medians print beside foqs's
#   scripts/bench.sh latency    single-item latency at half the single-item peak rate
#   scripts/bench.sh counters   one run; MySQL's work per item in each phase: InnoDB's
#                               Handler_* and Innodb_rows_* counters (SHOW GLOBAL STATUS
#                               around the phase) and the server's CPU time
#
# FOQS_BENCH_FOQSD=path runs another foqsd binary (e.g. a build of an older commit, for a
# before/after in one sitting); FOQS_BENCH_RABBITMQ=0 skips RabbitMQ.
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
  RUST_LOG=warn "${FOQS_BENCH_FOQSD:-./target/release/foqsd}" --config "$config" --listen "$listen" >/dev/null 2>&1 &
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

rabbit_url="amqp://guest:guest@127.0.0.1:5672/%2f"
with_rabbit=0
if [ "${FOQS_BENCH_RABBITMQ:-1}" != 0 ] && foqs_port_open 127.0.0.1 5672; then with_rabbit=1; fi
if [ "$mode" = counters ]; then
  mysqld_pid=$(pgrep -x mariadbd || pgrep -x mysqld | head -1)
  status() {
    "$client" -h"${hostport%:*}" -P"${hostport##*:}" -uroot -N -e \
      "SHOW GLOBAL STATUS WHERE Variable_name REGEXP '^(Handler_(read_key|read_next|read_rnd_next|write|update|delete)|Innodb_rows_(read|inserted|updated|deleted)|Innodb_data_fsyncs|Com_(insert|update|delete|select))$'"
    awk '{print "cpu_ms\t" ($14 + $15) * 1000 / '"$(getconf CLK_TCK)"'}' "/proc/$mysqld_pid/stat"
  }
  fresh_foqsd
  for phase in enqueue drain mixed; do
    before=$(status)
    out=$(bench --items 200000 --phases "$phase" --topic counters)
    after=$(status)
    python3 -c '
import sys, json
phase, items, before, after, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
parse = lambda t: {l.split("\t")[0]: float(l.split("\t")[1]) for l in t.splitlines() if "\t" in l}
b, a = parse(before), parse(after)
per = {k: round((a[k] - b[k]) / items, 3) for k in sorted(a)}
r = json.loads(out)
rate = r.get(phase + "_items_per_s")
print(json.dumps({"phase": phase, "items_per_s": rate, "per_item": per}))' "$phase" 200000 "$before" "$after" "$out"
  done
  exit 0
fi

runs=()
for i in 1 2 3; do
  fresh_foqsd
  line=$(bench --items 200000)
  echo "$line"
  runs+=("$line")
  if [ "$with_rabbit" = 1 ]; then
    line=$(./target/release/foqs-bench --rabbitmq "$rabbit_url" --items 200000)
    echo "$line"
    runs+=("$line")
  fi
done
printf '%s\n' "${runs[@]}" | python3 -c '
import json, sys, statistics
rows = [json.loads(l) for l in sys.stdin]
keys = ("enqueue_items_per_s", "drain_items_per_s", "mixed_items_per_s")
for system in ("foqs", "rabbitmq"):
    mine = [r for r in rows if r.get("system", "foqs") == system]
    if mine:
        med = {k: round(statistics.median(r[k] for r in mine)) for k in keys}
        print(json.dumps({"system": system, "median_of": len(mine), **med}))'
