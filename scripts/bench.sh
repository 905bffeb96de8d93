#!/usr/bin/env bash
# Reproduces the performance table (README, docs/performance.md): foqsd (release build) on the local MySQL and
# on local SQLite files, side by side with RabbitMQ, driven by foqs-bench.
#
#   scripts/bench.sh            3 runs of the throughput workload, then the medians; when
#                               RabbitMQ answers on 127.0.0.1:5672 (guest), each foqs run is
#                               followed by the same workload on RabbitMQ's durable priority
#                               queue, and its medians print beside foqs's
#   scripts/bench.sh latency    single-item latency at half the single-item peak rate, and
#                               how soon a long-poll consumer has an item after the
#                               enqueue's reply (one producer, one consumer, 2000 items)
#   scripts/bench.sh transports single-item mixed throughput over each transport
#                               (framed, unframed, THeader; and FOQS_BENCH_BEFORE's
#                               binary, framed), 5 rounds interleaved, medians
#   scripts/bench.sh tenants    a victim namespace at its guaranteed rate beside a
#                               flooding one (see the mode below): the victim's
#                               enqueue-to-delivery latency alone and beside, its refusals,
#                               the flooder's throughput alone and beside
#                               (FOQS_BENCH_FLOOD_RATE=R holds the flood to R items/s;
#                               FOQS_BENCH_METRICS_DIR=DIR keeps foqsd's /metrics after
#                               each victim run there)
#   scripts/bench.sh counters   one run; MySQL's work per item in each phase: InnoDB's
#                               Handler_* and Innodb_rows_* counters (SHOW GLOBAL STATUS
#                               around the phase) and the server's CPU time
#
# Each round runs foqs on MySQL (conf/mysql.toml's four shards, fresh databases
# foqs_bench_0..3) and on SQLite (conf/foqsd.toml's four shards, fresh files in
# .run/bench-sqlite); FOQS_BENCH_BACKENDS="mysql" (or "sqlite") runs one only.
# FOQS_BENCH_BEFORE=path also runs that foqsd binary on each backend each round (a build
# of an older commit: before and after in one sitting); FOQS_BENCH_RABBITMQ=0 skips
# RabbitMQ. FOQS_BENCH_ENGINE="KEY = VALUE" runs every foqsd with that line in place of
# the configuration's own KEY (e.g. "payload_cache_bytes_max = 0"), and
# FOQS_BENCH_BEFORE_ENGINE the "before" runs only (throughput and latency; without
# FOQS_BENCH_BEFORE they run this build: one setting against another in one sitting).
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

sqlite_dir="$FOQS_RUN/bench-sqlite"
sqlite_config="$FOQS_RUN/bench-sqlite.toml"
foqs_config_for_sqlite "$sqlite_config" "$sqlite_dir"

# Keys newer than some FOQS_BENCH_BEFORE binaries, at their defaults: left out, so that an
# older binary (which refuses keys it does not know) reads the same files.
for cfg in "$config" "$sqlite_config"; do
  sed -i '/^fair_/d; /^overload_cpu_busy/d; /^dlq_max_items_per_topic = 0$/d; /^enqueue_marks = true$/d' "$cfg"
done

# with_setting CONFIG "KEY = VALUE": the path of CONFIG with that line in place of its
# own KEY line, or added to its [engine] when it has none (CONFIG itself when the setting
# is empty).
with_setting() {
  local cfg=$1 setting=$2 key
  [ -z "$setting" ] && { echo "$cfg"; return 0; }
  key=${setting%%[ =]*}
  if grep -q "^$key = " "$cfg"; then
    sed -e "s#^$key = .*#$setting#" "$cfg" >"${cfg%.toml}-set.toml"
  else
    grep -q '^\[engine\]' "$cfg" || { foqs_log "$cfg has no [engine] for $setting"; return 1; }
    sed -e "/^\[engine\]/a $setting" "$cfg" >"${cfg%.toml}-set.toml"
  fi
  echo "${cfg%.toml}-set.toml"
}

