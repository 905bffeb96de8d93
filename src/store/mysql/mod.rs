//! [`MySqlStore`]: a shard as one MySQL/MariaDB database, through a `mysql_async` pool.
//!
//! Schema facts that matter:
//! - `ns` and `topic` are `VARBINARY`, so they compare as exact bytes (`Orders`, `orders`
//!   and `ordérs` are three topics) whatever the server's default collation.
//! - Keys are chosen by the shard worker, not `AUTO_INCREMENT`: the worker must know a
//!   batch's keys to index it, and a persisted high-water mark guarantees that a key is
//!   never reused, even after its row was deleted and the host restarted.
//! - Every time is a `BIGINT` of milliseconds passed in by the caller.
//! - `due_at_ms` is set only for items that were deferred when written (NULL otherwise,
//!   and a range scan skips NULLs), so the due scan reads deferred items only, not every
//!   item ever enqueued.
//! - The timestamp indexes of the background scans leave `state` out, so that leasing a
//!   row (the hottest write) changes only `ready_order` and `lease`; the scans read from a
//!   checkpoint, so filtering state on the few rows past it is cheap.
//! - A write that is one statement runs in autocommit: an explicit transaction would add
//!   two round trips for nothing.
//! - Lists of keys are spliced into the SQL text as integers: they are `u64`s, so there is
//!   nothing to escape, and a prepared statement per list length would churn the cache.

use mysql_async::prelude::*;
use mysql_async::{
    Conn, Opts, OptsBuilder, Params, Pool, PoolConstraints, PoolOpts, TxOpts, Value,
};

mod owner;
mod sql;

/// MySQL's errors in the store's terms: a statement the server cannot run on this schema
/// (no such table or column, a syntax error) will fail again; anything else (connection
/// lost, deadlock, lock wait timeout, server gone) may succeed when retried.
impl From<mysql_async::Error> for StoreError {
    fn from(e: mysql_async::Error) -> StoreError {
        // Statements this build should never send, or data it should never write:
        // duplicate key, syntax, unknown column or table, too long, wrong value, out of
        // range.
        const CORRUPT: [u16; 7] = [1062, 1064, 1054, 1146, 1406, 1366, 1264];
        // The server refuses this user or has no such database: configuration.
        const SCHEMA: [u16; 4] = [1044, 1045, 1049, 1142];
        match &e {
            mysql_async::Error::Server(s) if CORRUPT.contains(&s.code) => {
                StoreError::Corrupt(format!("mysql: {e}"))
            }
            mysql_async::Error::Server(s) if SCHEMA.contains(&s.code) => {
                StoreError::Schema(format!("mysql: {e}"))
            }
            _ => StoreError::Transient(format!("mysql: {e}")),
        }
    }
}

pub use owner::OnLost;
use owner::OwnerLock;
use sql::{apply_statements, insert_sql, key_list, run};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{
    Change, Checkpoints, ItemMeta, Recovered, Scan, ShardStore, StateCount, StoreError, StoreResult,
};
use crate::model::{
    Item, ItemId, ItemState, NewItem, Policy, ReadyKey, ShardId, TopicCounts, TopicName,
    TopicSnapshot, Totals,
};

