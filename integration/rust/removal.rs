//! A shard removed from a host (a hand-over, a lost lock, a dead worker) while a dequeue
//! is claiming on it: the items that claim leased are handed out to that dequeue, not
//! dropped leased by nobody (issue 18, risk 4: on the next owner their leases would have
//! ended as real deliveries, an at-most-once item deleted unseen).

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use foqs::clock::SystemClock;
use foqs::config::Config;
use foqs::core::{Caller, EnqueueRequestItem, TopicRequest};
use foqs::store::faulty::{Fault, Faults};

/// A host on `db`'s one shard (with faults the test arms) holding one at-most-once item of
/// topic `topic` in namespace "rm".
async fn start_with_one_item(
    db: &TestDb,
    topic: &str,
    lease_ms: Option<i64>,
) -> (foqs::daemon::Running, Faults) {
    let cfg = Config::from_toml(&config_toml(db, "", FAST_ENGINE)).unwrap();
    let faults = Faults::default();
    let plan = BTreeMap::from([(0, faults.clone())]);
    let running = foqs::daemon::start_with_faults(&cfg, Arc::new(SystemClock), plan)
        .await
        .unwrap();
    let enqueued = running
        .host
        .enqueue(
            &Caller::anonymous(),
            vec![EnqueueRequestItem {
                ns: "rm".into(),
                topic: topic.into(),
                payload: b"once".to_vec(),
                policy: Some(2),
                lease_ms,
                ..Default::default()
            }],
            (None, None),
            None,
        )
        .await
        .unwrap();
    assert!(enqueued[0].is_ok());
    (running, faults)
}

/// Dequeues one item of `topic` (namespace "rm") in a task of its own, once its claim
/// is held in the store (`faults` armed with `Fault::Hold` on "claim"): returns when the
/// claim waits there.
async fn dequeue_held(
    host: &std::sync::Arc<foqs::core::Host>,
    faults: &Faults,
    topic: &'static str,
) -> tokio::task::JoinHandle<foqs::error::Result<Vec<foqs::model::Item>>> {
    faults.arm("claim", Fault::Hold);
    let waiting = faults.waiting().notified();
    let host = host.clone();
    let dequeue = tokio::spawn(async move {
        let t = TopicRequest {
            ns: "rm".into(),
            topic: topic.into(),
            count: 1,
            before: (None, None),
        };
        host.dequeue(&Caller::anonymous(), vec![t], None, false)
            .await
    });
    waiting.await;
    dequeue
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_claimed_while_their_shard_is_removed_are_handed_out() {
    let db = TestDb::new(1);
    let (running, faults) = start_with_one_item(&db, "t", None).await;
    let host = running.host.clone();
    // The dequeue's claim is held in the store; meanwhile the shard is removed.
    let dequeue = dequeue_held(&host, &faults, "t").await;
    let removal = tokio::spawn({
        let host = host.clone();
        async move { host.remove_shard(0).await }
    });
    // The removal has taken the shard out of the map and waits.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(host.shard_ids().is_empty());
    faults.release();
    let got = dequeue.await.unwrap().unwrap();
    assert_eq!(
        got.len(),
        1,
        "the item its claim leased was dropped, leased by nobody"
    );
    assert_eq!(got[0].payload, b"once");
    tokio::time::timeout(Duration::from_secs(10), removal)
        .await
        .expect("the removal ends")
        .unwrap();
    running.shutdown().await;
}

/// A planned stop of a shard (a move to another host, a switchover) gives back the leases
/// nobody was handed: here an at-most-once item whose claim committed while the worker
/// heard a timeout. Left leased, the shard's next owner, on another host, would count its
/// lease's end as the delivery and delete it unseen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_stop_gives_back_leases_nobody_was_handed() {
    let db = TestDb::new(1);
    let (running, faults) = start_with_one_item(&db, "amo", Some(600_000)).await;
    let host = running.host.clone();
    let caller = Caller::anonymous();
    faults.arm("claim", Fault::FailAfterCommit);
    let t = TopicRequest {
        ns: "rm".into(),
        topic: "amo".into(),
        count: 1,
        before: (None, None),
    };
    let got = host.dequeue(&caller, vec![t], None, false).await;
    assert!(
        got.as_ref().map_or(true, |g| g.is_empty()),
        "the claim's caller heard a timeout: {got:?}"
    );
    let state = |sql: &'static str| {
        let db = &db;
        async move { db.column(0, sql).await }
    };
    assert_eq!(
        state("SELECT state FROM items").await,
        vec![1],
        "the claim committed: leased, by nobody"
    );
    host.remove_shard(0).await;
    assert_eq!(
        state("SELECT state FROM items").await,
        vec![0],
        "given back: ready again"
    );
    assert_eq!(
        state("SELECT delivery_count FROM items").await,
        vec![0],
        "the delivery nobody saw is not counted"
    );
    running.shutdown().await;
}

/// A shard abandoned because its server was fenced (a failover) does not wait for claims
/// still out on the frozen server: the claim's keys were staged before its statement ran,
/// so the lease it may make is known at once as one nobody was handed (for the successor
/// to give back uncounted), and when its answer comes back late nothing of it is handed
/// out. (Before: the stop waited for every claim in flight on the host, up to a store
/// timeout on a frozen server, which held the reopen on the new primary.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_stop_knows_claims_still_out_without_waiting_for_them() {
    let db = TestDb::new(1);
    let (running, faults) = start_with_one_item(&db, "fenced", Some(600_000)).await;
    let host = running.host.clone();
    let dequeue = dequeue_held(&host, &faults, "fenced").await;
    // The claim is out (held, as on a frozen server): the abandon does not wait for it.
    tokio::time::timeout(
        Duration::from_secs(5),
        host.abandon_shard(0, Duration::from_millis(200)),
    )
    .await
    .expect("the fenced stop waited for a claim still out on the frozen server");
    let unseen = host.unseen_leases(0).unwrap_or_default();
    assert_eq!(
        unseen.len(),
        1,
        "the claim still out is a lease nobody was handed: {unseen:?}"
    );
    // The claim commits late: its answer is not handed out.
    faults.release();
    let got = dequeue.await.unwrap();
    assert!(
        got.as_ref().map_or(true, |g| g.is_empty()),
        "an item of an abandoned shard was handed out: {got:?}"
    );
    let leased: Vec<i64> = db
        .column(0, "SELECT lease_token FROM items WHERE state = 1")
        .await;
    assert_eq!(
        leased,
        vec![unseen[0].1],
        "the late claim's lease is the one the successor is told of"
    );
    running.shutdown().await;
}
