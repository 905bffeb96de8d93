//! The small tools of tests that drive a `ShardWorker` themselves (the faults they inject
//! are `foqs::store::faulty`'s).

use foqs::clock::{Clock, SystemClock};
use foqs::model::{NewItem, Policy, TopicName};

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
        topic_forget_after_ms: 3_600_000,
        breaker_failures_max: 3,
        breaker_slow_ms: 10_000,
        breaker_open_ms: 1000,
        store_timeout_ms: 20_000,
        open_timeout_ms: 60_000,
        ack_memory_ms: 600_000,
        ack_memory_items_max: 100_000,
        dlq_bounds: Default::default(),
        enqueue_marks: true,
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

/// A worker over the real MySQL store of `db`'s shard 0, wrapped in the `Faulty` store
/// whose faults the test arms (returned).
pub async fn faulty_worker(
    db: &super::TestDb,
    cfg: foqs::shard::WorkerConfig,
) -> (
    foqs::shard::ShardHandle,
    tokio::task::JoinHandle<()>,
    foqs::store::faulty::Faults,
) {
    use foqs::store::faulty::{Faults, Faulty};
    let faults = Faults::default();
    let store = Faulty::new(
        foqs::store::MySqlStore::new(0, &db.url(0), 4).unwrap(),
        faults.clone(),
    );
    let (shard, worker) = foqs::shard::ShardWorker::start(
        0,
        store,
        std::sync::Arc::new(SystemClock),
        cfg,
        foqs::waiters::Waiters::new(),
        std::sync::Arc::new(foqs::metrics::Metrics::new()),
    )
    .await
    .unwrap();
    (shard, worker, faults)
}
