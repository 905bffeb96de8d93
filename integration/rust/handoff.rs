//! The direct hand-off: an item enqueued while a consumer waits on its topic (a long poll,
//! or a dequeue that found nothing) is written already leased and handed over when its
//! INSERT commits, with no claim. What these tests hold it to: the consumer gets it on a
//! real lease, in priority order; a consumer that left does not take it away from the
//! next one (its delivery uncounted), at-most-once items included; kill -9 between the
//! commit and the hand-over loses nothing.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use foqs::model::ItemState;
use foqs::thrift_gen::{DeliveryPolicy, EnqueueItem, Item};

const NS: &str = "handoff";

/// Failpoints are per process and named by shard id: one test at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn handoffs(srv: &TestServer) -> u64 {
    srv.running.as_ref().unwrap().host.metrics().handoffs.get()
}

/// How many items of `topic` an enqueue would hand to waiting consumers now.
fn grant(srv: &TestServer, topic: &str) -> foqs::demand::Grant {
    srv.running.as_ref().unwrap().host.handoff_grant(NS, topic)
}

/// Waits until a long poll on `topic` is parked (at-most-once items may be handed then).
async fn parked(srv: &TestServer, topic: &str) {
    until(Duration::from_secs(10), "the long poll parks", || async {
        grant(srv, topic).at_most_once
    })
    .await;
}

fn payloads(items: &[Item]) -> Vec<Vec<u8>> {
    items.iter().map(|i| i.payload.clone().unwrap()).collect()
}

/// A long poll on its own connection and thread; `read_timeout` bounds the client's wait
/// for the reply (the connection is dropped, closed, when it passes).
fn long_poll(
    addr: std::net::SocketAddr,
    topic: &str,
    count: i32,
    wait_ms: i64,
    read_timeout: Duration,
) -> std::thread::JoinHandle<(thrift::Result<Vec<Item>>, Instant)> {
    let topics = vec![topic_req(NS, topic, count)];
    std::thread::spawn(move || {
        let c = foqs::client::connect(addr, Proto::Binary, read_timeout).expect("connect");
        let mut c = Client::from_sync(c);
        let r = c.try_dequeue_wait(topics, Some(wait_ms));
        (r, Instant::now())
    })
}

