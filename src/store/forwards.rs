//! Forwarded requests' marks: how a host that forwarded an enqueue to a peer learns, after
//! the peer died or went silent mid-call, what the peer stored.
//!
//! The forwarding host draws a token for the request and sends it along
//! (`EnqueueRequest.forward_token`). The peer's shard worker writes, in the transaction
//! that inserts the items, one row `(token, position, key, dup, committed = 1)` of
//! `forward_marks` per item of the request it stored (`position`: the item's place in the
//! forwarded request). To learn the outcome, the forwarding host asks every shard of the
//! tier (through whichever host serves it now): each writes a tombstone
//! `(token, position, committed = 0)` for every position with `INSERT IGNORE`, then reads
//! back the positions marked committed. As with `batches`, the tombstone decides the race
//! for good: a late insert (a frozen host resumed) fails on it as a duplicate, rolling
//! back its items, and an insert still holding a position's key makes the tombstone wait
//! for its end.
//!
//! A row per item, not per request: a request's items may be written by several shards
//! (dedup keys), each of which knows only its own, and the positions are what the
//! tombstone must cover. Forwarded enqueues are the exception path (misrouted or
//! overflowing ones), so the extra rows cost the common path nothing.
//!
//! Rows are forgotten with the batch marks, under the same watermark (see
//! `batches::FORGOTTEN_BELOW`): a token below it is not tombstoned, and its missing
//! positions are unknown.

use super::batches;
use super::sql::Dialect;

/// One item of a forwarded request, as written with its insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardMark {
    pub token: i64,
    /// Its place in the forwarded request.
    pub position: u32,
    /// The item's key on this shard (an existing item's, for a dedup hit).
    pub key: u64,
    /// A dedup hit: the key is that of an item written before.
    pub dup: bool,
}

/// What an insert marks itself with, in its own transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marks {
    /// The insert's batch token (see `batches`); 0: none.
    pub batch: i64,
    /// The items of forwarded requests it stores.
    pub forwarded: Vec<ForwardMark>,
}

impl Marks {
    /// Only a batch mark (0: none).
    pub fn batch(batch: i64) -> Marks {
        Marks {
            batch,
            forwarded: Vec::new(),
        }
    }

    /// The statements that write the marks, first in the insert's transaction (so that a
    /// tombstone meets them before anything else of it).
    pub fn statements(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.batch != 0 {
            out.push(batches::mark(self.batch));
        }
        if !self.forwarded.is_empty() {
            let rows: Vec<String> = self
                .forwarded
                .iter()
                .map(|m| {
                    format!(
                        "({}, {}, {}, {}, 1)",
                        m.token, m.position, m.key, m.dup as u8
                    )
                })
                .collect();
            out.push(format!(
                "INSERT INTO forward_marks (token, position, item_key, dup, committed) VALUES {}",
                rows.join(", ")
            ));
        }
        out
    }
}

/// What a shard says of a forwarded request's token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardOutcome {
    /// The positions it stored: (position, key, dup).
    pub stored: Vec<(u32, u64, bool)>,
    /// The token is past the shard's memory: the positions not listed are unknown (else
    /// they were not stored here, and never will be).
    pub forgotten: bool,
}

pub const MYSQL_DDL: &str = "CREATE TABLE IF NOT EXISTS forward_marks (
        token BIGINT NOT NULL,
        position INT NOT NULL,
        item_key BIGINT UNSIGNED NOT NULL,
        dup TINYINT NOT NULL,
        committed TINYINT NOT NULL,
        PRIMARY KEY (token, position)
    ) ENGINE=InnoDB";

pub const SQLITE_DDL: &str = "CREATE TABLE IF NOT EXISTS forward_marks (
        token INTEGER NOT NULL,
        position INTEGER NOT NULL,
        item_key INTEGER NOT NULL,
        dup INTEGER NOT NULL,
        committed INTEGER NOT NULL,
        PRIMARY KEY (token, position)
    );";

/// Whether `token` is too old, by the shard's clock at `now_ms`, to be decided here: past
/// half the marks' memory. The token was drawn by another host's clock; were that clock
/// far behind this one, the forget could delete the token's marks between the watermark's
/// read and the tombstones, and "nothing stored" would be wrong. Such a token is answered
/// `forgotten` (unknown). Resolutions ask within seconds of the call, so only a clock
/// minutes off meets this.
pub fn too_old(token: i64, now_ms: i64) -> bool {
    token < batches::first_token_at(now_ms - batches::BATCH_MEMORY_MS / 2)
}

