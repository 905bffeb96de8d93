//! Enqueue batches' marks: how a shard learns, after the fact, whether an insert whose
//! outcome was lost (the connection broke at commit, the store did not answer in time)
//! committed.
//!
//! Every insert writes, in its own transaction, one row `(token, committed = 1)` of
//! `enqueue_marks` under a token drawn for it. To learn the outcome, the shard writes a
//! tombstone `(token, committed = 0)` with `INSERT IGNORE` and reads the row back:
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
//! transaction (a worker turn's group of requests), not per item, and no index but the
//! primary key: a token starts with the millisecond it was drawn at (see [`new_token`]),
//! so the old ones are a range of the key. (A first layout with a time column and an index
//! on it cost single-item enqueues about 15 % of their rate.)
//!
//! Forgetting is by the worker's clock, which can jump (an NTP step, a VM resumed): a mark
//! forgotten while its insert was still in doubt would read as "not committed". So every
//! forget first raises a watermark in `foqs_meta` ([`FORGOTTEN_BELOW`]), and a token below
//! it whose row is gone is answered [`BatchOutcome::Forgotten`] (unknown), never "not
//! committed".

use super::sql::Dialect;

/// How long marks and tombstones are kept (10 minutes).
pub const BATCH_MEMORY_MS: i64 = 600_000;

/// Rows deleted per background tick, at most.
pub const FORGET_CHUNK: u64 = 5_000;

/// The `foqs_meta` row holding the millisecond below which marks may have been forgotten.
pub const FORGOTTEN_BELOW: &str = "marks_forgotten_below_ms";

/// What a shard says of an insert whose outcome was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchOutcome {
    /// It committed.
    Committed,
    /// It did not, and never will (a tombstone holds its token).
    NotCommitted,
    /// Its mark is past the shard's memory: unknown.
    Forgotten,
}

/// The watermark's raise, before each forget (its value only grows).
pub fn raise_forgotten(dialect: Dialect, before_ms: i64) -> String {
    match dialect {
        Dialect::MySql => format!(
            "INSERT INTO foqs_meta (name, value) VALUES ('{FORGOTTEN_BELOW}', {before_ms})
             ON DUPLICATE KEY UPDATE value = GREATEST(value, VALUES(value))"
        ),
        Dialect::Sqlite => format!(
            "INSERT INTO foqs_meta (name, value) VALUES ('{FORGOTTEN_BELOW}', {before_ms})
             ON CONFLICT (name) DO UPDATE SET value = max(value, excluded.value)"
        ),
    }
}

/// Reads the watermark (no row: nothing forgotten yet).
pub fn read_forgotten() -> String {
    format!("SELECT value FROM foqs_meta WHERE name = '{FORGOTTEN_BELOW}'")
}

/// Whether `token` was drawn before the watermark `forgotten_below_ms`: its row, when
/// gone, may have been forgotten.
pub fn below(token: i64, forgotten_below_ms: Option<i64>) -> bool {
    forgotten_below_ms.is_some_and(|ms| token < first_token_at(ms))
}

/// The outcome from the row read back (`None`: no row, which only a token [`below`] the
/// watermark can meet, as no tombstone is written for those).
pub fn outcome(row: Option<i64>) -> BatchOutcome {
    match row {
        Some(1) => BatchOutcome::Committed,
        Some(_) => BatchOutcome::NotCommitted,
        None => BatchOutcome::Forgotten,
    }
}

pub const MYSQL_DDL: &str = "CREATE TABLE IF NOT EXISTS enqueue_marks (
        token BIGINT NOT NULL PRIMARY KEY,
        committed TINYINT NOT NULL
    ) ENGINE=InnoDB";

pub const SQLITE_DDL: &str = "CREATE TABLE IF NOT EXISTS enqueue_marks (
        token INTEGER NOT NULL PRIMARY KEY,
        committed INTEGER NOT NULL
    );";

/// The low bits of a token: a per-process sequence (from a random start). 42 bits of
/// milliseconds above them last until 2109.
const SEQ_BITS: u32 = 21;

/// The mark an insert writes in its transaction (first, so that a tombstone meets it
/// before anything else of the batch).
pub fn mark(token: i64) -> String {
    format!("INSERT INTO enqueue_marks (token, committed) VALUES ({token}, 1)")
}

