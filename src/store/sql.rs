//! The SQL text both SQL stores send for writes whose shape varies with their input:
//! multi-row INSERTs, grouped state changes, id lists, and the timer of every row they
//! change. Built as text (ids and times are integers, bytes are hex literals, which MySQL
//! and SQLite both read), so they need no prepare round trip and no escaping, and no
//! statement here holds a `;` or a `?` (MySQL sends a transaction's statements as one
//! text, see `MySqlStore::run_all`). Both stores have the same layout (schema version 2),
//! so the same statements serve both; where the dialects differ, [`Dialect`] says.

use std::fmt::Write;
use std::sync::Mutex;

use super::topics::TopicIds;
use super::{next_event, Change, Handoff, ItemMeta, Settle};
use crate::model::{ItemState, NewItem, TopicName, Totals};

mod apply;
pub use apply::apply_statements;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    MySql,
    Sqlite,
}

impl Dialect {
    /// How a row with no next event spells its timer. SQLite: NULL, which its partial
    /// `timer` index leaves out. MySQL: 0, which no scan reaches (every real timer is at
    /// least `now + 1`). InnoDB keeps NULL keys in the index too, and moving a row's entry
    /// away from NULL (a claim of a ready row) cost it 30 µs a row against 15 µs from 0
    /// (`scripts/bench-claim.sh`, claim with the timer move only). Rows written before
    /// may hold NULL; both mean none (`MySqlStore` reads 0 as none).
    pub fn no_event(self) -> &'static str {
        match self {
            Dialect::MySql => "0",
            Dialect::Sqlite => "NULL",
        }
    }
}

/// One statement, its values in its text (binary ones as hex literals, which both
/// dialects read): run in MySQL's text protocol, one round trip, where a bound blob made
/// each a prepare, an execute and a close, and most are used once.
pub type Statement = String;

/// The columns of a row as inserted, in the order `insert_items` writes them.
pub const INSERT_COLUMNS: &str = "(id, tid, priority, state, deliver_after_ms, next_event_ms, enqueued_at_ms, lease_ms, expires_at_ms, policy, max_attempts, has_dedup, lease_token, delivery_count, lease_expires_ms, payload, metadata)";

/// `1,2,3` for an `IN (...)` list; callers never pass an empty slice.
pub fn key_list(keys: &[u64]) -> String {
    let mut s = String::with_capacity(keys.len() * 8);
    for (i, k) in keys.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{k}");
    }
    s
}

/// Appends `bytes` as a hex literal (`X'...'`): binary-safe, nothing to escape.
pub fn push_hex(sql: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    sql.push_str("X'");
    for b in bytes {
        sql.push(HEX[(b >> 4) as usize] as char);
        sql.push(HEX[(b & 15) as usize] as char);
    }
    sql.push('\'');
}

fn opt(v: Option<i64>) -> String {
    v.map_or_else(|| "NULL".to_string(), |t| t.to_string())
}

/// A row's timer as [`next_event`] spells it in `dialect` (see [`Dialect::no_event`]).
fn timer_value(dialect: Dialect, timer: Option<i64>) -> String {
    timer.map_or_else(|| dialect.no_event().to_string(), |t| t.to_string())
}

/// A row's timer when its TTL is its only event (ready, dead): the TTL, never before
/// `now + 1` (see [`next_event`]); no event without a TTL.
pub fn ttl_timer(dialect: Dialect, now: i64) -> String {
    let floor = (now + 1).to_string();
    format!(
        "CASE WHEN expires_at_ms IS NULL THEN {} ELSE {} END",
        dialect.no_event(),
        ttl_timer_from(&floor)
    )
}

/// The TTL of a row that has one, never before `floor` (`now + 1`, spelled by the
/// caller).
fn ttl_timer_from(floor: &str) -> String {
    format!("CASE WHEN expires_at_ms < {floor} THEN {floor} ELSE expires_at_ms END")
}

/// A row's timer when `event` (SQL) is its own next event: the earlier of that and its
/// TTL, never before `now + 1`. Reads only `expires_at_ms`, which nothing changes, so it
/// means the same whether the dialect evaluates `SET` with old or new values.
pub fn timer_at(event: &str, now: i64) -> String {
    timer_at_from(event, &(now + 1).to_string())
}

