//! The nemesis run, short form: three foqsd hosts, a one-member etcd and a MariaDB server,
//! each in its own network namespace; load through every host (at-least-once items,
//! nacked once in two on their first delivery, and at-most-once items, acked by lease);
//! and a seeded schedule of faults, each healed after a while: a host cut from etcd
//! (both ways, and one way), a host cut from every other node, kill -9 and restart, and
//! a host's clock skewed within the bound and beyond it. Then everything heals and the
//! consumers drain. The checker (after Jepsen's queue checker) counts:
//! - lost: acknowledged enqueues never delivered whose row is gone;
//! - stranded: acknowledged enqueues still in storage after the drain, ready or leased;
//! - dead-lettered: the same, dead (their attempts used up: by faults, as no consumer
//!   here fails an item);
//! - duplicated: at-most-once items delivered twice;
//! - overlapping leases: a delivery (before its reply arrived) while the previous delivery
//!   of the item was surely still leased (its `lease_ms` from when its dequeue was sent,
//!   less the skew bound and 250 ms) and not settled;
//! - errors answered for acks that were applied (counted, allowed).
//!
//! `bash scripts/nemesis.sh [SECONDS] [SEED]` runs a longer one; everything replays from
//! its seed (the schedule; the timing is the machine's).

use super::*;
use std::collections::HashMap;

/// Fault kinds, dealt from a deck shuffled by the seed, so that every kind comes up once
/// in each six faults.
const FAULTS: [&str; 6] = [
    "cut-from-etcd",
    "one-way-to-etcd",
    "isolate",
    "kill",
    "skew-within",
    "skew-beyond",
];
/// `cluster.clock_skew_max_ms` in this run.
const SKEW_BOUND_MS: u64 = 500;

struct Delivery {
    lease_id: i64,
    lease_ms: i64,
    /// When the dequeue that delivered it was sent: its lease began after, so it lasts at
    /// least until `sent + lease_ms` (however late the reply arrived).
    sent: Instant,
    /// When the reply arrived: the delivery happened before.
    at: Instant,
    settled: Option<Instant>,
}

#[derive(Default)]
struct History {
    enqueued: HashMap<String, &'static str>,
    alo_enqueued: usize,
    deliveries: HashMap<String, Vec<Delivery>>,
    acked: HashSet<String>,
    alo_acked: usize,
    ack_errors: u64,
}

/// xorshift64*: the schedule's randomness, from the seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// A client of the `n`th host in turn; none (after a short pause) while it is down.
fn connect_to(hosts: &[SocketAddr], n: usize) -> Option<foqs::client::SyncClient> {
    let c = foqs::client::connect(
        hosts[n % hosts.len()],
        Proto::Binary,
        Duration::from_secs(3),
    );
    if c.is_err() {
        std::thread::sleep(Duration::from_millis(50));
    }
    c.ok()
}

/// Acknowledged at-least-once enqueues not acked yet, at most: past it the producers wait,
/// so that the backlog stays what the consumers drain in seconds, however long the run.
const OUTSTANDING_MAX: usize = 2_000;

