#!/usr/bin/env bash
# How long foqsd takes to migrate a shard from schema version 1 to 2 in place.
#
#   scripts/bench-migrate.sh [ROWS]     (default 1000000)
#
# Creates one shard database (foqs_bench_migrate, on the MySQL the other scripts use) with
# the version-1 tables (the DDL of integration/rust/migrate.rs), bulk-loads ROWS items
# (100-byte payloads, 10 topics, a tenth of them leased, a tenth deferred, one in a
# hundred with a dedup key) with the SEQUENCE engine, starts foqsd on it and prints one
# JSON line: {"rows", "migrate_ms" (from foqsd's log line), "start_ms" (until it listens)}.
# The loader uses MariaDB's SEQUENCE engine (seq_1_to_N tables): MariaDB only.
# The shard serves nothing until its migration is done; other shards open meanwhile.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
foqs_cargo_check
foqs_mysql_ensure
rows=${1:-1000000}
cargo build --release --bin foqsd >&2
client=$(command -v mariadb || command -v mysql) ||
  { foqs_log "needs the mariadb (or mysql) client"; exit 1; }
command -v python3 >/dev/null || { foqs_log "needs python3"; exit 1; }
hostport=${FOQS_MYSQL_URL#mysql://root@}
sql() { "$client" -h"${hostport%:*}" -P"${hostport##*:}" -uroot "$@"; }
db=foqs_bench_migrate
listen="127.0.0.1:${FOQS_BENCH_LISTEN_PORT:-9193}"
foqsd_pid=""
cleanup() {
  [ -n "$foqsd_pid" ] && kill "$foqsd_pid" 2>/dev/null && wait "$foqsd_pid" 2>/dev/null
  sql -e "DROP DATABASE IF EXISTS $db" || true
  foqs_mysql_stop
}
trap cleanup EXIT

sql -e "DROP DATABASE IF EXISTS $db; CREATE DATABASE $db"
sed -n '/^const V1_DDL/,/^];/p' integration/rust/migrate.rs |
  python3 -c 'import re,sys; print(";\n".join(re.findall(r"\"(CREATE TABLE.*?)\"", sys.stdin.read(), re.S)) + ";")' |
  sql "$db"
now=$(date +%s%3N)
foqs_log "loading $rows version-1 rows"
from=1
while [ "$from" -le "$rows" ]; do
  to=$((from + 499999)); [ "$to" -gt "$rows" ] && to=$rows
  sql "$db" -e "INSERT INTO items (id, ns, topic, priority, state, deliver_after_ms, due_at_ms,
      dedup_key, enqueued_at_ms, lease_ms, lease_expires_ms, lease_token, policy, max_attempts,
      delivery_count, payload, metadata)
    SELECT seq, 'bench', CONCAT('topic-', seq % 10), seq % 10, IF(seq % 10 = 1, 1, 0),
      IF(seq % 10 = 2, $now + 3600000, $now - 1000), IF(seq % 10 = 2, $now + 3600000, NULL),
      IF(seq % 100 = 3, CONCAT('key-', seq), NULL), $now - 1000, 30000,
      IF(seq % 10 = 1, $now + 600000, 0), IF(seq % 10 = 1, 7, 0), 1, 5, IF(seq % 10 = 1, 1, 0),
      REPEAT('x', 100), '' FROM seq_${from}_to_${to}"
  from=$((to + 1))
done
sql "$db" -e "INSERT INTO foqs_meta VALUES ('schema_version', 1), ('key_high_water', $((rows + 1)))"
config="$FOQS_RUN/bench-migrate.toml"
cat >"$config" <<TOML
[[shards]]
id = 0
url = "mysql://root@$hostport/$db"
TOML
log="$FOQS_RUN/bench-migrate.log"
! foqs_port_open 127.0.0.1 "${listen##*:}" || { foqs_log "port ${listen##*:} is taken: set FOQS_BENCH_LISTEN_PORT"; exit 1; }
t0=$(date +%s%3N)
RUST_LOG=warn,foqs::daemon=info ./target/release/foqsd --config "$config" --listen "$listen" >"$log" 2>&1 &
foqsd_pid=$!
until grep -q "listening" "$log" 2>/dev/null || ! kill -0 "$foqsd_pid" 2>/dev/null; do sleep 0.1; done
kill -0 "$foqsd_pid" 2>/dev/null || { foqs_log "foqsd stopped:"; cat "$log" >&2; exit 1; }
t1=$(date +%s%3N)
took=$(sed -nE 's/.*took_ms=([0-9]+).*migrated the shard.*/\1/p; s/.*migrated the shard.*took_ms=([0-9]+).*/\1/p' "$log" | head -1)
echo "{\"rows\":$rows,\"migrate_ms\":${took:-null},\"start_ms\":$((t1 - t0))}"