/// [`timer_at`] with its floor (`now + 1`) spelled by the caller.
fn timer_at_from(event: &str, floor: &str) -> String {
    format!(
        "CASE WHEN expires_at_ms < {event} THEN ({}) WHEN {event} < {floor} THEN {floor} ELSE {event} END",
        ttl_timer_from(floor)
    )
}

/// One multi-row INSERT of items; `tids[i]` is the topic id of `rows[i]`; timers as of
/// `now` (the worker's clock at the write, not the enqueue's). The rows `handoff` holds
/// are written as a claim at `now` leaves them: leased under its token, delivered once.
/// The most bytes one INSERT of items is built to (about): under MySQL 5.7's default
/// `max_allowed_packet` (4 MiB), let alone MariaDB's (16 MiB).
pub const STATEMENT_BYTES_MAX: usize = 2 << 20;

/// About how many bytes a row takes in an INSERT (its blobs as hex literals).
fn row_sql_bytes(it: &NewItem) -> usize {
    2 * (it.payload.len() + it.metadata.len()) + it.dedup_key.as_ref().map_or(0, String::len) + 160
}

/// `rows` cut into consecutive ranges of at most `max` bytes of SQL each (a row larger
/// than `max` alone in its range).
pub fn byte_chunks(rows: &[(u64, NewItem)], max: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, (_, it)) in rows.iter().enumerate() {
        let b = row_sql_bytes(it);
        if i > start && bytes + b > max {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += b;
    }
    if start < rows.len() {
        out.push(start..rows.len());
    }
    out
}

pub fn insert_items(
    dialect: Dialect,
    rows: &[(u64, NewItem)],
    tids: &[u32],
    handoff: &Handoff,
    now: i64,
) -> String {
    let bytes: usize = rows.iter().map(|(_, it)| row_sql_bytes(it)).sum();
    let mut sql = String::with_capacity(128 + bytes);
    sql.push_str("INSERT INTO items ");
    sql.push_str(INSERT_COLUMNS);
    sql.push_str(" VALUES ");
    for (i, ((key, it), tid)) in rows.iter().zip(tids).enumerate() {
        if i > 0 {
            sql.push(',');
        }
        let (state, token, deliveries, lease_end) = if handoff.holds(*key) {
            (ItemState::Leased, handoff.token, 1, now + it.lease_ms)
        } else {
            (ItemState::Ready, 0, 0, 0)
        };
        let timer = next_event(state, it.deliver_after_ms, lease_end, it.expires_at_ms, now);
        let _ = write!(
            sql,
            "({key},{tid},{},{},{},{},{},{},{},{},{},{},{token},{deliveries},{lease_end},",
            it.priority,
            state as i8,
            it.deliver_after_ms,
            timer_value(dialect, timer),
            it.enqueued_at_ms,
            it.lease_ms,
            opt(it.expires_at_ms),
            it.policy as i8,
            it.max_attempts,
            it.dedup_key.is_some() as u8,
        );
        push_hex(&mut sql, &it.payload);
        sql.push(',');
        push_hex(&mut sql, &it.metadata);
        sql.push(')');
    }
    sql
}

/// `(tid,ns,topic` of a `topics` row, the parenthesis left open.
fn push_topic(sql: &mut String, tid: u32, ns: &str, topic: &str) {
    let _ = write!(sql, "({tid},");
    push_hex(sql, ns.as_bytes());
    sql.push(',');
    push_hex(sql, topic.as_bytes());
}

/// Writes the `topics` rows of new topic ids, leaving existing ones alone.
pub fn insert_topics(dialect: Dialect, topics: &[(u32, &str, &str)]) -> String {
    let mut sql = String::from(match dialect {
        Dialect::MySql => "INSERT IGNORE INTO topics (tid, ns, topic) VALUES ",
        Dialect::Sqlite => "INSERT OR IGNORE INTO topics (tid, ns, topic) VALUES ",
    });
    for (i, (tid, ns, topic)) in topics.iter().enumerate() {
        if i > 0 {
            sql.push(',');
        }
        push_topic(&mut sql, *tid, ns, topic);
        sql.push(')');
    }
    sql
}