/// Waits until `check` holds, or panics after `within`.
async fn until<F: std::future::Future<Output = bool>>(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> F,
) {
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < within, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn join<T: Send + 'static>(h: std::thread::JoinHandle<T>) -> T {
    tokio::task::spawn_blocking(move || h.join().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_gets_items_enqueued_while_it_waits_on_a_lease_most_urgent_first() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let waiter = long_poll(srv.addr, "t", 2, 10_000, Duration::from_secs(20));
    parked(&srv, "t").await;
    let before = handoffs(&srv);
    c.enqueue(vec![
        item(NS, "t", 9, b"c"),
        item(NS, "t", 1, b"a"),
        item(NS, "t", 5, b"b"),
    ]);
    let replied = Instant::now();
    let (got, woke) = join(waiter).await;
    let got = got.expect("long poll");
    assert_eq!(payloads(&got), vec![b"a".to_vec(), b"b".to_vec()]);
    assert_eq!(handoffs(&srv) - before, 2, "both written leased, no claim");
    for i in &got {
        assert!(i.lease_id.unwrap() != 0, "a delivery names its lease");
        assert!(i.lease_expires_ms.unwrap() > now_ms());
        assert_eq!(i.delivery_count, Some(1));
    }
    eprintln!(
        "woke {:?} after the enqueue's reply",
        woke.saturating_duration_since(replied)
    );
    // The lease is real: nack and touch name it, and the row is leased in storage.
    let s = c.stats(NS, "t");
    assert_eq!(
        (s.ready, s.leased, s.delivered),
        (Some(1), Some(2), Some(2))
    );
    let ids: Vec<String> = got.iter().map(|i| i.id.clone().unwrap()).collect();
    let r = c.touch(&[(&ids[0], 5_000)]);
    assert!(r[0].error.is_none(), "{:?}", r[0].error);
    assert!(c.ack(&ids).iter().all(|r| r.error.is_none()));
    // The item not asked for was written ready.
    assert_eq!(payloads(&c.dequeue(NS, "t", 5)), vec![b"c".to_vec()]);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_handed_past_an_item_already_ready() {
    let _serial = ONE_AT_A_TIME.lock().await;
    // A clock that stands still: the 250 ms a dequeue that found nothing is waited for
    // never runs out here, so a grant of 0 below can only mean the topic is blocked.
    let clock = foqs::clock::ManualClock::new(now_ms());
    let srv =
        TestServer::start_with_clock(TestDb::new(1), "", "", std::sync::Arc::new(clock)).await;
    let mut c = srv.client();
    // A dequeue of one that finds nothing: one item may be handed to it.
    assert!(c.dequeue(NS, "o", 1).is_empty());
    assert_eq!(grant(&srv, "o").items, 1);
    let before = handoffs(&srv);
    c.enqueue(vec![item(NS, "o", 7, b"handed")]);
    // Asked for one: the next goes in ready, the usual way, and blocks further hand-offs.
    c.enqueue(vec![item(NS, "o", 1, b"urgent")]);
    c.enqueue(vec![item(NS, "o", 0, b"later")]);
    assert_eq!(handoffs(&srv) - before, 1);
    let got = c.dequeue(NS, "o", 3);
    assert_eq!(
        payloads(&got),
        vec![b"later".to_vec(), b"urgent".to_vec(), b"handed".to_vec()],
        "staged and ready items come out in one order"
    );
    // A nack makes an item ready while a consumer waits: what is enqueued next is not
    // handed ahead of it.
    let ids: Vec<String> = got.iter().map(|i| i.id.clone().unwrap()).collect();
    c.ack(&ids[1..]);
    assert!(c.dequeue(NS, "o", 1).is_empty(), "the rest is leased");
    assert!(
        grant(&srv, "o").items > 0,
        "it found nothing: items may be handed"
    );
    c.nack(vec![nack(&ids[0], None, None)]);
    assert_eq!(
        grant(&srv, "o").items,
        0,
        "the nacked item is the most urgent now"
    );
    let before = handoffs(&srv);
    c.enqueue(vec![item(NS, "o", 5, b"behind")]);
    assert_eq!(handoffs(&srv), before, "the nacked item is ready first");
    assert_eq!(
        payloads(&c.dequeue(NS, "o", 2)),
        vec![b"later".to_vec(), b"behind".to_vec()]
    );
    // Only a prefix in order is handed: an at-most-once item (no long poll waits) goes in
    // ready, and the less urgent item of the same enqueue is not handed ahead of it.
    assert!(c.dequeue(NS, "o2", 2).is_empty());
    assert_eq!(grant(&srv, "o2").items, 2);
    let before = handoffs(&srv);
    c.enqueue(vec![
        EnqueueItem {
            policy: Some(DeliveryPolicy::AT_MOST_ONCE),
            ..item(NS, "o2", 0, b"once")
        },
        item(NS, "o2", 5, b"five"),
    ]);
    assert_eq!(handoffs(&srv), before);
    assert_eq!(
        payloads(&c.dequeue(NS, "o2", 2)),
        vec![b"once".to_vec(), b"five".to_vec()]
    );
    srv.stop().await;
}

/// A long poll on `topic` parks; an enqueue of `new` is handed to it while the worker is
/// held at `failpoint` (3 s), and meanwhile the waiter gives up and closes its connection.
async fn hand_to_a_waiter_that_leaves(
    srv: &TestServer,
    topic: &str,
    failpoint: &str,
    new: EnqueueItem,
) {
    let waiter = long_poll(srv.addr, topic, 1, 10_000, Duration::from_millis(1500));
    parked(srv, topic).await;
    fail::cfg(failpoint, "1*return(3000)").unwrap();
    let before = handoffs(srv);
    let producer = std::thread::spawn({
        let addr = srv.addr;
        move || Client::connect(addr, Proto::Binary).enqueue(vec![new])
    });
    let (r, _) = join(waiter).await;
    assert!(
        r.is_err(),
        "the waiter gave up and closed its connection: {r:?}"
    );
    join(producer).await;
    fail::remove(failpoint);
    assert_eq!(handoffs(srv) - before, 1, "it was handed to the waiter");
}

/// The waiter's connection closes while the hand-off is planned and its INSERT not yet
/// run (the worker held there by a failpoint): the item is committed leased to nobody,
/// and the next consumer gets it, as its first delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_left_before_the_commit_leaves_the_item_to_the_next_consumer() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let scenario = fail::FailScenario::setup();
    let srv = TestServer::start(1, "").await;
    let new = item(NS, "gone", 0, b"x");
    hand_to_a_waiter_that_leaves(&srv, "gone", "shard-0-handoff-planned", new).await;
    let mut c = srv.client();
    let got = c.dequeue(NS, "gone", 5);
    assert_eq!(payloads(&got), vec![b"x".to_vec()]);
    assert_eq!(
        got[0].delivery_count,
        Some(1),
        "the waiter's delivery is not counted"
    );
    assert!(got[0].lease_id.unwrap() != 0);
    srv.stop().await;
    scenario.teardown();
}

/// An at-most-once item handed to a long poll that has gone by the time the INSERT
/// commits (held there by a failpoint) is released, ready again, uncounted: not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_at_most_once_item_handed_to_a_poll_that_left_is_released() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let scenario = fail::FailScenario::setup();
    let srv = TestServer::start(1, "").await;
    let new = EnqueueItem {
        policy: Some(DeliveryPolicy::AT_MOST_ONCE),
        ..item(NS, "amo", 0, b"once")
    };
    hand_to_a_waiter_that_leaves(&srv, "amo", "shard-0-handoff-committed", new).await;
    // Nobody takes it from the stage: released, ready in storage, its delivery undone.
    until(Duration::from_secs(5), "the item is released", || async {
        srv.db
            .count_in(ItemState::Ready, "delivery_count = 0")
            .await
            == 1
    })
    .await;
    // The worker puts it back in its ready index after that commit: a dequeue at once
    // may still miss it, so ask until one gets it.
    let mut c = srv.client();
    let start = Instant::now();
    let got = loop {
        let got = c.dequeue(NS, "amo", 5);
        if !got.is_empty() {
            break got;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the released item is dequeued again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(payloads(&got), vec![b"once".to_vec()]);
    assert_eq!(got[0].delivery_count, Some(1));
    srv.stop().await;
    scenario.teardown();
}

/// foqsd is killed after the INSERT of a handed item committed and before the hand-over
/// (a failpoint holds it there): the item, leased to nobody, comes back when the lease
/// ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_the_commit_and_the_hand_over_loses_nothing() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let db = TestDb::new(1);
    let config = write_config(&db, &config_toml(&db, "", FAST_ENGINE));
    let mut p = Proc::spawn(
        &config,
        &[("FAILPOINTS", "shard-0-handoff-committed=return(60000)")],
    );
    let waiter = long_poll(p.addr, "k9", 1, 20_000, Duration::from_secs(30));
    // Another process: its demand cannot be read from here; the poll parks within this.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let producer = std::thread::spawn({
        let addr = p.addr;
        move || {
            let c = foqs::client::connect(addr, Proto::Binary, Duration::from_secs(30)).unwrap();
            Client::from_sync(c).try_enqueue(vec![EnqueueItem {
                lease_ms: Some(1_500),
                ..item(NS, "k9", 0, b"kept")
            }])
        }
    });
    // The INSERT commits, then the worker stops at the failpoint.
    until(
        Duration::from_secs(10),
        "the handed row is stored",
        || async { db.count_in(ItemState::Leased, "").await == 1 },
    )
    .await;
    p.sigkill();
    assert!(join(waiter).await.0.is_err());
    assert!(
        join(producer).await.is_err(),
        "the enqueue was never answered"
    );

    let p = Proc::spawn(&config, &[]);
    let mut c = Client::connect(p.addr, Proto::Binary);
    let got = c
        .try_dequeue_wait(vec![topic_req(NS, "k9", 5)], Some(10_000))
        .expect("long poll");
    assert_eq!(payloads(&got), vec![b"kept".to_vec()]);
    // The crash counts the delivery nobody received, as for any staged item.
    assert_eq!(got[0].delivery_count, Some(2));
    drop(p);
    let _ = std::fs::remove_dir_all(config.parent().unwrap());
}

