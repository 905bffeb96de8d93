#!/usr/bin/env bash
# The followers' protocol over a simulated etcd at 3 to 1,000 hosts (10 shards each), by
# `foqs-sim --etcd` (each host on the real planning code, a simulated clock, lease TTL
# 10 s, poll 1 s, watch events arriving within 20 ms): per size and kind of event, the
# longest time until every shard was served by exactly one host again, the most shards
# moved against the fewest the event needed, etcd's requests per event, and the watch
# events one host received per event. Moments with two hosts serving a shard must be 0.
#
#   bash scripts/sim-etcd.sh [EVENTS]      # default 20 events per size, seed 1
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
foqs_cargo_check
events=${1:-20}
cargo build -q --release --bin foqs-sim
printf '| hosts | shards | event | events | settled (max) | moved / ideal (max) | shards moved (max) | etcd requests (max) | watch events per host (max) | two owners |\n'
printf '|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n'
for hosts in 3 30 100 300 1000; do
  target/release/foqs-sim --etcd --hosts "$hosts" --shards $((hosts * 10)) --events "$events" --seed 1 | tail -1 |
    python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
for kind in ("join", "leave", "crash", "partition", "partition healed"):
    k = r["by_kind"].get(kind)
    if not k:
        continue
    print("| %d | %d | %s | %d | %.1f s | %.2f | %d | %d | %d | %d |" % (r["hosts"], r["shards"], kind, k["events"],
          k["settled_ms_max"] / 1000, k["ratio_max"], k["moved_max"], k["etcd_requests_max"],
          k["watch_events_per_host_max"], r["double_served"]))
'
done