/// Records the dedup keys of new items: (topic id, key, item). A key whose item is gone
/// may still have its row (the MySQL ack removes it in a second statement); the new item
/// takes it over. A row whose item still lives is kept (a lookup and an insert of the
/// same key that raced past each other, after an insert whose outcome was unknown): the
/// key keeps answering with the older item.
pub fn upsert_dedup(dialect: Dialect, keys: &[(u32, &str, u64)]) -> String {
    let mut sql = String::from("INSERT INTO dedup (tid, dedup_key, id) VALUES ");
    for (i, (tid, key, id)) in keys.iter().enumerate() {
        if i > 0 {
            sql.push(',');
        }
        let _ = write!(sql, "({tid},");
        push_hex(&mut sql, key.as_bytes());
        let _ = write!(sql, ",{id})");
    }
    sql.push_str(match dialect {
        Dialect::MySql => {
            " ON DUPLICATE KEY UPDATE id = IF(EXISTS (SELECT 1 FROM items i WHERE i.id = dedup.id), dedup.id, VALUES(id))"
        }
        Dialect::Sqlite => {
            " ON CONFLICT (tid, dedup_key) DO UPDATE SET id = excluded.id
               WHERE NOT EXISTS (SELECT 1 FROM items i WHERE i.id = dedup.id)"
        }
    });
    sql
}

/// The live items among `keys` in topic `tid`: `(dedup_key, id)` rows. The keys are in
/// the text as hex literals (one round trip on MySQL, where a prepared statement would
/// be a prepare, an execute and a close per number of keys). A key's row may outlive its
/// item (see [`upsert_dedup`]): only a live item counts.
pub fn dedup_lookup(tid: u32, keys: &[&str]) -> String {
    let mut sql = format!(
        "SELECT d.dedup_key, d.id FROM dedup d JOIN items i ON i.id = d.id
         WHERE d.tid = {tid} AND d.dedup_key IN ("
    );
    for (i, k) in keys.iter().enumerate() {
        if i > 0 {
            sql.push(',');
        }
        push_hex(&mut sql, k.as_bytes());
    }
    sql.push(')');
    sql
}

/// Adds to the saved totals of topics (their `topics` rows, written when missing).
pub fn add_totals(dialect: Dialect, rows: &[(u32, &str, &str, [i64; 5])]) -> String {
    let mut sql = String::from(
        "INSERT INTO topics (tid, ns, topic, enqueued, delivered, acked, nacked, expired) VALUES ",
    );
    for (i, (tid, ns, topic, d)) in rows.iter().enumerate() {
        if i > 0 {
            sql.push(',');
        }
        push_topic(&mut sql, *tid, ns, topic);
        let _ = write!(sql, ",{},{},{},{},{})", d[0], d[1], d[2], d[3], d[4]);
    }
    sql.push_str(match dialect {
        Dialect::MySql => {
            " ON DUPLICATE KEY UPDATE enqueued = enqueued + VALUES(enqueued), delivered = delivered + VALUES(delivered),
               acked = acked + VALUES(acked), nacked = nacked + VALUES(nacked), expired = expired + VALUES(expired)"
        }
        Dialect::Sqlite => {
            " ON CONFLICT (tid) DO UPDATE SET enqueued = enqueued + excluded.enqueued, delivered = delivered + excluded.delivered,
               acked = acked + excluded.acked, nacked = nacked + excluded.nacked, expired = expired + excluded.expired"
        }
    });
    sql
}

/// Leases the still-ready, due, unexpired rows among `keys` under `token`.
pub fn claim(keys: &[u64], now: i64, token: i64) -> String {
    claim_spelled(&ClaimValues {
        keys: &format!("({})", key_list(keys)),
        now: &now.to_string(),
        token: &token.to_string(),
    })
}

/// How a claim spells its values: literals, or a dialect's bound parameters (so that
/// one prepared statement serves every claim, whatever its keys and time).
pub struct ClaimValues<'a> {
    /// The right side of `id IN`: `(1,2,3)`, or a table-valued parameter.
    pub keys: &'a str,
    pub now: &'a str,
    pub token: &'a str,
}

