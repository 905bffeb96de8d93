//! Writes whose outcome the shard's worker cannot know: the store commits and then reports
//! a timeout ([`common::faulty`]). After such a write, whatever it made ready is handed
//! out without a restart: the worker must not go on trusting an index that says the
//! topic holds nothing.

use crate::common;

use std::time::Duration;

use common::shard as faulty;
use common::*;
use foqs::model::{ItemState, NewItem, TopicName};
use foqs::shard::{AckOp, NackOp, Settled, ShardHandle, WorkerConfig};
use foqs::store::faulty::{Fault, Faults};

mod unanswered;

fn new_item(t: &str) -> NewItem {
    faulty::new_item("out", t, 0)
}

fn topic(t: &str) -> TopicName {
    faulty::topic("out", t)
}

/// A worker over the real store of `db`'s shard 0 with faults the test arms; background
/// scans far apart, so that only the test's calls touch the index.
async fn start(db: &TestDb) -> (ShardHandle, tokio::task::JoinHandle<()>, Faults) {
    start_with(db, faulty::worker_config()).await
}

async fn start_with(
    db: &TestDb,
    cfg: WorkerConfig,
) -> (ShardHandle, tokio::task::JoinHandle<()>, Faults) {
    // Injected failures must not open the breaker and hide the shard.
    let cfg = WorkerConfig {
        breaker_failures_max: 100,
        ..cfg
    };
    faulty::faulty_worker(db, cfg).await
}

/// Enqueues one item on `t` and delivers it (handed out: leased to a consumer; a staged
/// item is ready as far as a nack knows); returns its key.
async fn delivered_item(shard: &ShardHandle, t: &str) -> u64 {
    delivered(shard, t).await.id.key
}

/// [`delivered_item`], returning the delivery (its `lease_token` is the lease id).
async fn delivered(shard: &ShardHandle, t: &str) -> foqs::model::Item {
    let key = shard
        .submit_enqueue(vec![new_item(t)], None)
        .map_err(|(_, e)| e)
        .unwrap()
        .wait()
        .await
        .unwrap()[0]
        .0;
    let keys = shard.peek(topic(t), 10, now_ms()).await.unwrap();
    let claimed = shard.claim(topic(t), keys).await.unwrap();
    let mut out = shard.hand_out(claimed);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].id.key, key);
    out.remove(0)
}

fn ack_op(key: u64, lease_id: Option<i64>) -> AckOp {
    AckOp { key, lease_id }
}

/// Issue 32: an ack whose DELETE committed is never answered with an error. The store
/// commits and then fails; the worker looks again, finds the row gone and answers done
/// (before, the caller heard a storage error, and its retry NOT_FOUND). A DELETE that
/// failed before committing still fails (retryably), and its retry deletes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_that_committed_is_answered_done_whatever_its_store_said() {
    let db = TestDb::mysql(1);
    let (shard, worker, faults) = start(&db).await;
    let x = delivered_item(&shard, "acked").await;
    faults.arm("delete", Fault::FailAfterCommit);
    let r = shard.ack(vec![ack_op(x, None)]).await;
    assert_eq!(
        r.unwrap(),
        vec![Settled::Done],
        "committed: done, not an error"
    );
    assert_eq!(db.count("1").await, 0);
    // Retried (the client never heard): done again, from the worker's memory.
    assert_eq!(
        shard.ack(vec![ack_op(x, None)]).await.unwrap(),
        vec![Settled::Done]
    );
    let y = delivered_item(&shard, "acked").await;
    faults.arm("delete", Fault::FailBefore);
    assert!(
        shard.ack(vec![ack_op(y, None)]).await.is_err(),
        "nothing applied"
    );
    assert_eq!(db.count("1").await, 1);
    assert_eq!(
        shard.ack(vec![ack_op(y, None)]).await.unwrap(),
        vec![Settled::Done]
    );
    assert_eq!(db.count("1").await, 0);
    shard.shutdown().await;
    worker.await.unwrap();
}

