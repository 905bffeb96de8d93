//! The SQLite shard's schema (version 2, the MySQL store's layout) and its check at open.

use std::path::Path;

use rusqlite::Connection;

use super::conn::store_error;
use crate::store::{StoreError, StoreResult};

const SCHEMA_VERSION: i64 = 2;

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS topics (
        tid INTEGER PRIMARY KEY,
        ns BLOB NOT NULL,
        topic BLOB NOT NULL,
        enqueued INTEGER NOT NULL DEFAULT 0,
        delivered INTEGER NOT NULL DEFAULT 0,
        acked INTEGER NOT NULL DEFAULT 0,
        nacked INTEGER NOT NULL DEFAULT 0,
        expired INTEGER NOT NULL DEFAULT 0,
        UNIQUE (ns, topic)
    );
    CREATE TABLE IF NOT EXISTS items (
        id INTEGER PRIMARY KEY,
        tid INTEGER NOT NULL,
        priority INTEGER NOT NULL,
        state INTEGER NOT NULL,
        deliver_after_ms INTEGER NOT NULL,
        next_event_ms INTEGER,
        died_at_ms INTEGER,
        enqueued_at_ms INTEGER NOT NULL,
        lease_ms INTEGER NOT NULL,
        lease_expires_ms INTEGER NOT NULL DEFAULT 0,
        lease_token INTEGER NOT NULL DEFAULT 0,
        expires_at_ms INTEGER,
        policy INTEGER NOT NULL,
        max_attempts INTEGER NOT NULL,
        delivery_count INTEGER NOT NULL DEFAULT 0,
        has_dedup INTEGER NOT NULL DEFAULT 0,
        payload BLOB NOT NULL,
        metadata BLOB NOT NULL,
        settled_token INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX IF NOT EXISTS ready_order ON items (tid, state, priority, deliver_after_ms, id);
    CREATE INDEX IF NOT EXISTS timer ON items (next_event_ms) WHERE next_event_ms IS NOT NULL;
    CREATE TABLE IF NOT EXISTS dedup (
        tid INTEGER NOT NULL,
        dedup_key BLOB NOT NULL,
        id INTEGER NOT NULL,
        PRIMARY KEY (tid, dedup_key)
    ) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS dedup_item ON dedup (id);
    CREATE TABLE IF NOT EXISTS foqs_meta (
        name TEXT NOT NULL PRIMARY KEY,
        value INTEGER NOT NULL
    );";

/// Every column of `items` at this schema version, to check a file at open.
const PROBE_COLUMNS: &str = "id, tid, priority, state, deliver_after_ms, next_event_ms, died_at_ms, enqueued_at_ms, lease_ms, lease_expires_ms, lease_token, expires_at_ms, policy, max_attempts, delivery_count, has_dedup, payload, metadata, settled_token";

pub(super) fn meta_get(conn: &Connection, name: &str) -> StoreResult<Option<i64>> {
    use rusqlite::OptionalExtension;
    conn.query_row("SELECT value FROM foqs_meta WHERE name = ?1", [name], |r| {
        r.get(0)
    })
    .optional()
    .map_err(store_error)
}

/// Creates the schema when the file is new; refuses a file of another version before
/// touching any of its tables.
pub(super) fn prepare(conn: &Connection, path: &Path) -> StoreResult<()> {
    // `rarray(?)`: the hot statements bind their keys as one array (see `rows::key_array`).
    rusqlite::vtab::array::load_module(conn).map_err(store_error)?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS foqs_meta (name TEXT NOT NULL PRIMARY KEY, value INTEGER NOT NULL)",
    )
    .map_err(store_error)?;
    match meta_get(conn, "schema_version")? {
        None => {
            conn.execute_batch(&format!(
                "BEGIN IMMEDIATE; {SCHEMA}
                 {}
                 {}
                 INSERT INTO foqs_meta (name, value) VALUES ('schema_version', {SCHEMA_VERSION});
                 COMMIT;",
                crate::store::batches::SQLITE_DDL,
                crate::store::forwards::SQLITE_DDL
            ))
            .map_err(store_error)?;
            Ok(())
        }
        Some(SCHEMA_VERSION) => {
            // Added in place to files of earlier builds (see the MySQL store's
            // `SETTLED_TOKEN`; earlier builds never name it).
            let has: i64 = conn
                .query_row(
                    "SELECT COUNT(*) FROM pragma_table_info('items') WHERE name = 'settled_token'",
                    [],
                    |r| r.get(0),
                )
                .map_err(store_error)?;
            if has == 0 {
                conn.execute_batch(
                    "ALTER TABLE items ADD COLUMN settled_token INTEGER NOT NULL DEFAULT 0",
                )
                .map_err(store_error)?;
            }
            // Created in place in files of earlier builds (which never name it).
            conn.execute_batch(crate::store::batches::SQLITE_DDL)
                .map_err(store_error)?;
            conn.execute_batch(crate::store::forwards::SQLITE_DDL)
                .map_err(store_error)?;
            // A file of another build with other columns: say so now, not at the first
            // write.
            for (table, columns) in [
                ("items", PROBE_COLUMNS),
                (
                    "topics",
                    "tid, ns, topic, enqueued, delivered, acked, nacked, expired",
                ),
                ("dedup", "tid, dedup_key, id"),
            ] {
                if let Err(e) = conn.prepare(&format!("SELECT {columns} FROM {table} LIMIT 0")) {
                    return Err(StoreError::Schema(format!(
                        "{}: table {table} does not have the columns of schema version {SCHEMA_VERSION} ({e}); \
                         it was made by another build: move the file away",
                        path.display()
                    )));
                }
            }
            Ok(())
        }
        Some(v) if v > SCHEMA_VERSION => Err(StoreError::Schema(format!(
            "{} has schema version {v}, made by a newer foqsd; this one knows {SCHEMA_VERSION}: \
             run the newer build, or move the file away",
            path.display()
        ))),
        Some(v) => Err(StoreError::Schema(format!(
            "{} has schema version {v}; this foqsd knows {SCHEMA_VERSION}",
            path.display()
        ))),
    }
}
