//! [`Faulty`]: a real store with faults armed from the test, per operation: fail before
//! the operation runs, run it and then report a timeout (a write whose outcome the worker
//! cannot know: it happened), or hold it until the test lets it go. Test code only; the
//! store underneath is real. Also the small tools of tests that drive a `ShardWorker`
//! themselves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use foqs::clock::{Clock, SystemClock};
use foqs::model::{Item, NewItem, Policy, ReadyKey, TopicCounts, TopicName, TopicSnapshot, Totals};
use foqs::store::{Change, ItemMeta, Recovered, ShardStore, StateCount, StoreError, StoreResult};
use tokio::sync::Notify;

/// What an armed operation does, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Refused before it reaches the store.
    FailBefore,
    /// Runs (and commits), then the caller hears a timeout.
    FailAfterCommit,
    /// Waits: [`Faults::waiting`] is notified when it gets there, and it goes on when the
    /// test notifies [`Faults::open`].
    Hold,
}

/// The faults armed, by operation name (`"apply"`, `"insert"`, ...); each fires once.
#[derive(Default, Clone)]
pub struct Faults {
    armed: Arc<Mutex<HashMap<&'static str, Fault>>>,
    pub waiting: Arc<Notify>,
    pub open: Arc<Notify>,
}

impl Faults {
    pub fn arm(&self, op: &'static str, fault: Fault) {
        self.armed.lock().unwrap().insert(op, fault);
    }

    fn take(&self, op: &'static str) -> Option<Fault> {
        self.armed.lock().unwrap().remove(op)
    }
}

/// A worker configuration for tests that drive a `ShardWorker` themselves: background
/// scans a minute apart (so only the test's calls touch the index), a small index, no
/// breaker in the way, a generous store timeout.
pub fn worker_config() -> foqs::shard::WorkerConfig {
    foqs::shard::WorkerConfig {
        enqueue_batch_rows_max: 500,
        worker_queue_max: 1024,
        index_keys_per_topic_max: 1000,
        index_topics_max: 10,
        scan_interval_ms: 60_000,
        scan_rows_max: 1000,
        checkpoint_interval_ms: 60_000,
        breaker_failures_max: 3,
        breaker_slow_ms: 10_000,
        breaker_open_ms: 1000,
        store_timeout_ms: 20_000,
    }
}

/// An item for `ns`/`topic` with every field set plainly (ready now, at-least-once).
pub fn new_item(ns: &str, topic: &str, priority: i32) -> NewItem {
    let now = SystemClock.now_ms();
    NewItem {
        ns: ns.into(),
        topic: topic.into(),
        priority,
        payload: b"x".to_vec(),
        metadata: vec![],
        deliver_after_ms: now,
        enqueued_at_ms: now,
        lease_ms: 60_000,
        expires_at_ms: None,
        policy: Policy::AtLeastOnce,
        max_attempts: 5,
        dedup_key: None,
    }
}

pub fn topic(ns: &str, topic: &str) -> TopicName {
    TopicName {
        ns: ns.into(),
        topic: topic.into(),
    }
}

pub struct Faulty<S> {
    pub inner: S,
    pub faults: Faults,
}

async fn with_fault<T>(
    faults: &Faults,
    op: &'static str,
    run: impl std::future::Future<Output = StoreResult<T>>,
) -> StoreResult<T> {
    match faults.take(op) {
        None => run.await,
        Some(Fault::FailBefore) => Err(StoreError::Transient(format!("injected: {op} refused"))),
        Some(Fault::FailAfterCommit) => {
            let _ = run.await;
            Err(StoreError::Timeout(1))
        }
        Some(Fault::Hold) => {
            let opened = faults.open.notified();
            faults.waiting.notify_one();
            opened.await;
            run.await
        }
    }
}

macro_rules! faulty {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $out:ty;)*) => {
        impl<S: ShardStore> ShardStore for Faulty<S> {
            async fn close(&self) {
                ShardStore::close(&self.inner).await
            }

            $(async fn $name(&self, $($arg: $ty),*) -> $out {
                with_fault(&self.faults, stringify!($name), self.inner.$name($($arg),*)).await
            })*
        }
    };
}

faulty! {
    open() -> StoreResult<Recovered>;
    insert(rows: &[(u64, NewItem)], hwm: Option<u64>, now_ms: i64) -> StoreResult<()>;
    claim(keys: &[u64], now_ms: i64, token: i64) -> StoreResult<Vec<Item>>;
    fetch_ready(keys: &[u64], now_ms: i64) -> StoreResult<Vec<Item>>;
    ready_keys(ns: &str, topic: &str, after: Option<ReadyKey>, now_ms: i64, limit: usize) -> StoreResult<Vec<ReadyKey>>;
    dead_items(ns: &str, topic: &str, after: Option<ReadyKey>, limit: usize) -> StoreResult<Vec<(Item, i64)>>;
    purge_dead(ns: &str, topic: &str, limit: usize) -> StoreResult<u64>;
    dedup_lookup(ns: &str, topic: &str, keys: &[&str]) -> StoreResult<Vec<(String, u64)>>;
    lookup(keys: &[u64]) -> StoreResult<Vec<ItemMeta>>;
    delete(keys: &[u64]) -> StoreResult<Vec<ItemMeta>>;
    apply(changes: &[Change], now_ms: i64) -> StoreResult<()>;
    scan(after: (i64, u64), now_ms: i64, limit: usize) -> StoreResult<Vec<ItemMeta>>;
    save_checkpoint(checkpoint_ms: i64) -> StoreResult<()>;
    topic_counts(ns: &str, after: Option<&str>, now_ms: i64, limit: usize) -> StoreResult<Vec<TopicCounts>>;
    topic_snapshot(ns: &str, topic: &str, now: i64) -> StoreResult<TopicSnapshot>;
    add_totals(deltas: &[(TopicName, Totals)]) -> StoreResult<()>;
    state_counts() -> StoreResult<Vec<StateCount>>;
    ping() -> StoreResult<()>;
}