const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS items (
        id BIGINT UNSIGNED NOT NULL PRIMARY KEY,
        ns VARBINARY(255) NOT NULL,
        topic VARBINARY(255) NOT NULL,
        priority INT NOT NULL,
        state TINYINT NOT NULL,
        deliver_after_ms BIGINT NOT NULL,
        due_at_ms BIGINT NULL,
        died_at_ms BIGINT NULL,
        dedup_key VARBINARY(255) NULL,
        enqueued_at_ms BIGINT NOT NULL,
        lease_ms BIGINT NOT NULL,
        lease_expires_ms BIGINT NOT NULL DEFAULT 0,
        lease_token BIGINT NOT NULL DEFAULT 0,
        expires_at_ms BIGINT NULL,
        policy TINYINT NOT NULL,
        max_attempts INT NOT NULL,
        delivery_count INT NOT NULL DEFAULT 0,
        payload BLOB NOT NULL,
        metadata BLOB NOT NULL,
        KEY ready_order (ns, topic, state, priority, deliver_after_ms, id),
        KEY due (due_at_ms),
        KEY lease (lease_expires_ms),
        KEY ttl (expires_at_ms),
        UNIQUE KEY dedup (ns, topic, dedup_key)
    ) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS topic_totals (
        ns VARBINARY(255) NOT NULL,
        topic VARBINARY(255) NOT NULL,
        enqueued BIGINT NOT NULL DEFAULT 0,
        delivered BIGINT NOT NULL DEFAULT 0,
        acked BIGINT NOT NULL DEFAULT 0,
        nacked BIGINT NOT NULL DEFAULT 0,
        expired BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (ns, topic)
    ) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS foqs_meta (
        name VARBINARY(64) NOT NULL PRIMARY KEY,
        value BIGINT NOT NULL
    ) ENGINE=InnoDB",
];

const ITEM_COLUMNS: &str = "id, ns, topic, priority, payload, metadata, deliver_after_ms, enqueued_at_ms, delivery_count, lease_expires_ms, policy, expires_at_ms, lease_token";
const META_COLUMNS: &str = "id, ns, topic, priority, deliver_after_ms, state, delivery_count, max_attempts, policy, lease_expires_ms, expires_at_ms, lease_token";
const INSERT_COLUMNS: &str = "(id, ns, topic, priority, state, deliver_after_ms, due_at_ms, enqueued_at_ms, lease_ms, expires_at_ms, policy, max_attempts, payload, metadata, dedup_key)";

pub struct MySqlStore {
    shard: ShardId,
    pool: Pool,
    /// The same server without a database selected, to create the database.
    server_opts: Opts,
    database: String,
    /// MariaDB has `DELETE ... RETURNING`, which makes an ack one statement; MySQL needs
    /// a lookup first. Known after `open`.
    returning: std::sync::atomic::AtomicBool,
    /// Take the shard's owner lock at open (see `owner.rs`); called when it is lost.
    owner_lock: Option<OnLost>,
    /// Closed (false) for good once the owner lock is lost: every operation checks it.
    owned: Arc<AtomicBool>,
    lock: tokio::sync::Mutex<Option<OwnerLock>>,
    /// Bounds the owner lock's checks, as every other operation is bounded.
    check_timeout: std::time::Duration,
}

impl MySqlStore {
    pub fn new(shard: ShardId, url: &str, pool_connections_max: usize) -> StoreResult<MySqlStore> {
        let opts =
            Opts::from_url(url).map_err(|e| StoreError::Schema(format!("bad url {url:?}: {e}")))?;
        let database = opts
            .db_name()
            .map(str::to_string)
            .ok_or_else(|| StoreError::Schema(format!("url {url:?} names no database")))?;
        let constraints = PoolConstraints::new(1, pool_connections_max.max(1)).expect("1 <= max");
        let pool_opts = PoolOpts::default().with_constraints(constraints);
        let shard_opts: Opts = OptsBuilder::from_opts(opts.clone())
            .pool_opts(pool_opts)
            .into();
        let server_opts: Opts = OptsBuilder::from_opts(opts).db_name(None::<String>).into();
        Ok(MySqlStore {
            shard,
            pool: Pool::new(shard_opts),
            server_opts,
            database,
            returning: std::sync::atomic::AtomicBool::new(false),
            owner_lock: None,
            owned: Arc::new(AtomicBool::new(true)),
            lock: tokio::sync::Mutex::new(None),
            check_timeout: std::time::Duration::from_secs(5),
        })
    }

    /// Takes the shard's owner lock when opened, and refuses to open while another
    /// process holds it; once the lock is lost, every operation fails with
    /// [`StoreError::Fenced`] and `on_lost` is called (see `owner.rs`).
    pub fn with_owner_lock(mut self, on_lost: OnLost, check_timeout_ms: u64) -> MySqlStore {
        self.owner_lock = Some(on_lost);
        self.check_timeout = std::time::Duration::from_millis(check_timeout_ms);
        self
    }

