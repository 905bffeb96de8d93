#!/usr/bin/env bash
# Runs the seeded fault simulation (integration/rust/simulation.rs) over many seeds, on
# MariaDB and on SQLite: scripts/soak.sh SEEDS [FIRST]. Seeds FIRST..FIRST+SEEDS-1 (FIRST
# defaults to 1), 20 per test run; a failing seed is printed with its problems, and
# FOQS_SIM_SEEDS=N cargo test --test failpoints -- simulation:: replays it. Exits non-zero when any failed.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
count=${1:?usage: scripts/soak.sh SEEDS [FIRST]}
first=${2:-1}
foqs_cargo_check
foqs_mysql_ensure
export FOQS_TEST_MYSQL_URL="$FOQS_MYSQL_URL"
trap foqs_mysql_stop EXIT
cargo build -q --tests
started=$(date +%s)
failed=()
seed=$first
last=$((first + count - 1))
while [ "$seed" -le "$last" ]; do
  end=$((seed + 19 > last ? last : seed + 19))
  seeds=$(seq -s, "$seed" "$end")
  log="$FOQS_RUN/soak-$seed-$end.log"
  mkdir -p "$FOQS_RUN"
  if FOQS_SIM_SEEDS="$seeds" cargo test -q --test failpoints -- simulation:: >"$log" 2>&1; then
    foqs_log "seeds $seed..$end clean ($(( $(date +%s) - started )) s so far)"
  else
    foqs_log "seeds $seed..$end: failures (log: $log)"
    grep -E "problems|^  " "$log" | head -40 || true
    failed+=("$seed..$end")
  fi
  seed=$((end + 1))
done
took=$(( $(date +%s) - started ))
if [ ${#failed[@]} -eq 0 ]; then
  foqs_log "soak: $count seeds clean on MariaDB and SQLite in $took s"
else
  foqs_log "soak: failures in ${failed[*]} ($took s)"
  exit 1
fi
