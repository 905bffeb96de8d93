#!/usr/bin/env bash
# Drain throughput and foqsd memory at several backlog depths.
#
#   scripts/bench-backlog.sh [DEPTH ...]     (default: 10000 1000000 10000000)
#
# For each depth D it loads D + MEASURE ready items (100-byte payloads) over the 4 shards
# of conf/mysql.toml straight into MySQL with the SEQUENCE engine (a bulk loader: through
# foqsd, 10M items would take minutes), waits until InnoDB has flushed the load's dirty
# pages (so the drain does not pay for the load's writes), starts a fresh foqsd, drains
# MEASURE items with foqs-bench (4 consumers, batches of 100) in ROUNDS + 1 equal batches
# (the first warms foqsd and the buffer pool up and is not counted), reads foqsd's RSS,
# and prints one JSON line: {"depth", "drain_items_per_s" (the median of the counted
# rounds), "rounds", "rss_bytes"}; then one line of ratios to the first depth.
# The MEASURE items are the most urgent (priority 0) and the oldest (lowest keys), as in a
# queue whose consumers fell behind; the D items of the backlog (priorities 1..9) stay
# behind them. So every depth drains the same rows and only the backlog differs.
#
# It runs its own MariaDB (datadir .run/bench-mariadb, port FOQS_BENCH_PORT, default 3417)
# with innodb_flush_log_at_trx_commit=1 and a buffer pool of FOQS_BENCH_BUFFER_POOL
# (default 4G), and stops it by pid at the end; the shared server is never touched.
# Environment: MEASURE (default 200000), ROUNDS (3), CONSUMERS (4), BATCH (100);
# FOQS_BENCH_FOQSD=path runs that foqsd binary (a build of another commit) instead.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
foqs_cargo_check
depths=("$@")
[ ${#depths[@]} -gt 0 ] || depths=(10000 1000000 10000000)
measure=${MEASURE:-200000}
rounds=${ROUNDS:-3}
consumers=${CONSUMERS:-4}
batch=${BATCH:-100}
port=${FOQS_BENCH_PORT:-3417}
pool=${FOQS_BENCH_BUFFER_POOL:-4G}
shards=4
dir="$FOQS_RUN/bench-mariadb"

command -v python3 >/dev/null || { foqs_log "needs python3"; exit 1; }
cargo build --release --bins >&2
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || foqs_apt_install mariadb-server
mariadbd=/usr/sbin/mariadbd
command -v mariadbd >/dev/null 2>&1 && mariadbd=$(command -v mariadbd)
client=$(command -v mariadb || command -v mysql)

foqsd_pid=""
cleanup() {
  [ -n "$foqsd_pid" ] && kill "$foqsd_pid" 2>/dev/null && wait "$foqsd_pid" 2>/dev/null
  if [ -f "$dir/pid" ]; then
    local pid
    pid=$(cat "$dir/pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  fi
}
trap cleanup EXIT

rm -rf "$dir" && mkdir -p "$dir"
mariadb-install-db --no-defaults --datadir="$dir/data" --user="$(id -un)" \
  --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1
"$mariadbd" --no-defaults --datadir="$dir/data" --port="$port" --bind-address=127.0.0.1 \
  --socket="$dir/sock" --pid-file="$dir/pid" --user="$(id -un)" --skip-name-resolve \
  --innodb-flush-log-at-trx-commit=1 --innodb-buffer-pool-size="$pool" \
  --innodb-log-file-size=1G --max-connections=500 --log-error="$dir/error.log" >/dev/null 2>&1 &
for _ in $(seq 1 120); do foqs_port_open 127.0.0.1 "$port" && break; sleep 0.5; done
sql() { "$client" -h127.0.0.1 -P"$port" -uroot "$@"; }

FOQS_MYSQL_URL="mysql://root@127.0.0.1:$port"
config="$FOQS_RUN/bench-backlog.toml"
foqs_config_for_mysql "$config" foqs_bench_
listen="127.0.0.1:${FOQS_BENCH_LISTEN_PORT:-9191}"

# Starts foqsd and waits until its shards are open, or the measurement would include
# the scan that opening a shard does.
start_foqsd() {
  local rc=0
  foqs_foqsd_start "${FOQS_BENCH_FOQSD:-./target/release/foqsd}" "$config" "$listen" \
    "$FOQS_RUN/bench-backlog-foqsd.log" || rc=1
  foqsd_pid=$FOQS_FOQSD_PID
  return $rc
}
stop_foqsd() { kill -TERM "$foqsd_pid"; wait "$foqsd_pid" || true; foqsd_pid=""; }

results=()
for depth in "${depths[@]}"; do
  for s in $(seq 0 $((shards - 1))); do sql -e "DROP DATABASE IF EXISTS foqs_bench_$s"; done
  start_foqsd && stop_foqsd   # creates the schema
  total=$((depth + measure))
  per_shard=$(( (total + shards - 1) / shards ))
  measure_per_shard=$(( (measure + shards - 1) / shards ))
  now_ms=$(($(date +%s%3N) - 60000))
  foqs_log "depth $depth: loading $total items ($per_shard per shard)"
  t0=$(date +%s)
  loaders=()
  for s in $(seq 0 $((shards - 1))); do
    from=1
    while [ "$from" -le "$per_shard" ]; do
      to=$((from + 499999)); [ "$to" -gt "$per_shard" ] && to=$per_shard
      sql "foqs_bench_$s" -e "INSERT IGNORE INTO topics (tid, ns, topic) VALUES (1, 'bench', 'backlog');
        INSERT INTO items (id, tid, priority, state, deliver_after_ms, next_event_ms,
          enqueued_at_ms, lease_ms, expires_at_ms, policy, max_attempts, payload, metadata)
        SELECT seq, 1, IF(seq <= $measure_per_shard, 0, 1 + seq % 9), 0, $now_ms, 0, $now_ms, 30000, NULL, 1, 5,
          REPEAT('x', 100), '' FROM seq_${from}_to_${to}"
      from=$((to + 1))
    done &
    loaders+=($!)
  done
  wait "${loaders[@]}"   # not a bare wait: that would wait for mariadbd too
  foqs_log "loaded in $(( $(date +%s) - t0 )) s; waiting for InnoDB to flush the load"
  sql -e "SET GLOBAL innodb_max_dirty_pages_pct = 0"
  for _ in $(seq 1 600); do
    dirty=$(sql -N -e "SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_dirty'" | awk '{print $2}')
    [ "$dirty" -lt 1000 ] && break
    sleep 1
  done
  sql -e "SET GLOBAL innodb_max_dirty_pages_pct = 90"
  foqs_log "flushed ($dirty dirty pages left); measuring"
  # How the refill and the timer scan read at this depth (shard 0), for the log.
  sql foqs_bench_0 -e "EXPLAIN SELECT priority, deliver_after_ms, id FROM items FORCE INDEX (ready_order)
      WHERE tid = 1 AND state = 0 AND (priority > 0 OR (priority = 0 AND (deliver_after_ms > $now_ms
        OR (deliver_after_ms = $now_ms AND id > 1000)))) AND deliver_after_ms <= $now_ms + 600000
      ORDER BY priority, deliver_after_ms, id LIMIT 2048;
    EXPLAIN SELECT id FROM items FORCE INDEX (timer) WHERE next_event_ms > $now_ms
      AND next_event_ms <= $now_ms + 600000 ORDER BY next_event_ms, id LIMIT 1000" >&2
  start_foqsd
  status() {
    sql -N -e "SHOW GLOBAL STATUS WHERE Variable_name REGEXP '^(Handler_(read_key|read_next|delete|update)|Innodb_buffer_pool_(reads|read_requests|write_requests)|Innodb_history_list_length)$'"
  }
  before=$(status)
  rates=()
  for r in $(seq 0 "$rounds"); do
    json=$(./target/release/foqs-bench --host "$listen" --ns bench --topic backlog \
      --phases drain --items $((measure / (rounds + 1))) --consumers "$consumers" --batch "$batch" --max-seconds 600)
    [ "$r" -gt 0 ] && rates+=("$(echo "$json" | sed -E 's/.*"drain_items_per_s":([0-9]+).*/\1/')")
  done
  rss_kb=$(awk '/VmRSS/ {print $2}' "/proc/$foqsd_pid/status")
  after=$(status)
  # MySQL's work per drained item at this depth (the warm-up round included); history
  # list length is the purge backlog at the end, not a rate.
  counters=$(python3 -c '
import sys, json
parse = lambda t: {l.split("\t")[0]: float(l.split("\t")[1]) for l in t.splitlines() if "\t" in l}
b, a, n = parse(sys.argv[1]), parse(sys.argv[2]), float(sys.argv[3])
out = {k: round((a[k] - b[k]) / n, 3) for k in sorted(a) if k != "Innodb_history_list_length"}
out["Innodb_history_list_length"] = a.get("Innodb_history_list_length")
print(json.dumps(out))' "$before" "$after" "$measure")
  stop_foqsd
  rate=$(printf '%s\n' "${rates[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}')
  line="{\"depth\":$depth,\"measured_items\":$measure,\"drain_items_per_s\":$rate,\"rounds\":[$(IFS=,; echo "${rates[*]}")],\"rss_bytes\":$((rss_kb * 1024)),\"per_item\":$counters}"
  echo "$line"
  results+=("$depth $rate $((rss_kb * 1024))")
done

read -r d0 r0 m0 <<<"${results[0]}"
ratios=""
for r in "${results[@]}"; do
  read -r d rate rss <<<"$r"
  ratios+="$( [ -n "$ratios" ] && echo , )\"$d\":{\"drain\":$(awk "BEGIN{printf \"%.3f\", $rate/$r0}"),\"rss\":$(awk "BEGIN{printf \"%.3f\", $rss/$m0}")}"
done
echo "{\"ratios_to_depth_$d0\":{$ratios}}"
