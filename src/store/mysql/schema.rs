//! The MySQL shard's schema: its tables at version 2, the check at open, and the
//! in-place migration from version 1.
//!
//! Version 2 is built for what InnoDB does per row (every item is written into, moved in
//! and deleted from the primary key and each secondary index):
//! - `items` carries a topic id (`tid`, see `store::topics`), not two names of up to 255
//!   bytes, so `ready_order` entries are a few bytes wide.
//! - One timer index (`next_event_ms`: due, lease end or TTL, whichever comes first for
//!   the row's state; 0 when none, NULL in rows written before that, see
//!   `Dialect::no_event`) instead of three (`due`, `lease`, `ttl`).
//! - Dedup keys live in a side table, written only for keyed items, instead of a unique
//!   index that every insert checked.
//! - Totals are columns of the `topics` row.

use mysql_async::prelude::*;
use mysql_async::Conn;

use crate::model::ShardId;
use crate::store::{StoreError, StoreResult};

pub(super) const SCHEMA_VERSION: i64 = 2;

fn items_ddl(name: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {name} (
        id BIGINT UNSIGNED NOT NULL PRIMARY KEY,
        tid INT UNSIGNED NOT NULL,
        priority INT NOT NULL,
        state TINYINT NOT NULL,
        deliver_after_ms BIGINT NOT NULL,
        next_event_ms BIGINT NULL,
        died_at_ms BIGINT NULL,
        enqueued_at_ms BIGINT NOT NULL,
        lease_ms BIGINT NOT NULL,
        lease_expires_ms BIGINT NOT NULL DEFAULT 0,
        lease_token BIGINT NOT NULL DEFAULT 0,
        expires_at_ms BIGINT NULL,
        policy TINYINT NOT NULL,
        max_attempts INT NOT NULL,
        delivery_count INT NOT NULL DEFAULT 0,
        has_dedup TINYINT NOT NULL DEFAULT 0,
        payload BLOB NOT NULL,
        metadata BLOB NOT NULL,
        settled_token BIGINT NOT NULL DEFAULT 0,
        KEY ready_order (tid, state, priority, deliver_after_ms, id),
        KEY timer (next_event_ms)
    ) ENGINE=InnoDB"
    )
}

const TOPICS: &str = "CREATE TABLE IF NOT EXISTS topics (
        tid INT UNSIGNED NOT NULL PRIMARY KEY,
        ns VARBINARY(255) NOT NULL,
        topic VARBINARY(255) NOT NULL,
        enqueued BIGINT NOT NULL DEFAULT 0,
        delivered BIGINT NOT NULL DEFAULT 0,
        acked BIGINT NOT NULL DEFAULT 0,
        nacked BIGINT NOT NULL DEFAULT 0,
        expired BIGINT NOT NULL DEFAULT 0,
        UNIQUE KEY name (ns, topic)
    ) ENGINE=InnoDB";

const DEDUP: &str = "CREATE TABLE IF NOT EXISTS dedup (
        tid INT UNSIGNED NOT NULL,
        dedup_key VARBINARY(255) NOT NULL,
        id BIGINT UNSIGNED NOT NULL,
        PRIMARY KEY (tid, dedup_key),
        KEY item (id)
    ) ENGINE=InnoDB";

/// The lease a consumer's nack or dead-lettering last settled (0: none): a nack retried
/// after its first try's outcome was lost is answered done from it, even once the item
/// was delivered again (see `shard::exec::nack_exec`).
const SETTLED_TOKEN: &str = "ALTER TABLE items ADD COLUMN settled_token BIGINT NOT NULL DEFAULT 0";

const META: &str = "CREATE TABLE IF NOT EXISTS foqs_meta (
        name VARBINARY(64) NOT NULL PRIMARY KEY,
        value BIGINT NOT NULL
    ) ENGINE=InnoDB";

/// Rows copied per statement while migrating: each is its own transaction, so the undo
/// log stays small and a crash loses at most one chunk's work (the migration restarts).
const MIGRATE_CHUNK_ROWS: u64 = 50_000;

pub(super) async fn meta_get(conn: &mut Conn, name: &str) -> StoreResult<Option<i64>> {
    Ok(conn
        .exec_first("SELECT value FROM foqs_meta WHERE name = ?", (name,))
        .await?)
}

async fn has_column(conn: &mut Conn, table: &str, column: &str) -> StoreResult<bool> {
    let n: Option<i64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.columns
             WHERE table_schema = DATABASE() AND table_name = ? AND column_name = ?",
            (table, column),
        )
        .await?;
    Ok(n.unwrap_or(0) > 0)
}

