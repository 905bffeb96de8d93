//! The drill's load and checker: producers and consumers through every host, and the
//! ledger of every acknowledged enqueue, delivery and ack they saw.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use foqs::thrift_gen::*;

use super::{client, now_ms, LEASE_MS, NS, QUOTA_NS, SHARDS_PER_SET, TOPICS};

/// What the checker saw.
#[derive(Default)]
pub struct Ledger {
    /// Payload -> id, for every enqueue whose reply gave an id.
    pub acknowledged: HashMap<String, String>,
    /// Payload -> (lease end, lease id) of its latest delivery.
    pub leased: HashMap<String, (i64, i64)>,
    pub acked: HashSet<String>,
    pub delivered_after_ack: u64,
    pub overlapping_leases: u64,
    pub deliveries: u64,
    /// Times of successful enqueues and the replica set each went to (client-visible
    /// gaps).
    pub enqueued_at: Vec<(Instant, u32)>,
    /// Enqueues admitted in the quota's namespace.
    pub quota_admitted: u64,
    /// Items whose ack call failed (it may have deleted them).
    pub ack_unknown: HashSet<String>,
    pub ack_errors: BTreeMap<String, u64>,
    /// Items whose ack was answered with an error (so it must not have deleted them),
    /// with the error and when (ms since the epoch).
    pub ack_refused: HashMap<String, (String, i64)>,
    /// Payloads whose enqueue was answered with an error (so none may be delivered),
    /// with the error and when.
    pub enqueue_refused: HashMap<String, (String, i64)>,
    /// Every payload delivered.
    pub delivered: HashSet<String>,
    pub last_ack_failure: Option<Instant>,
}

pub struct Load {
    ledger: Arc<Mutex<Ledger>>,
    producing: Arc<AtomicBool>,
    consuming: Arc<AtomicBool>,
    /// Consumers wait while it is set (see [`Load::hold_consumers`]).
    held: Arc<AtomicBool>,
    /// Stopped and joined first when the load finishes, so that an enqueue still in
    /// flight then has its reply in the ledger before the consumers are let go.
    producers: Vec<std::thread::JoinHandle<()>>,
    consumers: Vec<std::thread::JoinHandle<()>>,
    pub failed_calls: Arc<AtomicU64>,
}

impl Load {
    /// Consumers take nothing while `on` (what is enqueued meanwhile stays pending, where
    /// a loss can show).
    pub fn hold_consumers(&self, on: bool) {
        self.held.store(on, Ordering::SeqCst);
    }

