//! The region drill: three real MariaDB servers replicating one another (one per region,
//! semi-synchronous, through `scripts/replicas.sh`), a private etcd, three real `foqsd`
//! processes (one per region), producers and consumers through every host and a checker
//! that records every acknowledged enqueue and ack; then planned switchovers, region
//! drains back and forth, a kill -9 of the primary's mariadbd and a SIGSTOP/SIGCONT of
//! one. Nothing acknowledged may be lost, nothing delivered after a successful ack, no two
//! leases of one item overlap, no server holds an errant GTID, and the servers converge.
//!
//! `FOQS_DRILL=long` runs the long form (`scripts/region-drill.sh`: ten switchovers and
//! longer load); `FOQS_DRILL_NEGATIVE=1` adds the negative control (semi-sync off, the
//! replicas' IO threads stopped, a forced failover: the checker must see loss).

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::replicas::Replicas;
use common::{now_ms, Etcd, Proc};
use foqs::client::{connect, Protocol, SyncClient};
use foqs::thrift_gen::*;
use serde_json::json;

const SHARDS: u32 = 4;
const NS: &str = "drill";
const TOPICS: usize = 4;
const LEASE_MS: i64 = 5000;
/// The namespace whose quota must hold across the switches (its budget is in etcd).
const QUOTA_NS: &str = "q";
const QUOTA_PER_MINUTE: u64 = 600;

fn toml(r: &Replicas, etcd: &Etcd, tag: &str) -> PathBuf {
    let mut t = format!(
        "[engine]\nstore_timeout_ms = 1000\nscan_interval_ms = 50\ncheckpoint_interval_ms = 200\n\
         [defaults]\nlease_ms = {LEASE_MS}\n\
         [[namespaces]]\nname = \"{NS}\"\n[[namespaces]]\nname = \"{QUOTA_NS}\"\nenqueues_per_minute = {QUOTA_PER_MINUTE}\n\
         [cluster]\nmanager = \"etcd\"\npeer_poll_ms = 100\n\
         [cluster.etcd]\nendpoints = [\"{}\"]\nprefix = \"/{tag}\"\nlease_ttl_ms = 3000\npoll_ms = 100\n\
         [replication]\nfailover_after_ms = 1500\nprobe_interval_ms = 200\n",
        etcd.endpoint
    );
    for s in 0..SHARDS {
        let url = |n: u16| format!("mysql://foqs:foqs@{}/foqs_{tag}_{s}", r.addr(n));
        t += &format!(
            "[[shards]]\nid = {s}\nurl = \"{}\"\nregion = \"r1\"\nreplicas = [{{ url = \"{}\", region = \"r2\" }}, {{ url = \"{}\", region = \"r3\" }}]\n",
            url(1),
            url(2),
            url(3)
        );
    }
    // In the replicas' folder: removed with them.
    let path = r.dir.join(format!("foqs-{tag}.toml"));
    std::fs::write(&path, t).unwrap();
    path
}

fn client(addr: SocketAddr) -> Option<SyncClient> {
    connect(addr, Protocol::Binary, Duration::from_secs(10)).ok()
}

/// What the checker saw.
#[derive(Default)]
struct Ledger {
    /// Payload -> id, for every enqueue whose reply gave an id.
    acknowledged: HashMap<String, String>,
    /// Payload -> (lease end, lease id) of its latest delivery.
    leased: HashMap<String, (i64, i64)>,
    acked: HashSet<String>,
    delivered_after_ack: u64,
    overlapping_leases: u64,
    deliveries: u64,
    /// Times of successful enqueues (client-visible gaps).
    enqueued_at: Vec<Instant>,
    /// Enqueues admitted in the quota's namespace.
    quota_admitted: u64,
    /// Items whose ack call failed (it may have deleted them).
    ack_unknown: HashSet<String>,
    ack_errors: BTreeMap<String, u64>,
    last_ack_failure: Option<Instant>,
}

