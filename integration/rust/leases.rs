//! Leases and the prefetch stage: an item that an ack deleted is never delivered again, at
//! most one consumer holds a live lease on an item, a staged item counts as ready for nack
//! and touch, and `lease_id` keeps a consumer whose lease ended from touching the next
//! holder's. The first tests drive the late-ack and late-nack sequences deterministically
//! with the host's clock; the last one checks a randomized history with kill -9 restarts.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use foqs::clock::ManualClock;
use foqs::model::ItemState;
use foqs::store::{MySqlStore, ShardStore};
use foqs::thrift_gen::*;

const NS: &str = "leases";
const T0: i64 = 1_000_000_000_000;

/// The stored state and lease token of one item, read through the store.
async fn row(db: &TestDb, id: &str) -> Option<(ItemState, i64)> {
    let id: foqs::model::ItemId = id.parse().unwrap();
    let store = MySqlStore::new(id.shard, &db.url(id.shard as usize), 1).unwrap();
    // Opening reads the shard's topic ids (foqsd holds no lock without a cluster).
    store.open().await.unwrap();
    let found = store.lookup(&[id.key]).await.unwrap();
    store.close().await;
    found.first().map(|m| (m.state, m.lease_token))
}

/// A server on a manual clock whose topic "busy" had one item `x` (priority 0, lease
/// 1 s) delivered to consumer A, and then went through a burst of dequeues that handed
/// out every other item (leases of an hour). Then the clock passes x's lease, and the
/// prefetch sweep (the topic counts as busy: the clock stands still, so its rate does
/// not decay) claims x, the only ready item, into the stage. Returns the server, the
/// clock and A's delivery of x.
async fn x_restaged_after_its_lease_ended() -> (TestServer, ManualClock, Item) {
    let clock = ManualClock::new(T0);
    let srv = TestServer::start_with_clock(TestDb::new(2), "", "", Arc::new(clock.clone())).await;
    let mut c = srv.client();
    let x_id = c
        .enqueue(vec![EnqueueItem {
            lease_ms: Some(1_000),
            ..item(NS, "busy", 0, b"x")
        }])
        .remove(0);
    c.enqueue(
        (0..300)
            .map(|_| EnqueueItem {
                lease_ms: Some(3_600_000),
                ..item(NS, "busy", 5, b"other")
            })
            .collect(),
    );
    let a = c.dequeue(NS, "busy", 1).remove(0);
    assert_eq!(a.id.as_deref(), Some(x_id.as_str()));
    let mut others = 0;
    loop {
        let got = c.dequeue(NS, "busy", 10);
        if got.is_empty() {
            break;
        }
        others += got.len();
    }
    assert_eq!(others, 300, "every other item is held by a consumer");
    clock.advance(1_001);
    let staged = eventually(Duration::from_secs(5), "x claimed into the stage", || {
        let r = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(row(&srv.db, &x_id))
        });
        match r {
            Some((ItemState::Leased, token)) if Some(token) != a.lease_id => Some(token),
            _ => None,
        }
    })
    .await;
    assert_ne!(staged, 0);
    // Staged items are ready as far as clients can tell.
    let peeked = c.try_peek(NS, "busy", 10).unwrap();
    assert_eq!(peeked.len(), 1);
    assert_eq!(peeked[0].id.as_deref(), Some(x_id.as_str()));
    (srv, clock, a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_ack_of_a_staged_item_deletes_it_for_good() {
    let (srv, _clock, a) = x_restaged_after_its_lease_ended().await;
    let mut c = srv.client();
    let x = a.id.clone().unwrap();
    // A's lease ended; its ack still deletes the item, which leaves the stage at once.
    assert!(c.ack(std::slice::from_ref(&x))[0].error.is_none());
    assert!(c.try_peek(NS, "busy", 10).unwrap().is_empty());
    assert!(c.topics(NS).iter().all(|t| t.1 == 0), "nothing ready");
    for _ in 0..3 {
        let got = c.dequeue(NS, "busy", 10);
        assert!(got.is_empty(), "delivered after a successful ack: {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(row(&srv.db, &x).await, None);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_nack_or_touch_of_a_staged_item_is_not_found_and_changes_nothing() {
    let (srv, clock, a) = x_restaged_after_its_lease_ended().await;
    let mut c = srv.client();
    let x = a.id.clone().unwrap();
    // Without a lease_id, as any nack of a ready item: NOT_FOUND, nothing changes.
    let r = c.nack(vec![nack(&x, None, None)]);
    assert_eq!(code_of(&r[0].error), Some(ErrorCode::NOT_FOUND), "{r:?}");
    assert_eq!(
        code_of(&c.touch(&[(&x, 60_000)])[0].error),
        Some(ErrorCode::NOT_FOUND)
    );
    // B gets x (from the stage), on a lease of its own.
    let b = c.dequeue(NS, "busy", 10);
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].id.as_deref(), Some(x.as_str()));
    assert_eq!(b[0].delivery_count, Some(2));
    assert_ne!(b[0].lease_id, a.lease_id);
    // While B's lease runs, nobody else gets x.
    clock.advance(500);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(c.dequeue(NS, "busy", 10).is_empty());
    assert!(c.ack(&[x])[0].error.is_none(), "B's ack");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_id_keeps_an_ended_lease_from_touching_the_next_holders() {
    let clock = ManualClock::new(T0);
    let srv = TestServer::start_with_clock(TestDb::new(2), "", "", Arc::new(clock.clone())).await;
    let mut c = srv.client();
    let x = c
        .enqueue(vec![EnqueueItem {
            lease_ms: Some(1_000),
            ..item(NS, "ids", 0, b"x")
        }])
        .remove(0);
    let a = c.dequeue(NS, "ids", 1).remove(0);
    let a_lease = a.lease_id.unwrap();
    assert!(a_lease > 0);
    // Touch with the right lease_id works while the lease runs.
    let r = call_touch(&mut c, &x, 1_000, Some(a_lease));
    assert!(r.error.is_none(), "{r:?}");
    clock.advance(1_001);
    // The lease ran out (the scan may not have seen it yet): the lease_id no longer works.
    let r = call_touch(&mut c, &x, 60_000, Some(a_lease));
    assert_eq!(code_of(&r.error), Some(ErrorCode::NOT_FOUND), "{r:?}");
    assert!(r.error.unwrap().message.unwrap().contains("lease ended"));
    let b = eventually(Duration::from_secs(5), "redelivery to B", || {
        c.dequeue(NS, "ids", 1).pop()
    })
    .await;
    let b_lease = b.lease_id.unwrap();
    assert_ne!(a_lease, b_lease);
    // A's late nack and touch, naming A's delivery, leave B's lease alone.
    let r = c.nack(vec![NackItem {
        lease_id: Some(a_lease),
        ..nack(&x, None, None)
    }]);
    assert_eq!(code_of(&r[0].error), Some(ErrorCode::NOT_FOUND), "{r:?}");
    let r = call_touch(&mut c, &x, 1, Some(a_lease));
    assert_eq!(code_of(&r.error), Some(ErrorCode::NOT_FOUND));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(c.dequeue(NS, "ids", 1).is_empty(), "B still holds x");
    // B's own nack, naming B's delivery, works.
    let r = c.nack(vec![NackItem {
        lease_id: Some(b_lease),
        ..nack(&x, None, None)
    }]);
    assert!(r[0].error.is_none(), "{r:?}");
    let again = c.dequeue(NS, "ids", 1);
    assert_eq!(again[0].delivery_count, Some(3));
    srv.stop().await;
}

fn call_touch(c: &mut Client, id: &str, extend_ms: i64, lease_id: Option<i64>) -> ItemResult {
    c.call(|c| {
        c.touch(TouchRequest {
            items: Some(vec![TouchItem {
                id: Some(id.to_string()),
                extend_ms: Some(extend_ms),
                lease_id,
            }]),
            forwarded_by: None,
            forwarded_for: None,
        })
    })
    .expect("touch")
    .results
    .unwrap()
    .remove(0)
}

/// One delivery as a consumer saw it, with wall-clock times in ms (foqsd runs on the
/// same clock).
#[derive(Debug, Clone)]
struct Delivery {
    lease_id: i64,
    /// When the dequeue's reply arrived: the delivery happened before.
    received_ms: i64,
    /// When this lease ended at the latest: its expiry (moved by touches), or when its
    /// holder's successful nack was sent.
    end_ms: i64,
}

#[derive(Default)]
struct History {
    deliveries: HashMap<String, Vec<Delivery>>,
    /// Per id: when the first successful ack's reply arrived.
    acked_ms: HashMap<String, i64>,
    /// Dequeues (their request's send time) and the ids they returned.
    dequeues: Vec<(i64, Vec<String>)>,
    /// Acks whose reply was lost to a kill: they may have deleted the item.
    uncertain: std::collections::HashSet<String>,
    counts: HashMap<&'static str, usize>,
}

/// Consumers with short leases that often answer late (after their lease ran out), with
/// acks, nacks carrying the delivery's lease_id and touches; foqsd is killed with SIGKILL
/// and restarted twice meanwhile. From the recorded history: no delivery follows a
/// successful ack, no two leases on one item overlap, and nothing acknowledged is lost.
/// A touch and a nack of one delivery, queued together, land in one turn of the shard's
/// worker. They used to run there as two concurrent statements that both succeeded: the
/// touch answered "extended" for an item the nack had made ready again. Here the worker
/// is held in the turn before (an ack of another item waits on a row lock taken from
/// outside), so both are queued when it goes on. The touch now waits a turn and sees
/// that the nack gave the item back: refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_touch_and_a_nack_of_one_delivery_in_one_turn_do_not_both_succeed() {
    use mysql_async::prelude::Queryable;
    let srv = TestServer::start(1, "[metrics]\nlisten = \"127.0.0.1:0\"\n").await;
    let metrics = srv.running.as_ref().unwrap().metrics_addr.unwrap();
    let queued = || {
        let (_, scrape) = http_get(metrics, "/metrics");
        sample(&scrape, "foqs_shard_queue_depth{shard=\"0\"}")
    };
    let mut c = srv.client();
    let ids = c.enqueue(vec![item(NS, "pair", 0, b"x"), item(NS, "pair", 1, b"y")]);
    assert_eq!(c.dequeue(NS, "pair", 2).len(), 2);
    let (x, y) = (ids[0].clone(), ids[1].clone());
    let y_key: u64 = y.split(':').nth(1).unwrap().parse().unwrap();
    let mut lock = mysql_async::Conn::from_url(srv.db.url(0)).await.unwrap();
    lock.query_drop("START TRANSACTION").await.unwrap();
    lock.query_drop(format!(
        "SELECT id FROM items WHERE id = {y_key} FOR UPDATE"
    ))
    .await
    .unwrap();
    let addr = srv.addr;
    fn on_own_connection<F>(
        addr: std::net::SocketAddr,
        f: F,
    ) -> std::thread::JoinHandle<Vec<ItemResult>>
    where
        F: FnOnce(&mut Client) -> Vec<ItemResult> + Send + 'static,
    {
        std::thread::spawn(move || f(&mut Client::connect(addr, Proto::Binary)))
    }
    let acker = on_own_connection(addr, move |c| c.ack(&[y]));
    // The ack's turn has begun (and waits on the lock) once the queue is empty again.
    tokio::time::sleep(Duration::from_millis(100)).await;
    tokio::task::block_in_place(|| {
        while queued() > 0.0 {
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let x2 = x.clone();
    let nacker = on_own_connection(addr, move |c| c.nack(vec![nack(&x2, None, None)]));
    let x3 = x.clone();
    let toucher = on_own_connection(addr, move |c| c.touch(&[(x3.as_str(), 60_000)]));
    // Both wait in the worker's queue: they will be taken in one turn.
    eventually(
        Duration::from_secs(10),
        "the nack and the touch queued",
        || tokio::task::block_in_place(|| (queued() >= 2.0).then_some(())),
    )
    .await;
    lock.query_drop("ROLLBACK").await.unwrap();
    let _ = lock.disconnect().await;
    let acked = tokio::task::block_in_place(|| acker.join().unwrap());
    let nacked = tokio::task::block_in_place(|| nacker.join().unwrap());
    let touched = tokio::task::block_in_place(|| toucher.join().unwrap());
    assert!(acked[0].error.is_none(), "{acked:?}");
    assert!(nacked[0].error.is_none(), "the nack wins: {nacked:?}");
    assert!(
        touched[0].error.is_some(),
        "a touch of a delivery nacked in the same turn is refused: {touched:?}"
    );
    // And x is ready again, as the nack said.
    assert_eq!(c.dequeue(NS, "pair", 1)[0].id.as_deref(), Some(x.as_str()));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_randomized_history_with_late_answers_and_kill_9_keeps_both_promises() {
    let db = TestDb::new(3);
    let config = write_config(
        &db,
        &config_toml(
            &db,
            "",
            "[engine]\nscan_interval_ms = 20\ncheckpoint_interval_ms = 100\n",
        ),
    );
    let port = free_port();
    let mut p = Proc::spawn_on(&config, port, &[]);
    let addr = p.addr;
    let mut c = Client::connect(addr, Proto::Binary);
    let mut enqueued = Vec::new();
    for batch in 0..3 {
        enqueued.extend(
            c.enqueue(
                (0..200)
                    .map(|i| EnqueueItem {
                        lease_ms: Some(300 + (i as i64 % 4) * 100),
                        max_attempts: Some(1_000),
                        ..item(NS, "random", (i + batch) % 10, b"r")
                    })
                    .collect(),
            ),
        );
    }
    let history = Arc::new(Mutex::new(History::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let consumers: Vec<_> = (0..6u64)
        .map(|n| {
            let (history, stop) = (history.clone(), stop.clone());
            std::thread::spawn(move || consume(n, addr, &history, &stop))
        })
        .collect();
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        p.sigkill();
        tokio::time::sleep(Duration::from_millis(200)).await;
        p = Proc::spawn_on(&config, port, &[]);
    }
    // Let the consumers finish the backlog (late answers and restarts delay it).
    let started = std::time::Instant::now();
    loop {
        let settled = {
            let h = history.lock().unwrap();
            enqueued
                .iter()
                .all(|id| h.acked_ms.contains_key(id) || h.uncertain.contains(id))
        };
        if settled || started.elapsed() > Duration::from_secs(30) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for t in consumers {
        t.join().unwrap();
    }
    let h = std::mem::take(&mut *history.lock().unwrap());
    eprintln!(
        "history: {} deliveries of {} items, {:?}",
        h.deliveries.values().map(Vec::len).sum::<usize>(),
        h.deliveries.len(),
        h.counts
    );
    // Every item was acked (nothing lost), the backlog drained; an item whose ack reply
    // was lost to a kill must be gone.
    let missing: Vec<String> = enqueued
        .iter()
        .filter(|id| !h.acked_ms.contains_key(*id))
        .cloned()
        .collect();
    for id in &missing {
        assert!(h.uncertain.contains(id), "{id} was never acked");
    }
    for key in ["late ack", "lease ended", "nack", "touch"] {
        assert!(
            h.counts.get(key).copied().unwrap_or(0) > 0,
            "the history has no {key:?}: {:?}",
            h.counts
        );
    }
    // 1. No delivery follows a successful ack.
    for (sent_ms, ids) in &h.dequeues {
        for id in ids {
            if let Some(acked) = h.acked_ms.get(id) {
                assert!(
                    sent_ms <= acked,
                    "{id} delivered by a dequeue sent at {sent_ms}, after its ack at {acked}"
                );
            }
        }
    }
    // 2. No two leases on one item overlap: each delivery arrived after the previous
    //    one's lease ended.
    for (id, ds) in &h.deliveries {
        let mut ds = ds.clone();
        ds.sort_by_key(|d| d.received_ms);
        for w in ds.windows(2) {
            assert!(
                w[1].received_ms >= w[0].end_ms,
                "{id}: delivery {} arrived at {} while delivery {} ran until {}",
                w[1].lease_id,
                w[1].received_ms,
                w[0].lease_id,
                w[0].end_ms
            );
        }
    }
    drop(h);
    for id in &missing {
        let r = row(&db, id).await;
        assert_eq!(r, None, "{id}: its ack reply was lost, yet it stayed");
    }
    assert_eq!(p.sigterm().code(), Some(0));
    let _ = std::fs::remove_dir_all(config.parent().unwrap());
}

/// One consumer: dequeues, then acks, nacks (with the lease_id) or touches, sometimes
/// after its lease ran out. Survives foqsd restarts by reconnecting.
fn consume(n: u64, addr: std::net::SocketAddr, history: &Mutex<History>, stop: &AtomicBool) {
    let mut rng = n.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut client: Option<foqs::client::SyncClient> = None;
    while !stop.load(Ordering::SeqCst) {
        let c = match &mut client {
            Some(c) => c,
            None => match foqs::client::connect(addr, Proto::Binary, Duration::from_secs(5)) {
                Ok(c) => client.insert(c),
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            },
        };
        let sent = now_ms();
        let items = match c.dequeue(DequeueRequest {
            forwarded_for: None,
            topics: Some(vec![topic_req(NS, "random", 1 + (next() % 5) as i32)]),
            wait_ms: None,
            local_only: None,
            forwarded_by: None,
        }) {
            Ok(r) => r.items.unwrap(),
            Err(_) => {
                client = None;
                continue;
            }
        };
        let received = now_ms();
        {
            let mut h = history.lock().unwrap();
            h.dequeues
                .push((sent, items.iter().map(|i| i.id.clone().unwrap()).collect()));
            for i in &items {
                h.deliveries
                    .entry(i.id.clone().unwrap())
                    .or_default()
                    .push(Delivery {
                        lease_id: i.lease_id.unwrap(),
                        received_ms: received,
                        end_ms: i.lease_expires_ms.unwrap(),
                    });
            }
        }
        if items.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        for i in items {
            if settle(c, &i, next(), history).is_err() {
                client = None;
                break;
            }
        }
    }
}

/// Answers one delivery; an error means the connection is gone.
fn settle(
    c: &mut foqs::client::SyncClient,
    i: &Item,
    dice: u64,
    history: &Mutex<History>,
) -> thrift::Result<()> {
    let id = i.id.clone().unwrap();
    let lease_id = i.lease_id.unwrap();
    let expires = i.lease_expires_ms.unwrap();
    // A fifth of the answers come after the lease ran out.
    let late = dice.is_multiple_of(5);
    if late {
        let wait = (expires - now_ms() + 30 + (dice % 150) as i64).max(0);
        std::thread::sleep(Duration::from_millis(wait as u64));
    }
    let count = |what: &'static str| *history.lock().unwrap().counts.entry(what).or_default() += 1;
    match (dice >> 8) % 10 {
        // Touch first (with the lease_id), then ack.
        0 if !late => {
            let r = c
                .touch(TouchRequest {
                    items: Some(vec![TouchItem {
                        id: Some(id.clone()),
                        extend_ms: Some(400),
                        lease_id: Some(lease_id),
                    }]),
                    forwarded_by: None,
                    forwarded_for: None,
                })?
                .results
                .unwrap()
                .remove(0);
            let touched = now_ms();
            if r.error.is_none() {
                count("touch");
                let mut h = history.lock().unwrap();
                if let Some(d) = h
                    .deliveries
                    .get_mut(&id)
                    .and_then(|ds| ds.iter_mut().find(|d| d.lease_id == lease_id))
                {
                    d.end_ms = d.end_ms.max(touched + 400);
                }
            }
            ack(c, &id, false, history)
        }
        // Nack with the lease_id.
        1..=3 => {
            let sent = now_ms();
            let end_at = |at: i64| {
                let mut h = history.lock().unwrap();
                if let Some(d) = h
                    .deliveries
                    .get_mut(&id)
                    .and_then(|ds| ds.iter_mut().find(|d| d.lease_id == lease_id))
                {
                    d.end_ms = d.end_ms.min(at);
                }
            };
            let r = match c.nack(NackRequest {
                items: Some(vec![NackItem {
                    lease_id: Some(lease_id),
                    ..nack(&id, Some((dice % 3) as i64 * 20), None)
                }]),
                forwarded_by: None,
                forwarded_for: None,
                nack_token: None,
            }) {
                Ok(r) => r.results.unwrap().remove(0),
                Err(e) => {
                    // The reply was lost: the nack may have ended the lease.
                    end_at(sent);
                    return Err(e);
                }
            };
            match r.error {
                None => {
                    assert!(!late, "{id}: a nack after its lease ran out succeeded");
                    count("nack");
                    end_at(sent);
                }
                Some(e) => {
                    assert_eq!(e.code, Some(ErrorCode::NOT_FOUND), "{e:?}");
                    count("lease ended");
                }
            }
            Ok(())
        }
        _ => ack(c, &id, late, history),
    }
}

fn ack(
    c: &mut foqs::client::SyncClient,
    id: &str,
    late: bool,
    history: &Mutex<History>,
) -> thrift::Result<()> {
    let r = match c.ack(AckRequest {
        ids: Some(vec![id.to_string()]),
        forwarded_by: None,
        forwarded_for: None,
        lease_ids: None,
    }) {
        Ok(r) => r.results.unwrap().remove(0),
        Err(e) => {
            history.lock().unwrap().uncertain.insert(id.to_string());
            return Err(e);
        }
    };
    let at = now_ms();
    let mut h = history.lock().unwrap();
    if r.error.is_none() {
        *h.counts
            .entry(if late { "late ack" } else { "ack" })
            .or_default() += 1;
        h.acked_ms.entry(id.to_string()).or_insert(at);
    }
    Ok(())
}
