//! `foqsd` as a real process: SIGKILL or SIGTERM it with items in every state and under
//! enqueue load, start it again, and check that nothing an enqueue acknowledged is lost
//! and that every state comes back as it should.

use crate::common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use foqs::model::ItemState;
use foqs::thrift_gen::{DeliveryPolicy, EnqueueItem};

const NS: &str = "restart";

/// Every item id stored in the test's databases.
async fn stored_ids(db: &TestDb) -> HashSet<String> {
    let mut ids = HashSet::new();
    for s in 0..db.names.len() {
        for k in db.column(s, "SELECT CAST(id AS SIGNED) FROM items").await {
            ids.insert(format!("{s}:{k}"));
        }
    }
    ids
}

/// Producers that keep enqueueing until stopped, recording every acknowledged id.
fn start_producers(
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<String>>>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..3)
        .map(|p| {
            let (stop, acked) = (stop.clone(), acked.clone());
            std::thread::spawn(move || {
                // A plain thread: the harness client's block_in_place is fine outside tokio.
                let mut c = Client::connect(addr, Proto::Binary);
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    let items = (0..20)
                        .map(|i| item(NS, "load", (n + i) % 10, format!("p{p}-{n}-{i}").as_bytes()))
                        .collect();
                    match c.try_enqueue(items) {
                        Ok(results) => {
                            let mut a = acked.lock().unwrap();
                            a.extend(results.into_iter().filter_map(|r| r.id));
                        }
                        Err(_) => return, // the server went away mid-call: not acknowledged
                    }
                    n += 20;
                }
            })
        })
        .collect()
}

/// Puts items in every state; returns (ready, deferred, leased) ids.
fn fill_every_state(c: &mut Client) -> (Vec<String>, Vec<String>, Vec<String>) {
    let ready = c.enqueue((0..10).map(|i| item(NS, "states", i, b"ready")).collect());
    let deferred = c.enqueue(
        (0..3)
            .map(|i| EnqueueItem {
                deliver_after_ms: Some(now_ms() + 2_500),
                ..item(NS, "states", -10 - i, b"deferred")
            })
            .collect(),
    );
    let leased_ids = c.enqueue(
        (0..5)
            .map(|i| EnqueueItem {
                lease_ms: Some(2_500),
                ..item(NS, "states", -100 - i, b"leased")
            })
            .collect(),
    );
    let got = c.dequeue(NS, "states", 5);
    let mut leased: Vec<String> = got.into_iter().map(|i| i.id.unwrap()).collect();
    leased.sort();
    let mut want = leased_ids.clone();
    want.sort();
    assert_eq!(
        leased, want,
        "the most urgent ready items were the leased ones"
    );
    (ready, deferred, leased)
}

async fn check_every_state_survived(
    c: &mut Client,
    ready: &[String],
    deferred: &[String],
    leased: &[String],
) {
    assert_eq!(
        c.topics(NS).into_iter().find(|t| t.0 == "states"),
        Some(("states".to_string(), 10, 3, 5))
    );
    let got: HashSet<String> = c
        .dequeue(NS, "states", 100)
        .into_iter()
        .map(|i| i.id.unwrap())
        .collect();
    assert_eq!(
        got,
        ready.iter().cloned().collect(),
        "ready items after restart"
    );
    // Deferred items come due and leased ones expire back to ready, with a higher count.
    let mut back: Vec<foqs::thrift_gen::Item> = Vec::new();
    let start = Instant::now();
    while back.len() < 8 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "only {} of 8 came back",
            back.len()
        );
        back.extend(c.dequeue(NS, "states", 100));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in &back {
        let id = i.id.clone().unwrap();
        if leased.contains(&id) {
            assert_eq!(i.delivery_count, Some(2), "{id}");
        } else {
            assert!(deferred.contains(&id), "{id}");
            assert_eq!(i.delivery_count, Some(1), "{id}");
        }
    }
}

/// How a test stops foqsd.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    Kill9,
    Term,
}

