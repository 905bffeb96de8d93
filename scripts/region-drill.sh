#!/usr/bin/env bash
# The region drill, long form: three MariaDB servers replicating one another (one per
# region), a private etcd and three foqsd hosts under load through a checker; ten planned
# switchovers, two region drains, a kill -9 and a SIGSTOP/SIGCONT of the primary, then the
# negative control (semi-sync off, the replicas' IO threads stopped, a forced failover: the
# checker must report loss). Prints one JSON line per switch and a summary line.
#
#   bash scripts/region-drill.sh          # long form (and the negative control)
#   bash scripts/region-drill.sh short    # the form the test suite runs
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
foqs_cargo_check
command -v mariadb-install-db >/dev/null 2>&1 || foqs_apt_install mariadb-server
foqs_etcd_install
form=${1:-long}
export FOQS_DRILL=$form
[ "$form" = long ] && export FOQS_DRILL_NEGATIVE=1
out="$FOQS_RUN/region-drill-$form.log"
mkdir -p "$FOQS_RUN"
foqs_log "region drill ($form form); everything it printed goes to $out"
status=0
cargo test --release --test replication -- --nocapture >"$out" 2>&1 || status=$?
grep -E '^\{' "$out" || true
grep -E '^lost |panicked' "$out" || true
exit $status