/// [`claim`] with its values spelled by the caller.
pub fn claim_spelled(v: &ClaimValues) -> String {
    let ClaimValues { keys, now, token } = v;
    format!(
        "UPDATE items SET state = 1, lease_token = {token}, delivery_count = delivery_count + 1,
           lease_expires_ms = {now} + lease_ms, next_event_ms = {}
         WHERE id IN {keys} AND state = 0 AND deliver_after_ms <= {now}
           AND (expires_at_ms IS NULL OR expires_at_ms > {now})",
        timer_at_from(&format!("({now} + lease_ms)"), &format!("({now} + 1)")),
    )
}

/// After deleting items (with whether each had a dedup key): the statement that deletes
/// the dedup rows of the keyed ones, if any. Only keyed items have one; a crash before it
/// runs leaves a row that no lookup counts (its item is gone), and the next item with the
/// key takes it over.
pub fn delete_dedup_of(deleted: &[(ItemMeta, bool)]) -> Option<String> {
    let keyed: Vec<u64> = deleted
        .iter()
        .filter(|(_, keyed)| *keyed)
        .map(|(m, _)| m.key)
        .collect();
    (!keyed.is_empty()).then(|| format!("DELETE FROM dedup WHERE id IN ({})", key_list(&keyed)))
}

/// `(priority, deliver_after_ms, id) > after`, spelled out so that the planner reads it as
/// a range of the `ready_order` index; empty without `after`.
pub fn after_ready(after: Option<crate::model::ReadyKey>) -> String {
    match after {
        None => String::new(),
        Some(k) => format!(
            " AND (priority > {p} OR (priority = {p} AND (deliver_after_ms > {d} OR (deliver_after_ms = {d} AND id > {id}))))",
            p = k.priority,
            d = k.deliver_after_ms,
            id = k.key
        ),
    }
}

/// The timer scan's range: rows after the cursor (`u64::MAX`: the whole millisecond is
/// done) up to `now`, in index order.
pub fn timer_range(after: (i64, u64), now: i64) -> String {
    let (ms, key) = after;
    // A cursor at or before 0 (a rewind with a clock near 0) starts after 0: MySQL's rows
    // with no event hold 0 (see `Dialect::no_event`), and no real timer is below 1.
    let from = if key == u64::MAX || ms <= 0 {
        let ms = ms.max(0);
        format!("next_event_ms > {ms}")
    } else {
        format!("(next_event_ms > {ms} OR (next_event_ms = {ms} AND id > {key}))")
    };
    format!("{from} AND next_event_ms <= {now} ORDER BY next_event_ms, id")
}

/// What an insert batch writes besides its rows: the `topics` rows of topics new to the
/// shard (in the same transaction, see `TopicIds`) and the dedup keys.
pub struct InsertPlan {
    tids: Vec<u32>,
    new_topics: Vec<u32>,
}

impl InsertPlan {
    pub fn new(topics: &Mutex<TopicIds>, rows: &[(u64, NewItem)]) -> InsertPlan {
        let mut map = topics.lock().expect("topics");
        let mut tids = Vec::with_capacity(rows.len());
        let mut new_topics = Vec::new();
        for (_, it) in rows {
            let (tid, new) = map.assign(&it.ns, &it.topic);
            if new && !new_topics.contains(&tid) {
                new_topics.push(tid);
            }
            tids.push(tid);
        }
        InsertPlan { tids, new_topics }
    }

