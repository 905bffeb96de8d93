//! [`MySqlStore`]: a shard as one MySQL/MariaDB database, through a `mysql_async` pool.
//!
//! Schema facts that matter:
//! - `ns` and `topic` are `VARBINARY`, so they compare as exact bytes (`Orders`, `orders`
//!   and `ordérs` are three topics) whatever the server's default collation.
//! - The layout is schema version 2 (see `schema.rs`): rows carry a topic id, one timer
//!   index serves every background event, dedup keys live in a side table.
//! - Keys are chosen by the shard worker, not `AUTO_INCREMENT`: the worker must know a
//!   batch's keys to index it, and a persisted high-water mark guarantees that a key is
//!   never reused, even after its row was deleted and the host restarted.
//! - Every time is a `BIGINT` of milliseconds passed in by the caller.
//! - Claiming a row changes two index entries: `ready_order` (its state) and `timer` (its
//!   lease end); everything else a claim writes is in the clustered row.
//! - A write that is one statement runs in autocommit: an explicit transaction would add
//!   two round trips for nothing.
//! - Lists of keys are spliced into the SQL text as integers: they are `u64`s, so there is
//!   nothing to escape, and a prepared statement per list length would churn the cache.

use mysql_async::prelude::*;
use mysql_async::{Conn, TxOpts};

mod build;
mod counts;
mod errors;
mod open;
mod owner;
mod rows;
mod schema;
mod target;
mod tls;

pub use owner::OnLost;
use owner::OwnerLock;
use rows::column;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use target::connecting;
use target::Target;
pub use tls::{with_tls, MysqlTls};

use super::batches::{self, BatchOutcome};
use super::forwards::{self, ForwardOutcome, Marks};
use super::sql::{self as text, key_list, totals_sql, Dialect, InsertPlan, Statement};
use super::topics::{forget_sql, kept_sql, TopicIds};
use super::{
    Change, Claimed, Handoff, ItemMeta, Recovered, Retarget, ShardStore, StateCount, StoreError,
    StoreResult,
};
use crate::model::{Item, NewItem, ReadyKey, ShardId, TopicCounts, TopicName, Totals};

const ITEM_COLUMNS: &str = "id, tid, priority, payload, metadata, deliver_after_ms, enqueued_at_ms, delivery_count, lease_expires_ms, policy, expires_at_ms, lease_token, lease_ms";
const META_COLUMNS: &str = "id, tid, priority, deliver_after_ms, state, delivery_count, max_attempts, policy, lease_expires_ms, expires_at_ms, lease_token, next_event_ms, has_dedup, settled_token";
/// Every column of `items` at this schema version, to check a table at open.
const PROBE_COLUMNS: &str = "id, tid, priority, state, deliver_after_ms, next_event_ms, died_at_ms, enqueued_at_ms, lease_ms, lease_expires_ms, lease_token, expires_at_ms, policy, max_attempts, delivery_count, has_dedup, payload, metadata, settled_token";

pub struct MySqlStore {
    shard: ShardId,
    /// The server and its pool; replaced whole when the store moves to another server of
    /// its replica set (see [`ShardStore::retarget`]).
    target: std::sync::RwLock<Arc<Target>>,
    pool_connections_max: usize,
    /// The statement bound set by [`Self::with_statement_timeout`], kept for a move.
    statement_timeout_ms: Option<u64>,
    database: String,
    /// MariaDB has `DELETE ... RETURNING`, which makes an ack one statement; MySQL needs
    /// a lookup first. Known after `open`.
    returning: AtomicBool,
    /// Take the shard's owner lock at open (see `owner.rs`); called when it is lost.
    owner_lock: Option<OnLost>,
    /// Closed (false) for good once the owner lock is lost: every operation checks it.
    owned: Arc<AtomicBool>,
    lock: tokio::sync::Mutex<Option<OwnerLock>>,
    /// Bounds the owner lock's checks, as every other operation is bounded.
    check_timeout: std::time::Duration,
    /// Bounds a connect or a wait for a pooled connection (see [`within`]).
    connect_timeout: std::time::Duration,
    topics: Mutex<TopicIds>,
}

impl MySqlStore {
    pub fn database(&self) -> &str {
        &self.database
    }