# fresh_foqsd [mysql|sqlite [BINARY [SETTING]]]: a foqsd on empty shards; SETTING as for
# with_setting (default FOQS_BENCH_ENGINE).
fresh_foqsd() {
  local backend=${1:-mysql} binary=${2:-./target/release/foqsd} cfg=$config
  local setting=${3:-${FOQS_BENCH_ENGINE:-}}
  [ -n "$foqsd_pid" ] && { kill "$foqsd_pid"; wait "$foqsd_pid" || true; }
  for s in 0 1 2 3; do
    "$client" -h"${hostport%:*}" -P"${hostport##*:}" -uroot -e "DROP DATABASE IF EXISTS foqs_bench_$s"
  done
  rm -rf "$sqlite_dir"
  [ "$backend" = sqlite ] && cfg=$sqlite_config
  cfg=$(with_setting "$cfg" "$setting")
  # Waits for this foqsd's own "listening" line, not for the port: a leftover foqsd on
  # the port would otherwise be measured in its place.
  local rc=0
  foqs_foqsd_start "$binary" "$cfg" "$listen" "$FOQS_RUN/bench-foqsd.log" || rc=1
  foqsd_pid=$FOQS_FOQSD_PID
  return $rc
}

bench() { ./target/release/foqs-bench --host "$listen" "$@"; }

if [ -n "${FOQS_BENCH_BEFORE_ENGINE:-}" ] && [ -z "${FOQS_BENCH_BEFORE:-}" ]; then
  FOQS_BENCH_BEFORE=./target/release/foqsd
fi
before_setting=${FOQS_BENCH_BEFORE_ENGINE:-${FOQS_BENCH_ENGINE:-}}

if [ "$mode" = latency ]; then
  targets=()
  for backend in ${FOQS_BENCH_BACKENDS:-mysql sqlite}; do
    [ -n "${FOQS_BENCH_BEFORE:-}" ] && targets+=("$backend:$FOQS_BENCH_BEFORE:foqs-$backend-before")
    targets+=("$backend:./target/release/foqsd:foqs-$backend")
  done
  for t in "${targets[@]}"; do
    IFS=: read -r backend binary label <<<"$t"
    setting=""
    [ "${label%-before}" != "$label" ] && setting=$before_setting
    fresh_foqsd "$backend" "$binary" "$setting"
    peak=$(bench --phases mixed --batch 1 --items 20000 --producers 4 --consumers 4 |
      sed -E 's/.*"mixed_items_per_s":([0-9]+).*/\1/')
    foqs_log "$label: single-item mixed peak: $peak items/s; measuring at half of it"
    fresh_foqsd "$backend" "$binary" "$setting"
    line=$(bench --phases mixed --batch 1 --items 20000 --producers 4 --consumers 4 --rate $((peak / 2)))
    echo "${line/\"system\":\"foqs\"/\"system\":\"$label\"}"
    # A long-poll consumer and a producer, an item at a time: how soon after the
    # enqueue's reply the waiting consumer has the item.
    fresh_foqsd "$backend" "$binary" "$setting"
    line=$(bench --phases longpoll --items 2000 --producers 1 --consumers 1 --batch 1)
    echo "${line/\"system\":\"foqs\"/\"system\":\"$label\"}"
  done
  exit 0
fi