fn produce(hosts: Vec<SocketAddr>, stop: Arc<AtomicBool>, h: Arc<Mutex<History>>, p: usize) {
    use foqs::thrift_gen::{DeliveryPolicy, EnqueueRequest, TFoqsSyncClient};
    let mut n = p;
    while !stop.load(Ordering::SeqCst) {
        let outstanding = {
            let h = h.lock().unwrap();
            h.alo_enqueued.saturating_sub(h.alo_acked)
        };
        if outstanding > OUTSTANDING_MAX {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        n += 1;
        let Some(mut c) = connect_to(&hosts, n) else {
            continue;
        };
        let mut items: Vec<_> = (0..4).map(|i| item(NS, "alo", i, b"a")).collect();
        items.push(foqs::thrift_gen::EnqueueItem {
            policy: Some(DeliveryPolicy::AT_MOST_ONCE),
            ..item(NS, "amo", 0, b"m")
        });
        let topics: Vec<&'static str> = vec!["alo", "alo", "alo", "alo", "amo"];
        let Ok(r) = c.enqueue(EnqueueRequest {
            forwarded_for: None,
            items: Some(items),
            forwarded_by: None,
            forward_token: None,
        }) else {
            continue;
        };
        let mut hist = h.lock().unwrap();
        for (res, topic) in r.results.unwrap().into_iter().zip(topics) {
            if let Some(id) = res.id {
                hist.alo_enqueued += usize::from(topic == "alo");
                hist.enqueued.insert(id, topic);
            }
        }
    }
}

fn consume(hosts: Vec<SocketAddr>, stop: Arc<AtomicBool>, h: Arc<Mutex<History>>, p: usize) {
    use foqs::thrift_gen::{AckRequest, DequeueRequest, NackItem, NackRequest, TFoqsSyncClient};
    let mut n = p;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let Some(mut c) = connect_to(&hosts, n) else {
            continue;
        };
        let sent = Instant::now();
        let Ok(r) = c.dequeue(DequeueRequest {
            forwarded_for: None,
            topics: Some(vec![topic_req(NS, "alo", 20), topic_req(NS, "amo", 20)]),
            wait_ms: Some(200),
            local_only: None,
            forwarded_by: None,
        }) else {
            continue;
        };
        let at = Instant::now();
        let items = r.items.unwrap_or_default();
        {
            let mut hist = h.lock().unwrap();
            for i in &items {
                hist.deliveries
                    .entry(i.id.clone().unwrap())
                    .or_default()
                    .push(Delivery {
                        lease_id: i.lease_id.unwrap_or(0),
                        lease_ms: i.lease_ms.unwrap_or(0),
                        sent,
                        at,
                        settled: None,
                    });
            }
        }
        let (to_nack, to_ack): (Vec<_>, Vec<_>) = items.into_iter().partition(|i| {
            i.topic.as_deref() == Some("alo")
                && i.delivery_count == Some(1)
                && i.id
                    .as_deref()
                    .unwrap()
                    .ends_with(['0', '2', '4', '6', '8'])
        });
        let settled = |h: &Mutex<History>, done: &[(String, i64)]| {
            let now = Instant::now();
            let mut hist = h.lock().unwrap();
            for (id, lease) in done {
                if let Some(d) = hist
                    .deliveries
                    .get_mut(id)
                    .and_then(|ds| ds.iter_mut().find(|d| d.lease_id == *lease))
                {
                    d.settled.get_or_insert(now);
                }
            }
        };
        let lease = |i: &foqs::thrift_gen::Item| (i.id.clone().unwrap(), i.lease_id.unwrap_or(0));
        if !to_nack.is_empty() {
            let done: Vec<_> = to_nack.iter().map(lease).collect();
            // Settled from when it was sent: a lost answer still settled it.
            settled(&h, &done);
            let _ = c.nack(NackRequest {
                items: Some(
                    done.iter()
                        .map(|(id, l)| NackItem {
                            lease_id: Some(*l),
                            ..nack(id, Some(200), None)
                        })
                        .collect(),
                ),
                forwarded_by: None,
                forwarded_for: None,
                nack_token: None,
            });
        }
        if !to_ack.is_empty() {
            let done: Vec<_> = to_ack.iter().map(lease).collect();
            settled(&h, &done);
            let r = c.ack(AckRequest {
                ids: Some(done.iter().map(|d| d.0.clone()).collect()),
                lease_ids: Some(done.iter().map(|d| d.1).collect()),
                forwarded_by: None,
                forwarded_for: None,
            });
            let mut hist = h.lock().unwrap();
            match r {
                Ok(r) => {
                    for ((id, _), res) in done.into_iter().zip(r.results.unwrap()) {
                        if res.error.is_none() {
                            if hist.enqueued.get(&id) == Some(&"alo") {
                                hist.alo_acked += 1;
                            }
                            hist.acked.insert(id);
                        } else {
                            hist.ack_errors += 1;
                        }
                    }
                }
                Err(_) => hist.ack_errors += done.len() as u64,
            }
        }
    }
}

/// Every item id still stored, over the shards' databases, with whether it is dead.
async fn stored(mysql: &str, shards: usize) -> HashMap<String, bool> {
    use mysql_async::prelude::*;
    let mut ids = HashMap::new();
    for s in 0..shards {
        let mut conn = mysql_async::Conn::from_url(format!("{mysql}/foqs_ns_s{s}"))
            .await
            .expect("connect to the stage's MariaDB");
        let rows: Vec<(u64, i8)> = conn.query("SELECT id, state FROM items").await.unwrap();
        ids.extend(
            rows.into_iter()
                .map(|(k, state)| (format!("{s}:{k}"), state == 2)),
        );
        let _ = conn.disconnect().await;
    }
    ids
}