    /// Everything the batch writes, in one transaction: the key high-water mark when
    /// given, new topics' rows, the items, their dedup keys. (The stores put the batch's
    /// mark first, see `batches`.)
    pub fn statements(
        &self,
        dialect: Dialect,
        rows: &[(u64, NewItem)],
        key_high_water: Option<u64>,
        handoff: &Handoff,
        now: i64,
    ) -> Vec<Statement> {
        let mut out = Vec::new();
        if let Some(hwm) = key_high_water {
            let keep_larger = match dialect {
                Dialect::MySql => "ON DUPLICATE KEY UPDATE value = GREATEST(value, VALUES(value))",
                Dialect::Sqlite => {
                    "ON CONFLICT (name) DO UPDATE SET value = max(value, excluded.value)"
                }
            };
            out.push(format!(
                "INSERT INTO foqs_meta (name, value) VALUES ('key_high_water', {hwm}) {keep_larger}"
            ));
        }
        if !self.new_topics.is_empty() {
            let mut names: Vec<(u32, &str, &str)> = Vec::new();
            for ((_, it), tid) in rows.iter().zip(&self.tids) {
                if self.new_topics.contains(tid) && !names.iter().any(|(t, _, _)| t == tid) {
                    names.push((*tid, &it.ns, &it.topic));
                }
            }
            out.push(insert_topics(dialect, &names));
        }
        // In statements of at most STATEMENT_BYTES_MAX, all in the batch's transaction: a
        // request of 1,000 items of 10 KiB as one statement was past MariaDB's default
        // max_allowed_packet (16 MiB), and the whole enqueue failed.
        for range in byte_chunks(rows, STATEMENT_BYTES_MAX) {
            out.push(insert_items(
                dialect,
                &rows[range.clone()],
                &self.tids[range],
                handoff,
                now,
            ));
        }
        let keyed: Vec<(u32, &str, u64)> = rows
            .iter()
            .zip(&self.tids)
            .filter_map(|((key, it), tid)| it.dedup_key.as_deref().map(|d| (*tid, d, *key)))
            .collect();
        if !keyed.is_empty() {
            out.push(upsert_dedup(dialect, &keyed));
        }
        out
    }

    /// The batch committed: its new topics' rows exist.
    pub fn committed(&self, topics: &Mutex<TopicIds>) {
        if !self.new_topics.is_empty() {
            topics.lock().expect("topics").confirm(&self.new_topics);
        }
    }
}

/// The statement that adds `deltas` to the topics' saved totals, and the topic ids it
/// writes (confirmed once it commits).
pub fn totals_sql(
    dialect: Dialect,
    topics: &Mutex<TopicIds>,
    deltas: &[(TopicName, Totals)],
) -> (String, Vec<u32>) {
    let mut map = topics.lock().expect("topics");
    let rows: Vec<(u32, &str, &str, [i64; 5])> = deltas
        .iter()
        .map(|(t, d)| {
            let (tid, _) = map.assign(&t.ns, &t.topic);
            (
                tid,
                t.ns.as_str(),
                t.topic.as_str(),
                [d.enqueued, d.delivered, d.acked, d.nacked, d.expired],
            )
        })
        .collect();
    let tids = rows.iter().map(|r| r.0).collect();
    (add_totals(dialect, &rows), tids)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: u64, payload: usize) -> (u64, NewItem) {
        (
            key,
            NewItem {
                ns: "n".into(),
                topic: "t".into(),
                priority: 0,
                payload: vec![7; payload],
                metadata: Vec::new(),
                deliver_after_ms: 0,
                enqueued_at_ms: 0,
                lease_ms: 1000,
                expires_at_ms: None,
                policy: crate::model::Policy::AtLeastOnce,
                max_attempts: 1,
                dedup_key: None,
            },
        )
    }

    #[test]
    fn a_batch_is_cut_into_statements_of_bounded_size_in_order() {
        let rows: Vec<_> = (0..1000).map(|k| row(k, 10_240)).collect();
        let chunks = byte_chunks(&rows, STATEMENT_BYTES_MAX);
        assert!(chunks.len() > 1);
        assert_eq!(chunks.first().unwrap().start, 0);
        assert_eq!(chunks.last().unwrap().end, 1000);
        assert!(chunks.windows(2).all(|w| w[0].end == w[1].start));
        let sql = insert_items(
            Dialect::MySql,
            &rows[chunks[0].clone()],
            &vec![1; chunks[0].len()],
            &Handoff::default(),
            0,
        );
        assert!(sql.len() <= STATEMENT_BYTES_MAX, "{} bytes", sql.len());
        // A row larger than the bound goes alone; small rows share one statement.
        assert_eq!(
            byte_chunks(&[row(1, 100), row(2, 100)], 10),
            vec![0..1, 1..2]
        );
        assert_eq!(byte_chunks(&[row(1, 100), row(2, 100)], 10_000), vec![0..2]);
        assert!(byte_chunks(&[], 10).is_empty());
    }
}
