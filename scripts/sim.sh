#!/usr/bin/env bash
# The tier's shard ownership at 3 to 1,000 hosts (10 shards each), by foqs-sim (the real
# assignment function over seeded event streams): per size, the worst and mean shards
# moved per join / leave / crash against the fewest possible, and the most and fewest
# shards a host held; with foqsd's assignment (from the current owners) and with the
# stateless one it had before (`--stateless`: rendezvous hashing with bounded loads, a
# quarter's slack). One region (what the assignment itself does) unless FOQS_SIM_REGIONS
# says otherwise. The last column: the most peers a host polls / the most hosts polling
# one host, per cluster.peer_fanout (8), on the real fan-out (all-to-all was hosts - 1 each),
# and the most hosts whose polled set one event changed.
#
#   bash scripts/sim.sh [EVENTS]      # default 40 events per size and seed, seeds 1-3
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
foqs_cargo_check
events=${1:-40}
regions=${FOQS_SIM_REGIONS:-1}
cargo build -q --release --bin foqs-sim
sim=target/release/foqs-sim
printf '| hosts | shards | assignment | join: mean / worst x ideal | leave | crash | max-min load (worst) | polls out / in per host, sets changed (max) |\n'
printf '|---:|---:|---|---|---|---|---:|---|\n'
for hosts in 3 30 100 300 1000; do
  for kind in from stateless; do
    args=(--hosts "$hosts" --shards $((hosts * 10)) --events "$events" --regions "$regions")
    [ "$kind" = stateless ] && args+=(--stateless)
    for seed in 1 2 3; do "$sim" "${args[@]}" --seed "$seed" | tail -1; done |
      python3 -c '
import json, sys
runs = [json.loads(l) for l in sys.stdin]
def cell(kind):
    ks = [r["by_kind"][kind] for r in runs if kind in r["by_kind"]]
    if not ks:
        return "-"
    n = sum(k["events"] for k in ks)
    mean = sum(k["mean_ratio"] * k["events"] for k in ks) / n
    return "%.2f / %.2f" % (mean, max(k["worst_ratio"] for k in ks))
r = runs[0]
print("| %d | %d | %s | %s | %s | %s | %d | %d / %d, %d |" % (r["hosts"], r["shards"], r["assignment"], cell("join"),
      cell("leave"), cell("crash"), max(x["worst_load_spread"] for x in runs),
      max(x["polls_out_max"] for x in runs), max(x["polls_in_max"] for x in runs),
      max(x["poll_sets_changed_max"] for x in runs)))
'
  done
done
