#!/usr/bin/env bash
# What a claim's index moves cost the store, row by row: the claim's UPDATE as foqsd
# writes it, and the same UPDATE with fewer of its index moves, each followed by the
# ack's DELETE, on foqsd's own schema (MySQL and SQLite).
#
#   scripts/bench-claim.sh
#
# A claim sets the row's state (an entry of `ready_order` moves) and its timer to the
# lease's end (an entry of `timer` moves), besides columns that no index holds
# (lease_token, lease_expires_ms, delivery_count). The variants:
#   full          what foqsd runs today (sql::claim_spelled's SET list)
#   state-only    the state moves, the timer does not
#   timer-only    the timer moves, the state does not
#   no-index      only the columns no index holds (what a claim that keeps leases apart
#                 from the items' indexes would write to the item's row)
# None but `full` is a correct claim: they are here to size what each move costs.
# Ready rows hold no timer as foqsd writes them: 0 on MySQL, NULL on SQLite (see
# Dialect::no_event); FOQS_BENCH_NO_EVENT=NULL fills MySQL's as builds before 3a9ab40 did.
#
# Each round fills a fresh table with ROWS (default 200000) ready items of one topic over
# 10 priorities (as a shard sees `foqs-bench`'s load), 100-byte payloads, then runs the UPDATE in batches of BATCH (default
# 200) ids taken in ready order (as claims take each topic's most urgent items), one
# statement per batch in autocommit (MySQL: through the mysql client, one connection;
# SQLite: a transaction per statement, WAL, synchronous = FULL, as foqsd opens a shard),
# then the DELETE of the same batches. It prints a JSON line per store and variant: the
# medians over ROUNDS (default 2) of microseconds per row for each. The schema is made
# by the release foqsd itself (one start and stop), on the local MySQL (databases
# foqs_bench_claim_0..3, dropped at the end) and in .run/bench-claim.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
foqs_cargo_check
foqs_mysql_ensure
command -v python3 >/dev/null || { foqs_log "needs python3"; exit 1; }
cargo build --release --bin foqsd >&2
client=$(command -v mariadb || command -v mysql)
hostport=${FOQS_MYSQL_URL#mysql://root@}
dir="$FOQS_RUN/bench-claim"
rm -rf "$dir" && mkdir -p "$dir"
mysql_config="$dir/mysql.toml"
sqlite_config="$dir/sqlite.toml"
foqs_config_for_mysql "$mysql_config" foqs_bench_claim_
foqs_config_for_sqlite "$sqlite_config" "$dir"
sql() { "$client" -h"${hostport%:*}" -P"${hostport##*:}" -uroot "$@"; }
drop_dbs() { for s in 0 1 2 3; do sql -e "DROP DATABASE IF EXISTS foqs_bench_claim_$s"; done; }
cleanup() { drop_dbs; foqs_mysql_stop; }
trap cleanup EXIT
drop_dbs

# Lets foqsd create the schema: starts it, waits until its shards are open, stops it.
make_schema() {
  local rc=0
  foqs_foqsd_start ./target/release/foqsd "$1" "127.0.0.1:${FOQS_BENCH_LISTEN_PORT:-9193}" \
    "$dir/foqsd.log" || rc=1
  kill -TERM "$FOQS_FOQSD_PID" 2>/dev/null
  wait "$FOQS_FOQSD_PID" || true
  return $rc
}
make_schema "$mysql_config"
make_schema "$sqlite_config"

python3 - "$client" "${hostport%:*}" "${hostport##*:}" "$dir" "${ROWS:-200000}" \
  "${BATCH:-200}" "${ROUNDS:-2}" "${FOQS_BENCH_NO_EVENT:-0}" <<'EOF'
import json, os, shutil, sqlite3, statistics, subprocess, sys, time
client, host, port, folder = sys.argv[1:5]
rows, batch, rounds = (int(a) for a in sys.argv[5:8])
no_event = sys.argv[8]
now, lease_end = 1_700_000_000_000, "1700000000000 + lease_ms"
lease_cols = f"lease_token = 7, delivery_count = delivery_count + 1, lease_expires_ms = {lease_end}"
variants = {
    "full": f"state = 1, {lease_cols}, next_event_ms = {lease_end}",
    "state-only": f"state = 1, {lease_cols}",
    "timer-only": f"{lease_cols}, next_event_ms = {lease_end}",
    "no-index": lease_cols,
}
# Claims take the topic's head, so a batch is a run of neighbours in `ready_order`
# (tid, state, priority, deliver_after_ms, id); acks follow in the same order.
in_ready_order = sorted(range(1, rows + 1), key=lambda i: (i % 10, i))
batches = [in_ready_order[s:s + batch] for s in range(0, rows, batch)]
ids = lambda b: ",".join(map(str, b))
fill_select = (f"SELECT seq, 1, seq % 10, 0, {now} - 1000, NO_EVENT, {now} - 1000, 30000, 0, 0,"
               f" NULL, 1, 5, 0, 0, REPEAT('x', 100), '' FROM seq_1_to_{rows}")
columns = ("id, tid, priority, state, deliver_after_ms, next_event_ms, enqueued_at_ms, lease_ms,"
           " lease_expires_ms, lease_token, expires_at_ms, policy, max_attempts, delivery_count,"
           " has_dedup, payload, metadata")

def mysql(script, db="foqs_bench_claim_0"):
    subprocess.run([client, f"-h{host}", f"-P{port}", "-uroot", db], input=script, text=True, check=True)

def timed_mysql(script):
    started = time.monotonic()
    mysql(script)
    return (time.monotonic() - started) * 1e6 / rows

def mysql_round(set_list):
    mysql(f"DELETE FROM items; INSERT IGNORE INTO topics (tid, ns, topic) VALUES (1,'b','1'),(2,'b','2'),(3,'b','3'),(4,'b','4');"
          f" INSERT INTO items ({columns}) {fill_select.replace('NO_EVENT', no_event)};")
    time.sleep(2)
    up = timed_mysql("\n".join(f"UPDATE items SET {set_list} WHERE id IN ({ids(b)}) AND state = 0;" for b in batches))
    de = timed_mysql("\n".join(f"DELETE FROM items WHERE id IN ({ids(b)});" for b in batches))
    return up, de

pristine = f"{folder}/shard_0.db"
settle = sqlite3.connect(pristine)
settle.execute("PRAGMA wal_checkpoint(TRUNCATE)")
settle.close()
def sqlite_round(set_list):
    path = f"{folder}/round.db"
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    shutil.copy(pristine, path)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    db.execute("INSERT OR IGNORE INTO topics (tid, ns, topic) VALUES (1,'b','1'),(2,'b','2'),(3,'b','3'),(4,'b','4')")
    db.execute("BEGIN")
    db.execute(f"WITH RECURSIVE seq(seq) AS (SELECT 1 UNION ALL SELECT seq + 1 FROM seq WHERE seq < {rows}) "
               f"INSERT INTO items ({columns}) " + fill_select.replace(f"FROM seq_1_to_{rows}", "FROM seq")
               .replace("NO_EVENT", "NULL")
               .replace("REPEAT('x', 100)", "zeroblob(100)").replace("''", "X''"))
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    def timed(statements):
        started = time.monotonic()
        for s in statements:
            db.execute("BEGIN")
            db.execute(s)
            db.execute("COMMIT")
        return (time.monotonic() - started) * 1e6 / rows
    up = timed(f"UPDATE items SET {set_list} WHERE id IN ({ids(b)}) AND state = 0" for b in batches)
    de = timed(f"DELETE FROM items WHERE id IN ({ids(b)})" for b in batches)
    db.close()
    return up, de

for store, run in (("mysql", mysql_round), ("sqlite", sqlite_round)):
    results = {name: [] for name in variants}
    for _ in range(rounds):
        for name, set_list in variants.items():
            results[name].append(run(set_list))
    for name, got in results.items():
        print(json.dumps({"store": store, "variant": name,
                          "no_event": no_event if store == "mysql" else "NULL", "rows": rows, "batch": batch, "rounds": rounds,
                          "update_us_per_row": round(statistics.median(u for u, _ in got), 1),
                          "delete_us_per_row": round(statistics.median(d for _, d in got), 1)}), flush=True)
EOF