/// Brings the database to version 2: creates it when empty, migrates version 1 in place,
/// refuses a newer one or tables of another build.
/// The database's tables. Reading them first lets an open write no DDL when nothing is
/// missing: `CREATE TABLE IF NOT EXISTS` is binlogged even when the table exists, and on a
/// semi-synchronous primary each waits for a replica's acknowledgement, so three of them
/// lengthened every open after a switch or failover (the owners' resume, inside the
/// read-only window).
async fn tables(conn: &mut Conn) -> StoreResult<std::collections::HashSet<String>> {
    let names: Vec<String> = conn
        .query("SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()")
        .await?;
    Ok(names.into_iter().collect())
}

/// Runs `ddl` (a `CREATE TABLE IF NOT EXISTS`) unless `table` is among `have`.
async fn create_missing(
    conn: &mut Conn,
    have: &std::collections::HashSet<String>,
    table: &str,
    ddl: &str,
) -> StoreResult<()> {
    if !have.contains(table) {
        conn.query_drop(ddl).await?;
    }
    Ok(())
}

pub(super) async fn prepare(conn: &mut Conn, shard: ShardId, database: &str) -> StoreResult<()> {
    let have = tables(conn).await?;
    create_missing(conn, &have, "foqs_meta", META).await?;
    match meta_get(conn, "schema_version").await? {
        None => {
            for ddl in [TOPICS.to_string(), DEDUP.to_string(), items_ddl("items")] {
                conn.query_drop(ddl).await?;
            }
            conn.exec_drop(
                "INSERT IGNORE INTO foqs_meta (name, value) VALUES ('schema_version', ?)",
                (SCHEMA_VERSION,),
            )
            .await?;
        }
        Some(1) => migrate_v1(conn, shard, database).await?,
        Some(SCHEMA_VERSION) => {
            // Left by a migration that stopped after recording version 2.
            if have.contains("items_v1") {
                conn.query_drop("DROP TABLE IF EXISTS items_v1, topic_totals")
                    .await?;
            }
        }
        Some(v) => {
            return Err(StoreError::Schema(format!(
                "database {database} has schema version {v}, made by a newer foqsd; this one knows {SCHEMA_VERSION}: \
                 run the newer build, or drop the database"
            )))
        }
    }
    // Created in place in databases of earlier builds (which never name it).
    use crate::store::{batches, forwards};
    create_missing(conn, &have, "enqueue_marks", batches::MYSQL_DDL).await?;
    create_missing(conn, &have, "forward_marks", forwards::MYSQL_DDL).await?;
    // Added in place to tables of earlier builds (instant on MariaDB, and they go on
    // working with it: they never name it).
    if !has_column(conn, "items", "settled_token").await? {
        conn.query_drop(SETTLED_TOKEN).await?;
    }
    // Catch tables created by a development build with other columns now, with a clear
    // message, rather than at the first write.
    for (table, columns) in [
        ("items", super::PROBE_COLUMNS),
        (
            "topics",
            "tid, ns, topic, enqueued, delivered, acked, nacked, expired",
        ),
        ("dedup", "tid, dedup_key, id"),
    ] {
        if let Err(e) = conn
            .query_drop(format!("SELECT {columns} FROM {table} LIMIT 0"))
            .await
        {
            return Err(StoreError::Schema(format!(
                "database {database}: table {table} does not have the columns of schema version {SCHEMA_VERSION} ({e}); \
                 it was made by another build: drop the database"
            )));
        }
    }
    Ok(())
}