    /// Closes the store for good: releases the owner lock (as `ShardStore::close` does)
    /// and disconnects the pool's connections. (Named apart from the trait's `close`,
    /// which it used to shadow, skipping the lock's release.)
    pub async fn disconnect(self) {
        ShardStore::close(&self).await;
        let pool = self.target().pool.clone();
        let _ = pool.disconnect().await;
    }

    async fn conn(&self) -> StoreResult<Conn> {
        if !self.owned.load(Ordering::SeqCst) {
            return Err(StoreError::Fenced);
        }
        let t = self.target();
        connecting(self.connect_timeout, &t.shard_opts, t.pool.get_conn()).await
    }

    /// A connection without the statement bound, for what may rightly take long and has
    /// no timeout of its own: the schema work and the full count at open. (Its reset puts the
    /// bound back when the connection returns.)
    async fn unbounded_conn(&self) -> StoreResult<Conn> {
        let mut conn = self.conn().await?;
        conn.query_drop("SET @foqs_session = 1 /*M! , SESSION max_statement_time = 0 */")
            .await?;
        // The pool does not reset connections: this one must not go back unbounded.
        conn.reset_connection(true);
        Ok(conn)
    }

    fn tid(&self, ns: &str, topic: &str) -> Option<u32> {
        self.topics.lock().expect("topics").get(ns, topic)
    }

    /// Runs `statements` in one transaction (one alone in autocommit): `START
    /// TRANSACTION` and the statements as one multi-statement text, then `COMMIT` alone.
    /// Two round trips, where `BEGIN`, each statement and `COMMIT` apart took one each (an
    /// insert with its batch mark took four, and single-item enqueues lost 38 % of their
    /// rate). `COMMIT` stays apart so that a caller that gave up before sending it (its
    /// timeout dropped the connection) leaves nothing to commit late: the server rolls back
    /// when the connection goes. The statements' values are integers and hex literals, so
    /// `;` never occurs inside one.
    async fn run_all(&self, statements: Vec<Statement>) -> StoreResult<()> {
        if statements.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn().await?;
        if statements.len() == 1 {
            return run(&mut conn, &statements[0]).await;
        }
        // One round trip for the usual batch, in as many as the packet limit needs for a
        // large one (see `PACKET_BYTES_MAX`), all in one transaction.
        let mut packets = vec![String::from("START TRANSACTION")];
        for s in &statements {
            let last = packets.last().expect("never empty");
            if last.len() + 1 + s.len() > PACKET_BYTES_MAX {
                packets.push(String::with_capacity(s.len()));
            }
            let last = packets.last_mut().expect("never empty");
            if !last.is_empty() {
                last.push(';');
            }
            last.push_str(s);
        }
        // Until the transaction ends here, the connection is reset if it goes back to the
        // pool (a store timeout drops this future between packets): the open transaction
        // is rolled back, never committed half by the next `START TRANSACTION` on it.
        conn.reset_connection(true);
        let mut r = Ok(());
        for p in packets {
            r = conn.query_drop(p).await;
            if r.is_err() {
                break;
            }
        }
        if r.is_ok() {
            r = conn.query_drop("COMMIT").await;
        }
        match r {
            Ok(()) => {
                conn.reset_connection(false);
                Ok(())
            }
            Err(e) => {
                // A statement failed: those after it, the COMMIT included, did not run,
                // and the transaction is open on this connection: rolled back before the
                // pool hands it out again (or reset, when the ROLLBACK fails). A lost
                // connection is not reused.
                let err = StoreError::from(e);
                if !matches!(err, StoreError::Lost(_)) && conn.query_drop("ROLLBACK").await.is_ok()
                {
                    conn.reset_connection(false);
                }
                Err(err)
            }
        }
    }
}

/// The most bytes sent to the server in one packet of statements (about): under MySQL
/// 5.7's default `max_allowed_packet` (4 MiB), let alone MariaDB's (16 MiB). Each
/// statement is built to at most `sql::STATEMENT_BYTES_MAX` (2 MiB).
const PACKET_BYTES_MAX: usize = 3 << 20;

/// Runs one statement in the text protocol: no prepare round trip for SQL that is
/// different every time.
async fn run<Q: Queryable>(q: &mut Q, sql: &Statement) -> StoreResult<()> {
    q.query_drop(sql).await?;
    Ok(())
}

