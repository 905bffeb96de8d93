//! [`SqliteStore`]: a shard as one local SQLite file (WAL mode, `synchronous = FULL`, so
//! a reply means committed and synced, as `innodb_flush_log_at_trx_commit = 1` does for
//! MySQL), through `rusqlite` with SQLite compiled in (no system library).
//!
//! The layout is the MySQL store's schema version 2 (`topics`, `items` with `ready_order`
//! and `timer` indexes, `dedup`, `foqs_meta`), and the writes are the same statements
//! (`store::sql`); only reads with dialect-specific SQL are written here. Every write,
//! and every read the worker orders after its writes, runs on the shard's own thread
//! (`conn.rs`); the reads beside the worker (counts, snapshots, peeks) run on a read-only
//! connection of their own (`reader.rs`), outside the writer's transaction. (Dead-item
//! listings stay on the writer: requeuing them reads them in the worker's order.)

mod conn;
mod counts;
mod disk;
mod priority;
pub use priority::can_lower_and_restore;
mod reader;
mod rows;
mod schema;

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};

use rusqlite::Connection;

use super::batches::{self, BatchOutcome};
use super::forwards::{self, ForwardOutcome, Marks};
use super::sql::{self as text, key_list, totals_sql, Dialect, InsertPlan};
use super::topics::{forget_sql, kept_sql, TopicIds};
use super::{
    Change, Handoff, ItemMeta, Recovered, ShardStore, StateCount, StoreError, StoreResult,
};
use crate::model::{Item, NewItem, ReadyKey, ShardId, TopicCounts, TopicName, Totals};
use conn::{store_error, ShardThread};
pub use disk::sqlite_path;
use disk::{room_on_disk, PROBE_BYTES};
use reader::ReadThread;
use rows::{key_array, run, Rows, ITEM_COLUMNS, META_COLUMNS};
use schema::{meta_get, prepare};

/// The claim, one text for every claim: its keys (`?1`), time (`?2`) and token (`?3`)
/// are bound, so the statement is prepared once per connection.
static CLAIM_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{} RETURNING {ITEM_COLUMNS}",
        text::claim_spelled(&text::ClaimValues {
            keys: "rarray(?1)",
            now: "?2",
            token: "?3",
        })
    )
});

/// The ack's DELETE, its keys bound as `?1` (prepared once, as the claim).
static DELETE_SQL: LazyLock<String> =
    LazyLock::new(|| format!("DELETE FROM items WHERE id IN rarray(?1) RETURNING {META_COLUMNS}"));

pub struct SqliteStore {
    shard: ShardId,
    path: PathBuf,
    thread: Mutex<Option<Arc<ShardThread>>>,
    reader: Mutex<Option<Arc<ReadThread>>>,
    topics: Arc<Mutex<TopicIds>>,
    /// The nice value its threads run at (see `priority`).
    nice: super::NiceKnob,
}

