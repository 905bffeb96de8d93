//! The seeded fault simulation of issue 18: producers, consumers with short leases and
//! late answers, nacks with delays, TTLs, dead letters and at-most-once topics run against
//! a real foqsd core (three shards on MariaDB, then on SQLite files) whose stores meet
//! seeded faults of every kind (`foqs::store::faulty`: refusals, timeouts after commit,
//! late commits, delays, hangs, a full disk) and whose shard workers panic now and then.
//! Then the faults stop, and the checker reads the recorded history and the storage:
//! - no delivery begins after a successful ack of the item;
//! - no two leases of an item overlap (a delivery ends at its lease's end or when its
//!   consumer answered, whatever the answer's outcome);
//! - no at-least-once delivery reaches its consumer on a lease that has ended;
//! - every item whose enqueue was confirmed is acked, dead-lettered, expired by its TTL or
//!   (at most once) delivered, within the bound after the faults end, with no restart:
//!   nothing stays ready or leased in storage;
//! - every shard is healthy again (`/readyz`, getHostInfo).
//!
//! A failure prints its seed; `FOQS_SIM_SEEDS=7` (a list: `1,2,3`) replays it.
//! `scripts/soak.sh N` runs N seeds. What a seed fixes: the workload, the fault plan and
//! when workers die; tokio's scheduling is not seeded, so a replay meets the same faults
//! in nearly, not exactly, the same interleaving.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use foqs::clock::SystemClock;
use foqs::config::Config;
use foqs::core::{Caller, EnqueueRequestItem, NackRequestItem, TopicRequest};
use foqs::daemon::FaultPlan;
use foqs::seeded::Rng;
use foqs::store::faulty::{Faults, Storm};

const NS: &str = "sim";
const SHARDS: usize = 3;
/// How long the faults last.
const STORM: Duration = Duration::from_millis(2500);
/// Leases are short, so that expiries happen during the storm.
const LEASE_MS: (i64, i64) = (200, 700);
const STORE_TIMEOUT_MS: u64 = 300;
const SCAN_MS: u64 = 50;
/// The bound after the faults end within which every confirmed item is settled: the
/// longest lease, a breaker's open time, the settle window of a write whose outcome was
/// unknown (store timeout + 1 s), scans, a reopened worker, and room for a slow machine.
const BOUND: Duration = Duration::from_secs(8);

/// The topics: (name, policy (the IDL's: 1 at least once, 2 at most once), max attempts,
/// TTL).
const TOPICS: [(&str, i32, i32, Option<i64>); 4] = [
    ("alo", 1, 4, None),
    ("once", 1, 1, None),
    ("amo", 2, 1, None),
    ("ttl", 1, 4, Some(1_500)),
];

fn seeds() -> Vec<u64> {
    match std::env::var("FOQS_SIM_SEEDS") {
        Ok(s) if !s.trim().is_empty() => s
            .split(',')
            .map(|x| {
                x.trim()
                    .parse()
                    .expect("FOQS_SIM_SEEDS: a comma-separated list of numbers")
            })
            .collect(),
        _ => vec![1, 2, 3],
    }
}

/// One delivery of an item, as the consumer saw it.
#[derive(Debug, Clone)]
struct Delivery {
    id: String,
    /// When the dequeue that returned it was sent, and when it returned.
    asked_ms: i64,
    got_ms: i64,
    lease_expires_ms: i64,
    /// When its consumer first answered (ack or nack, whatever came of it).
    answered_ms: Option<i64>,
}

#[derive(Debug, Default)]
struct Item {
    topic: usize,
    /// The id when the enqueue was confirmed.
    confirmed: Option<String>,
    expires_ms: Option<i64>,
    deliveries: Vec<Delivery>,
    /// When an ack of it returned success.
    acked_ms: Option<i64>,
    /// An ack or a nack to the dead letters was tried (its outcome may be unknown).
    tried_ack: bool,
    tried_dlq: bool,
}

#[derive(Default)]
struct History {
    /// By payload (a sequence number).
    items: BTreeMap<u64, Item>,
    next: u64,
}

type Shared = Arc<Mutex<History>>;

