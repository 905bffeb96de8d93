#!/usr/bin/env bash
# Many lightweight hosts (the real etcd shard manager, no shards opened) against one
# private etcd: all join, a tenth crash, as many join (integration/rust/tier_etcd.rs).
# Prints one JSON line per step: how long until every shard had one live owner again and
# the loads were even, and etcd's own counters for the step (requests, bytes sent).
#
#   bash scripts/tier-etcd.sh [HOSTS]     # default 200 (the suite runs 30)
#   FOQS_TIER_RELEASE=1 bash scripts/tier-etcd.sh 200   # an optimized build (as hosts run)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
foqs_cargo_check
foqs_etcd_install
hosts=${1:-200}
profile=()
[ -n "${FOQS_TIER_RELEASE:-}" ] && profile=(--release)
FOQS_TIER_HOSTS=$hosts cargo test -q "${profile[@]}" --test clusters tier_etcd -- --nocapture 2>&1 |
  grep -E '^\{"etcd_requests|^test result|panicked|not settled|two owners'