impl ShardStore for MySqlStore {
    async fn open(&self) -> StoreResult<Recovered> {
        self.open_shard().await
    }

    async fn retarget(&self, to: &Retarget) -> StoreResult<()> {
        self.move_to(to).await
    }

    async fn insert(
        &self,
        rows: &[(u64, NewItem)],
        key_high_water: Option<u64>,
        marks: &Marks,
        handoff: &Handoff,
        now_ms: i64,
    ) -> StoreResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let plan = InsertPlan::new(&self.topics, rows);
        let mut statements = marks.statements();
        statements.extend(plan.statements(Dialect::MySql, rows, key_high_water, handoff, now_ms));
        self.run_all(statements).await?;
        plan.committed(&self.topics);
        Ok(())
    }

    async fn ready_keys(
        &self,
        ns: &str,
        topic: &str,
        after: Option<ReadyKey>,
        now_ms: i64,
        limit: usize,
    ) -> StoreResult<Vec<ReadyKey>> {
        let Some(tid) = self.tid(ns, topic) else {
            return Ok(vec![]);
        };
        let mut conn = self.conn().await?;
        let keys = conn
            .query_map(
                format!(
                    "SELECT priority, deliver_after_ms, id FROM items FORCE INDEX (ready_order)
                     WHERE tid = {tid} AND state = 0{} AND deliver_after_ms <= {now_ms}
                     ORDER BY priority, deliver_after_ms, id LIMIT {limit}",
                    text::after_ready(after)
                ),
                |(priority, deliver_after_ms, key)| ReadyKey {
                    priority,
                    deliver_after_ms,
                    key,
                },
            )
            .await?;
        Ok(keys)
    }

    async fn claim(&self, keys: &[u64], now_ms: i64, token: i64) -> StoreResult<Vec<Item>> {
        Ok(self.claim_known(keys, &[], now_ms, token).await?.items)
    }

    fn claim_reads_apart(&self) -> bool {
        true
    }

    async fn claim_known(
        &self,
        keys: &[u64],
        known: &[u64],
        now_ms: i64,
        token: i64,
    ) -> StoreResult<Claimed> {
        if keys.is_empty() {
            return Ok(Claimed::default());
        }
        let mut conn = self.conn().await?;
        conn.query_drop(text::claim(keys, now_ms, token)).await?;
        // Each key is one row's primary key, and a claim changes every row it matches:
        // as many rows changed as keys means every key was leased, so the rows the caller
        // knows need no reading back. Fewer: which ones is only known by reading.
        let known_leased = conn.affected_rows() == keys.len() as u64;
        let read: Vec<u64> = if known_leased {
            keys.iter()
                .filter(|k| known.binary_search(k).is_err())
                .copied()
                .collect()
        } else {
            keys.to_vec()
        };
        if read.is_empty() {
            return Ok(Claimed {
                items: Vec::new(),
                known_leased,
            });
        }
        let rows: Vec<mysql_async::Row> = conn
            .query(format!(
                "SELECT {ITEM_COLUMNS} FROM items WHERE id IN ({}) AND state = 1 AND lease_token = {token}",
                key_list(&read)
            ))
            .await?;
        let items = rows
            .into_iter()
            .map(|r| self.item_from_row(r))
            .collect::<StoreResult<_>>()?;
        Ok(Claimed {
            items,
            known_leased,
        })
    }

    async fn fetch_ready(&self, keys: &[u64], now_ms: i64) -> StoreResult<Vec<Item>> {
        if keys.is_empty() {
            return Ok(vec![]);
        }
        let mut conn = self.conn().await?;
        let rows: Vec<mysql_async::Row> = conn
            .query(format!(
                "SELECT {ITEM_COLUMNS} FROM items WHERE id IN ({}) AND state = 0
                   AND deliver_after_ms <= {now_ms} AND (expires_at_ms IS NULL OR expires_at_ms > {now_ms})",
                key_list(keys)
            ))
            .await?;
        rows.into_iter().map(|r| self.item_from_row(r)).collect()
    }

    async fn dead_items(
        &self,
        ns: &str,
        topic: &str,
        after: Option<ReadyKey>,
        limit: usize,
    ) -> StoreResult<Vec<(Item, i64)>> {
        let Some(tid) = self.tid(ns, topic) else {
            return Ok(vec![]);
        };
        let mut conn = self.conn().await?;
        let rows: Vec<mysql_async::Row> = conn
            .query(format!(
                "SELECT {ITEM_COLUMNS}, died_at_ms FROM items FORCE INDEX (ready_order)
                 WHERE tid = {tid} AND state = 2{}
                 ORDER BY priority, deliver_after_ms, id LIMIT {limit}",
                text::after_ready(after)
            ))
            .await?;
        rows.into_iter()
            .map(|mut r| {
                let died: Option<i64> = column(&mut r, 13)?;
                Ok((self.item_from_row(r)?, died.unwrap_or(0)))
            })
            .collect()
    }

    async fn purge_dead(&self, ns: &str, topic: &str, limit: usize) -> StoreResult<u64> {
        let Some(tid) = self.tid(ns, topic) else {
            return Ok(0);
        };
        let keys: Vec<u64> = {
            let mut conn = self.conn().await?;
            conn.query(format!(
                "SELECT id FROM items WHERE tid = {tid} AND state = 2 ORDER BY died_at_ms, id LIMIT {limit}"
            ))
            .await?
        };
        if keys.is_empty() {
            return Ok(0);
        }
        let list = key_list(&keys);
        let mut conn = self.conn().await?;
        let mut tx = conn.start_transaction(TxOpts::default()).await?;
        tx.query_drop(format!(
            "DELETE FROM items WHERE id IN ({list}) AND state = 2"
        ))
        .await?;
        let n = tx.affected_rows();
        tx.query_drop(format!("DELETE FROM dedup WHERE id IN ({list})"))
            .await?;
        tx.commit().await?;
        Ok(n)
    }

    async fn dedup_lookup(
        &self,
        ns: &str,
        topic: &str,
        dedup_keys: &[&str],
    ) -> StoreResult<Vec<(String, u64)>> {
        let Some(tid) = self.tid(ns, topic) else {
            return Ok(vec![]);
        };
        if dedup_keys.is_empty() {
            return Ok(vec![]);
        }
        let mut conn = self.conn().await?;
        let rows: Vec<(String, u64)> = conn.query(text::dedup_lookup(tid, dedup_keys)).await?;
        Ok(rows)
    }

    async fn lookup(&self, keys: &[u64]) -> StoreResult<Vec<ItemMeta>> {
        if keys.is_empty() {
            return Ok(vec![]);
        }
        let mut conn = self.conn().await?;
        let rows: Vec<mysql_async::Row> = conn
            .query(format!(
                "SELECT {META_COLUMNS} FROM items WHERE id IN ({})",
                key_list(keys)
            ))
            .await?;
        self.metas(rows)
    }

    async fn delete(&self, keys: &[u64]) -> StoreResult<Vec<ItemMeta>> {
        if keys.is_empty() {
            return Ok(vec![]);
        }
        let list = key_list(keys);
        let mut conn = self.conn().await?;
        let found: Vec<(ItemMeta, bool)> = if self.returning.load(Ordering::Relaxed) {
            let rows: Vec<mysql_async::Row> = conn
                .query(format!(
                    "DELETE FROM items WHERE id IN ({list}) RETURNING {META_COLUMNS}"
                ))
                .await?;
            rows.into_iter()
                .map(|r| self.meta_from_row(r))
                .collect::<StoreResult<_>>()?
        } else {
            // The worker is the only writer, so nothing changes between the two statements.
            let rows: Vec<mysql_async::Row> = conn
                .query(format!(
                    "SELECT {META_COLUMNS} FROM items WHERE id IN ({list})"
                ))
                .await?;
            let found = rows
                .into_iter()
                .map(|r| self.meta_from_row(r))
                .collect::<StoreResult<Vec<_>>>()?;
            if !found.is_empty() {
                conn.query_drop(format!("DELETE FROM items WHERE id IN ({list})"))
                    .await?;
            }
            found
        };
        if let Some(sql) = text::delete_dedup_of(&found) {
            conn.query_drop(sql).await?;
        }
        Ok(found.into_iter().map(|(m, _)| m).collect())
    }

    async fn apply(&self, changes: &[Change], now_ms: i64) -> StoreResult<()> {
        self.run_all(text::apply_statements(Dialect::MySql, changes, now_ms))
            .await
    }

    async fn scan(
        &self,
        after: (i64, u64),
        now_ms: i64,
        limit: usize,
    ) -> StoreResult<Vec<ItemMeta>> {
        // InnoDB appends the primary key to every secondary index, so (timer, id) order is
        // the index's own order and the cursor is a plain range start.
        let mut conn = self.conn().await?;
        let rows: Vec<mysql_async::Row> = conn
            .query(format!(
                "SELECT {META_COLUMNS} FROM items FORCE INDEX (timer) WHERE {} LIMIT {limit}",
                text::timer_range(after, now_ms)
            ))
            .await?;
        self.metas(rows)
    }

    async fn batch_committed(&self, batch: i64) -> StoreResult<BatchOutcome> {
        let mut conn = self.conn().await?;
        let forgotten: Option<i64> = conn.query_first(batches::read_forgotten()).await?;
        if !batches::below(batch, forgotten) {
            conn.query_drop(batches::tombstone(Dialect::MySql, batch))
                .await?;
        }
        let c: Option<i64> = conn.query_first(batches::read(batch)).await?;
        Ok(batches::outcome(c))
    }

    async fn forward_committed(&self, token: i64, items: u32) -> StoreResult<ForwardOutcome> {
        let mut conn = self.conn().await?;
        let forgotten: Option<i64> = conn.query_first(batches::read_forgotten()).await?;
        let forgotten = batches::below(token, forgotten);
        if !forgotten {
            conn.query_drop(forwards::tombstone(Dialect::MySql, token, items))
                .await?;
        }
        let stored = conn
            .query_map(forwards::read(token), |(p, k, d): (u32, u64, i64)| {
                (p, k, d != 0)
            })
            .await?;
        Ok(ForwardOutcome { stored, forgotten })
    }

    async fn forget_batches(&self, before_ms: i64) -> StoreResult<u64> {
        let mut conn = self.conn().await?;
        conn.query_drop(batches::raise_forgotten(Dialect::MySql, before_ms))
            .await?;
        conn.query_drop(batches::forget(Dialect::MySql, before_ms))
            .await?;
        let marks = conn.affected_rows();
        conn.query_drop(forwards::forget(Dialect::MySql, before_ms))
            .await?;
        Ok(marks + conn.affected_rows())
    }

    async fn save_checkpoint(&self, checkpoint_ms: i64) -> StoreResult<()> {
        let mut conn = self.conn().await?;
        conn.query_drop(format!(
            "INSERT INTO foqs_meta (name, value) VALUES ('checkpoint_ms', {checkpoint_ms})
             ON DUPLICATE KEY UPDATE value = VALUES(value)"
        ))
        .await?;
        Ok(())
    }

    async fn topic_counts(
        &self,
        ns: &str,
        after: Option<&str>,
        now_ms: i64,
        limit: usize,
    ) -> StoreResult<Vec<TopicCounts>> {
        self.count_topics(ns, after, now_ms, limit).await
    }

    async fn totals(&self) -> StoreResult<Vec<(TopicName, Totals)>> {
        self.read_totals().await
    }

    async fn forget_topics(&self, topics: &[TopicName]) -> StoreResult<Vec<TopicName>> {
        let ids = self.topics.lock().expect("topics").begin_forgetting(topics);
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.run_all(forget_sql(&ids)).await?;
        let kept: Vec<u32> = self.conn().await?.query(kept_sql(&ids)).await?;
        Ok(self.topics.lock().expect("topics").forgotten(&ids, &kept))
    }

    async fn add_totals(&self, deltas: &[(TopicName, Totals)]) -> StoreResult<()> {
        if deltas.is_empty() {
            return Ok(());
        }
        let (sql, tids) = totals_sql(Dialect::MySql, &self.topics, deltas);
        self.run_all(vec![sql]).await?;
        self.topics.lock().expect("topics").confirm(&tids);
        Ok(())
    }

    async fn close(&self) {
        if let Some(lock) = self.lock.lock().await.take() {
            lock.release().await;
        }
    }

    async fn state_counts(&self, topic: Option<&TopicName>) -> StoreResult<Vec<StateCount>> {
        self.count_states(topic).await
    }

    async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.conn().await?;
        conn.query_drop("SELECT 1").await?;
        Ok(())
    }
}