/// Issue 32: a nack naming its lease whose UPDATE committed and whose answer was lost is,
/// retried, done: the row records the lease a consumer's nack settled, so the retry knows
/// its first try applied, even once the item was delivered again. A nack whose UPDATE
/// failed before committing applies on its retry. A nack naming a lease nobody settled is
/// `lease_ended`. (Before: the retry answered `NOT_FOUND`, and the client could not tell
/// done from not done.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_that_committed_is_done_when_retried_even_after_the_next_delivery() {
    let db = TestDb::mysql(1);
    let (shard, worker, faults) = start(&db).await;
    let nack_of = |key: u64, lease: i64, to_dlq: bool| NackOp {
        key,
        delay_ms: 0,
        metadata: None,
        to_dlq,
        lease_id: Some(lease),
        token: None,
    };
    let first = delivered(&shard, "n").await;
    let (key, lease) = (first.id.key, first.lease_token);
    faults.arm("apply", Fault::FailAfterCommit);
    assert!(
        shard.nack(vec![nack_of(key, lease, false)]).await.is_err(),
        "the store said it timed out"
    );
    // Delivered again (the nack had applied), then the first nack retried: done.
    let keys = shard.peek(topic("n"), 10, now_ms()).await.unwrap();
    let claimed = shard.claim(topic("n"), keys).await.unwrap();
    let second = shard.hand_out(claimed).remove(0);
    assert_eq!(second.id.key, key);
    assert_ne!(second.lease_token, lease);
    assert_eq!(
        shard.nack(vec![nack_of(key, lease, false)]).await.unwrap(),
        vec![Settled::Done]
    );
    // And it did not touch the second delivery's lease.
    assert_eq!(
        shard
            .nack(vec![nack_of(key, lease + 1_000_000, false)])
            .await
            .unwrap(),
        vec![Settled::LeaseEnded]
    );
    assert_eq!(
        shard
            .nack(vec![nack_of(key, second.lease_token, true)])
            .await
            .unwrap(),
        vec![Settled::Done],
        "the second delivery's own nack (to the dead letters) settles it"
    );
    // Failed before committing: not applied, and its retry applies it.
    let third = delivered(&shard, "m").await;
    faults.arm("apply", Fault::FailBefore);
    assert!(shard
        .nack(vec![nack_of(third.id.key, third.lease_token, false)])
        .await
        .is_err());
    assert_eq!(db.count_in(ItemState::Leased, "").await, 1);
    assert_eq!(
        shard
            .nack(vec![nack_of(third.id.key, third.lease_token, false)])
            .await
            .unwrap(),
        vec![Settled::Done]
    );
    assert_eq!(db.count_in(ItemState::Leased, "").await, 0);
    shard.shutdown().await;
    worker.await.unwrap();
}

/// Issue 32: the same for a nack without `lease_id`: its token (drawn by the host that
/// took the call) is kept in the row, so its retry, after the item was delivered again,
/// is done and leaves the new delivery's lease alone. (Before: an unnamed nack in doubt
/// could not be retried: it would have settled the next delivery.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unnamed_nack_that_committed_is_done_when_retried_and_spares_the_next_delivery() {
    let db = TestDb::new(1);
    let (shard, worker, faults) = start(&db).await;
    let unnamed = |key: u64, token: i64| NackOp {
        key,
        delay_ms: 0,
        metadata: None,
        to_dlq: false,
        lease_id: None,
        token: Some(token),
    };
    let first = delivered(&shard, "u").await;
    let key = first.id.key;
    faults.arm("apply", Fault::FailAfterCommit);
    assert!(
        shard.nack(vec![unnamed(key, -7)]).await.is_err(),
        "the store said it timed out"
    );
    let keys = shard.peek(topic("u"), 10, now_ms()).await.unwrap();
    let claimed = shard.claim(topic("u"), keys).await.unwrap();
    let second = shard.hand_out(claimed).remove(0);
    assert_eq!(second.id.key, key, "delivered again: the nack had applied");
    assert_eq!(
        shard.nack(vec![unnamed(key, -7)]).await.unwrap(),
        vec![Settled::Done]
    );
    assert_eq!(
        db.count_in(ItemState::Leased, "").await,
        1,
        "the retry left the second delivery leased"
    );
    // Another nack (another token) settles whatever lease the item is on: the second.
    assert_eq!(
        shard.nack(vec![unnamed(key, -8)]).await.unwrap(),
        vec![Settled::Done]
    );
    assert_eq!(db.count_in(ItemState::Leased, "").await, 0);
    assert_eq!(db.count_in(ItemState::Ready, "delivery_count = 2").await, 1);
    shard.shutdown().await;
    worker.await.unwrap();
}

