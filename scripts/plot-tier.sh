#!/usr/bin/env bash
# Draws docs/figures/tier-costs.png, the per-host costs of a tier from 3 to 1,000 hosts (10 shards
# each): foqs-sim (seed 1, EVENTS events per size, both assignments) and, when given, the
# lines `scripts/tier-etcd.sh` printed (one file per build, named for it). Installs
# matplotlib from PyPI into .run/plot-venv the first time.
#
#   bash scripts/plot-tier.sh [EVENTS] [TIER_ETCD_JSONL ...]     # default 20 events
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
foqs_cargo_check
events=${1:-20}
shift || true
venv=$FOQS_RUN/plot-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
  mkdir -p "$FOQS_RUN"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q matplotlib
fi
cargo build -q --release --bin foqs-sim
sims=$FOQS_RUN/tier-sim.jsonl
: >"$sims"
for hosts in 3 30 100 300 1000; do
  for kind in from stateless; do
    args=(--hosts "$hosts" --shards $((hosts * 10)) --events "$events" --seed 1)
    [ "$kind" = stateless ] && args+=(--stateless)
    target/release/foqs-sim "${args[@]}" >>"$sims"
  done
done
"$venv/bin/python" scripts/plot-tier.py "$sims" "$@" --out docs/figures/tier-costs.png