    pub fn database(&self) -> &str {
        &self.database
    }

    /// Closes the pool's connections.
    pub async fn close(self) {
        let _ = self.pool.disconnect().await;
    }

    async fn conn(&self) -> StoreResult<Conn> {
        if !self.owned.load(Ordering::SeqCst) {
            return Err(StoreError::Fenced);
        }
        Ok(self.pool.get_conn().await?)
    }

    fn item_from_row(&self, mut row: mysql_async::Row) -> StoreResult<Item> {
        Ok(Item {
            id: ItemId {
                shard: self.shard,
                key: column(&mut row, 0)?,
            },
            ns: column(&mut row, 1)?,
            topic: column(&mut row, 2)?,
            priority: column(&mut row, 3)?,
            payload: column(&mut row, 4)?,
            metadata: column(&mut row, 5)?,
            deliver_after_ms: column(&mut row, 6)?,
            enqueued_at_ms: column(&mut row, 7)?,
            delivery_count: column(&mut row, 8)?,
            lease_expires_ms: column(&mut row, 9)?,
            policy: policy_from_db(column(&mut row, 10)?)?,
            expires_at_ms: column(&mut row, 11)?,
            lease_token: column(&mut row, 12)?,
        })
    }
}

/// Column `i` of `row` as `T`.
fn column<T: FromValue>(row: &mut mysql_async::Row, i: usize) -> StoreResult<T> {
    match row.take_opt::<T, usize>(i) {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => Err(StoreError::Corrupt(format!("column {i}: {e}"))),
        None => Err(StoreError::Corrupt(format!("column {i} missing"))),
    }
}

fn policy_from_db(v: i8) -> StoreResult<Policy> {
    Policy::from_i32(v as i32).ok_or_else(|| StoreError::Corrupt(format!("unknown policy {v}")))
}

fn meta_from_row(row: mysql_async::Row) -> StoreResult<ItemMeta> {
    type R = (
        u64,
        String,
        String,
        i32,
        i64,
        i8,
        i32,
        i32,
        i8,
        i64,
        Option<i64>,
        i64,
    );
    let (
        key,
        ns,
        topic,
        priority,
        deliver_after_ms,
        state,
        delivery_count,
        max_attempts,
        policy,
        lease_expires_ms,
        expires_at_ms,
        lease_token,
    ): R = mysql_async::from_row_opt(row)
        .map_err(|e| StoreError::Corrupt(format!("meta row: {e}")))?;
    Ok(ItemMeta {
        key,
        ns,
        topic,
        priority,
        deliver_after_ms,
        state: ItemState::from_i8(state)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown state {state}")))?,
        delivery_count,
        max_attempts,
        policy: policy_from_db(policy)?,
        lease_expires_ms,
        expires_at_ms,
        lease_token,
    })
}

/// `(priority, deliver_after_ms, id) > after`, spelled out so that the optimizer reads it
/// as a range of the ready_order index; empty without `after`.
fn after_condition(after: Option<ReadyKey>) -> (&'static str, Vec<Value>) {
    match after {
        None => ("", vec![]),
        Some(k) => (
            " AND (priority > ? OR (priority = ? AND (deliver_after_ms > ? OR (deliver_after_ms = ? AND id > ?))))",
            vec![
                k.priority.into(),
                k.priority.into(),
                k.deliver_after_ms.into(),
                k.deliver_after_ms.into(),
                k.key.into(),
            ],
        ),
    }
}

async fn meta_get(conn: &mut Conn, name: &str) -> StoreResult<Option<i64>> {
    Ok(conn
        .exec_first("SELECT value FROM foqs_meta WHERE name = ?", (name,))
        .await?)
}

