//! Long-poll dequeue (`wait_ms`): returns as soon as an item becomes ready in a requested
//! topic, empty after `wait_ms`; many waiters at once; shutdown ends the waits.

use crate::common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::*;
use foqs::thrift_gen::{EnqueueItem, ErrorCode};

const NS: &str = "longpoll";

/// The tests here measure latencies, and one runs 300 client threads: run one at a time,
/// so that none measures another's load (two latency bounds were missed in a loaded run
/// beside the crowd).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Starts a long poll on its own connection and thread; yields (items, elapsed).
fn poll(
    addr: std::net::SocketAddr,
    topics: Vec<foqs::thrift_gen::TopicRequest>,
    wait_ms: i64,
) -> std::thread::JoinHandle<(Vec<foqs::thrift_gen::Item>, Duration)> {
    std::thread::spawn(move || {
        let mut c = Client::connect(addr, Proto::Binary);
        let t = Instant::now();
        let got = c
            .try_dequeue_wait(topics, Some(wait_ms))
            .expect("long poll");
        (got, t.elapsed())
    })
}

/// The bound is counted from the enqueue's reply (the item is durable and ready from then
/// on), not from its start: the commit's own time is the store's, and on a loaded machine a
/// MariaDB commit alone has taken over 100 ms. A wake that relied on polling would miss the
/// bound every time; one slow commit or claim misses it once, so the best of three tries
/// counts, and every try is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_returns_within_100_ms_of_an_enqueue() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let mut tries = Vec::new();
    for attempt in 0..3 {
        let topic = format!("wake{attempt}");
        let waiter = std::thread::spawn({
            let addr = srv.addr;
            let topics = vec![topic_req(NS, "quiet", 5), topic_req(NS, &topic, 5)];
            move || {
                let mut c = Client::connect(addr, Proto::Binary);
                let got = c.try_dequeue_wait(topics, Some(10_000)).expect("long poll");
                (got, Instant::now())
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        c.enqueue(vec![item(NS, &topic, 0, b"hello")]);
        let replied = Instant::now();
        let (got, woke) = tokio::task::spawn_blocking(move || waiter.join().unwrap())
            .await
            .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].payload.as_deref(), Some(&b"hello"[..]));
        let after_reply = woke.saturating_duration_since(replied);
        tries.push((replied - started, after_reply));
        if after_reply < Duration::from_millis(100) {
            break;
        }
    }
    assert!(
        tries
            .iter()
            .any(|(_, woke)| *woke < Duration::from_millis(100)),
        "(enqueue took, woke after its reply) per try: {tries:?}"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_returns_empty_after_wait_ms_and_bad_waits_are_refused() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let (got, took) = tokio::task::spawn_blocking({
        let addr = srv.addr;
        move || {
            poll(addr, vec![topic_req(NS, "empty", 1)], 400)
                .join()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(got.is_empty());
    assert!(
        took >= Duration::from_millis(390) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    for bad in [-1, 30_001] {
        let e = foqs_error(
            c.try_dequeue_wait(vec![topic_req(NS, "empty", 1)], Some(bad))
                .unwrap_err(),
        );
        assert_eq!(e.code, Some(ErrorCode::INVALID_ARGUMENT), "wait_ms {bad}");
    }
    // With something ready, a long poll answers at once.
    c.enqueue(vec![item(NS, "full", 0, b"x")]);
    let t = Instant::now();
    assert_eq!(
        c.try_dequeue_wait(vec![topic_req(NS, "full", 1)], Some(5_000))
            .unwrap()
            .len(),
        1
    );
    assert!(t.elapsed() < Duration::from_millis(500));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacks_and_deferred_items_coming_due_wake_long_polls() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let id = c.enqueue(vec![item(NS, "nacked", 0, b"x")]).remove(0);
    assert_eq!(c.dequeue(NS, "nacked", 1).len(), 1);
    let waiter = poll(srv.addr, vec![topic_req(NS, "nacked", 1)], 10_000);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let nacked = Instant::now();
    c.nack(vec![nack(&id, None, None)]);
    let (got, _) = tokio::task::spawn_blocking(move || waiter.join().unwrap())
        .await
        .unwrap();
    assert_eq!(got[0].id.as_deref(), Some(id.as_str()));
    // Woken by the nack, long before the poll's 10 s: nothing else wakes it (no periodic
    // recheck). Usually within a few ms; the bound leaves room for a MySQL busy with the
    // other tests' schema changes (a clean-clone CI run once took 656 ms).
    assert!(
        nacked.elapsed() < Duration::from_millis(1_000),
        "{:?}",
        nacked.elapsed()
    );

    let due = now_ms() + 400;
    c.enqueue(vec![EnqueueItem {
        deliver_after_ms: Some(due),
        ..item(NS, "deferred", 0, b"later")
    }]);
    let (got, _) = tokio::task::spawn_blocking({
        let addr = srv.addr;
        move || {
            poll(addr, vec![topic_req(NS, "deferred", 1)], 10_000)
                .join()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let late = now_ms() - due;
    assert_eq!(got.len(), 1);
    assert!(
        (0..200).contains(&late),
        "delivered {late} ms after it came due"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_waiters_each_get_their_own_item() {
    let _serial = ONE_AT_A_TIME.lock().await;
    // Seen once in CI: one waiter's connection took 1.07 s to open (a dropped SYN) and
    // was reset at its first request, and foqsd never logged it. A 1 s connect is the
    // SYN retransmit after a listen-queue overflow (reproduced with a 16-deep backlog: 283
    // of 300 connects took 1.0 s, ListenOverflows rose), so most likely CI's
    // `net.core.somaxconn` capped the backlog below 300 (test.sh now prints it). What this test is about is the long polls, so the
    // connections are opened, and each proven accepted with a call, one after another;
    // all 300 polls then wait together. The kernel's listen counters say more if not.
    logs_in_test_output();
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let before = listen_counters();
    let addr = srv.addr;
    let clients = tokio::task::spawn_blocking(move || {
        (0..300)
            .map(|_| {
                let mut c = Client::connect(addr, Proto::Binary);
                c.host_info();
                c
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let waiters: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            std::thread::spawn(move || {
                let t = Instant::now();
                c.try_dequeue_wait(vec![topic_req(NS, "crowd", 1)], Some(20_000))
                    .map_err(|e| format!("{e} (after {:?})", t.elapsed()))
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.enqueue((0..300).map(|i| item(NS, "crowd", i, b"x")).collect());
    let results = tokio::task::spawn_blocking(move || {
        waiters
            .into_iter()
            .map(|w| w.join().unwrap())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of 300 long polls failed: {failed:?}; kernel listen counters before {before:?}, after {:?}",
        failed.len(),
        listen_counters()
    );
    let ids: Vec<String> = results
        .into_iter()
        .flat_map(|got| got.unwrap().into_iter().map(|i| i.id.unwrap()))
        .collect();
    let unique: HashSet<&String> = ids.iter().collect();
    assert_eq!(ids.len(), 300, "every waiter got an item");
    assert_eq!(unique.len(), 300, "no item went to two waiters");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_long_polls_instead_of_waiting_for_them() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let srv = TestServer::start(3, "").await;
    let waiter = poll(srv.addr, vec![topic_req(NS, "never", 1)], 30_000);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    srv.stop().await;
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "shutdown took {:?}",
        t.elapsed()
    );
    let (got, took) = tokio::task::spawn_blocking(move || waiter.join().unwrap())
        .await
        .unwrap();
    assert!(got.is_empty());
    assert!(took < Duration::from_secs(5));
}