impl SqliteStore {
    pub fn new(shard: ShardId, path: PathBuf) -> SqliteStore {
        SqliteStore {
            shard,
            path,
            thread: Mutex::new(None),
            reader: Mutex::new(None),
            topics: Arc::new(Mutex::new(TopicIds::default())),
            nice: Arc::new(std::sync::atomic::AtomicI32::new(0)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn rows(&self) -> Rows {
        Rows {
            shard: self.shard,
            topics: self.topics.clone(),
        }
    }

    fn tid(&self, ns: &str, topic: &str) -> Option<u32> {
        self.topics.lock().expect("topics").get(ns, topic)
    }

    async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        opened(&self.thread)?.call(f).await
    }

    /// Runs a read that needs no order with the worker's writes on the reader.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        opened(&self.reader)?.call(f).await
    }
}

/// What a slot holds while the shard is open (the writer's thread, the reader).
fn opened<T>(slot: &Mutex<Option<Arc<T>>>) -> StoreResult<Arc<T>> {
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
        .ok_or_else(|| StoreError::Transient("the shard is not open".into()))
}

impl ShardStore for SqliteStore {
    async fn open(&self) -> StoreResult<Recovered> {
        let (shard, path) = (self.shard, self.path.clone());
        let nice = self.nice.clone();
        let thread = tokio::task::spawn_blocking(move || {
            ShardThread::open(shard, &path, nice, |conn| prepare(conn, &path))
        })
        .await
        .map_err(|e| StoreError::Transient(format!("opening the shard: {e}")))??;
        let real = thread.path().to_path_buf();
        *self.thread.lock().expect("thread") = Some(Arc::new(thread));
        let nice = self.nice.clone();
        let reader = tokio::task::spawn_blocking(move || ReadThread::open(shard, &real, nice))
            .await
            .map_err(|e| StoreError::Transient(format!("opening the shard's reader: {e}")))
            .and_then(|r| r);
        match reader {
            Ok(reader) => *self.reader.lock().expect("reader") = Some(Arc::new(reader)),
            Err(e) => {
                // Not half open: the writer lets go of the file (and its owner lock).
                self.close().await;
                return Err(e);
            }
        }
        let (topics, recovered) = self
            .call(|conn| {
                let mut st = conn
                    .prepare("SELECT tid, ns, topic FROM topics")
                    .map_err(store_error)?;
                let topics = st
                    .query_map([], |r| {
                        let ns: Vec<u8> = r.get(1)?;
                        let topic: Vec<u8> = r.get(2)?;
                        Ok((
                            r.get::<_, u32>(0)?,
                            String::from_utf8_lossy(&ns).into_owned(),
                            String::from_utf8_lossy(&topic).into_owned(),
                        ))
                    })
                    .map_err(store_error)?
                    .collect::<rusqlite::Result<Vec<_>>>()
                    .map_err(store_error)?;
                let hwm = meta_get(conn, "key_high_water")?.unwrap_or(0).max(0) as u64;
                let max_key: Option<i64> = conn
                    .query_row("SELECT MAX(id) FROM items", [], |r| r.get(0))
                    .map_err(store_error)?;
                Ok((
                    topics,
                    Recovered {
                        key_high_water: hwm.max(max_key.map_or(1, |k| k as u64 + 1)),
                        checkpoint_ms: meta_get(conn, "checkpoint_ms")?.unwrap_or(0),
                    },
                ))
            })
            .await?;
        *self.topics.lock().expect("topics") = TopicIds::load(topics);
        Ok(recovered)
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
        statements.extend(plan.statements(Dialect::Sqlite, rows, key_high_water, handoff, now_ms));
        self.call(move |conn| run(conn, &statements)).await?;
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
        let sql = format!(
            "SELECT priority, deliver_after_ms, id FROM items INDEXED BY ready_order
             WHERE tid = {tid} AND state = 0{} AND deliver_after_ms <= {now_ms}
             ORDER BY priority, deliver_after_ms, id LIMIT {limit}",
            text::after_ready(after)
        );
        self.call(move |conn| {
            let mut st = conn.prepare(&sql).map_err(store_error)?;
            let keys = st
                .query_map([], |r| {
                    Ok(ReadyKey {
                        priority: r.get(0)?,
                        deliver_after_ms: r.get(1)?,
                        key: r.get::<_, i64>(2)? as u64,
                    })
                })
                .map_err(store_error)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(store_error)?;
            Ok(keys)
        })
        .await
    }

    async fn claim(&self, keys: &[u64], now_ms: i64, token: i64) -> StoreResult<Vec<Item>> {
        if keys.is_empty() {
            return Ok(vec![]);
        }
        let keys = keys.to_vec();
        let rows = self.rows();
        self.call(move |conn| {
            rows.items_bound(
                conn,
                &CLAIM_SQL,
                rusqlite::params![key_array(&keys), now_ms, token],
            )
        })
        .await
    }

    async fn fetch_ready(&self, keys: &[u64], now_ms: i64) -> StoreResult<Vec<Item>> {
        if keys.is_empty() {
            return Ok(vec![]);
        }
        let sql = format!(
            "SELECT {ITEM_COLUMNS} FROM items WHERE id IN ({}) AND state = 0
               AND deliver_after_ms <= {now_ms} AND (expires_at_ms IS NULL OR expires_at_ms > {now_ms})",
            key_list(keys)
        );
        let rows = self.rows();
        self.read(move |conn| rows.items(conn, &sql)).await
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
        let sql = format!(
            "SELECT {ITEM_COLUMNS}, died_at_ms FROM items INDEXED BY ready_order
             WHERE tid = {tid} AND state = 2{}
             ORDER BY priority, deliver_after_ms, id LIMIT {limit}",
            text::after_ready(after)
        );
        let rows = self.rows();
        self.call(move |conn| {
            let mut st = conn.prepare(&sql).map_err(store_error)?;
            let out = st
                .query_map([], |r| {
                    Ok((rows.item(r)?, r.get::<_, Option<i64>>(13)?.unwrap_or(0)))
                })
                .map_err(store_error)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(store_error)?;
            Ok(out)
        })
        .await
    }