/// An INSERT carrying hand-offs that fails: the keys it staged before running stay staged
/// while its outcome is unknown, and once that has settled those of rows that do not exist
/// leave the staged set (it does not grow with every failed hand-off); those of rows that
/// do exist stay, leased by nobody, for their lease's end to give back uncounted. A worker
/// driven directly, over the real MySQL store wrapped in the fault injector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_staged_keys_of_a_failed_hand_off_are_let_go_once_its_outcome_is_known() {
    use common::shard as faulty;
    use foqs::store::faulty::{Fault, Faults, Faulty};
    let _serial = ONE_AT_A_TIME.lock().await;
    let db = TestDb::mysql(1);
    let faults = Faults::default();
    let store = Faulty::new(
        foqs::store::MySqlStore::new(0, &db.url(0), 4).unwrap(),
        faults.clone(),
    );
    let waiters = foqs::waiters::Waiters::new();
    let handed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    waiters.demand().set_sink(
        std::sync::Arc::new({
            let handed = handed.clone();
            move |_: &foqs::model::TopicName, items: Vec<foqs::model::Item>| {
                handed.lock().unwrap().extend(items);
                Vec::new()
            }
        }),
        std::sync::Arc::new(|_: &foqs::model::TopicName| usize::MAX),
    );
    let cfg = foqs::shard::WorkerConfig {
        scan_interval_ms: 50,
        store_timeout_ms: 300,
        ..faulty::worker_config()
    };
    let (shard, _worker) = foqs::shard::ShardWorker::start(
        0,
        store,
        std::sync::Arc::new(foqs::clock::SystemClock),
        cfg,
        waiters.clone(),
        std::sync::Arc::new(foqs::metrics::Metrics::new()),
    )
    .await
    .unwrap();
    let topic = faulty::topic("h", "t");
    let enqueue = |n: i32| {
        let shard = shard.clone();
        async move {
            let items = (0..n).map(|i| faulty::new_item("h", "t", i)).collect();
            shard
                .submit_enqueue(items, None)
                .map_err(|(_, e)| e)
                .unwrap()
                .wait()
                .await
        }
    };

    // Refused before anything was written: no row, so the keys go once it has settled.
    waiters
        .demand()
        .found_nothing(&topic, 10, now_ms(), waiters.demand().epoch(&topic));
    faults.arm("insert", Fault::FailBefore);
    assert!(enqueue(2).await.is_err());
    assert_eq!(
        shard.unseen_leases().len(),
        2,
        "staged before the INSERT ran"
    );
    until(
        Duration::from_secs(10),
        "the keys of rows that never were leave",
        || {
            let n = shard.unseen_leases().len();
            async move { n == 0 }
        },
    )
    .await;

    // Failed after its commit: the rows exist, leased by nobody; their keys stay.
    waiters
        .demand()
        .found_nothing(&topic, 10, now_ms(), waiters.demand().epoch(&topic));
    faults.arm("insert", Fault::FailAfterCommit);
    assert!(enqueue(3).await.is_err());
    assert_eq!(db.count_in(ItemState::Leased, "").await, 3);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        shard.unseen_leases().len(),
        3,
        "leases nobody holds stay known"
    );
    assert!(handed.lock().unwrap().is_empty());

    // And one that works is handed over, staged until a consumer takes it.
    waiters
        .demand()
        .found_nothing(&topic, 10, now_ms(), waiters.demand().epoch(&topic));
    enqueue(1).await.unwrap();
    assert_eq!(handed.lock().unwrap().len(), 1);
    assert_eq!(shard.unseen_leases().len(), 4);
    shard.shutdown().await;
}