/// Version 1 to 2, in place. Builds the new tables beside the old ones, copies in chunks,
/// then swaps `items` in one atomic `RENAME` and only then records version 2. A crash
/// before the rename leaves version 1 intact (the migration starts over); a crash after it
/// is finished at the next open (the old table is still there as `items_v1`). The shard
/// serves nothing until it is done.
async fn migrate_v1(conn: &mut Conn, shard: ShardId, database: &str) -> StoreResult<()> {
    let started = std::time::Instant::now();
    // Version 1's items have names; once swapped, `items` has topic ids.
    let renamed = !has_column(conn, "items", "ns").await?;
    let mut copied = 0u64;
    if !renamed {
        let rows: i64 = conn
            .query_first("SELECT COUNT(*) FROM items")
            .await?
            .unwrap_or(0);
        tracing::warn!(
            shard,
            database,
            rows,
            "migrating the shard from schema version 1 to 2 in place; it serves once this is done"
        );
        for t in ["items_v2", "dedup", "topics"] {
            conn.query_drop(format!("DROP TABLE IF EXISTS {t}")).await?;
        }
        for ddl in [TOPICS.to_string(), DEDUP.to_string(), items_ddl("items_v2")] {
            conn.query_drop(ddl).await?;
        }
        // Topic ids: every name with items or totals, numbered from 1.
        let names: Vec<(Vec<u8>, Vec<u8>)> = conn
            .query(
                "SELECT ns, topic FROM items GROUP BY ns, topic
                 UNION SELECT ns, topic FROM topic_totals",
            )
            .await?;
        for (i, chunk) in names.chunks(500).enumerate() {
            let mut sql = String::from("INSERT INTO topics (tid, ns, topic) VALUES ");
            for (j, (ns, topic)) in chunk.iter().enumerate() {
                if j > 0 {
                    sql.push(',');
                }
                sql.push_str(&format!("({},", i * 500 + j + 1));
                crate::store::sql::push_hex(&mut sql, ns);
                sql.push(',');
                crate::store::sql::push_hex(&mut sql, topic);
                sql.push(')');
            }
            conn.query_drop(sql).await?;
        }
        conn.query_drop(
            "UPDATE topics t JOIN topic_totals x ON x.ns = t.ns AND x.topic = t.topic
             SET t.enqueued = x.enqueued, t.delivered = x.delivered, t.acked = x.acked,
                 t.nacked = x.nacked, t.expired = x.expired",
        )
        .await?;
        let cp = v1_checkpoint(conn).await?;
        // The timer of each row: its pending events (those after the old checkpoints),
        // the earliest first; one already due is set just past the checkpoint, so the
        // first scan after the migration handles it.
        let due = format!(
            "CASE WHEN i.state = 0 AND i.due_at_ms IS NOT NULL AND i.deliver_after_ms > {cp} THEN i.deliver_after_ms
                  WHEN i.state = 1 THEN i.lease_expires_ms END"
        );
        // No pending event: MySQL's spelling of none (`Dialect::no_event`).
        let timer = format!(
            "COALESCE(GREATEST(COALESCE(LEAST({due}, i.expires_at_ms), {due}, i.expires_at_ms), {}), {})",
            cp + 1,
            crate::store::sql::Dialect::MySql.no_event()
        );
        let mut after = 0u64;
        loop {
            let last: Option<u64> = conn
                .query_first(format!(
                    "SELECT MAX(id) FROM (SELECT id FROM items WHERE id > {after} ORDER BY id LIMIT {MIGRATE_CHUNK_ROWS}) c"
                ))
                .await?
                .flatten();
            let Some(last) = last else { break };
            conn.query_drop(format!(
                "INSERT INTO items_v2 (id, tid, priority, state, deliver_after_ms, next_event_ms, died_at_ms,
                   enqueued_at_ms, lease_ms, lease_expires_ms, lease_token, expires_at_ms, policy, max_attempts,
                   delivery_count, has_dedup, payload, metadata)
                 SELECT i.id, t.tid, i.priority, i.state, i.deliver_after_ms, {timer}, i.died_at_ms,
                   i.enqueued_at_ms, i.lease_ms, i.lease_expires_ms, i.lease_token, i.expires_at_ms, i.policy,
                   i.max_attempts, i.delivery_count, i.dedup_key IS NOT NULL, i.payload, i.metadata
                 FROM items i JOIN topics t ON t.ns = i.ns AND t.topic = i.topic
                 WHERE i.id > {after} AND i.id <= {last}"
            ))
            .await?;
            copied += conn.affected_rows();
            after = last;
        }
        conn.query_drop(
            "INSERT INTO dedup (tid, dedup_key, id)
             SELECT t.tid, i.dedup_key, i.id FROM items i JOIN topics t ON t.ns = i.ns AND t.topic = i.topic
             WHERE i.dedup_key IS NOT NULL",
        )
        .await?;
        conn.query_drop("RENAME TABLE items TO items_v1, items_v2 TO items")
            .await?;
    }
    let cp = v1_checkpoint(conn).await?;
    conn.exec_drop(
        "INSERT INTO foqs_meta (name, value) VALUES ('checkpoint_ms', ?), ('schema_version', ?)
         ON DUPLICATE KEY UPDATE value = VALUES(value)",
        (cp, SCHEMA_VERSION),
    )
    .await?;
    conn.query_drop("DROP TABLE IF EXISTS items_v1, topic_totals")
        .await?;
    conn.query_drop(
        "DELETE FROM foqs_meta WHERE name IN ('checkpoint_due_ms', 'checkpoint_lease_ms', 'checkpoint_ttl_ms')",
    )
    .await?;
    tracing::warn!(
        shard,
        database,
        rows = copied,
        took_ms = started.elapsed().as_millis() as u64,
        "migrated the shard to schema version 2"
    );
    Ok(())
}

/// The last millisecond all three version-1 scans had processed.
async fn v1_checkpoint(conn: &mut Conn) -> StoreResult<i64> {
    let mut cp = i64::MAX;
    for name in [
        "checkpoint_due_ms",
        "checkpoint_lease_ms",
        "checkpoint_ttl_ms",
    ] {
        cp = cp.min(meta_get(conn, name).await?.unwrap_or(0));
    }
    Ok(cp)
}