    async fn purge_dead(&self, ns: &str, topic: &str, limit: usize) -> StoreResult<u64> {
        let Some(tid) = self.tid(ns, topic) else {
            return Ok(0);
        };
        self.call(move |conn| {
            let mut st = conn
                .prepare(&format!(
                    "SELECT id FROM items WHERE tid = {tid} AND state = 2 ORDER BY died_at_ms, id LIMIT {limit}"
                ))
                .map_err(store_error)?;
            let keys = st
                .query_map([], |r| r.get::<_, i64>(0).map(|k| k as u64))
                .map_err(store_error)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(store_error)?;
            if keys.is_empty() {
                return Ok(0);
            }
            let list = key_list(&keys);
            let n = conn
                .execute(
                    &format!("DELETE FROM items WHERE id IN ({list}) AND state = 2"),
                    [],
                )
                .map_err(store_error)?;
            conn.execute(&format!("DELETE FROM dedup WHERE id IN ({list})"), [])
                .map_err(store_error)?;
            Ok(n as u64)
        })
        .await
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
        let sql = text::dedup_lookup(tid, dedup_keys);
        self.call(move |conn| {
            let mut st = conn.prepare(&sql).map_err(store_error)?;
            let out = st
                .query_map([], |r| {
                    let k: Vec<u8> = r.get(0)?;
                    Ok((
                        String::from_utf8_lossy(&k).into_owned(),
                        r.get::<_, i64>(1)? as u64,
                    ))
                })
                .map_err(store_error)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(store_error)?;
            Ok(out)
        })
        .await
    }

    async fn lookup(&self, keys: &[u64]) -> StoreResult<Vec<ItemMeta>> {
        if keys.is_empty() {
            return Ok(vec![]);
        }
        let sql = format!(
            "SELECT {META_COLUMNS} FROM items WHERE id IN ({})",
            key_list(keys)
        );
        let rows = self.rows();
        let found = self.call(move |conn| rows.metas(conn, &sql)).await?;
        Ok(found.into_iter().map(|(m, _)| m).collect())
    }

    async fn delete(&self, keys: &[u64]) -> StoreResult<Vec<ItemMeta>> {
        if keys.is_empty() {
            return Ok(vec![]);
        }
        let keys = keys.to_vec();
        let rows = self.rows();
        let found = self
            .call(move |conn| {
                let found = rows.metas_bound(conn, &DELETE_SQL, [key_array(&keys)])?;
                if let Some(sql) = text::delete_dedup_of(&found) {
                    conn.execute_batch(&sql).map_err(store_error)?;
                }
                Ok(found)
            })
            .await?;
        Ok(found.into_iter().map(|(m, _)| m).collect())
    }

    async fn apply(&self, changes: &[Change], now_ms: i64) -> StoreResult<()> {
        let statements = text::apply_statements(Dialect::Sqlite, changes, now_ms);
        if statements.is_empty() {
            return Ok(());
        }
        self.call(move |conn| run(conn, &statements)).await
    }

    async fn scan(
        &self,
        after: (i64, u64),
        now_ms: i64,
        limit: usize,
    ) -> StoreResult<Vec<ItemMeta>> {
        let sql = format!(
            "SELECT {META_COLUMNS} FROM items INDEXED BY timer WHERE {} LIMIT {limit}",
            text::timer_range(after, now_ms)
        );
        let rows = self.rows();
        let found = self.call(move |conn| rows.metas(conn, &sql)).await?;
        Ok(found.into_iter().map(|(m, _)| m).collect())
    }

    async fn batch_committed(&self, batch: i64) -> StoreResult<BatchOutcome> {
        self.call(move |conn| {
            use rusqlite::OptionalExtension;
            let forgotten: Option<i64> = conn
                .query_row(&batches::read_forgotten(), [], |r| r.get(0))
                .optional()
                .map_err(store_error)?;
            if !batches::below(batch, forgotten) {
                conn.execute_batch(&batches::tombstone(Dialect::Sqlite, batch))
                    .map_err(store_error)?;
            }
            let c: Option<i64> = conn
                .query_row(&batches::read(batch), [], |r| r.get(0))
                .optional()
                .map_err(store_error)?;
            Ok(batches::outcome(c))
        })
        .await
    }

    async fn forward_committed(&self, token: i64, items: u32) -> StoreResult<ForwardOutcome> {
        self.call(move |conn| {
            use rusqlite::OptionalExtension;
            let forgotten: Option<i64> = conn
                .query_row(&batches::read_forgotten(), [], |r| r.get(0))
                .optional()
                .map_err(store_error)?;
            let forgotten = batches::below(token, forgotten);
            if !forgotten {
                conn.execute_batch(&forwards::tombstone(Dialect::Sqlite, token, items))
                    .map_err(store_error)?;
            }
            let mut st = conn.prepare(&forwards::read(token)).map_err(store_error)?;
            let stored = st
                .query_map([], |r| {
                    Ok((
                        r.get::<_, u32>(0)?,
                        r.get::<_, i64>(1)? as u64,
                        r.get::<_, i64>(2)? != 0,
                    ))
                })
                .map_err(store_error)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(store_error)?;
            Ok(ForwardOutcome { stored, forgotten })
        })
        .await
    }