    pub fn start(hosts: &[SocketAddr]) -> Load {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let producing = Arc::new(AtomicBool::new(true));
        let consuming = Arc::new(AtomicBool::new(true));
        let held = Arc::new(AtomicBool::new(false));
        let failed_calls = Arc::new(AtomicU64::new(0));
        let mut producers = Vec::new();
        for p in 0..2 {
            let (ledger, producing, failed) =
                (ledger.clone(), producing.clone(), failed_calls.clone());
            let hosts = hosts.to_vec();
            producers.push(std::thread::spawn(move || {
                let mut seq = 0u64;
                let mut c = None;
                while producing.load(Ordering::SeqCst) {
                    let addr = hosts[(p + seq as usize / 50) % hosts.len()];
                    if c.is_none() {
                        c = client(addr);
                    }
                    let Some(cl) = c.as_mut() else {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    };
                    let payloads: Vec<String> =
                        (0..5).map(|i| format!("p{p}-{}", seq + i)).collect();
                    let items = payloads
                        .iter()
                        .enumerate()
                        .map(|(i, pl)| {
                            foqs::client::new_item(
                                NS,
                                &format!("t{}", (seq as usize + i) % TOPICS),
                                0,
                                pl.as_bytes().to_vec(),
                            )
                        })
                        .collect();
                    seq += 5;
                    match cl.enqueue(EnqueueRequest {
                        forwarded_for: None,
                        items: Some(items),
                        forwarded_by: None,
                        forward_token: None,
                    }) {
                        Ok(r) => {
                            let mut l = ledger.lock().unwrap();
                            for (pl, res) in payloads.into_iter().zip(r.results.unwrap_or_default())
                            {
                                if let Some(id) = res.id {
                                    let set = set_of_id(&id);
                                    l.acknowledged.insert(pl, id);
                                    l.enqueued_at.push((Instant::now(), set));
                                } else {
                                    let why = format!("{:?}", res.error);
                                    l.enqueue_refused.insert(pl, (why, now_ms()));
                                }
                            }
                        }
                        Err(e) => {
                            // Answered with an error (the items must not be stored), or
                            // the outcome is unknown (these items are in no set).
                            if matches!(e, thrift::Error::User(_)) {
                                let why = (call_error(&e), now_ms());
                                ledger
                                    .lock()
                                    .unwrap()
                                    .enqueue_refused
                                    .extend(payloads.into_iter().map(|p| (p, why.clone())));
                            }
                            failed.fetch_add(1, Ordering::Relaxed);
                            c = None;
                        }
                    }
                    // Move between hosts every 50 items, so every host is used.
                    if seq.is_multiple_of(50) {
                        c = None;
                    }
                    std::thread::sleep(Duration::from_millis(15));
                }
            }));
        }
        {
            let (ledger, producing) = (ledger.clone(), producing.clone());
            let hosts = hosts.to_vec();
            producers.push(std::thread::spawn(move || {
                let mut n = 0usize;
                let mut c = None;
                while producing.load(Ordering::SeqCst) {
                    n += 1;
                    if c.is_none() || n.is_multiple_of(20) {
                        c = client(hosts[n / 20 % hosts.len()]);
                    }
                    let Some(cl) = c.as_mut() else { continue };
                    let item = foqs::client::new_item(QUOTA_NS, "t", 0, b"q".to_vec());
                    match cl.enqueue(EnqueueRequest {
                        forwarded_for: None,
                        items: Some(vec![item]),
                        forwarded_by: None,
                        forward_token: None,
                    }) {
                        Ok(r) if r.results.iter().flatten().any(|x| x.id.is_some()) => {
                            ledger.lock().unwrap().quota_admitted += 1;
                        }
                        Ok(_) => {}
                        Err(_) => c = None,
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }));
        }
        let mut consumers = Vec::new();
        for k in 0..2 {
            let (ledger, consuming, failed, held) = (
                ledger.clone(),
                consuming.clone(),
                failed_calls.clone(),
                held.clone(),
            );
            let hosts = hosts.to_vec();
            consumers.push(std::thread::spawn(move || {
                let mut n = 0usize;
                let mut c = None;
                while consuming.load(Ordering::SeqCst) {
                    if held.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    n += 1;
                    if c.is_none() {
                        c = client(hosts[(k + n / 40) % hosts.len()]);
                    }
                    let Some(cl) = c.as_mut() else {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    };
                    let topic = format!("t{}", (k + n) % TOPICS);
                    let items = match cl.dequeue(dequeue_request(&topic, 20)) {
                        Ok(r) => r.items.unwrap_or_default(),
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            c = None;
                            continue;
                        }
                    };
                    if items.is_empty() {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    let now = now_ms();
                    let mut ids = Vec::new();
                    let mut by_id = HashMap::new();
                    {
                        let mut l = ledger.lock().unwrap();
                        for it in &items {
                            let pl =
                                String::from_utf8_lossy(it.payload.as_deref().unwrap_or_default())
                                    .into_owned();
                            l.deliveries += 1;
                            l.delivered.insert(pl.clone());
                            if l.acked.contains(&pl) {
                                l.delivered_after_ack += 1;
                            }
                            let end = it.lease_expires_ms.unwrap_or(0);
                            if let Some((prev_end, prev_id)) = l.leased.get(&pl) {
                                // The previous lease still runs (50 ms of slack for the
                                // two clocks' reading moments): two consumers hold it.
                                if *prev_end > now + 50 && *prev_id != it.lease_id.unwrap_or(0) {
                                    l.overlapping_leases += 1;
                                }
                            }
                            l.leased.insert(pl.clone(), (end, it.lease_id.unwrap_or(0)));
                            let id = it.id.clone().unwrap_or_default();
                            by_id.insert(id.clone(), pl);
                            ids.push(id);
                        }
                    }
                    if ids.is_empty() {
                        continue;
                    }
                    let r = cl.ack(AckRequest {
                        ids: Some(ids.clone()),
                        forwarded_by: None,
                        forwarded_for: None,
                        lease_ids: None,
                    });
                    match r {
                        Ok(r) => {
                            let mut l = ledger.lock().unwrap();
                            for (id, res) in ids.iter().zip(r.results.unwrap_or_default()) {
                                let pl = by_id[id].clone();
                                match &res.error {
                                    None => {
                                        l.leased.remove(&pl);
                                        l.acked.insert(pl);
                                    }
                                    // Refused: the item stays to come back (kept among the
                                    // unknown until it does, and checked in storage after).
                                    Some(e) => {
                                        let code = format!("{:?}", e.code);
                                        *l.ack_errors.entry(code).or_default() += 1;
                                        let why = format!("{e:?}");
                                        l.ack_refused.insert(pl.clone(), (why, now_ms()));
                                        l.ack_unknown.insert(pl);
                                        l.last_ack_failure = Some(Instant::now());
                                    }
                                }
                            }
                        }
                        Err(e) => {
                            // Outcome unknown: not acked, and the leases run out and
                            // the items come back; or acked, and the reply was lost.
                            // (A whole call answered with an error applied nothing.)
                            failed.fetch_add(1, Ordering::Relaxed);
                            let mut l = ledger.lock().unwrap();
                            if matches!(e, thrift::Error::User(_)) {
                                let why = (call_error(&e), now_ms());
                                l.ack_refused
                                    .extend(by_id.values().map(|p| (p.clone(), why.clone())));
                            }
                            l.ack_unknown.extend(by_id.into_values());
                            l.last_ack_failure = Some(Instant::now());
                            c = None;
                        }
                    }
                }
            }));
        }
        Load {
            ledger,
            producing,
            consuming,
            producers,
            consumers,
            held,
            failed_calls,
        }
    }

    /// The longest stretch without a successful enqueue inside [from, to], into replica
    /// set `set` (None: into any).
    pub fn gap_ms(&self, from: Instant, to: Instant, set: Option<u32>) -> u64 {
        let l = self.ledger.lock().unwrap();
        let mut times: Vec<Instant> = l
            .enqueued_at
            .iter()
            .filter(|(t, s)| *t >= from && *t <= to && set.is_none_or(|k| k == *s))
            .map(|(t, _)| *t)
            .collect();
        times.sort();
        let mut gap = times
            .first()
            .map(|t| t.duration_since(from))
            .unwrap_or(to - from);
        for w in times.windows(2) {
            gap = gap.max(w[1] - w[0]);
        }
        if let Some(last) = times.last() {
            gap = gap.max(to - *last);
        }
        gap.as_millis() as u64
    }

    /// Stops producing, consumes until every acknowledged item was acked (or `within`),
    /// stops; returns how many acknowledged items were never acked.
    pub fn finish(mut self, within: Duration) -> (Ledger, u64) {
        self.producing.store(false, Ordering::SeqCst);
        // An enqueue in flight now may still land; its reply must be in the ledger
        // before "every acknowledged item was acked" can be judged.
        for t in self.producers.drain(..) {
            t.join().unwrap();
        }
        let end = Instant::now() + within;
        loop {
            // Done when every acknowledged item was acked, but for those in a failed ack
            // (maybe deleted by it): those get one lease (and a little) to come back.
            let (missing, settled) = {
                let l = self.ledger.lock().unwrap();
                let missing = l
                    .acknowledged
                    .keys()
                    .filter(|p| !l.acked.contains(*p) && !l.ack_unknown.contains(*p))
                    .count();
                let lease_over = l
                    .last_ack_failure
                    .is_none_or(|t| t.elapsed() > Duration::from_millis(LEASE_MS as u64 + 2000));
                let unknown = l
                    .ack_unknown
                    .iter()
                    .filter(|p| !l.acked.contains(*p))
                    .count();
                (missing, unknown == 0 || lease_over)
            };
            if (missing == 0 && settled) || Instant::now() > end {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.consuming.store(false, Ordering::SeqCst);
        for t in self.consumers.drain(..) {
            t.join().unwrap();
        }
        let l = Arc::try_unwrap(self.ledger)
            .ok()
            .unwrap()
            .into_inner()
            .unwrap();
        let lost = l
            .acknowledged
            .keys()
            // Never acked, and in no ack whose outcome is unknown.
            .filter(|p| !l.acked.contains(*p) && !l.ack_unknown.contains(*p))
            .count() as u64;
        (l, lost)
    }
}

/// The replica set of item id "SHARD:KEY".
pub fn set_of_id(id: &str) -> u32 {
    id.split(':').next().unwrap().parse::<u32>().unwrap() / SHARDS_PER_SET
}

/// At-most-once items through every host while shards move by plan (switchovers,
/// drains): the strict checker. An acknowledged at-most-once item may be missing only if
/// a consumer received it; a planned move gives its unseen items back (it never deletes
/// them as delivered).
pub struct AmoLoad {
    producing: Arc<AtomicBool>,
    consuming: Arc<AtomicBool>,
    producer: Option<std::thread::JoinHandle<()>>,
    consumer: Option<std::thread::JoinHandle<()>>,
    seen: Arc<Mutex<AmoSeen>>,
}

/// Payloads acknowledged, payloads received, dequeue replies lost.
type AmoSeen = (HashSet<String>, HashSet<String>, u64);

/// The at-most-once namespace's topic.
pub const AMO_TOPIC: &str = "once";

impl AmoLoad {
    pub fn start(hosts: &[SocketAddr]) -> AmoLoad {
        let producing = Arc::new(AtomicBool::new(true));
        let consuming = Arc::new(AtomicBool::new(true));
        let seen = Arc::new(Mutex::new((HashSet::new(), HashSet::new(), 0)));
        let producer = {
            let (producing, seen, hosts) = (producing.clone(), seen.clone(), hosts.to_vec());
            std::thread::spawn(move || {
                let mut n = 0usize;
                let mut c = None;
                while producing.load(Ordering::SeqCst) {
                    n += 1;
                    if c.is_none() || n.is_multiple_of(20) {
                        c = client(hosts[n / 20 % hosts.len()]);
                    }
                    let Some(cl) = c.as_mut() else { continue };
                    let pl = format!("amo-{n}");
                    let mut item = foqs::client::new_item(NS, AMO_TOPIC, 0, pl.as_bytes().to_vec());
                    item.policy = Some(DeliveryPolicy::AT_MOST_ONCE);
                    match cl.enqueue(EnqueueRequest {
                        forwarded_for: None,
                        items: Some(vec![item]),
                        forwarded_by: None,
                        forward_token: None,
                    }) {
                        Ok(r) if r.results.iter().flatten().any(|x| x.id.is_some()) => {
                            seen.lock().unwrap().0.insert(pl);
                        }
                        Ok(_) => {}
                        Err(_) => c = None,
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        };
        let consumer = {
            let (consuming, seen, hosts) = (consuming.clone(), seen.clone(), hosts.to_vec());
            std::thread::spawn(move || {
                let mut n = 0usize;
                let mut c = None;
                while consuming.load(Ordering::SeqCst) {
                    n += 1;
                    if c.is_none() || n.is_multiple_of(30) {
                        c = client(hosts[n / 30 % hosts.len()]);
                    }
                    let Some(cl) = c.as_mut() else {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    };
                    match cl.dequeue(dequeue_request(AMO_TOPIC, 10)) {
                        Ok(r) => {
                            let items = r.items.unwrap_or_default();
                            if items.is_empty() {
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            let mut s = seen.lock().unwrap();
                            for it in items {
                                s.1.insert(
                                    String::from_utf8_lossy(
                                        it.payload.as_deref().unwrap_or_default(),
                                    )
                                    .into_owned(),
                                );
                            }
                        }
                        // A reply lost: what it held counts as delivered (the rule),
                        // and this checker cannot tell which items those were.
                        Err(_) => {
                            seen.lock().unwrap().2 += 1;
                            c = None;
                        }
                    }
                }
            })
        };
        AmoLoad {
            producing,
            consuming,
            producer: Some(producer),
            consumer: Some(consumer),
            seen,
        }
    }

    /// Stops producing, consumes until every acknowledged item was received (or
    /// `within`); returns (acknowledged, received, missing: acknowledged and never
    /// received), and how many dequeue replies were lost.
    pub fn finish(mut self, within: Duration) -> (usize, usize, Vec<String>, u64) {
        self.producing.store(false, Ordering::SeqCst);
        self.producer.take().unwrap().join().unwrap();
        let end = Instant::now() + within;
        let missing = loop {
            let missing: Vec<String> = {
                let s = self.seen.lock().unwrap();
                s.0.difference(&s.1).cloned().collect()
            };
            if missing.is_empty() || Instant::now() > end {
                break missing;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        self.consuming.store(false, Ordering::SeqCst);
        self.consumer.take().unwrap().join().unwrap();
        let s = self.seen.lock().unwrap();
        (s.0.len(), s.1.len(), missing, s.2)
    }
}

/// A whole call's error as the checker records it (a declared `FoqsError` with its
/// fields, `outcome_unknown` among them).
fn call_error(e: &thrift::Error) -> String {
    match e {
        thrift::Error::User(b) => match b.downcast_ref::<FoqsError>() {
            Some(f) => format!("{f:?}"),
            None => e.to_string(),
        },
        _ => e.to_string(),
    }
}

/// A dequeue of up to `count` items of the drill's namespace's `topic`.
fn dequeue_request(topic: &str, count: i32) -> DequeueRequest {
    DequeueRequest {
        forwarded_for: None,
        topics: Some(vec![TopicRequest {
            ns: Some(NS.into()),
            topic: Some(topic.into()),
            count: Some(count),
            before_priority: None,
            before_deliver_after_ms: None,
        }]),
        wait_ms: None,
        local_only: None,
        forwarded_by: None,
    }
}