/// How far ahead of this host's clock a peer's token may be: clocks differ by far less,
/// and a token further ahead would keep its marks (and the rows they hold) past the
/// marks' memory.
pub const TOKEN_AHEAD_MS_MAX: i64 = 60_000;

/// Whether `token` was drawn more than [`TOKEN_AHEAD_MS_MAX`] ahead of `now_ms`: refused.
pub fn from_the_future(token: i64, now_ms: i64) -> bool {
    token >= batches::first_token_at(now_ms.saturating_add(TOKEN_AHEAD_MS_MAX))
}

/// Most positions a request can have (the API's batch bound, with room).
pub const POSITIONS_MAX: u32 = 10_000;

/// The tombstones of every position of a request of `items` items.
pub fn tombstone(dialect: Dialect, token: i64, items: u32) -> String {
    let ignore = match dialect {
        Dialect::MySql => "INSERT IGNORE",
        Dialect::Sqlite => "INSERT OR IGNORE",
    };
    let rows: Vec<String> = (0..items.clamp(1, POSITIONS_MAX))
        .map(|p| format!("({token}, {p}, 0, 0, 0)"))
        .collect();
    format!(
        "{ignore} INTO forward_marks (token, position, item_key, dup, committed) VALUES {}",
        rows.join(", ")
    )
}

/// Read after the tombstones: the positions stored, as (position, key, dup).
pub fn read(token: i64) -> String {
    format!(
        "SELECT position, item_key, dup FROM forward_marks WHERE token = {token} AND committed = 1 ORDER BY position"
    )
}

/// Deletes up to [`batches::FORGET_CHUNK`] rows of tokens drawn before `before_ms` (after
/// the watermark's raise, as for the batch marks).
pub fn forget(dialect: Dialect, before_ms: i64) -> String {
    batches::forget_in(dialect, "forward_marks", before_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(conn: &rusqlite::Connection, token: i64) -> Vec<(u32, u64, bool)> {
        let mut st = conn.prepare(&read(token)).unwrap();
        st.query_map([], |r| {
            Ok((
                r.get::<_, u32>(0)?,
                r.get::<_, i64>(1)? as u64,
                r.get::<_, i64>(2)? != 0,
            ))
        })
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
    }

    #[test]
    fn tombstones_keep_what_was_stored_and_refuse_what_comes_late() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch(SQLITE_DDL).unwrap();
        let now = 1_796_500_000_000;
        let (early, late) = (batches::new_token(now), batches::new_token(now + 1));
        let marks = |token: i64, positions: &[u32]| Marks {
            batch: 0,
            forwarded: positions
                .iter()
                .map(|&p| ForwardMark {
                    token,
                    position: p,
                    key: 100 + p as u64,
                    dup: p == 2,
                })
                .collect(),
        };
        // Positions 0 and 2 of three stored here (1 went to another shard).
        for s in marks(early, &[0, 2]).statements() {
            conn.execute_batch(&s).unwrap();
        }
        conn.execute_batch(&tombstone(Dialect::Sqlite, early, 3))
            .unwrap();
        assert_eq!(stored(&conn, early), vec![(0, 100, false), (2, 102, true)]);
        // Asked first: a late insert of any position fails on its tombstone.
        conn.execute_batch(&tombstone(Dialect::Sqlite, late, 2))
            .unwrap();
        for s in marks(late, &[1]).statements() {
            assert!(conn.execute_batch(&s).is_err(), "a late insert must fail");
        }
        assert!(stored(&conn, late).is_empty());
        // Forgotten by age, with the batch marks.
        conn.execute_batch(&forget(Dialect::Sqlite, now + 1))
            .unwrap();
        let left: i64 = conn
            .query_row("SELECT COUNT(*) FROM forward_marks", [], |r| r.get(0))
            .unwrap();
        assert_eq!(left, 2, "the later token's two tombstones");
    }

    #[test]
    fn only_what_there_is_is_written() {
        assert!(Marks::batch(0).statements().is_empty());
        assert_eq!(Marks::batch(7).statements(), vec![batches::mark(7)]);
    }
}
