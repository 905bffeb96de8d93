//! Writes whose outcome the shard's worker cannot know: the store commits and then reports
//! a timeout ([`common::faulty`]). After such a write, whatever it made ready is handed
//! out without a restart: the worker must not go on trusting an index that says the
//! topic holds nothing.

mod common;

use std::sync::Arc;

use common::faulty::{self, Fault, Faults, Faulty};
use common::*;
use foqs::clock::{SharedClock, SystemClock};
use foqs::metrics::Metrics;
use foqs::model::{NewItem, TopicName};
use foqs::shard::{NackOp, Settled, ShardHandle, ShardWorker, WorkerConfig};
use foqs::store::MySqlStore;
use foqs::waiters::Waiters;

fn new_item(t: &str) -> NewItem {
    faulty::new_item("out", t, 0)
}

fn topic(t: &str) -> TopicName {
    faulty::topic("out", t)
}

/// A worker over the real store of `db`'s shard 0 with faults the test arms; background
/// scans far apart, so that only the test's calls touch the index.
async fn start(db: &TestDb) -> (ShardHandle, tokio::task::JoinHandle<()>, Faults) {
    let faults = Faults::default();
    let store = Faulty {
        inner: MySqlStore::new(0, &db.url(0), 4).unwrap(),
        faults: faults.clone(),
    };
    // Injected failures must not open the breaker and hide the shard.
    let cfg = WorkerConfig {
        breaker_failures_max: 100,
        ..common::faulty::worker_config()
    };
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
    (shard, worker, faults)
}

/// Enqueues one item on `t`, delivers it and nacks it to the dead letters; the index then
/// knows `t` holds nothing ready.
async fn dead_item(shard: &ShardHandle, t: &str) -> u64 {
    let key = shard
        .submit_enqueue(vec![new_item(t)])
        .map_err(|(_, e)| e)
        .unwrap()
        .wait()
        .await
        .unwrap()[0]
        .0;
    let keys = shard.peek(topic(t), 10).await.unwrap();
    let claimed = shard.claim(topic(t), keys).await.unwrap();
    // Handed out: leased to a consumer (a staged item is ready as far as a nack knows).
    assert_eq!(shard.hand_out(claimed).len(), 1);
    let nacked = shard
        .nack(vec![NackOp {
            key,
            delay_ms: 0,
            metadata: None,
            to_dlq: true,
            lease_id: None,
        }])
        .await
        .unwrap();
    assert!(matches!(nacked[0], Settled::Done));
    assert!(shard.peek(topic(t), 10).await.unwrap().is_empty());
    key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_requeue_whose_outcome_is_unknown_strands_nothing() {
    let db = TestDb::mysql(1);
    let (shard, worker, faults) = start(&db).await;
    // dlqRequeue of one id: the revive commits, the worker hears a timeout.
    let x = dead_item(&shard, "one").await;
    faults.arm("apply", Fault::FailAfterCommit);
    assert!(shard.revive(vec![x]).await.is_err());
    let head = shard.peek(topic("one"), 10).await.unwrap();
    assert_eq!(
        head.first().map(|k| k.key),
        Some(x),
        "the revived item is ready in storage and must be found"
    );
    // dlqRequeueAll: the same.
    let y = dead_item(&shard, "all").await;
    faults.arm("apply", Fault::FailAfterCommit);
    assert!(shard.revive_some(topic("all"), 10).await.is_err());
    let head = shard.peek(topic("all"), 10).await.unwrap();
    assert_eq!(head.first().map(|k| k.key), Some(y));
    shard.shutdown().await;
    worker.await.unwrap();
}