impl ShardStore for MySqlStore {
    async fn open(&self) -> StoreResult<Recovered> {
        if let Some(on_lost) = &self.owner_lock {
            let lock = OwnerLock::acquire(
                self.shard,
                &self.database,
                self.server_opts.clone(),
                self.owned.clone(),
                on_lost.clone(),
                self.check_timeout,
            )
            .await?;
            *self.lock.lock().await = Some(lock);
        }
        let mut server = Conn::new(self.server_opts.clone()).await?;
        let create = format!(
            "CREATE DATABASE IF NOT EXISTS `{}`",
            self.database.replace('`', "``")
        );
        server.query_drop(create).await?;
        let _ = server.disconnect().await;

        let mut conn = self.conn().await?;
        let version: String = conn
            .query_first("SELECT VERSION()")
            .await?
            .unwrap_or_default();
        self.returning.store(
            version.contains("MariaDB"),
            std::sync::atomic::Ordering::Relaxed,
        );
        for stmt in SCHEMA {
            conn.query_drop(*stmt).await?;
        }
        conn.exec_drop(
            "INSERT IGNORE INTO foqs_meta (name, value) VALUES ('schema_version', ?)",
            (SCHEMA_VERSION,),
        )
        .await?;
        let version = meta_get(&mut conn, "schema_version").await?.unwrap_or(0);
        if version != SCHEMA_VERSION {
            return Err(StoreError::Schema(format!(
                "database {} has schema version {version}; this foqsd knows {SCHEMA_VERSION}",
                self.database
            )));
        }
        // Catch a table created by a development build with other columns now, with a
        // clear message, rather than at the first write.
        let probe = format!("SELECT {ITEM_COLUMNS}, {META_COLUMNS}, due_at_ms, died_at_ms, dedup_key FROM items LIMIT 0");
        if let Err(e) = conn.query_drop(probe).await {
            return Err(StoreError::Schema(format!(
                "database {}: table items does not have the columns of schema version {SCHEMA_VERSION} ({e}); \
                 it was made by another build: drop the database or migrate it",
                self.database
            )));
        }
        let hwm = meta_get(&mut conn, "key_high_water")
            .await?
            .unwrap_or(0)
            .max(0) as u64;
        let max_key: Option<u64> = conn
            .query_first("SELECT MAX(id) FROM items")
            .await?
            .flatten();
        let items: i64 = conn
            .query_first("SELECT COUNT(*) FROM items")
            .await?
            .unwrap_or(0);
        let checkpoints = Checkpoints {
            due_ms: meta_get(&mut conn, "checkpoint_due_ms").await?.unwrap_or(0),
            lease_ms: meta_get(&mut conn, "checkpoint_lease_ms")
                .await?
                .unwrap_or(0),
            ttl_ms: meta_get(&mut conn, "checkpoint_ttl_ms").await?.unwrap_or(0),
        };
        Ok(Recovered {
            key_high_water: hwm.max(max_key.map_or(1, |k| k + 1)),
            checkpoints,
            items,
        })
    }