/// Items in every state, then enqueue load for `load`, then `stop`; checks that nothing
/// acknowledged is missing from MySQL, restarts foqsd and checks every state came back.
async fn restart_under_load(stop: Stop, load: Duration) {
    let db = TestDb::new(3);
    let config = write_config(&db, &config_toml(&db, "", FAST_ENGINE));
    let mut p = Proc::spawn(&config, &[]);
    let mut c = Client::connect(p.addr, Proto::Binary);
    let (ready, deferred, leased) = fill_every_state(&mut c);

    let stopping = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let producers = start_producers(p.addr, stopping.clone(), acked.clone());
    tokio::time::sleep(load).await;
    match stop {
        Stop::Kill9 => p.sigkill(),
        Stop::Term => assert_eq!(p.sigterm().code(), Some(0), "foqsd exits 0 on SIGTERM"),
    }
    stopping.store(true, Ordering::SeqCst);
    for t in producers {
        t.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 100,
        "the load ran: {} acknowledged",
        acked.len()
    );
    let stored = stored_ids(&db).await;
    let lost: Vec<&String> = acked.iter().filter(|id| !stored.contains(*id)).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged items lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );

    let mut p = Proc::spawn(&config, &[]);
    let mut c = Client::connect(p.addr, Proto::Binary);
    check_every_state_survived(&mut c, &ready, &deferred, &leased).await;
    // Keys are never reused after a restart: a new item gets a fresh id.
    let fresh = c.enqueue(vec![item(NS, "fresh", 0, b"x")]).remove(0);
    assert!(!stored.contains(&fresh), "{fresh} reused");
    assert_eq!(p.sigterm().code(), Some(0));
    let _ = std::fs::remove_dir_all(config.parent().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_item_in_any_state() {
    restart_under_load(Stop::Kill9, Duration::from_millis(700)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_requests_and_exits_0() {
    restart_under_load(Stop::Term, Duration::from_millis(500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_staged_items_brings_them_back_after_their_lease() {
    let db = TestDb::new(3);
    let config = write_config(&db, &config_toml(&db, "", FAST_ENGINE));
    let mut p = Proc::spawn(&config, &[]);
    let mut c = Client::connect(p.addr, Proto::Binary);
    let all: HashSet<String> = c
        .enqueue(
            (0..1000)
                .map(|i| EnqueueItem {
                    lease_ms: Some(1_500),
                    ..item(NS, "staged", i % 5, b"x")
                })
                .collect(),
        )
        .into_iter()
        .collect();
    let mut done = HashSet::new();
    for _ in 0..40 {
        let ids: Vec<String> = c
            .dequeue(NS, "staged", 10)
            .into_iter()
            .map(|i| i.id.unwrap())
            .collect();
        c.ack(&ids);
        done.extend(ids);
    }
    assert_eq!(done.len(), 400);
    let staged = db.count_in(ItemState::Leased, "").await;
    assert!(staged > 0, "the busy topic staged items ahead");
    p.sigkill();

    let mut p = Proc::spawn(&config, &[]);
    let mut c = Client::connect(p.addr, Proto::Binary);
    let start = Instant::now();
    let mut back = HashSet::new();
    while back.len() < 600 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{} of 600 came back ({staged} were staged)",
            back.len()
        );
        // Acked at once: a restart as fast as SQLite's hands the first items out again
        // before the staged ones' leases end, and a lease of 1.5 s held across that wait
        // would end too (a redelivery that is right, not a duplicate).
        let got: Vec<String> = c
            .dequeue(NS, "staged", 100)
            .into_iter()
            .map(|i| i.id.unwrap())
            .collect();
        for id in &got {
            assert!(back.insert(id.clone()), "an acked item was delivered again");
        }
        c.ack(&got);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rest: HashSet<String> = all.difference(&done).cloned().collect();
    assert_eq!(back, rest, "exactly the items not acked came back");
    assert_eq!(p.sigterm().code(), Some(0));
    let _ = std::fs::remove_dir_all(config.parent().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_on_a_busy_at_most_once_topic_loses_no_item_nobody_received() {
    // At-most-once may lose an item a consumer could have received, never one it could
    // not: nothing is staged ahead of demand, so after kill -9 every item not handed out
    // is still there.
    let db = TestDb::new(3);
    let config = write_config(&db, &config_toml(&db, "", FAST_ENGINE));
    let mut p = Proc::spawn(&config, &[]);
    let mut c = Client::connect(p.addr, Proto::Binary);
    let all: HashSet<String> = c
        .enqueue(
            (0..1000)
                .map(|i| EnqueueItem {
                    lease_ms: Some(1_000),
                    policy: Some(DeliveryPolicy::AT_MOST_ONCE),
                    ..item(NS, "amo", i % 5, b"x")
                })
                .collect(),
        )
        .into_iter()
        .collect();
    let mut received = HashSet::new();
    for _ in 0..40 {
        let ids: Vec<String> = c
            .dequeue(NS, "amo", 10)
            .into_iter()
            .map(|i| i.id.unwrap())
            .collect();
        received.extend(ids);
    }
    assert_eq!(received.len(), 400);
    p.sigkill();

    let p = Proc::spawn(&config, &[]);
    let mut c = Client::connect(p.addr, Proto::Binary);
    // Past every lease that could have been running at the kill.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut back = HashSet::new();
    loop {
        let got = c.dequeue(NS, "amo", 100);
        if got.is_empty() {
            break;
        }
        back.extend(got.into_iter().map(|i| i.id.unwrap()));
    }
    let unseen: HashSet<String> = all.difference(&received).cloned().collect();
    assert_eq!(
        back.len(),
        unseen.len(),
        "{} at-most-once items nobody received were lost",
        unseen.len() as i64 - back.len() as i64
    );
    assert_eq!(back, unseen);
    drop(p);
    let _ = std::fs::remove_dir_all(config.parent().unwrap());
}
