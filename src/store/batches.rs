//! Enqueue batches' marks: how a shard learns, after the fact, whether an insert whose
//! outcome was lost (the connection broke at commit, the store did not answer in time)
//! committed.
//!
//! Every insert writes, in its own transaction, one row `(token, at_ms, committed = 1)`
//! of `enqueue_batches` under a token drawn for it. To learn the outcome, the shard
//! writes a tombstone `(token, now, committed = 0)` with `INSERT IGNORE` and reads the
//! row back:
//! - `committed = 1`: the insert committed (the tombstone was ignored);
//! - `committed = 0`: it did not, and never will: the tombstone holds its token's key,
//!   so a late commit (a statement the server went on running after the client gave up,
//!   a frozen primary resumed) fails on it as a duplicate, rolling back the items.
//!   A late insert holding the key uncommitted makes the tombstone wait for its end
//!   (InnoDB's row lock; SQLite's one writer), so the answer is that end.
//!
//! This is the "write a tombstone to resolve" of transaction resolvers (Percolator's
//! rollback record): the check itself decides the race. Rows are kept for
//! [`BATCH_MEMORY_MS`], far past any late commit a fenced server could still make, then
//! deleted in bounded chunks by the shard's background ticks. One row per insert
//! transaction (a worker turn's group of requests), not per item.

use super::sql::Dialect;

/// How long marks and tombstones are kept (10 minutes).
pub const BATCH_MEMORY_MS: i64 = 600_000;

/// Rows deleted per background tick, at most.
pub const FORGET_CHUNK: u64 = 5_000;

pub const MYSQL_DDL: &str = "CREATE TABLE IF NOT EXISTS enqueue_batches (
        token BIGINT NOT NULL PRIMARY KEY,
        at_ms BIGINT NOT NULL,
        committed TINYINT NOT NULL,
        KEY at (at_ms)
    ) ENGINE=InnoDB";

pub const SQLITE_DDL: &str = "CREATE TABLE IF NOT EXISTS enqueue_batches (
        token INTEGER NOT NULL PRIMARY KEY,
        at_ms INTEGER NOT NULL,
        committed INTEGER NOT NULL
    );
    CREATE INDEX IF NOT EXISTS enqueue_batches_at ON enqueue_batches (at_ms);";

/// The mark an insert writes in its transaction (first, so that a tombstone meets it
/// before anything else of the batch).
pub fn mark(token: i64, now_ms: i64) -> String {
    format!("INSERT INTO enqueue_batches (token, at_ms, committed) VALUES ({token}, {now_ms}, 1)")
}

/// The tombstone: does nothing when the batch's mark is there.
pub fn tombstone(dialect: Dialect, token: i64, now_ms: i64) -> String {
    let ignore = match dialect {
        Dialect::MySql => "INSERT IGNORE",
        Dialect::Sqlite => "INSERT OR IGNORE",
    };
    format!("{ignore} INTO enqueue_batches (token, at_ms, committed) VALUES ({token}, {now_ms}, 0)")
}

/// Read after the tombstone: 1 when the batch committed, 0 when it did not.
pub fn read(token: i64) -> String {
    format!("SELECT committed FROM enqueue_batches WHERE token = {token}")
}

/// Deletes up to [`FORGET_CHUNK`] rows written before `before_ms`.
pub fn forget(dialect: Dialect, before_ms: i64) -> String {
    match dialect {
        Dialect::MySql => {
            format!("DELETE FROM enqueue_batches WHERE at_ms < {before_ms} LIMIT {FORGET_CHUNK}")
        }
        Dialect::Sqlite => format!(
            "DELETE FROM enqueue_batches WHERE token IN
             (SELECT token FROM enqueue_batches WHERE at_ms < {before_ms} LIMIT {FORGET_CHUNK})"
        ),
    }
}

/// A fresh token for an insert: random, positive (a signed BIGINT), never 0.
pub fn new_token() -> i64 {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    // std's `RandomState` draws its keys from the OS once per thread and steps them per
    // instance: a keyed SipHash of a process-wide counter, so never repeated in a process
    // and unpredictable across processes.
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let h = std::collections::hash_map::RandomState::new().hash_one(seq);
    ((h >> 1) as i64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_positive_and_distinct() {
        let tokens: std::collections::HashSet<i64> = (0..10_000).map(|_| new_token()).collect();
        assert_eq!(tokens.len(), 10_000);
        assert!(tokens.iter().all(|t| *t > 0));
    }

    #[test]
    fn a_tombstone_decides_against_a_late_insert_and_yields_to_an_earlier_one() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch(SQLITE_DDL).unwrap();
        let committed = |t: i64| -> i64 { conn.query_row(&read(t), [], |r| r.get(0)).unwrap() };
        // Committed first: the tombstone is ignored.
        conn.execute_batch(&mark(7, 1)).unwrap();
        conn.execute_batch(&tombstone(Dialect::Sqlite, 7, 2))
            .unwrap();
        assert_eq!(committed(7), 1);
        // The tombstone first: the late insert fails on it.
        conn.execute_batch(&tombstone(Dialect::Sqlite, 8, 2))
            .unwrap();
        assert!(conn.execute_batch(&mark(8, 3)).is_err());
        assert_eq!(committed(8), 0);
        // Forgotten by age.
        conn.execute_batch(&forget(Dialect::Sqlite, 2)).unwrap();
        let left: i64 = conn
            .query_row("SELECT COUNT(*) FROM enqueue_batches", [], |r| r.get(0))
            .unwrap();
        assert_eq!(left, 1);
    }
}