struct Load {
    ledger: Arc<Mutex<Ledger>>,
    producing: Arc<AtomicBool>,
    consuming: Arc<AtomicBool>,
    /// Stopped and joined first when the load finishes, so that an enqueue still in
    /// flight then has its reply in the ledger before the consumers are let go.
    producers: Vec<std::thread::JoinHandle<()>>,
    consumers: Vec<std::thread::JoinHandle<()>>,
    failed_calls: Arc<AtomicU64>,
}

impl Load {
    fn start(hosts: &[SocketAddr]) -> Load {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let producing = Arc::new(AtomicBool::new(true));
        let consuming = Arc::new(AtomicBool::new(true));
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
                        items: Some(items),
                        forwarded_by: None,
                    }) {
                        Ok(r) => {
                            let mut l = ledger.lock().unwrap();
                            for (pl, res) in payloads.into_iter().zip(r.results.unwrap_or_default())
                            {
                                if let Some(id) = res.id {
                                    l.acknowledged.insert(pl, id);
                                    l.enqueued_at.push(Instant::now());
                                }
                            }
                        }
                        Err(_) => {
                            // Outcome unknown (these items are in no set) or refused.
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
                        items: Some(vec![item]),
                        forwarded_by: None,
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
            let (ledger, consuming, failed) =
                (ledger.clone(), consuming.clone(), failed_calls.clone());
            let hosts = hosts.to_vec();
            consumers.push(std::thread::spawn(move || {
                let mut n = 0usize;
                let mut c = None;
                while consuming.load(Ordering::SeqCst) {
                    n += 1;
                    if c.is_none() {
                        c = client(hosts[(k + n / 40) % hosts.len()]);
                    }
                    let Some(cl) = c.as_mut() else {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    };
                    let topic = format!("t{}", (k + n) % TOPICS);
                    let req = DequeueRequest {
                        topics: Some(vec![TopicRequest {
                            ns: Some(NS.into()),
                            topic: Some(topic),
                            count: Some(20),
                            before_priority: None,
                            before_deliver_after_ms: None,
                        }]),
                        wait_ms: None,
                        local_only: None,
                        forwarded_by: None,
                    };
                    let items = match cl.dequeue(req) {
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
                                    // A failed ack may still have deleted the item (a
                                    // retryable error: the delete's outcome is unknown).
                                    Some(e) => {
                                        let code = format!("{:?}", e.code);
                                        *l.ack_errors.entry(code).or_default() += 1;
                                        l.ack_unknown.insert(pl);
                                        l.last_ack_failure = Some(Instant::now());
                                    }
                                }
                            }
                        }
                        Err(_) => {
                            // Outcome unknown: not acked, and the leases run out and
                            // the items come back; or acked, and the reply was lost.
                            failed.fetch_add(1, Ordering::Relaxed);
                            let mut l = ledger.lock().unwrap();
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
            failed_calls,
        }
    }

    /// The longest stretch without a successful enqueue inside [from, to].
    fn gap_ms(&self, from: Instant, to: Instant) -> u64 {
        let l = self.ledger.lock().unwrap();
        let mut times: Vec<Instant> = l
            .enqueued_at
            .iter()
            .copied()
            .filter(|t| *t >= from && *t <= to)
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
    fn finish(mut self, within: Duration) -> (Ledger, u64) {
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

struct Cluster {
    hosts: Vec<Proc>,
}

impl Cluster {
    fn addrs(&self) -> Vec<SocketAddr> {
        self.hosts.iter().map(|p| p.addr).collect()
    }

    /// The replication status, asked of any host that answers.
    fn replication(&self) -> Vec<ShardReplicationInfo> {
        for a in self.addrs() {
            if let Some(mut c) = client(a) {
                if let Ok(r) = c.get_replication() {
                    return r.shards.unwrap_or_default();
                }
            }
        }
        Vec::new()
    }

    /// Waits until every shard is served on one primary by one owner, every replica
    /// replicating; returns the primary.
    fn settled(&self, within: Duration) -> String {
        let end = Instant::now() + within;
        loop {
            let r = self.replication();
            let primaries: HashSet<_> = r.iter().filter_map(|s| s.primary.clone()).collect();
            let ok = r.len() == SHARDS as usize
                && primaries.len() == 1
                && r.iter().all(|s| {
                    s.state.as_deref() == Some("serving")
                        && s.owner.is_some()
                        && s.replicas
                            .iter()
                            .flatten()
                            .all(|x| x.io_running == Some(true) && x.sql_running == Some(true))
                });
            if ok {
                return primaries.into_iter().next().unwrap();
            }
            assert!(Instant::now() < end, "the cluster did not settle: {r:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn admin(&self, i: usize) -> SyncClient {
        let addrs = self.addrs();
        client(addrs[i % addrs.len()]).expect("connect for an admin call")
    }
}

fn switch_line(r: &SwitchReport, gap_ms: u64) -> serde_json::Value {
    json!({"switch": r.kind, "shards": r.shards, "from": r.from_server, "to": r.to_server,
        "to_region": r.to_region, "generation": r.generation, "ok": r.ok, "error": r.error,
        "pause_ms": r.pause_ms, "read_only_ms": r.read_only_ms, "catchup_ms": r.catchup_ms,
        "client_gap_ms": gap_ms})
}

fn percentile(mut v: Vec<u64>, p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Waits until `primary`'s binlog position is every server's, then compares the shards'
/// tables; returns (converged, errant GTIDs).
fn converged(r: &Replicas, primary: u16, tag: &str) -> (bool, Vec<String>) {
    let end = Instant::now() + Duration::from_secs(20);
    let pos = |n| r.value(n, "SELECT @@global.gtid_binlog_pos");
    loop {
        let p = pos(primary);
        if p.is_some() && (1..=3).all(|n| pos(n) == p) {
            break;
        }
        if Instant::now() > end {
            return (
                false,
                vec![format!(
                    "positions differ: {:?}",
                    (1..=3).map(pos).collect::<Vec<_>>()
                )],
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let tables: Vec<String> = (0..SHARDS)
        .map(|s| format!("foqs_{tag}_{s}.items"))
        .collect();
    let sums = |n| r.query(n, &format!("CHECKSUM TABLE {}", tables.join(", ")));
    let first = sums(primary);
    let same = first.is_some() && (1..=3).all(|n| sums(n) == first);
    let state = |n| {
        r.value(n, "SELECT @@global.gtid_binlog_state")
            .unwrap_or_default()
    };
    let errant = (1..=3)
        .filter(|n| *n != primary)
        .flat_map(|n| foqs::replication::server::errant(&state(n), &state(primary)))
        .collect();
    (same, errant)
}

#[test]
fn region_drill_loses_nothing_acknowledged() {
    let long = std::env::var("FOQS_DRILL").as_deref() == Ok("long");
    let r = Replicas::up();
    let etcd = Etcd::start();
    let tag = format!("drill{}", std::process::id());
    let config = toml(&r, &etcd, &tag);
    let hosts = (1..=3)
        .map(|n| {
            Proc::spawn(
                &config,
                &[
                    ("FOQS__SERVER__HOST_ID", &*format!("h{n}")),
                    ("FOQS__CLUSTER__REGION", &*format!("r{n}")),
                ],
            )
        })
        .collect();
    let cluster = Cluster { hosts };
    let mut primary = cluster.settled(Duration::from_secs(30));
    let load = Load::start(&cluster.addrs());
    let load_started = Instant::now();
    let pause = Duration::from_millis(if long { 1500 } else { 700 });
    std::thread::sleep(pause);
    let mut planned = Vec::new();
    let mut lines = Vec::new();
    // Planned switchovers, each to the most caught-up replica outside the region.
    let switches = if long { 10 } else { 4 };
    for i in 0..switches {
        let t0 = Instant::now();
        let resp = cluster
            .admin(i)
            .shard_switchover(SwitchoverRequest {
                shard_id: Some((i % SHARDS as usize) as i32),
                to: None,
            })
            .expect("shardSwitchover");
        std::thread::sleep(pause);
        for s in resp.switches.unwrap_or_default() {
            assert_eq!(s.ok, Some(true), "switchover failed: {s:?}");
            planned.push(s.read_only_ms.unwrap_or(0) as u64);
            lines.push(switch_line(&s, load.gap_ms(t0, Instant::now())));
            primary = s.to_server.clone().unwrap();
        }
    }
    // Region drains, out of the primary's region and back.
    let region_of = |addr: &str| format!("r{}", r.number(addr));
    let home = region_of(&primary);
    let away = if home == "r1" { "r2" } else { "r1" };
    for (from, to) in [
        (home.clone(), away.to_string()),
        (away.to_string(), home.clone()),
    ] {
        let t0 = Instant::now();
        let resp = cluster
            .admin(1)
            .region_drain(RegionDrainRequest {
                from_region: Some(from.clone()),
                to_region: Some(to.clone()),
            })
            .expect("regionDrain");
        std::thread::sleep(pause);
        let switches = resp.switches.unwrap_or_default();
        assert_eq!(switches.len(), 1, "one replica set to drain out of {from}");
        for s in switches {
            assert_eq!(s.ok, Some(true), "drain {from} -> {to} failed: {s:?}");
            assert_eq!(s.to_region.as_deref(), Some(to.as_str()));
            planned.push(s.read_only_ms.unwrap_or(0) as u64);
            lines.push(switch_line(&s, load.gap_ms(t0, Instant::now())));
            primary = s.to_server.clone().unwrap();
        }
    }
    // Unplanned: kill -9 of the primary's mariadbd; the monitor fails over by itself;
    // restarted (as a supervisor would), it rejoins as a replica by itself.
    let victim = r.number(&primary);
    let t0 = Instant::now();
    r.kill(victim);
    let after_kill = cluster.settled_without(&primary, Duration::from_secs(30));
    let kill_outage = load.gap_ms(t0, Instant::now());
    lines.push(json!({"switch": "failover", "cause": "kill -9", "from": primary, "to": after_kill, "client_gap_ms": kill_outage}));
    r.start(victim);
    primary = cluster.settled(Duration::from_secs(30));
    std::thread::sleep(pause);
    // Unplanned: SIGSTOP; once replaced, SIGCONT: the old primary must take no write.
    let frozen = r.number(&primary);
    let t0 = Instant::now();
    r.freeze(frozen);
    let after_stop = cluster.settled_without(&primary, Duration::from_secs(30));
    let stop_outage = load.gap_ms(t0, Instant::now());
    r.thaw(frozen);
    // What it committed: its tables' checksums, at once and two seconds later. (Its binlog
    // may grow by statements that were in its sockets when it froze: they wait for a
    // replica's acknowledgement that never comes, uncommitted, and the rejoin drops them.)
    let tables = (0..SHARDS)
        .map(|s| format!("foqs_{tag}_{s}.items"))
        .collect::<Vec<_>>()
        .join(", ");
    let sums = || r.query(frozen, &format!("CHECKSUM TABLE {tables}"));
    let at_resume = r.value(frozen, "SELECT @@global.gtid_binlog_pos");
    let sums_at_resume = sums();
    std::thread::sleep(Duration::from_secs(2));
    let later = r.value(frozen, "SELECT @@global.gtid_binlog_pos");
    let stuck = r
        .value(frozen, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE LIKE '%semi-sync%' OR STATE = 'Commit'")
        .unwrap_or_default();
    let wrote_after_resume = sums_at_resume.is_none() || sums() != sums_at_resume;
    lines.push(
        json!({"switch": "failover", "cause": "SIGSTOP", "from": primary, "to": after_stop,
        "client_gap_ms": stop_outage, "binlog_at_resume": at_resume, "binlog_2s_later": later,
        "commits_stuck_waiting_for_ack": stuck}),
    );
    // Its commits that were waiting for an acknowledgement when it froze are dropped by
    // a restart as a replica (init_rpl_role = SLAVE).
    r.rejoin(frozen, r.number(&after_stop));
    primary = cluster.settled(Duration::from_secs(30));
    std::thread::sleep(pause);
    let failed_calls = load.failed_calls.load(Ordering::Relaxed);
    let quota_secs = load_started.elapsed().as_secs_f64();
    let (ledger, lost) = load.finish(Duration::from_secs(if long { 60 } else { 40 }));
    let (same, errant) = converged(&r, r.number(&primary), &tag);
    // An item whose ack failed and that never came back must be gone from storage (the
    // ack took effect); one still stored is stuck: counted as lost.
    let unknown: Vec<&String> = ledger
        .ack_unknown
        .iter()
        .filter(|p| !ledger.acked.contains(*p))
        .collect();
    let stuck_after_failed_ack = unknown
        .iter()
        .filter(|pl| {
            let Some(id) = ledger.acknowledged.get(**pl) else {
                return false;
            };
            let (shard, key) = id.split_once(':').unwrap();
            r.value(
                r.number(&primary),
                &format!("SELECT COUNT(*) FROM foqs_{tag}_{shard}.items WHERE id = {key}"),
            )
            .as_deref()
                != Some("0")
        })
        .count() as u64;
    let lost = lost + stuck_after_failed_ack;
    let no_tx: i64 = (1..=3)
        .map(|n| r.status(n, "Rpl_semi_sync_master_no_tx"))
        .sum();
    for l in &lines {
        println!("{l}");
    }
    let summary = json!({
        "summary": if long { "long" } else { "short" },
        "acknowledged": ledger.acknowledged.len(), "acked": ledger.acked.len(),
        "deliveries": ledger.deliveries, "lost": lost,
        "delivered_after_ack": ledger.delivered_after_ack,
        "overlapping_leases": ledger.overlapping_leases,
        "planned_switches": planned.len(),
        "read_only_ms_p50": percentile(planned.clone(), 0.5),
        "read_only_ms_max": planned.iter().max(),
        "kill9_client_gap_ms": kill_outage, "sigstop_client_gap_ms": stop_outage,
        "rpl_semi_sync_master_no_tx": no_tx, "errant_gtids": errant.len(),
        "converged": same, "wrote_after_resume": wrote_after_resume,
        "failed_calls": failed_calls,
        "ack_failed_and_gone": unknown.len() as u64 - stuck_after_failed_ack,
        "ack_errors": ledger.ack_errors,
        "quota_admitted": ledger.quota_admitted,
        "quota_allowed": quota_allowed(quota_secs),
    });
    println!("{summary}");
    // What became of the items lost, as every server holds them (for the failure message).
    let primary_n = r.number(&primary);
    for (pl, id) in ledger
        .acknowledged
        .iter()
        .filter(|(p, _)| !ledger.acked.contains(*p) && !ledger.ack_unknown.contains(*p))
        .take(10)
    {
        let (shard, key) = id.split_once(':').unwrap();
        let rows: Vec<_> = (1..=3)
            .map(|n| {
                r.value(n, &format!("SELECT CONCAT_WS(' ', state, delivery_count, lease_expires_ms, next_event_ms) FROM foqs_{tag}_{shard}.items WHERE id = {key}"))
            })
            .collect();
        println!(
            "lost {pl} {id}: last lease {:?}; servers 1..3 (primary {primary_n}) hold {rows:?}",
            ledger.leased.get(pl)
        );
    }
    assert!(
        (ledger.quota_admitted as f64) <= quota_allowed(quota_secs) * 1.1 + 5.0,
        "the quota did not hold across the switches: {summary}"
    );
    assert!(
        ledger.acknowledged.len() > 500,
        "too little load to mean anything: {summary}"
    );
    assert_eq!(lost, 0, "acknowledged items lost: {summary}");
    assert_eq!(ledger.delivered_after_ack, 0, "{summary}");
    assert_eq!(ledger.overlapping_leases, 0, "{summary}");
    assert!(errant.is_empty(), "errant GTIDs {errant:?}: {summary}");
    assert!(same, "the servers did not converge: {summary}");
    assert_eq!(no_tx, 0, "a commit fell back to asynchronous: {summary}");
    assert!(
        !wrote_after_resume,
        "the frozen primary took a write after it resumed: {summary}"
    );
    assert!(
        percentile(planned, 1.0) < 2000,
        "a planned switch was read-only too long: {summary}"
    );
    if std::env::var("FOQS_DRILL_NEGATIVE").as_deref() == Ok("1") {
        negative_control(&r, &cluster, &primary);
    }
}

/// The checker can see loss: with semi-sync off and the replicas' IO threads stopped,
/// the primary's acknowledged items are on it alone; a forced failover after its kill -9
/// must show them lost.
fn negative_control(r: &Replicas, cluster: &Cluster, primary: &str) {
    let p = r.number(primary);
    r.query(p, "SET GLOBAL rpl_semi_sync_master_enabled = OFF")
        .expect("semi-sync off");
    for n in (1..=3).filter(|n| *n != p) {
        r.query(
            n,
            "STOP SLAVE IO_THREAD; SET GLOBAL rpl_semi_sync_slave_enabled = OFF",
        )
        .expect("IO thread stopped");
    }
    let load = Load::start(&cluster.addrs());
    std::thread::sleep(Duration::from_secs(2));
    r.kill(p);
    // The monitor refuses: no semi-synchronous replica can vouch for what was acknowledged.
    std::thread::sleep(Duration::from_millis(2500));
    let refused = cluster
        .replication()
        .iter()
        .all(|s| s.primary.as_deref() == Some(primary));
    // (Retried while the monitor's own attempt holds the set's switch lock.)
    let mut tries = 0;
    let resp = loop {
        let r = cluster.admin(tries).shard_failover(FailoverRequest {
            shard_id: Some(0),
            allow_loss: Some(true),
        });
        let busy = |resp: &SwitchResponse| {
            resp.switches.iter().flatten().any(|s| {
                s.ok != Some(true) && s.error.as_deref().is_some_and(|e| e.contains("under way"))
            })
        };
        match r {
            Ok(resp) if busy(&resp) && tries < 20 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(300));
            }
            Ok(resp) => break resp,
            Err(e) if tries < 20 => {
                eprintln!("shardFailover: {e}; again");
                tries += 1;
                std::thread::sleep(Duration::from_millis(300));
            }
            Err(e) => panic!("shardFailover --allow-loss: {e}"),
        }
    };
    let report = resp.switches.unwrap_or_default().pop().expect("a report");
    cluster.settled_without(primary, Duration::from_secs(30));
    let (ledger, lost) = load.finish(Duration::from_secs(15));
    let line = json!({"negative_control": true, "refused_without_allow_loss": refused,
        "acknowledged": ledger.acknowledged.len(), "lost": lost,
        "lost_transactions": report.lost_transactions, "failover": switch_line(&report, 0)});
    println!("{line}");
    assert!(
        refused,
        "the monitor promoted an asynchronous replica by itself: {line}"
    );
    assert!(
        lost > 0,
        "the checker saw no loss where there must be some: {line}"
    );
}

/// The quota's burst plus its rate over `secs`.
fn quota_allowed(secs: f64) -> f64 {
    foqs::quota::burst(QUOTA_PER_MINUTE) + QUOTA_PER_MINUTE as f64 / 60.0 * secs
}

impl Cluster {
    /// Waits until every shard is served again on a primary other than `old`; returns it.
    fn settled_without(&self, old: &str, within: Duration) -> String {
        let end = Instant::now() + within;
        loop {
            let r = self.replication();
            let by: BTreeMap<_, _> = r
                .iter()
                .map(|s| {
                    (
                        s.shard_id,
                        (s.primary.clone(), s.state.clone(), s.owner.clone()),
                    )
                })
                .collect();
            let primaries: HashSet<_> = r.iter().filter_map(|s| s.primary.clone()).collect();
            if r.len() == SHARDS as usize
                && primaries.len() == 1
                && !primaries.contains(old)
                && by
                    .values()
                    .all(|(_, st, o)| st.as_deref() == Some("serving") && o.is_some())
            {
                return primaries.into_iter().next().unwrap();
            }
            assert!(Instant::now() < end, "no failover away from {old}: {r:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