    async fn insert(
        &self,
        rows: &[(u64, NewItem)],
        key_high_water: Option<u64>,
    ) -> StoreResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let sql = insert_sql(rows);
        let mut conn = self.conn().await?;
        let Some(hwm) = key_high_water else {
            conn.query_drop(sql).await?;
            return Ok(());
        };
        let mut tx = conn.start_transaction(TxOpts::default()).await?;
        tx.exec_drop(
            "INSERT INTO foqs_meta (name, value) VALUES ('key_high_water', ?) ON DUPLICATE KEY UPDATE value = GREATEST(value, VALUES(value))",
            (hwm,),
        )
        .await?;
        tx.query_drop(sql).await?;
        tx.commit().await?;
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
        let mut conn = self.conn().await?;
        let (cond, mut params) = after_condition(after);
        let sql = format!(
            "SELECT priority, deliver_after_ms, id FROM items FORCE INDEX (ready_order)
             WHERE ns = ? AND topic = ? AND state = 0{cond} AND deliver_after_ms <= ?
             ORDER BY priority, deliver_after_ms, id LIMIT {limit}"
        );
        let mut all: Vec<Value> = vec![ns.as_bytes().into(), topic.as_bytes().into()];
        all.append(&mut params);
        all.push(now_ms.into());
        let keys = conn
            .exec_map(
                sql,
                Params::Positional(all),
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
        if keys.is_empty() {
            return Ok(vec![]);
        }
        let list = key_list(keys);
        let mut conn = self.conn().await?;
        conn.query_drop(format!(
            "UPDATE items SET state = 1, lease_token = {token}, delivery_count = delivery_count + 1,
               lease_expires_ms = {now_ms} + lease_ms
             WHERE id IN ({list}) AND state = 0 AND deliver_after_ms <= {now_ms}
               AND (expires_at_ms IS NULL OR expires_at_ms > {now_ms})"
        ))
        .await?;
        let rows: Vec<mysql_async::Row> = conn
            .query(format!(
                "SELECT {ITEM_COLUMNS} FROM items WHERE id IN ({list}) AND state = 1 AND lease_token = {token}"
            ))
            .await?;
        rows.into_iter().map(|r| self.item_from_row(r)).collect()
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
        let (cond, after_params) = after_condition(after);
        let mut params: Vec<Value> = vec![ns.as_bytes().into(), topic.as_bytes().into()];
        params.extend(after_params);
        let sql = format!(
            "SELECT {ITEM_COLUMNS}, died_at_ms FROM items FORCE INDEX (ready_order)
             WHERE ns = ? AND topic = ? AND state = 2{cond}
             ORDER BY priority, deliver_after_ms, id LIMIT {limit}"
        );
        let mut conn = self.conn().await?;
        let rows: Vec<mysql_async::Row> = conn.exec(sql, Params::Positional(params)).await?;
        rows.into_iter()
            .map(|mut r| {
                let died: Option<i64> = column(&mut r, 13)?;
                Ok((self.item_from_row(r)?, died.unwrap_or(0)))
            })
            .collect()
    }

    async fn purge_dead(&self, ns: &str, topic: &str, limit: usize) -> StoreResult<u64> {
        let mut conn = self.conn().await?;
        conn.exec_drop(
            format!("DELETE FROM items WHERE ns = ? AND topic = ? AND state = 2 LIMIT {limit}"),
            (ns.as_bytes(), topic.as_bytes()),
        )
        .await?;
        Ok(conn.affected_rows())
    }

    async fn dedup_lookup(
        &self,
        ns: &str,
        topic: &str,
        dedup_keys: &[&str],
    ) -> StoreResult<Vec<(String, u64)>> {
        if dedup_keys.is_empty() {
            return Ok(vec![]);
        }
        let marks = vec!["?"; dedup_keys.len()].join(", ");
        let mut params: Vec<Value> = vec![ns.as_bytes().into(), topic.as_bytes().into()];
        params.extend(dedup_keys.iter().map(|k| Value::from(k.as_bytes())));
        let mut conn = self.conn().await?;
        let rows: Vec<(String, u64)> = conn
            .exec(
                format!("SELECT dedup_key, id FROM items WHERE ns = ? AND topic = ? AND dedup_key IN ({marks})"),
                Params::Positional(params),
            )
            .await?;
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
        rows.into_iter().map(meta_from_row).collect()
    }

    async fn delete(&self, keys: &[u64]) -> StoreResult<Vec<ItemMeta>> {
        if keys.is_empty() {
            return Ok(vec![]);
        }
        let list = key_list(keys);
        if self.returning.load(std::sync::atomic::Ordering::Relaxed) {
            let mut conn = self.conn().await?;
            let rows: Vec<mysql_async::Row> = conn
                .query(format!(
                    "DELETE FROM items WHERE id IN ({list}) RETURNING {META_COLUMNS}"
                ))
                .await?;
            return rows.into_iter().map(meta_from_row).collect();
        }
        // The worker is the only writer, so nothing changes between the two statements.
        let found = self.lookup(keys).await?;
        if !found.is_empty() {
            let mut conn = self.conn().await?;
            conn.query_drop(format!(
                "DELETE FROM items WHERE id IN ({})",
                key_list(&found.iter().map(|m| m.key).collect::<Vec<_>>())
            ))
            .await?;
        }
        Ok(found)
    }