/// The tombstone: does nothing when the batch's mark is there.
pub fn tombstone(dialect: Dialect, token: i64) -> String {
    let ignore = match dialect {
        Dialect::MySql => "INSERT IGNORE",
        Dialect::Sqlite => "INSERT OR IGNORE",
    };
    format!("{ignore} INTO enqueue_marks (token, committed) VALUES ({token}, 0)")
}

/// Read after the tombstone: 1 when the batch committed, 0 when it did not.
pub fn read(token: i64) -> String {
    format!("SELECT committed FROM enqueue_marks WHERE token = {token}")
}

/// Deletes up to [`FORGET_CHUNK`] rows of tokens drawn before `before_ms`.
pub fn forget(dialect: Dialect, before_ms: i64) -> String {
    forget_in(dialect, "enqueue_marks", before_ms)
}

/// Deletes up to [`FORGET_CHUNK`] rows of `table` (keyed by a token first) whose tokens
/// were drawn before `before_ms`: a range of its primary key.
pub(super) fn forget_in(dialect: Dialect, table: &str, before_ms: i64) -> String {
    let below = first_token_at(before_ms);
    match dialect {
        Dialect::MySql => {
            format!("DELETE FROM {table} WHERE token < {below} LIMIT {FORGET_CHUNK}")
        }
        Dialect::Sqlite => format!(
            "DELETE FROM {table} WHERE rowid IN
             (SELECT rowid FROM {table} WHERE token < {below} LIMIT {FORGET_CHUNK})"
        ),
    }
}

/// The smallest token drawn at `ms`.
pub(super) fn first_token_at(ms: i64) -> i64 {
    ms.max(0) << SEQ_BITS
}

/// A fresh token for an insert at `now_ms`: the millisecond in the high bits, a sequence
/// of this process's below (from a random start, so that two processes writing one shard
/// in turn, across a hand-over, meet in the same millisecond with the same bits once in 2
/// million). Unique within the process while it draws fewer than 2 million a millisecond:
/// random bits alone had two groups of one turn (drawn in the same millisecond) share a
/// token once in 4 million pairs, and the second's mark failed as a duplicate.
pub fn new_token(now_ms: i64) -> i64 {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::LazyLock;
    static START: LazyLock<u64> =
        LazyLock::new(|| std::collections::hash_map::RandomState::new().hash_one(0u8));
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = START.wrapping_add(SEQ.fetch_add(1, Ordering::Relaxed));
    let low = (seq & ((1 << SEQ_BITS) - 1)) as i64;
    (first_token_at(now_ms) | low).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_positive_and_ordered_by_their_millisecond() {
        let now = 1_796_500_000_000;
        let tokens: std::collections::HashSet<i64> =
            (0..1_000).map(|i| new_token(now + i % 3)).collect();
        assert_eq!(tokens.len(), 1_000, "unique within a millisecond too");
        assert!(tokens.iter().all(|t| *t > 0));
        assert!(new_token(now) < first_token_at(now + 1));
        assert!(new_token(now) >= first_token_at(now));
        assert!(new_token(0) > 0);
    }

    #[test]
    fn a_tombstone_decides_against_a_late_insert_and_yields_to_an_earlier_one() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch(SQLITE_DDL).unwrap();
        let committed = |t: i64| -> i64 { conn.query_row(&read(t), [], |r| r.get(0)).unwrap() };
        let now = 1_796_500_000_000;
        let (early, late) = (new_token(now), new_token(now + 1));
        // Committed first: the tombstone is ignored.
        conn.execute_batch(&mark(early)).unwrap();
        conn.execute_batch(&tombstone(Dialect::Sqlite, early))
            .unwrap();
        assert_eq!(committed(early), 1);
        // The tombstone first: the late insert fails on it.
        conn.execute_batch(&tombstone(Dialect::Sqlite, late))
            .unwrap();
        assert!(conn.execute_batch(&mark(late)).is_err());
        assert_eq!(committed(late), 0);
        // Forgotten by age.
        conn.execute_batch(&forget(Dialect::Sqlite, now + 1))
            .unwrap();
        let left: i64 = conn
            .query_row("SELECT COUNT(*) FROM enqueue_marks", [], |r| r.get(0))
            .unwrap();
        assert_eq!(left, 1);
    }
}