fn config(db: &TestDb) -> Config {
    let toml = config_toml(
        db,
        "",
        &format!(
            "[engine]\nscan_interval_ms = {SCAN_MS}\ncheckpoint_interval_ms = 100\n\
             store_timeout_ms = {STORE_TIMEOUT_MS}\nshard_open_timeout_ms = 1000\nbreaker_failures_max = 5\nbreaker_open_ms = 300\n"
        ),
    );
    Config::from_toml(&toml).expect("simulation config")
}

fn payload_of(item: &foqs::model::Item) -> u64 {
    std::str::from_utf8(&item.payload)
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("a payload of this simulation")
}

async fn producer(host: Arc<foqs::core::Host>, history: Shared, mut rng: Rng, until: Instant) {
    let caller = Caller::anonymous();
    while Instant::now() < until {
        let n = 1 + rng.below(5);
        let mut batch = Vec::with_capacity(n);
        let mut payloads = Vec::with_capacity(n);
        {
            let mut h = history.lock().unwrap();
            for _ in 0..n {
                let p = h.next;
                h.next += 1;
                let topic = rng.below(TOPICS.len());
                let (name, policy, attempts, ttl) = TOPICS[topic];
                let deferred = rng.chance(200).then(|| now_ms() + rng.below(400) as i64);
                batch.push(EnqueueRequestItem {
                    ns: NS.into(),
                    topic: name.into(),
                    priority: rng.below(3) as i32,
                    payload: p.to_string().into_bytes(),
                    deliver_after_ms: deferred,
                    lease_ms: Some(
                        LEASE_MS.0 + rng.below((LEASE_MS.1 - LEASE_MS.0) as usize) as i64,
                    ),
                    ttl_ms: ttl,
                    policy: Some(policy),
                    max_attempts: Some(attempts),
                    ..Default::default()
                });
                h.items.insert(
                    p,
                    Item {
                        topic,
                        ..Default::default()
                    },
                );
                payloads.push((p, ttl));
            }
        }
        let sent = now_ms();
        if let Ok(outcomes) = host.enqueue(&caller, batch, (None, None), None).await {
            let mut h = history.lock().unwrap();
            for ((p, ttl), o) in payloads.into_iter().zip(outcomes) {
                if let Ok((id, _)) = o {
                    let it = h.items.get_mut(&p).unwrap();
                    it.confirmed = Some(id.to_string());
                    it.expires_ms = ttl.map(|t| sent + t);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.below(20) as u64)).await;
    }
}

/// What a consumer does with a delivery.
enum Answer {
    Ack,
    /// Acks after its lease has ended (a late answer).
    LateAck,
    Nack(i64),
    Dlq,
    /// Never answers: the lease ends by itself.
    Drop,
}

fn answer(rng: &mut Rng) -> Answer {
    match rng.below(100) {
        0..=54 => Answer::Ack,
        55..=64 => Answer::LateAck,
        65..=79 => Answer::Nack(rng.below(300) as i64),
        80..=82 => Answer::Dlq,
        _ => Answer::Drop,
    }
}

/// Dequeues and answers until `until`; with `ack_all`, acks whatever it gets (the drain).
async fn consumer(
    host: Arc<foqs::core::Host>,
    history: Shared,
    mut rng: Rng,
    until: Instant,
    ack_all: bool,
) {
    let caller = Caller::anonymous();
    while Instant::now() < until {
        let topics: Vec<TopicRequest> = TOPICS
            .iter()
            .map(|(name, ..)| TopicRequest {
                ns: NS.into(),
                topic: (*name).into(),
                count: 1 + rng.below(8) as i32,
                before: (None, None),
            })
            .collect();
        let asked = now_ms();
        let got = match host.dequeue(&caller, topics, Some(50), false).await {
            Ok(items) => items,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let got_ms = now_ms();
        for it in got {
            let p = payload_of(&it);
            let id = it.id.to_string();
            let delivery = Delivery {
                id: id.clone(),
                asked_ms: asked,
                got_ms,
                lease_expires_ms: it.lease_expires_ms,
                answered_ms: None,
            };
            let n = {
                let mut h = history.lock().unwrap();
                let rec = h.items.get_mut(&p).unwrap();
                rec.deliveries.push(delivery);
                rec.deliveries.len() - 1
            };
            let what = if ack_all {
                Answer::Ack
            } else {
                answer(&mut rng)
            };
            let host = host.clone();
            let history = history.clone();
            let lease_id = it.lease_token;
            let expires = it.lease_expires_ms;
            // Answers run beside the next dequeue, as a real consumer's workers do.
            tokio::spawn(async move {
                let caller = Caller::anonymous();
                let mark = |h: &mut History| {
                    let d = &mut h.items.get_mut(&p).unwrap().deliveries[n];
                    d.answered_ms.get_or_insert(now_ms());
                };
                match what {
                    Answer::Drop => {}
                    Answer::Ack | Answer::LateAck => {
                        if matches!(what, Answer::LateAck) {
                            let wait = (expires - now_ms() + 50).max(0) as u64;
                            tokio::time::sleep(Duration::from_millis(wait)).await;
                        }
                        {
                            let mut h = history.lock().unwrap();
                            mark(&mut h);
                            h.items.get_mut(&p).unwrap().tried_ack = true;
                        }
                        let r = host.ack(&caller, vec![id], (None, None)).await;
                        if let Ok(rs) = r {
                            if rs.first().is_some_and(|r| r.is_ok()) {
                                let mut h = history.lock().unwrap();
                                let rec = h.items.get_mut(&p).unwrap();
                                rec.acked_ms.get_or_insert(now_ms());
                            }
                        }
                    }
                    Answer::Nack(_) | Answer::Dlq => {
                        let to_dlq = matches!(what, Answer::Dlq);
                        {
                            let mut h = history.lock().unwrap();
                            mark(&mut h);
                            if to_dlq {
                                h.items.get_mut(&p).unwrap().tried_dlq = true;
                            }
                        }
                        let delay_ms = match what {
                            Answer::Nack(d) => Some(d),
                            _ => None,
                        };
                        let _ = host
                            .nack(
                                &caller,
                                vec![NackRequestItem {
                                    id,
                                    delay_ms,
                                    metadata: None,
                                    to_dlq,
                                    lease_id: Some(lease_id),
                                }],
                                (None, None),
                                None,
                            )
                            .await;
                    }
                }
            });
        }
    }
}

/// Rows still in storage by payload: state (0 ready, 1 leased, 2 dead).
async fn stored(db: &TestDb) -> HashMap<u64, i64> {
    let mut out = HashMap::new();
    for s in 0..SHARDS {
        let payloads = db
            .column(s, "SELECT CAST(payload AS SIGNED) FROM items ORDER BY id")
            .await;
        let states = db.column(s, "SELECT state FROM items ORDER BY id").await;
        out.extend(payloads.into_iter().map(|p| p as u64).zip(states));
    }
    out
}

/// Runs one seed on `db`; returns what went wrong (nothing: empty).
async fn run(seed: u64, db: TestDb) -> Vec<String> {
    let mut rng = Rng::new(seed);
    let faults: Vec<Faults> = (0..SHARDS).map(|_| Faults::default()).collect();
    let plan: FaultPlan = faults
        .iter()
        .enumerate()
        .map(|(i, f)| (i as u32, f.clone()))
        .collect();
    let running = foqs::daemon::start_with_faults(&config(&db), Arc::new(SystemClock), plan)
        .await
        .expect("foqsd starts");
    let host = running.host.clone();
    for (i, f) in faults.iter().enumerate() {
        f.storm(Storm::new(
            seed.wrapping_mul(31).wrapping_add(i as u64),
            30 + rng.below(60) as u32,
            Duration::from_millis(STORE_TIMEOUT_MS * 2),
        ));
    }
    let history: Shared = Arc::default();
    let until = Instant::now() + STORM;
    let mut tasks = Vec::new();
    for i in 0..3 {
        tasks.push(tokio::spawn(producer(
            host.clone(),
            history.clone(),
            Rng::new(seed ^ (100 + i)),
            until,
        )));
    }
    for i in 0..3 {
        tasks.push(tokio::spawn(consumer(
            host.clone(),
            history.clone(),
            Rng::new(seed ^ (200 + i)),
            until,
            false,
        )));
    }
    // During the storm: a full disk for a while, and worker panics.
    let full_shard = rng.below(SHARDS);
    let full_at = Duration::from_millis(rng.below(1500) as u64);
    let panics: Vec<(Duration, usize)> = (0..1 + rng.below(2))
        .map(|_| {
            (
                Duration::from_millis(rng.below(2000) as u64),
                rng.below(SHARDS),
            )
        })
        .collect();
    let started = Instant::now();
    let mut events: Vec<(Duration, &str, usize)> = vec![
        (full_at, "full", full_shard),
        (full_at + Duration::from_millis(400), "room", full_shard),
    ];
    events.extend(panics.iter().map(|(at, s)| (*at, "panic", *s)));
    events.sort();
    for (at, what, shard) in events {
        tokio::time::sleep_until((started + at).into()).await;
        match what {
            "full" => faults[shard].set_full(true),
            "room" => faults[shard].set_full(false),
            _ => fail::cfg(format!("shard-{shard}-turn"), "1*panic").unwrap(),
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    // The faults end; late commits already under way still land.
    for f in &faults {
        f.calm();
    }
    for s in 0..SHARDS {
        fail::remove(format!("shard-{s}-turn"));
    }
    let calm = Instant::now();
    let deadline = calm + BOUND;
    let mut problems = Vec::new();
    // Drain: consumers ack whatever they get until storage holds only dead letters.
    let drain: Vec<_> = (0..2)
        .map(|i| {
            tokio::spawn(consumer(
                host.clone(),
                history.clone(),
                Rng::new(seed ^ (300 + i)),
                deadline,
                true,
            ))
        })
        .collect();
    let mut settled_after = None;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let rows = stored(&db).await;
        let status = host.shard_status();
        let healthy =
            status.len() == SHARDS && status.iter().all(|s| s.healthy) && host.readiness().is_ok();
        if healthy && rows.values().all(|s| *s == 2) {
            settled_after = Some(calm.elapsed());
            break;
        }
    }
    // Answers in flight finish before the checks.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for d in drain {
        d.abort();
    }
    let rows = stored(&db).await;
    if settled_after.is_none() {
        let stuck: Vec<_> = rows.iter().filter(|(_, s)| **s != 2).take(10).collect();
        // What storage says of them, to tell which timer or change went missing.
        for (p, _) in stuck.iter().take(3) {
            let mut row = Vec::new();
            for col in [
                "id",
                "state",
                "lease_token",
                "lease_expires_ms",
                "COALESCE(next_event_ms, -1)",
                "delivery_count",
                "deliver_after_ms",
            ] {
                for s in 0..SHARDS {
                    let v = db
                        .column(
                            s,
                            &format!("SELECT {col} FROM items WHERE CAST(payload AS SIGNED) = {p}"),
                        )
                        .await;
                    if let Some(v) = v.first() {
                        row.push(format!("{col}={v} (shard {s})"));
                    }
                }
            }
            problems.push(format!("stuck {p}: {} (now {})", row.join(", "), now_ms()));
        }
        problems.push(format!(
            "not settled {BOUND:?} after the faults ended: rows still ready/leased (payload, state) {stuck:?}; shards {:?}",
            host.shard_status()
        ));
    }
    let items = std::mem::take(&mut history.lock().unwrap().items);
    for (p, it) in &items {
        // No delivery begins after a successful ack.
        if let Some(acked) = it.acked_ms {
            if let Some(d) = it.deliveries.iter().find(|d| d.asked_ms > acked) {
                problems.push(format!(
                    "{p}: delivered at {} after its ack at {acked}: {d:?}",
                    d.asked_ms
                ));
            }
        }
        // No overlapping leases: a consumer holds a live lease from when it got the item
        // until the lease ends or it answers; no two of those stretches overlap. (A
        // delivery that reached its consumer after its lease had ended is held by nobody:
        // the host does not hand out an ended lease, but the way back can be slow.)
        let held: Vec<(i64, i64, &Delivery)> = it
            .deliveries
            .iter()
            .map(|d| {
                let end = d
                    .answered_ms
                    .map_or(d.lease_expires_ms, |a| a.min(d.lease_expires_ms));
                (d.got_ms, end, d)
            })
            .filter(|(got, end, _)| got < end)
            .collect();
        for (i, a) in held.iter().enumerate() {
            for b in &held[i + 1..] {
                if a.0 < b.1 && b.0 < a.1 {
                    problems.push(format!("{p}: leases overlap: {:?} and {:?}", a.2, b.2));
                }
            }
        }
        // The host never hands out a lease that has already ended.
        if let Some(d) = it
            .deliveries
            .iter()
            .find(|d| d.lease_expires_ms <= d.asked_ms)
        {
            problems.push(format!(
                "{p}: handed out on a lease that ended before the dequeue: {d:?}"
            ));
        }
        // A delivery leaves the host with at least half its lease (renewed when its reply
        // waited), so it reaches its in-process consumer before its lease ends. (An
        // at-most-once item whose lease a dead worker's successor ended goes out anyway:
        // left out, it would be lost unseen.)
        if let Some(d) = it
            .deliveries
            .iter()
            .find(|d| d.lease_expires_ms <= d.got_ms && TOPICS[it.topic].1 != 2)
        {
            problems.push(format!(
                "{p} (topic {}): reached its consumer on a lease that had ended: {d:?}",
                TOPICS[it.topic].0
            ));
        }
        let Some(id) = &it.confirmed else { continue };
        if let Some(d) = it.deliveries.iter().find(|d| &d.id != id) {
            problems.push(format!("{p}: enqueued as {id}, delivered as {}", d.id));
        }
        let (_, policy, attempts, _) = TOPICS[it.topic];
        let explained = it.acked_ms.is_some()
            || match rows.get(p) {
                // Dead: nacked there, or out of attempts.
                Some(2) => it.tried_dlq || it.deliveries.len() >= attempts as usize,
                Some(_) => false,
                // Gone: acked (perhaps with an outcome its consumer never heard), expired,
                // or delivered at most once.
                None => {
                    it.tried_ack
                        || it.expires_ms.is_some_and(|e| e <= now_ms())
                        || (policy == 2 && !it.deliveries.is_empty())
                }
            };
        if !explained {
            problems.push(format!(
                "{p} ({id}, topic {}): confirmed, not settled: stored {:?}, {} deliveries {:?}",
                TOPICS[it.topic].0,
                rows.get(p),
                it.deliveries.len(),
                it.deliveries
            ));
        }
    }
    let confirmed = items.values().filter(|i| i.confirmed.is_some()).count();
    let deliveries: usize = items.values().map(|i| i.deliveries.len()).sum();
    let met: Vec<_> = faults.iter().map(|f| f.met()).collect();
    println!(
        "seed {seed}: {confirmed} confirmed items, {deliveries} deliveries, settled {settled_after:?} after the faults; faults met by shard: {met:?}"
    );
    let stop = running.shutdown();
    if tokio::time::timeout(Duration::from_secs(20), stop)
        .await
        .is_err()
    {
        problems.push("shutdown took over 20 s".into());
    }
    problems
}

async fn simulate(backend: &str, make: impl Fn() -> TestDb) {
    let mut failed = Vec::new();
    for seed in seeds() {
        let problems = run(seed, make()).await;
        if !problems.is_empty() {
            eprintln!("seed {seed} on {backend}: {} problems", problems.len());
            for p in problems.iter().take(20) {
                eprintln!("  {p}");
            }
            failed.push(seed);
        }
    }
    assert!(
        failed.is_empty(),
        "{backend}: seeds {failed:?} failed; replay with FOQS_SIM_SEEDS={}",
        failed
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
}

/// Both backends in one test, one after the other: the workers' failpoints are global to
/// the process, so two simulations at once would panic each other's workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_faults_lose_nothing_and_end_by_themselves() {
    let scenario = fail::FailScenario::setup();
    // The workers' planned panics print one line, not a backtrace each.
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let planned = info
            .payload()
            .downcast_ref::<String>()
            .is_some_and(|m| m.starts_with("failpoint"));
        if planned {
            eprintln!("(planned) {info}");
        } else {
            quiet(info);
        }
    }));
    simulate("MariaDB", || TestDb::mysql(SHARDS)).await;
    simulate("SQLite", || TestDb::sqlite(SHARDS)).await;
    scenario.teardown();
}