/// An ack naming a lease deletes only that delivery's item; a retry of a done ack is done
/// (same lease or none), one naming another lease is "lease ended"; the memory is
/// bounded by `ack_memory_items_max` (the oldest forgotten first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_are_remembered_per_lease_within_their_bound() {
    let db = TestDb::mysql(1);
    let cfg = WorkerConfig {
        ack_memory_items_max: 2,
        ..faulty::worker_config()
    };
    let (shard, worker, _faults) = start_with(&db, cfg).await;
    let x = delivered(&shard, "mem").await;
    let (key, lease) = (x.id.key, x.lease_token);
    let ack = |ops: Vec<AckOp>| shard.ack(ops);
    assert_eq!(
        ack(vec![ack_op(key, Some(lease + 1))]).await.unwrap(),
        vec![Settled::LeaseEnded],
        "another delivery's lease"
    );
    assert_eq!(db.count("1").await, 1, "left alone");
    assert_eq!(
        ack(vec![ack_op(key, Some(lease))]).await.unwrap(),
        vec![Settled::Done]
    );
    assert_eq!(db.count("1").await, 0);
    assert_eq!(
        ack(vec![
            ack_op(key, Some(lease)),
            ack_op(key, None),
            ack_op(key, Some(lease + 1)),
            ack_op(999_999_999, None),
        ])
        .await
        .unwrap(),
        vec![
            Settled::Done,
            Settled::Done,
            Settled::LeaseEnded,
            Settled::NotFound
        ]
    );
    // Two more acks: the first one is forgotten (items_max 2).
    for _ in 0..2 {
        let k = delivered_item(&shard, "mem").await;
        assert_eq!(
            ack(vec![ack_op(k, None)]).await.unwrap(),
            vec![Settled::Done]
        );
    }
    assert_eq!(
        ack(vec![ack_op(key, None)]).await.unwrap(),
        vec![Settled::NotFound]
    );
    shard.shutdown().await;
    worker.await.unwrap();
}

/// Enqueues one item on `t`, delivers it and nacks it to the dead letters; the index then
/// knows `t` holds nothing ready.
async fn dead_item(shard: &ShardHandle, t: &str) -> u64 {
    let key = delivered_item(shard, t).await;
    let nacked = shard
        .nack(vec![NackOp {
            key,
            delay_ms: 0,
            metadata: None,
            to_dlq: true,
            lease_id: None,
            token: None,
        }])
        .await
        .unwrap();
    assert!(matches!(nacked[0], Settled::Done));
    assert!(shard.peek(topic(t), 10, now_ms()).await.unwrap().is_empty());
    key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_requeue_whose_outcome_is_unknown_strands_nothing() {
    let db = TestDb::mysql(1);
    let (shard, worker, faults) = start(&db).await;
    // dlqRequeue of one id: the revive commits, the worker hears a timeout.
    let x = dead_item(&shard, "one").await;
    faults.arm("apply", Fault::FailAfterCommit);
    assert!(shard.revive(vec![x], Some(-7)).await.is_err());
    // Its retry under the same token knows its own work; another requeue does not.
    assert_eq!(
        shard.revive(vec![x], Some(-7)).await.unwrap(),
        vec![Settled::Done]
    );
    assert_eq!(
        shard.revive(vec![x], Some(-8)).await.unwrap(),
        vec![Settled::NotFound]
    );
    let head = shard.peek(topic("one"), 10, now_ms()).await.unwrap();
    assert_eq!(
        head.first().map(|k| k.key),
        Some(x),
        "the revived item is ready in storage and must be found"
    );
    // dlqRequeueAll: the same.
    let y = dead_item(&shard, "all").await;
    faults.arm("apply", Fault::FailAfterCommit);
    assert!(shard.revive_some(topic("all"), 10).await.is_err());
    let head = shard.peek(topic("all"), 10, now_ms()).await.unwrap();
    assert_eq!(head.first().map(|k| k.key), Some(y));
    shard.shutdown().await;
    worker.await.unwrap();
}

/// Risk 2 of issue 18: a nack whose statement the worker gave up on commits later (MySQL
/// goes on running it). A refill between the timeout and the late commit finds the topic
/// empty; without a second look once the outcome has settled, the item, ready in storage,
/// would never be handed out (nor its lease expire: it has none) until a restart. The
/// counts behind topicStats said "leased" meanwhile; they must say "ready" again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_that_commits_after_its_timeout_strands_nothing_and_the_counts_heal() {
    let db = TestDb::mysql(1);
    // A short store timeout (so a short settle window), scans often enough to settle.
    let cfg = WorkerConfig {
        store_timeout_ms: 300,
        scan_interval_ms: 50,
        ..faulty::worker_config()
    };
    let (shard, worker, faults) = start_with(&db, cfg).await;
    let key = delivered_item(&shard, "late").await;
    faults.arm("apply", Fault::CommitLate(Duration::from_millis(200)));
    let nacked = shard
        .nack(vec![NackOp {
            key,
            delay_ms: 0,
            metadata: None,
            to_dlq: false,
            lease_id: None,
            token: None,
        }])
        .await;
    assert!(nacked.is_err(), "the worker hears a timeout: {nacked:?}");
    // The refill right after the failure reads the row still leased.
    assert!(shard
        .peek(topic("late"), 10, now_ms())
        .await
        .unwrap()
        .is_empty());
    let t = std::time::Instant::now();
    let found = loop {
        let head = shard.peek(topic("late"), 10, now_ms()).await.unwrap();
        if !head.is_empty() || t.elapsed() > Duration::from_secs(10) {
            break head;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        found.first().map(|k| k.key),
        Some(key),
        "the nacked item, ready in storage, is never handed out"
    );
    // Found within the settle window (store timeout + 1 s) plus a scan interval or two.
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "found after {:?}",
        t.elapsed()
    );
    let counts = eventually(Duration::from_secs(5), "counts say ready", || {
        let snap = shard.ns_counts(now_ms());
        let out = snap.iter().find(|(ns, _)| ns == "out")?.1;
        (out.ready == 1 && out.leased == 0).then_some(out)
    })
    .await;
    assert_eq!(counts.ready, 1);
    shard.shutdown().await;
    worker.await.unwrap();
}