    async fn forget_batches(&self, before_ms: i64) -> StoreResult<u64> {
        self.call(move |conn| {
            conn.execute_batch(&batches::raise_forgotten(Dialect::Sqlite, before_ms))
                .map_err(store_error)?;
            let marks = conn
                .execute(&batches::forget(Dialect::Sqlite, before_ms), [])
                .map_err(store_error)?;
            let forwarded = conn
                .execute(&forwards::forget(Dialect::Sqlite, before_ms), [])
                .map_err(store_error)?;
            Ok((marks + forwarded) as u64)
        })
        .await
    }

    async fn save_checkpoint(&self, checkpoint_ms: i64) -> StoreResult<()> {
        self.call(move |conn| {
            conn.execute(
                "INSERT INTO foqs_meta (name, value) VALUES ('checkpoint_ms', ?1)
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                [checkpoint_ms],
            )
            .map_err(store_error)?;
            Ok(())
        })
        .await
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
        let (statements, kept) = (forget_sql(&ids), kept_sql(&ids));
        let kept = self
            .call(move |conn| {
                for s in &statements {
                    conn.execute(s, []).map_err(store_error)?;
                }
                let mut st = conn.prepare(&kept).map_err(store_error)?;
                let kept = st
                    .query_map([], |r| r.get::<_, u32>(0))
                    .map_err(store_error)?
                    .collect::<rusqlite::Result<Vec<_>>>()
                    .map_err(store_error)?;
                Ok(kept)
            })
            .await?;
        Ok(self.topics.lock().expect("topics").forgotten(&ids, &kept))
    }

    async fn add_totals(&self, deltas: &[(TopicName, Totals)]) -> StoreResult<()> {
        if deltas.is_empty() {
            return Ok(());
        }
        let (sql, tids) = totals_sql(Dialect::Sqlite, &self.topics, deltas);
        self.call(move |conn| conn.execute_batch(&sql).map_err(store_error))
            .await?;
        self.topics.lock().expect("topics").confirm(&tids);
        Ok(())
    }

    async fn state_counts(&self, topic: Option<&TopicName>) -> StoreResult<Vec<StateCount>> {
        self.count_states(topic).await
    }

    async fn ping(&self) -> StoreResult<()> {
        // On the writer's thread, behind every write given to it before (the settling of
        // doubts counts on that). `SELECT 1` passes on a full disk; this asks for what a
        // write needs: room on the disk for about a batch (a scratch file beside the
        // database, written, synced and removed: a page cache cannot hide a full disk
        // from an fsync), room in the file (allocated and given back: `max_page_count`),
        // and a committed change.
        let scratch = PathBuf::from(format!("{}.probe", opened(&self.thread)?.path().display()));
        self.call(move |conn| {
            room_on_disk(&scratch)?;
            conn.execute_batch(&format!(
                "INSERT INTO foqs_meta (name, value) VALUES ('probe_count', 1)
                   ON CONFLICT (name) DO UPDATE SET value = value + 1;
                 SAVEPOINT room;
                 INSERT INTO foqs_meta (name, value) VALUES ('probe_room', zeroblob({PROBE_BYTES}));
                 ROLLBACK TO room;
                 RELEASE room;"
            ))
            .map_err(store_error)
        })
        .await
    }

    fn runs_in_order(&self) -> bool {
        // Every write is a job on the shard's one thread, in the order it was given.
        true
    }

    fn nice_knob(&self) -> Option<super::NiceKnob> {
        Some(self.nice.clone())
    }

    async fn close(&self) {
        let reader = self.reader.lock().expect("reader").take();
        if let Some(reader) = reader {
            if let Ok(reader) = Arc::try_unwrap(reader) {
                let _ = tokio::task::spawn_blocking(move || reader.close()).await;
            }
        }
        let thread = self.thread.lock().expect("thread").take();
        if let Some(thread) = thread {
            // Jobs still in flight hold the thread too; the last one out closes it.
            if let Ok(thread) = Arc::try_unwrap(thread) {
                let _ = tokio::task::spawn_blocking(move || thread.close()).await;
            }
        }
    }
}
