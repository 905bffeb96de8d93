#!/usr/bin/env bash
# The cost of routed dequeues (issue 11): drain throughput through one host of a 3-host
# cluster vs through all three, and vs a single host with the same 8 shards.
#   scripts/bench-routing.sh [ITEMS]      (default 60000)
# Each run: ITEMS items enqueued through the three hosts (a third each, so they land on
# every host's shards), then drained with foqs-bench (4 consumers, 100 per dequeue, acked)
# through h1 alone, or through h1, h2 and h3 at once (90% of a third each; the figure is
# the sum of the three rates). The single-host row runs foqsd with conf/cluster.toml's 8 shards and manager
# "single". Fresh databases each time; release build; prints one JSON line per row.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
items=${1:-60000}
third=$((items / 3))
foqs_cargo_check
foqs_mysql_ensure
cargo build --release --bins >&2
client=$(command -v mariadb || command -v mysql)
hostport=${FOQS_MYSQL_URL#mysql://root@}
drop_dbs() {
  for s in 0 1 2 3 4 5 6 7; do
    "$client" -h"${hostport%:*}" -P"${hostport##*:}" -uroot -e "DROP DATABASE IF EXISTS foqs_cluster_$s"
  done
}
bench() { ./target/release/foqs-bench --ns routing --consumers 4 --producers 4 "$@"; }
rate() { sed -E "s/.*\"$1\":([0-9]+).*/\1/"; }
settle() {
  for _ in $(seq 1 60); do
    local n=0 p
    for p in 9091 9092 9093; do
      n=$((n + $(./target/release/foqsctl --host "127.0.0.1:$p" --json host-info |
        python3 -c 'import json,sys; print(len(json.loads(sys.stdin.read())["shards"]))' 2>/dev/null || echo 0)))
    done
    [ "$n" = 8 ] && return 0
    sleep 0.5
  done
  foqs_log "shards did not settle"; return 1
}
fill() { # topic
  local p
  for p in 9091 9092 9093; do
    bench --host "127.0.0.1:$p" --phases enqueue --items "$third" --topic "$1" >/dev/null
  done
  sleep 1 # one peer poll, so every host knows where the items are
}

trap 'scripts/cluster.sh stop >/dev/null 2>&1 || true' EXIT
scripts/cluster.sh stop >/dev/null 2>&1 || true
drop_dbs
RUST_LOG=warn scripts/cluster.sh start >&2
settle

fill one
one=$(bench --host 127.0.0.1:9091 --phases drain --items $((third * 3)) --topic one | rate drain_items_per_s)
echo "{\"row\":\"3 hosts, drained through h1 alone\",\"drain_items_per_s\":$one}"

fill all
outs=$(mktemp -d)
# Each drains 90% of a third: a consumer's last dequeue may take more than its process
# still needs, so asking for exactly a third each could leave one waiting for items
# another already took.
for p in 9091 9092 9093; do
  bench --host "127.0.0.1:$p" --phases drain --items $((third * 9 / 10)) --topic all >"$outs/$p" &
done
wait
sum=0
for p in 9091 9092 9093; do sum=$((sum + $(rate drain_items_per_s <"$outs/$p"))); done
rm -rf "$outs"
echo "{\"row\":\"3 hosts, drained through all three\",\"drain_items_per_s\":$sum}"
scripts/cluster.sh stop >&2

drop_dbs
single="$FOQS_RUN/bench-single.toml"
sed -e "s#mysql://root@127.0.0.1:3306/#mysql://root@$hostport/#" conf/cluster.toml |
  python3 -c 'import sys,re; t=sys.stdin.read(); print(re.split(r"\n\[cluster\]", t)[0])' >"$single"
RUST_LOG=warn ./target/release/foqsd --config "$single" --listen 127.0.0.1:9194 >/dev/null 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
foqs_wait_port 9194 30
bench --host 127.0.0.1:9194 --phases enqueue --items $((third * 3)) --topic single >/dev/null
s=$(bench --host 127.0.0.1:9194 --phases drain --items $((third * 3)) --topic single | rate drain_items_per_s)
echo "{\"row\":\"1 host, same 8 shards\",\"drain_items_per_s\":$s}"
kill $pid; wait $pid || true
drop_dbs
