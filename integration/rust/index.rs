//! The ready index has one writer, its shard's worker. An earlier build let peeks answered
//! beside the worker (`ShardHandle::peek`) add topics to the index, and so evict others,
//! while the worker was refilling a topic from storage: the refill then landed in a fresh
//! entry that claimed to cover every key, and the topic's most urgent items were hidden.
//! Here the refill is held at a gate (a wrapper around the real MySQL store that waits
//! before `ready_keys` while armed), so the interleaving is certain.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use foqs::clock::{SharedClock, SystemClock};
use foqs::metrics::Metrics;
use foqs::model::{Item, NewItem, Policy, ReadyKey, TopicCounts, TopicName, TopicSnapshot, Totals};
use foqs::shard::ShardWorker;
use foqs::store::{Change, ItemMeta, MySqlStore, Recovered, ShardStore, StateCount, StoreResult};
use foqs::waiters::Waiters;
use tokio::sync::Notify;

/// Holds `ready_keys` while armed: `waiting` says a refill got there, `open` lets it go.
#[derive(Default)]
struct Gate {
    armed: AtomicBool,
    waiting: Notify,
    open: Notify,
}

/// The real store, with its `ready_keys` behind a [`Gate`] the test keeps a handle on
/// (`ShardWorker::start` takes the store by value).
struct Gated {
    inner: MySqlStore,
    gate: Arc<Gate>,
}

/// Every other operation goes straight to the real store.
macro_rules! delegate {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $out:ty;)*) => {
        impl ShardStore for Gated {
            async fn ready_keys(
                &self,
                ns: &str,
                topic: &str,
                after: Option<ReadyKey>,
                now_ms: i64,
                limit: usize,
            ) -> StoreResult<Vec<ReadyKey>> {
                if self.gate.armed.swap(false, Ordering::SeqCst) {
                    let opened = self.gate.open.notified();
                    self.gate.waiting.notify_one();
                    opened.await;
                }
                self.inner.ready_keys(ns, topic, after, now_ms, limit).await
            }

            async fn close(&self) {
                ShardStore::close(&self.inner).await
            }

            $(async fn $name(&self, $($arg: $ty),*) -> $out { self.inner.$name($($arg),*).await })*
        }
    };
}

delegate! {
    open() -> StoreResult<Recovered>;
    insert(rows: &[(u64, NewItem)], hwm: Option<u64>, now_ms: i64) -> StoreResult<()>;
    claim(keys: &[u64], now_ms: i64, token: i64) -> StoreResult<Vec<Item>>;
    fetch_ready(keys: &[u64], now_ms: i64) -> StoreResult<Vec<Item>>;
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

fn new_item(topic: &str, priority: i32) -> NewItem {
    let now = foqs::clock::Clock::now_ms(&SystemClock);
    NewItem {
        ns: "ix".into(),
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

fn topic(t: &str) -> TopicName {
    TopicName {
        ns: "ix".into(),
        topic: t.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refill_racing_other_topics_never_hides_the_most_urgent_items() {
    let db = TestDb::new(1);
    let gate = Arc::new(Gate::default());
    let store = Gated {
        inner: MySqlStore::new(0, &db.url(0), 4).unwrap(),
        gate: gate.clone(),
    };
    let cfg = common::faulty::worker_config();
    let clock: SharedClock = Arc::new(SystemClock);
    let (shard, worker) = ShardWorker::start(
        0,
        store,
        clock,
        cfg,
        Waiters::new(),
        Arc::new(Metrics::new()),
    )
    .await
    .unwrap();
    let enqueue = |items: Vec<NewItem>| {
        let s = shard.clone();
        async move {
            s.submit_enqueue(items)
                .map_err(|(_, e)| e)
                .unwrap()
                .wait()
                .await
                .unwrap()
        }
    };
    for _ in 0..3 {
        enqueue((0..500).map(|_| new_item("a", 5)).collect()).await;
    }
    // The index loads 1000 of the 1500 keys of "a" (partial), 990 are claimed: 10 left.
    let keys = shard.peek(topic("a"), 990).await.unwrap();
    assert_eq!(shard.claim(topic("a"), keys).await.unwrap().len(), 990);
    let urgent = enqueue(vec![new_item("a", 0)]).await[0].0;

    // A peek of 50 needs a refill of "a": held at the gate.
    gate.armed.store(true, Ordering::SeqCst);
    let waiting = gate.waiting.notified();
    let refill = tokio::spawn({
        let s = shard.clone();
        async move { s.peek(topic("a"), 50).await.unwrap() }
    });
    waiting.await;
    // Meanwhile, peeks of 10 other topics ("a" plus them: one more than index_topics_max).
    let others: Vec<_> = (0..10)
        .map(|i| {
            let s = shard.clone();
            tokio::spawn(async move { s.peek(topic(&format!("b{i}")), 1).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate.open.notify_one();
    let head = refill.await.unwrap();
    for o in others {
        assert!(o.await.unwrap().unwrap().is_empty());
    }
    assert_eq!(
        head.first().map(|k| k.key),
        Some(urgent),
        "the most urgent item is hidden: the refill's head is {:?}",
        &head[..head.len().min(3)]
    );
    assert_eq!(head.len(), 50);
    shard.shutdown().await;
    worker.await.unwrap();
}