if [ "$mode" = tenants ]; then
  # A victim namespace at its guaranteed rate beside a flooder with none, on one host, one
  # backend after the other: the victim alone, the flooder alone, then both (the flooder
  # started first, its load generator at nice 19: the load shares the cores with foqsd).
  # Victim: --rate items/s (FOQS_BENCH_VICTIM_RATE, default 200, its guarantee) in single
  # items and in batches of 20; flooder: 8 producers, batches of 100, 4 consumers.
  secs=${FOQS_BENCH_SECONDS:-15}
  vrate=${FOQS_BENCH_VICTIM_RATE:-200}
  metrics_port=$((${listen##*:} + 1))
  for cfg in "$config" "$sqlite_config"; do
    cat >>"$cfg" <<EOT

[metrics]
listen = "127.0.0.1:$metrics_port"

[[namespaces]]
name = "victim"
enqueues_per_minute = $((vrate * 60))

[[namespaces]]
name = "flood"
EOT
  done
  # The server's view of the victim: its enqueue-to-delivery histogram, from /metrics.
  server_side() {
    curl -s "http://127.0.0.1:$metrics_port/metrics" | python3 -c '
import sys, re
b = {}
for l in sys.stdin:
    m = re.match(r"foqs_ns_enqueue_to_delivery_seconds_bucket\{([^}]*)\} (\S+)", l)
    labels = dict(re.findall(r"(\w+)=\"([^\"]*)\"", m[1])) if m else {}
    if labels.get("ns") == "victim":
        le = labels["le"]
        b[float("inf") if le == "+Inf" else float(le)] = float(m[2])
if not b:
    print("null"); sys.exit()
total = b[float("inf")]
def q(p):
    for le in sorted(b):
        if b[le] >= p * total:
            return None if le == float("inf") else round(le * 1000, 3)
import json
print(json.dumps({"count": int(total), "p50_ms_le": q(0.5), "p99_ms_le": q(0.99)}))'
  }
  # On MySQL, a plain client (foqs-bench's probe phase: one connection, a one-row insert
  # and commit at the victim's rate) commits to the same server during each victim run:
  # what the server answers a lone writer then is the floor under the victim's enqueues.
  victim() {
    local label=$1 batch=$2 line probe_pid="" probe='null'
    if [ "$backend" = mysql ]; then
      bench --phases probe --mysql "$FOQS_MYSQL_URL" --rate "$vrate" --max-seconds "$secs" >"$FOQS_RUN/bench-probe.json" &
      probe_pid=$!
    fi
    line=$(bench --ns victim --phases victim --rate "$vrate" --batch "$batch" --consumers 2 --max-seconds "$secs")
    if [ -n "$probe_pid" ]; then
      wait "$probe_pid"
      probe=$(python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["probe_commit"]))' "$FOQS_RUN/bench-probe.json")
    fi
    [ -n "${FOQS_BENCH_METRICS_DIR:-}" ] && curl -s "http://127.0.0.1:$metrics_port/metrics" >"$FOQS_BENCH_METRICS_DIR/$label-$batch.txt"
    python3 -c 'import json, sys
r = json.loads(sys.argv[1])
print(json.dumps({"run": sys.argv[2], "victim_batch": int(sys.argv[3]), **r, "server": json.loads(sys.argv[4]), "mysql_probe_commit": json.loads(sys.argv[5])}))' \
      "$line" "$label" "$batch" "$(server_side)" "$probe"
  }
  flood() { nice -n 19 ./target/release/foqs-bench --host "$listen" --ns flood --phases flood --producers 8 --consumers 4 --batch 100 --max-seconds "$1" ${FOQS_BENCH_FLOOD_RATE:+--rate "$FOQS_BENCH_FLOOD_RATE"}; }
  # With FOQS_BENCH_BEFORE (or FOQS_BENCH_BEFORE_ENGINE), that foqsd (or this one with
  # that setting) runs each step too, first (labels end in -before).
  runs=(now)
  [ -n "${FOQS_BENCH_BEFORE:-}" ] && runs=(before now)
  for backend in ${FOQS_BENCH_BACKENDS:-mysql sqlite}; do
    for run in "${runs[@]}"; do
      tag=$backend bin=./target/release/foqsd setting=${FOQS_BENCH_ENGINE:-}
      if [ "$run" = before ]; then
        tag=$backend-before bin=$FOQS_BENCH_BEFORE setting=$before_setting
      fi
      for batch in 1 20; do
        fresh_foqsd "$backend" "$bin" "$setting"
        victim "$tag-victim-alone" "$batch"
      done
      fresh_foqsd "$backend" "$bin" "$setting"
      line=$(flood "$secs")
      echo "{\"run\":\"$tag-flood-alone\",${line#\{}"
      for batch in 1 20; do
        fresh_foqsd "$backend" "$bin" "$setting"
        flood $((secs + 4)) >"$FOQS_RUN/bench-flood.json" &
        flood_pid=$!
        sleep 2
        victim "$tag-victim-beside-flood" "$batch"
        wait "$flood_pid"
        echo "{\"run\":\"$tag-flood-beside-victim\",$(sed 's/^{//' "$FOQS_RUN/bench-flood.json")"
      done
    done
  done
  exit 0
fi

if [ "$mode" = transports ]; then
  # Requests, not storage, dominate at one item per call: the transport's cost shows most.
  backend=${FOQS_BENCH_BACKENDS:-sqlite}
  backend=${backend%% *}
  # With FOQS_BENCH_BEFORE, that binary (framed only) runs in each round too.
  rows=()
  for i in 1 2 3 4 5; do
    targets=(framed unframed header)
    [ -n "${FOQS_BENCH_BEFORE:-}" ] && targets=(before "${targets[@]}")
    for t in "${targets[@]}"; do
      if [ "$t" = before ]; then
        fresh_foqsd "$backend" "$FOQS_BENCH_BEFORE"
        line=$(bench --phases mixed --batch 1 --items 20000 --producers 4 --consumers 4)
        line=${line/\"transport\":\"framed\"/\"transport\":\"framed-before\"}
      else
        fresh_foqsd "$backend"
        line=$(bench --phases mixed --batch 1 --items 20000 --producers 4 --consumers 4 --transport "$t")
      fi
      echo "$line"
      rows+=("$line")
    done
  done
  printf '%s\n' "${rows[@]}" | python3 -c '
import json, sys, statistics
rows = [json.loads(l) for l in sys.stdin]
for t in ("framed-before", "framed", "unframed", "header"):
    mine = [r for r in rows if r["transport"] == t]
    if not mine:
        continue
    med = lambda f: round(statistics.median(f(r) for r in mine), 3)
    print(json.dumps({"transport": t, "backend": sys.argv[1], "median_of": len(mine),
                      "mixed_items_per_s": round(med(lambda r: r["mixed_items_per_s"])),
                      "enqueue_p50_ms": med(lambda r: r["mixed_enqueue_latency"]["p50_ms"]),
                      "dequeue_ack_p99_ms": med(lambda r: r["mixed_dequeue_ack_latency"]["p99_ms"])}))' "$backend"
  exit 0
fi

rabbit_url="amqp://guest:guest@127.0.0.1:5672/%2f"
with_rabbit=0
if [ "${FOQS_BENCH_RABBITMQ:-1}" != 0 ] && foqs_port_open 127.0.0.1 5672; then with_rabbit=1; fi
if [ "$mode" = counters ]; then
  # The pid of the server foqsd talks to (other servers may run beside it).
  pid_file=$("$client" -h"${hostport%:*}" -P"${hostport##*:}" -uroot -N -e "SELECT @@pid_file")
  mysqld_pid=$(cat "$pid_file")
  status() {
    "$client" -h"${hostport%:*}" -P"${hostport##*:}" -uroot -N -e \
      "SHOW GLOBAL STATUS WHERE Variable_name REGEXP '^(Handler_(read_key|read_next|read_rnd_next|write|update|delete)|Innodb_rows_(read|inserted|updated|deleted)|Innodb_buffer_pool_(read|write)_requests|Innodb_data_written|Innodb_data_fsyncs|Com_(insert|update|delete|select))$'"
    awk '{print "cpu_ms\t" ($14 + $15) * 1000 / '"$(getconf CLK_TCK)"'}' "/proc/$mysqld_pid/stat"
  }
  fresh_foqsd mysql "${FOQS_BENCH_FOQSD:-./target/release/foqsd}"
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
# One run of the workload against what listens now, labelled.
measure() {
  local label=$1 line
  line=$(bench --items 200000)
  line=${line/\"system\":\"foqs\"/\"system\":\"$label\"}
  echo "$line"
  runs+=("$line")
}
for i in 1 2 3; do
  for backend in ${FOQS_BENCH_BACKENDS:-mysql sqlite}; do
    if [ -n "${FOQS_BENCH_BEFORE:-}" ]; then
      fresh_foqsd "$backend" "$FOQS_BENCH_BEFORE" "$before_setting"
      measure "foqs-$backend-before"
    fi
    fresh_foqsd "$backend"
    measure "foqs-$backend"
  done
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
for system in ("foqs-mysql-before", "foqs-mysql", "foqs-sqlite-before", "foqs-sqlite", "rabbitmq"):
    mine = [r for r in rows if r.get("system") == system]
    if mine:
        med = {k: round(statistics.median(r[k] for r in mine)) for k in keys}
        print(json.dumps({"system": system, "median_of": len(mine), **med}))'