    async fn apply(&self, changes: &[Change]) -> StoreResult<()> {
        let statements = apply_statements(changes);
        if statements.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn().await?;
        if let [(sql, params)] = statements.as_slice() {
            run(&mut conn, sql, params.clone()).await?;
            return Ok(());
        }
        let mut tx = conn.start_transaction(TxOpts::default()).await?;
        for (sql, params) in statements {
            run(&mut tx, &sql, params).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn scan(
        &self,
        scan: Scan,
        after: (i64, u64),
        now_ms: i64,
        limit: usize,
    ) -> StoreResult<Vec<ItemMeta>> {
        // InnoDB appends the primary key to every secondary index, so (ts, id) order is
        // the index's own order and the cursor is a plain range start.
        let (state, ts) = match scan {
            Scan::Due => ("state = 0 AND ", "due_at_ms"),
            Scan::Lease => ("state = 1 AND ", "lease_expires_ms"),
            Scan::Ttl => ("", "expires_at_ms"),
        };
        let sql = format!(
            "SELECT {META_COLUMNS} FROM items
             WHERE {state}({ts} > ? OR ({ts} = ? AND id > ?)) AND {ts} <= ?
             ORDER BY {ts}, id LIMIT {limit}"
        );
        let mut conn = self.conn().await?;
        let rows: Vec<mysql_async::Row> =
            conn.exec(sql, (after.0, after.0, after.1, now_ms)).await?;
        rows.into_iter().map(meta_from_row).collect()
    }

    async fn save_checkpoints(&self, cp: Checkpoints) -> StoreResult<()> {
        let mut conn = self.conn().await?;
        conn.exec_drop(
            "INSERT INTO foqs_meta (name, value) VALUES ('checkpoint_due_ms', ?), ('checkpoint_lease_ms', ?), ('checkpoint_ttl_ms', ?)
             ON DUPLICATE KEY UPDATE value = VALUES(value)",
            (cp.due_ms, cp.lease_ms, cp.ttl_ms),
        )
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
        let mut conn = self.conn().await?;
        let rows: Vec<(String, i64, i64, i64)> = conn
            .exec(
                format!(
                    "SELECT topic,
                        CAST(SUM(state = 0 AND deliver_after_ms <= ?) AS SIGNED),
                        CAST(SUM(state = 0 AND deliver_after_ms > ?) AS SIGNED),
                        CAST(SUM(state = 1) AS SIGNED)
                     FROM items
                     WHERE ns = ? AND topic > ? AND state IN (0, 1)
                       AND (expires_at_ms IS NULL OR expires_at_ms > ?)
                     GROUP BY topic ORDER BY topic LIMIT {limit}"
                ),
                (
                    now_ms,
                    now_ms,
                    ns.as_bytes(),
                    after.unwrap_or("").as_bytes(),
                    now_ms,
                ),
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|(topic, ready, deferred, leased)| TopicCounts {
                topic,
                ready,
                deferred,
                leased,
                hosts: Vec::new(),
            })
            .collect())
    }

    async fn topic_snapshot(
        &self,
        ns: &str,
        topic: &str,
        now_ms: i64,
    ) -> StoreResult<TopicSnapshot> {
        let mut conn = self.conn().await?;
        // SUM and MIN are NULL over no rows.
        type Counts = (
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
        );
        let counts: Option<Counts> = conn
            .exec_first(
                "SELECT CAST(SUM(state = 0 AND deliver_after_ms <= ?) AS SIGNED),
                        CAST(SUM(state = 0 AND deliver_after_ms > ?) AS SIGNED),
                        CAST(SUM(state = 1) AS SIGNED),
                        CAST(SUM(state = 2) AS SIGNED),
                        MIN(IF(state = 0 AND deliver_after_ms <= ?, deliver_after_ms, NULL))
                 FROM items WHERE ns = ? AND topic = ? AND (expires_at_ms IS NULL OR expires_at_ms > ?)",
                (now_ms, now_ms, now_ms, ns.as_bytes(), topic.as_bytes(), now_ms),
            )
            .await?;
        let (ready, deferred, leased, dead, oldest_ready_ms) = counts.unwrap_or_default();
        let totals: Option<(i64, i64, i64, i64, i64)> = conn
            .exec_first(
                "SELECT enqueued, delivered, acked, nacked, expired FROM topic_totals WHERE ns = ? AND topic = ?",
                (ns.as_bytes(), topic.as_bytes()),
            )
            .await?;
        let (enqueued, delivered, acked, nacked, expired) = totals.unwrap_or_default();
        Ok(TopicSnapshot {
            ready: ready.unwrap_or(0),
            deferred: deferred.unwrap_or(0),
            leased: leased.unwrap_or(0),
            dead: dead.unwrap_or(0),
            oldest_ready_ms,
            totals: Totals {
                enqueued,
                delivered,
                acked,
                nacked,
                expired,
            },
        })
    }

    async fn add_totals(&self, deltas: &[(TopicName, Totals)]) -> StoreResult<()> {
        if deltas.is_empty() {
            return Ok(());
        }
        let rows = vec!["(?, ?, ?, ?, ?, ?, ?)"; deltas.len()].join(", ");
        let mut params: Vec<Value> = Vec::with_capacity(deltas.len() * 7);
        for (t, d) in deltas {
            params.extend([
                t.ns.as_bytes().into(),
                t.topic.as_bytes().into(),
                d.enqueued.into(),
                d.delivered.into(),
                d.acked.into(),
                d.nacked.into(),
                d.expired.into(),
            ]);
        }
        let mut conn = self.conn().await?;
        conn.exec_drop(
            format!(
                "INSERT INTO topic_totals (ns, topic, enqueued, delivered, acked, nacked, expired) VALUES {rows}
                 ON DUPLICATE KEY UPDATE enqueued = enqueued + VALUES(enqueued), delivered = delivered + VALUES(delivered),
                   acked = acked + VALUES(acked), nacked = nacked + VALUES(nacked), expired = expired + VALUES(expired)"
            ),
            Params::Positional(params),
        )
        .await?;
        Ok(())
    }

    async fn close(&self) {
        if let Some(lock) = self.lock.lock().await.take() {
            lock.release().await;
        }
    }

    async fn state_counts(&self) -> StoreResult<Vec<StateCount>> {
        let mut conn = self.conn().await?;
        let rows: Vec<(String, String, i8, i64, i64)> = conn
            .query(
                "SELECT ns, topic, state, IF(state = 0, FLOOR(deliver_after_ms / 1000), 0) AS sec, COUNT(*)
                 FROM items GROUP BY ns, topic, state, sec",
            )
            .await?;
        rows.into_iter()
            .map(|(ns, topic, state, sec, n)| {
                let state = ItemState::from_i8(state)
                    .ok_or_else(|| StoreError::Corrupt(format!("unknown state {state}")))?;
                Ok((ns, topic, state, sec, n))
            })
            .collect()
    }

    async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.conn().await?;
        conn.query_drop("SELECT 1").await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: u16) -> mysql_async::Error {
        mysql_async::Error::Server(mysql_async::ServerError {
            code,
            message: "x".into(),
            state: "HY000".into(),
        })
    }

    #[test]
    fn mysql_errors_are_transient_unless_no_retry_can_fix_them() {
        // Deadlock, lock wait timeout: retry.
        assert!(matches!(
            StoreError::from(server(1213)),
            StoreError::Transient(_)
        ));
        assert!(matches!(
            StoreError::from(server(1205)),
            StoreError::Transient(_)
        ));
        // No such table, unknown column: the schema is not this build's.
        assert!(matches!(
            StoreError::from(server(1146)),
            StoreError::Corrupt(_)
        ));
        assert!(matches!(
            StoreError::from(server(1054)),
            StoreError::Corrupt(_)
        ));
    }
}