/// A stored item's state, due time, timer, lease end, deliveries and settled lease.
async fn row_of(mysql: &str, shard: &str, key: &str) -> Option<(i8, i64, i64, i64, i32, i64)> {
    use mysql_async::prelude::*;
    let mut conn = mysql_async::Conn::from_url(format!("{mysql}/foqs_ns_s{shard}"))
        .await
        .ok()?;
    conn.query_first(format!(
        "SELECT state, deliver_after_ms, COALESCE(next_event_ms, -1), lease_expires_ms, \
         delivery_count, settled_token FROM items WHERE id = {key}"
    ))
    .await
    .ok()?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nemesis() {
    let _serial = SERIAL.lock().await;
    let seconds: u64 = std::env::var("FOQS_NEMESIS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("FOQS_NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let hosts = ["h1", "h2", "h3"];
    let nodes = ["etcd", "db", "h1", "h2", "h3"];
    let mut stage = netns::Stage::new(&nodes);
    let etcd = stage.etcd("etcd");
    let mysql = stage.mariadb("db");
    let dir = std::env::temp_dir().join(format!("foqs-nemesis-{}", std::process::id()));
    const SHARDS: usize = 6;
    let config = stage_config(
        &dir,
        &mysql,
        &etcd,
        SHARDS,
        &format!("clock_skew_max_ms = {SKEW_BOUND_MS}\n"),
    );
    let clock_file = |h: &str| dir.join(format!("faketime-{h}"));
    let mut procs = HashMap::new();
    let mut addrs = Vec::new();
    for h in hosts {
        std::fs::write(clock_file(h), "+0\n").unwrap();
        let env = faketime_env(&clock_file(h));
        let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.clone())).collect();
        let (child, addr) = stage.foqsd_with(h, &config, h, &env);
        procs.insert(h, child);
        addrs.push(addr);
    }
    let named: Vec<(String, SocketAddr)> = hosts
        .iter()
        .map(|h| h.to_string())
        .zip(addrs.clone())
        .collect();
    eventually(Duration::from_secs(30), "every shard served", || {
        let n: usize = addrs.iter().map(|a| owned(*a).map_or(0, |s| s.len())).sum();
        (n == SHARDS).then_some(())
    })
    .await;

    let history = Arc::new(Mutex::new(History::default()));
    let (stop_load, stop_consume) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let mut threads = Vec::new();
    for p in 0..2 {
        let (a, s, h) = (addrs.clone(), stop_load.clone(), history.clone());
        threads.push(std::thread::spawn(move || produce(a, s, h, p)));
    }
    let mut consumers = Vec::new();
    for p in 0..2 {
        let (a, s, h) = (addrs.clone(), stop_consume.clone(), history.clone());
        consumers.push(std::thread::spawn(move || consume(a, s, h, p)));
    }
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = watch_single_owner(named.clone(), stop_watch.clone());

    // The schedule.
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let start = Instant::now();
    let mut faults: Vec<(String, String)> = Vec::new();
    let mut deck: Vec<&str> = Vec::new();
    // At least `seconds`, and every kind at least once.
    while start.elapsed() < Duration::from_secs(seconds) || faults.len() < FAULTS.len() {
        if deck.is_empty() {
            deck = FAULTS.to_vec();
            for i in (1..deck.len()).rev() {
                deck.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        tokio::time::sleep(Duration::from_millis(500 + rng.below(1000))).await;
        let kind = deck.pop().unwrap();
        let host = hosts[rng.below(3) as usize];
        faults.push((kind.to_string(), host.to_string()));
        eprintln!(
            "nemesis {:>5} ms: {kind} {host}",
            start.elapsed().as_millis()
        );
        match kind {
            "cut-from-etcd" => stage.cut(host, "etcd"),
            "one-way-to-etcd" => stage.cut_one_way(host, "etcd"),
            "isolate" => stage.isolate(host, &nodes),
            "kill" => stage.kill(procs[host]),
            "skew-within" => std::fs::write(clock_file(host), "+0.3\n").unwrap(),
            _ => std::fs::write(clock_file(host), "+2\n").unwrap(),
        }
        tokio::time::sleep(Duration::from_millis(2000 + rng.below(2000))).await;
        stage.heal();
        std::fs::write(clock_file(host), "+0\n").unwrap();
        if kind == "kill" {
            let env = faketime_env(&clock_file(host));
            let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.clone())).collect();
            let (child, _) = stage.foqsd_with(host, &config, host, &env);
            procs.insert(host, child);
        }
    }
    stop_load.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    // Drain: the consumers go on until no acknowledged enqueue left unacked is still
    // stored (an ack answered with an error may have been applied), or 60 s.
    let drain = Instant::now();
    loop {
        let rows = stored(&mysql, SHARDS).await;
        let left = {
            let h = history.lock().unwrap();
            h.enqueued
                .iter()
                .filter(|(id, t)| {
                    **t == "alo" && !h.acked.contains(*id) && rows.get(*id) == Some(&false)
                })
                .count()
        };
        if left == 0 || drain.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop_consume.store(true, Ordering::SeqCst);
    for t in consumers {
        t.join().unwrap();
    }
    stop_watch.store(true, Ordering::SeqCst);
    let two_owners = watcher.join().unwrap();

    // The checker.
    let rows = stored(&mysql, SHARDS).await;
    let h = std::mem::take(&mut *history.lock().unwrap());
    let slack = Duration::from_millis(SKEW_BOUND_MS + 250);
    let (mut lost, mut stranded, mut duplicated, mut overlapping) =
        (vec![], vec![], vec![], vec![]);
    let mut dead = vec![];
    for (id, topic) in &h.enqueued {
        let ds = h.deliveries.get(id).map_or(&[][..], Vec::as_slice);
        if *topic == "amo" {
            if ds.len() > 1 {
                duplicated.push(id.clone());
            }
            continue;
        }
        if h.acked.contains(id) {
            continue;
        }
        match (ds.is_empty(), rows.get(id)) {
            (_, Some(true)) => dead.push(id.clone()),
            (_, Some(false)) => stranded.push(id.clone()),
            (true, None) => lost.push(id.clone()),
            // Delivered, its ack applied but answered with an error: not lost.
            (false, None) => {}
        }
    }
    for (id, ds) in &h.deliveries {
        for w in ds.windows(2) {
            let (a, b) = (&w[0], &w[1]);
            // b was delivered before its reply arrived; a's lease lasted at least until
            // its dequeue was sent plus lease_ms.
            let until = a.sent + Duration::from_millis(a.lease_ms as u64);
            let live_at_b = b.at + slack < until && a.settled.is_none_or(|s| s > b.at);
            if live_at_b {
                eprintln!(
                    "overlap {id}: delivered {} ms after the previous delivery's dequeue was sent (lease {} ms, settled: {:?})",
                    b.at.duration_since(a.sent).as_millis(),
                    a.lease_ms,
                    a.settled.map(|s| s.duration_since(a.sent).as_millis())
                );
                overlapping.push(id.clone());
            }
        }
    }
    let mut by_kind: HashMap<&str, usize> = HashMap::new();
    for (k, _) in &faults {
        *by_kind.entry(k.as_str()).or_default() += 1;
    }
    let summary = serde_json::json!({
        "seconds": seconds,
        "seed": seed,
        "faults": by_kind,
        "enqueued": h.enqueued.len(),
        "delivered": h.deliveries.values().map(Vec::len).sum::<usize>(),
        "acked": h.acked.len(),
        "ack_errors_answered": h.ack_errors,
        "lost": lost.len(),
        "stranded": stranded.len(),
        "dead_lettered": dead.len(),
        "duplicated_at_most_once": duplicated.len(),
        "overlapping_leases": overlapping.len(),
        "two_owners": two_owners.len(),
    });
    eprintln!("{summary}");
    // What an unacked row left looks like, and what the consumers saw of it.
    for id in stranded.iter().chain(&dead).take(10) {
        let (shard, key) = id.split_once(':').unwrap();
        let row = row_of(&mysql, shard, key).await;
        let seen: Vec<_> = h.deliveries.get(id).map_or(vec![], |ds| {
            ds.iter()
                .map(|d| (d.lease_id, d.at.duration_since(start).as_millis()))
                .collect()
        });
        eprintln!("unacked {id}: row {row:?}; deliveries (lease, ms into the run) {seen:?}");
    }
    assert!(h.enqueued.len() > 100, "the load ran: {summary}");
    for (what, ids) in [
        ("lost", &lost),
        ("stranded", &stranded),
        ("dead-lettered", &dead),
        ("duplicated", &duplicated),
        ("overlapping", &overlapping),
    ] {
        assert!(ids.is_empty(), "{what} {:?}", &ids[..ids.len().min(5)]);
    }
    assert!(two_owners.is_empty(), "{two_owners:?}");
    drop(h);
    drop(stage);
    let _ = std::fs::remove_dir_all(dir);
}