/// A delivery leaves the host with a useful lease: a dequeue of two topics whose first
/// topic's claim came back late (the host's clock moved 600 ms of a 1,000 ms lease while
/// the store held it) re-leases that item before the reply leaves, instead of handing
/// out a lease with 400 ms left that ends before a consumer across a network can use it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_leaves_with_at_least_half_its_lease() {
    use foqs::clock::{Clock, ManualClock};
    use foqs::core::{AckRequestItem, Caller, EnqueueRequestItem, TopicRequest};
    use std::sync::Arc;

    const LEASE_MS: i64 = 1_000;
    let db = TestDb::new(1);
    let clock = ManualClock::new(1_000_000_000_000);
    let (running, faults) = foqsd_with_faults(&db, FAST_ENGINE, Arc::new(clock.clone())).await;
    let host = running.host.clone();
    let caller = Caller::anonymous();
    for t in ["a", "b"] {
        let r = host
            .enqueue(
                &caller,
                vec![EnqueueRequestItem {
                    ns: "out".into(),
                    topic: t.into(),
                    payload: t.as_bytes().to_vec(),
                    lease_ms: Some(LEASE_MS),
                    ..Default::default()
                }],
                (None, None),
                None,
            )
            .await
            .unwrap();
        assert!(r[0].is_ok(), "{r:?}");
    }
    // Topic a's claim is held in the store while the clock passes 600 ms of its lease.
    faults.arm("claim", Fault::Hold);
    let waiting = faults.waiting().notified();
    let dequeue = tokio::spawn({
        let host = host.clone();
        async move {
            let topics = ["a", "b"]
                .map(|t| TopicRequest {
                    ns: "out".into(),
                    topic: t.into(),
                    count: 1,
                    before: (None, None),
                })
                .to_vec();
            host.dequeue(&Caller::anonymous(), topics, None, false)
                .await
        }
    });
    waiting.await;
    clock.advance(600);
    faults.release();
    let got = dequeue.await.unwrap().unwrap();
    let now = clock.now_ms();
    let payloads: Vec<&[u8]> = got.iter().map(|i| i.payload.as_slice()).collect();
    assert_eq!(payloads, [b"a", b"b"], "both topics' items are delivered");
    for it in &got {
        assert_eq!(it.lease_ms, LEASE_MS);
        assert!(
            it.lease_expires_ms - now >= LEASE_MS / 2,
            "{:?} left the host with {} ms of its {LEASE_MS} ms lease",
            String::from_utf8_lossy(&it.payload),
            it.lease_expires_ms - now
        );
    }
    assert!(
        host.metrics()
            .encode()
            .contains("foqs_dequeue_leases_renewed_total{outcome=\"renewed\"} 1"),
        "a's renewal counted (b was claimed after the clock moved)"
    );
    // The renewed lease is the one storage holds: an ack with that delivery's id works
    // after the first lease would have ended.
    clock.advance(500);
    let acks = got
        .iter()
        .map(|i| AckRequestItem {
            id: i.id.to_string(),
            lease_id: Some(i.lease_token),
        })
        .collect();
    let acked = host.ack_items(&caller, acks, (None, None)).await.unwrap();
    assert!(acked.iter().all(|r| r.is_ok()), "{acked:?}");
    running.shutdown().await;
}
