#!/usr/bin/env bash
# The followers' protocol over a simulated etcd at 3 to 1,000 hosts (10 shards each, three
# regions, replica sets of 10 shards), by `foqs-sim --etcd` (each host on the real
# planning code, a simulated clock, lease TTL 10 s, poll 1 s, watch events arriving within
# 20 ms): per size and kind of event, the longest time until every shard was served by
# exactly one host of its region again (for a drain or added shards: after the operator's
# last write), the longest a shard went unserved, the shards moved and the hand-overs
# (keys created: interim moves too) against the fewest the event needed, etcd's requests
# per event (the followers' for the event; the operator's writes; the periodic key counts,
# one per host per 10 polls whatever happens), and what one host received (watch events)
# and computed (plans) per event. Moments with two hosts serving a shard must be 0.
#
#   bash scripts/sim-etcd.sh [EVENTS] [SIZES]   # default 20 events per size, seed 1,
#                                               # sizes "3 30 100 300 1000"
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
foqs_cargo_check
events=${1:-20}
sizes=${2:-3 30 100 300 1000}
cargo build -q --release --bin foqs-sim
printf '| hosts | shards | event | events | settled (max) | longest unserved | moved / ideal (max) | hand-overs / ideal (max) | shards moved (max) | etcd requests (max): followers; operator; periodic counts | watch events per host (max) | plans per host (max) | two owners |\n'
printf '|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
for hosts in $sizes; do
  target/release/foqs-sim --etcd --hosts "$hosts" --shards $((hosts * 10)) --events "$events" --seed 1 | tail -1 |
    python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
for kind in ("join", "leave", "crash", "partition", "partition healed", "drain", "add shards"):
    k = r["by_kind"].get(kind)
    if not k:
        continue
    print("| %d | %d | %s | %d | %.1f s | %.1f s | %.2f | %.2f | %d | %d; %d; %d | %d | %d | %d |" % (r["hosts"], r["shards"], kind,
          k["events"], k["settled_after_operator_ms_max"] / 1000, k["longest_unserved_ms_max"] / 1000,
          k["ratio_max"], k["taken_ratio_max"], k["moved_max"], k["event_requests_max"], k["operator_requests_max"],
          k["check_requests_max"],
          k["watch_events_per_host_max"], k["plans_per_host_max"], r["double_served"]))
'
done
