//! Three real `foqsd` processes, one private etcd, the test MariaDB, eight shards:
//! ownership (exactly one owner per shard, at every moment), routing through any host,
//! failover after SIGKILL under load with nothing acknowledged lost, rejoin with minimal
//! movement, and a namespace quota enforced across the three hosts.

use crate::common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::netns;
use common::*;
use foqs::thrift_gen::ErrorCode;

mod forwarded;
mod nemesis;

const SHARDS: usize = 8;
const LEASE_TTL_MS: u64 = 3000;
const NS: &str = "cl";

/// The scenarios share the machine's two cores; run them one at a time so that the
/// failover timing is not measured under another scenario's load.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn cluster_toml(db: &TestDb, etcd: &Etcd, prefix: &str, extra: &str) -> String {
    format!(
        "{}\n[engine]\nscan_interval_ms = 20\ncheckpoint_interval_ms = 100\nstore_timeout_ms = 1000\n\
         [defaults]\nlease_ms = 2000\n{extra}\n\
         [cluster]\nmanager = \"etcd\"\npeer_secret = \"foqs-test-peer-secret\"\npeer_poll_ms = 100\n\
         [cluster.etcd]\nendpoints = [\"{}\"]\nprefix = \"{prefix}\"\nlease_ttl_ms = {LEASE_TTL_MS}\npoll_ms = 100\n",
        db.shards_toml(),
        etcd.endpoint
    )
}

struct Cluster {
    config: std::path::PathBuf,
    hosts: BTreeMap<String, Proc>,
}

impl Cluster {
    fn start(config: std::path::PathBuf, ids: &[&str]) -> Cluster {
        let mut c = Cluster {
            config,
            hosts: BTreeMap::new(),
        };
        for id in ids {
            c.start_host(id);
        }
        c
    }

    fn start_host(&mut self, id: &str) {
        let p = Proc::spawn(&self.config, &[("FOQS__SERVER__HOST_ID", id)]);
        self.hosts.insert(id.to_string(), p);
    }

    fn addrs(&self) -> Vec<(String, SocketAddr)> {
        self.hosts
            .iter()
            .map(|(id, p)| (id.clone(), p.addr))
            .collect()
    }
}

/// The shards each host says it serves now.
fn owned(addr: SocketAddr) -> Option<BTreeSet<i32>> {
    let mut c = foqs::client::connect(addr, Proto::Binary, Duration::from_secs(2)).ok()?;
    use foqs::thrift_gen::TFoqsSyncClient;
    let info = c.get_host_info().ok()?;
    Some(info.shards?.iter().filter_map(|s| s.shard_id).collect())
}

/// Polls until the hosts' shards are exactly 0..SHARDS, each served by one host, and
/// every host serves some (the balanced end state; a host still joining has none).
async fn settled(hosts: &[(String, SocketAddr)], within: Duration) -> BTreeMap<i32, String> {
    let hosts = hosts.to_vec();
    eventually(within, "every shard has exactly one owner", move || {
        let mut owners = BTreeMap::new();
        for (id, addr) in &hosts {
            for s in owned(*addr)? {
                if owners.insert(s, id.clone()).is_some() {
                    return None;
                }
            }
        }
        // Every host holds its share: the counts within one of each other.
        let counts: Vec<usize> = hosts
            .iter()
            .map(|(id, _)| owners.values().filter(|o| *o == id).count())
            .collect();
        let even = counts.iter().max()? - counts.iter().min()? <= 1;
        let all_busy = counts.iter().all(|n| *n > 0);
        (owners.len() == SHARDS && all_busy && even).then_some(owners)
    })
    .await
}

/// Watches the hosts' own state while a scenario runs: in rounds over the hosts, a shard
/// that host X serves at two consecutive reads of X, and some other host serves at a read
/// between them, had two owners at once.
fn watch_single_owner(
    hosts: Vec<(String, SocketAddr)>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let mut reads: Vec<(String, BTreeSet<i32>)> = Vec::new();
        let mut violations = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            for (id, addr) in &hosts {
                if let Some(s) = owned(*addr) {
                    reads.push((id.clone(), s));
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for (i, (x, xs)) in reads.iter().enumerate() {
            let Some(j) = reads[i + 1..].iter().position(|(id, _)| id == x) else {
                continue;
            };
            let (_, xs2) = &reads[i + 1 + j];
            for (y, ys) in &reads[i + 1..i + 1 + j] {
                for s in xs.intersection(xs2).filter(|s| ys.contains(s)) {
                    violations.push(format!("shard {s} served by {x} and {y} at once"));
                }
            }
        }
        violations
    })
}

/// Producers enqueueing through every host in turn until stopped; ids acknowledged.
fn producers(
    hosts: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<String>>>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..2)
        .map(|p| {
            let (hosts, stop, acked) = (hosts.clone(), stop.clone(), acked.clone());
            std::thread::spawn(move || {
                let mut n = p;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let addr = hosts[n % hosts.len()];
                    let Ok(mut c) =
                        foqs::client::connect(addr, Proto::Binary, Duration::from_secs(5))
                    else {
                        continue;
                    };
                    use foqs::thrift_gen::{EnqueueRequest, TFoqsSyncClient};
                    for _ in 0..20 {
                        let items = (0..5)
                            .map(|i| foqs::client::new_item(NS, "load", i, b"load".to_vec()))
                            .collect();
                        let Ok(r) = c.enqueue(EnqueueRequest {
                            forwarded_for: None,
                            items: Some(items),
                            forwarded_by: None,
                            forward_token: None,
                        }) else {
                            break; // a dead host: go to the next one
                        };
                        for res in r.results.unwrap() {
                            if let Some(id) = res.id {
                                acked.lock().unwrap().push(id);
                            }
                        }
                    }
                }
            })
        })
        .collect()
}

/// Acks `ids` through the host at `addr`, retrying the retryable failures as a client
/// would (that host's view of a shard that just moved can be a poll behind); every ack
/// must succeed within a few seconds.
async fn ack_retrying(addr: SocketAddr, mut ids: Vec<String>) {
    let start = Instant::now();
    let mut c = Client::connect(addr, Proto::Binary);
    loop {
        let r = c.ack(&ids);
        let failed: Vec<_> = r.into_iter().filter(|x| x.error.is_some()).collect();
        if failed.is_empty() {
            return;
        }
        let e = failed[0].error.as_ref().unwrap();
        assert!(
            e.code == Some(ErrorCode::UNAVAILABLE) && start.elapsed() < Duration::from_secs(5),
            "acks through another host: {failed:?}"
        );
        ids = failed.into_iter().map(|x| x.id.unwrap()).collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Dequeues from every host until each of `want` was delivered (acking through a host
/// other than the one that delivered, so acks are forwarded), or `within` passes.
async fn drain_all(cluster: &Cluster, want: &HashSet<String>, within: Duration) -> HashSet<String> {
    let mut seen = HashSet::new();
    let start = Instant::now();
    let addrs = cluster.addrs();
    while !want.is_subset(&seen) && start.elapsed() < within {
        let mut got_any = false;
        for (i, (_, addr)) in addrs.iter().enumerate() {
            let mut c = Client::connect(*addr, Proto::Binary);
            let items = c.dequeue(NS, "load", 1000);
            got_any |= !items.is_empty();
            let ids: Vec<String> = items.into_iter().map(|i| i.id.unwrap()).collect();
            seen.extend(ids.iter().cloned());
            if !ids.is_empty() {
                let (_, other) = addrs[(i + 1) % addrs.len()];
                ack_retrying(other, ids).await;
            }
        }
        if !got_any {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_share_shards_fail_over_after_sigkill_and_rebalance_on_rejoin() {
    let _serial = SERIAL.lock().await;
    let db = TestDb::new(SHARDS);
    let etcd = Etcd::start();
    let prefix = format!("/foqs-test-{}", db.names[0]);
    let config = write_config(&db, &cluster_toml(&db, &etcd, &prefix, ""));
    let mut cluster = Cluster::start(config, &["h1", "h2", "h3"]);
    let initial = settled(&cluster.addrs(), Duration::from_secs(20)).await;
    for h in ["h1", "h2", "h3"] {
        assert!(
            initial.values().any(|o| o == h),
            "{h} owns no shard: {initial:?}"
        );
    }

    // Enqueue through any host: items land on shards the receiving host serves.
    let mut first = HashSet::new();
    for (id, addr) in cluster.addrs() {
        let mut c = Client::connect(addr, Proto::Binary);
        for item_id in c.enqueue((0..30).map(|i| item(NS, "load", i, b"x")).collect()) {
            let shard: i32 = item_id.split(':').next().unwrap().parse().unwrap();
            assert_eq!(
                initial[&shard], id,
                "item {item_id} written by its shard's owner"
            );
            first.insert(item_id);
        }
    }
    let seen = drain_all(&cluster, &first, Duration::from_secs(20)).await;
    assert!(
        first.is_subset(&seen),
        "every item delivered once acked elsewhere"
    );
    assert_eq!(
        db.count("1").await,
        0,
        "every item acked (through other hosts)"
    );

    // Under load, SIGKILL the host with the most shards.
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = watch_single_owner(cluster.addrs(), stop_watch.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let load = producers(
        cluster.addrs().into_iter().map(|(_, a)| a).collect(),
        stop.clone(),
        acked.clone(),
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let victim = ["h1", "h2", "h3"]
        .into_iter()
        .max_by_key(|h| initial.values().filter(|o| o == h).count())
        .unwrap()
        .to_string();
    let victims_shards: BTreeSet<i32> = initial
        .iter()
        .filter(|(_, o)| **o == victim)
        .map(|(s, _)| *s)
        .collect();
    cluster.hosts.get_mut(&victim).unwrap().sigkill();
    let killed = Instant::now();
    let mut dead = cluster.hosts.remove(&victim).unwrap();
    let survivors = cluster.addrs();
    let after = settled(&survivors, Duration::from_millis(LEASE_TTL_MS + 5000)).await;
    let failover = killed.elapsed();
    eprintln!(
        "failover: {victim}'s shards {victims_shards:?} served again after {} ms (lease TTL {LEASE_TTL_MS} ms)",
        failover.as_millis()
    );
    // Minimal movement: the victim's shards move, and none of the survivors'.
    let moved: Vec<_> = initial
        .iter()
        .filter(|(s, o)| **o != victim && after[*s] != **o)
        .collect();
    assert!(moved.is_empty(), "survivors' shards moved: {moved:?}");
    let counts: Vec<usize> = survivors
        .iter()
        .map(|(id, _)| after.values().filter(|o| *o == id).count())
        .collect();
    assert!(
        counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1,
        "{after:?}"
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::SeqCst);
    for p in load {
        p.join().unwrap();
    }
    let acked: HashSet<String> = acked.lock().unwrap().iter().cloned().collect();
    assert!(
        acked.len() > 100,
        "the load ran: {} acknowledged",
        acked.len()
    );
    // Items the victim had staged or leased come back when their leases (2 s) expire.
    let seen = drain_all(&cluster, &acked, Duration::from_secs(30)).await;
    let lost: Vec<_> = acked.difference(&seen).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged items never delivered: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );

    // The dead host comes back: it takes its share (the loads even out again) from the
    // others, and no other shard moves (the assignment starts from the current owners).
    drop(dead.child.wait());
    cluster.start_host(&victim);
    let rejoined = eventually(
        Duration::from_secs(LEASE_TTL_MS / 1000 + 15),
        "rebalanced",
        || {
            let mut owners = BTreeMap::new();
            for (id, addr) in cluster.addrs() {
                for s in owned(addr)? {
                    owners.insert(s, id.clone());
                }
            }
            let counts: Vec<usize> = ["h1", "h2", "h3"]
                .iter()
                .map(|h| owners.values().filter(|o| o == h).count())
                .collect();
            let even = counts.iter().max()? - counts.iter().min()? <= 1;
            (owners.len() == after.len() && even).then_some(owners)
        },
    )
    .await;
    let moved: Vec<_> = after
        .iter()
        .filter(|(s, o)| rejoined[*s] != **o && rejoined[*s] != victim)
        .collect();
    assert!(
        moved.is_empty(),
        "shards moved between the survivors on the rejoin: {moved:?} ({after:?} -> {rejoined:?})"
    );
    stop_watch.store(true, Ordering::SeqCst);
    let violations = watcher.join().unwrap();
    assert!(violations.is_empty(), "{violations:?}");
    for p in cluster.hosts.values_mut() {
        assert_eq!(p.sigterm().code(), Some(0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_quota_holds_across_all_hosts() {
    let _serial = SERIAL.lock().await;
    const PER_MINUTE: u64 = 1200;
    const RUN: Duration = Duration::from_secs(30);
    let db = TestDb::new(SHARDS);
    let etcd = Etcd::start();
    let prefix = format!("/foqs-test-{}", db.names[0]);
    let quota = format!("[[namespaces]]\nname = \"q\"\nenqueues_per_minute = {PER_MINUTE}\nquota_burst_ms = 1000\n[[namespaces]]\nname = \"{NS}\"\n");
    let config = write_config(&db, &cluster_toml(&db, &etcd, &prefix, &quota));
    let cluster = Cluster::start(config, &["h1", "h2", "h3"]);
    settled(&cluster.addrs(), Duration::from_secs(20)).await;

    let start = Instant::now();
    let drivers: Vec<_> = cluster
        .addrs()
        .into_iter()
        .map(|(_, addr)| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr, Proto::Binary);
                let (mut ok, mut limited, mut unavailable) = (0u64, 0u64, 0u64);
                while start.elapsed() < RUN {
                    let r = c.try_enqueue(vec![item("q", "t", 0, b"q")]).unwrap();
                    match &r[0].error {
                        None => ok += 1,
                        // A loaded machine may let a host's etcd lease lapse: its shards
                        // refuse, retryably, until it holds them again. Counted, bounded.
                        Some(e) if e.code == Some(ErrorCode::UNAVAILABLE) => {
                            unavailable += 1;
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Some(e) => {
                            assert_eq!(e.code, Some(ErrorCode::RATE_LIMITED), "{e:?}");
                            limited += 1;
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                }
                assert!(
                    unavailable * 10 <= ok + limited,
                    "{unavailable} enqueues refused as UNAVAILABLE beside {ok} admitted and {limited} limited"
                );
                (ok, limited)
            })
        })
        .collect();
    let results: Vec<(u64, u64)> = drivers.into_iter().map(|d| d.join().unwrap()).collect();
    let admitted: u64 = results.iter().map(|r| r.0).sum();
    let per_minute = admitted as f64 * 60.0 / RUN.as_secs_f64();
    eprintln!(
        "quota {PER_MINUTE}/min through 3 hosts for {} s: admitted {admitted} ({per_minute:.0}/min), per host {results:?}",
        RUN.as_secs()
    );
    assert!(
        results.iter().all(|r| r.0 > 0 && r.1 > 0),
        "every host admitted some and limited some: {results:?}"
    );
    let expected = PER_MINUTE as f64;
    assert!(
        (per_minute - expected).abs() <= expected * 0.10,
        "{per_minute:.0}/min is not within 10% of {expected}"
    );
    assert_eq!(
        db.count("tid IN (SELECT tid FROM topics WHERE ns = X'71')")
            .await as u64,
        admitted
    );
}

/// A TCP proxy in front of etcd that the test can cut: while cut, its connections are
/// dropped and new ones closed at once (a host partitioned from etcd, not from MySQL).
struct Cuttable {
    port: u16,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Cuttable {
    async fn start(target: String) -> Cuttable {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, cut_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if *cut_rx.borrow() {
                    continue; // dropped: closed at once
                }
                let target = target.clone();
                let mut cut_rx = cut_rx.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut_rx.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        Cuttable { port, cut }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_cut_off_from_etcd_stops_serving_before_another_takes_over() {
    let _serial = SERIAL.lock().await;
    let db = TestDb::new(SHARDS);
    let etcd = Etcd::start();
    let proxy = Cuttable::start(etcd.endpoint.clone()).await;
    let prefix = format!("/foqs-test-{}", db.names[0]);
    let direct = write_config(&db, &cluster_toml(&db, &etcd, &prefix, ""));
    let via_proxy = direct.with_file_name("via-proxy.toml");
    std::fs::write(
        &via_proxy,
        std::fs::read_to_string(&direct)
            .unwrap()
            .replace(&etcd.endpoint, &format!("127.0.0.1:{}", proxy.port)),
    )
    .unwrap();
    let mut cluster = Cluster::start(direct, &["h1"]);
    let cut_host = Proc::spawn(&via_proxy, &[("FOQS__SERVER__HOST_ID", "h2")]);
    let h2 = cut_host.addr;
    cluster.hosts.insert("h2".into(), cut_host);
    let initial = settled(&cluster.addrs(), Duration::from_secs(20)).await;
    let h2_shards: BTreeSet<i32> = initial
        .iter()
        .filter(|(_, o)| o.as_str() == "h2")
        .map(|(s, _)| *s)
        .collect();
    assert!(!h2_shards.is_empty());
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = watch_single_owner(cluster.addrs(), stop_watch.clone());

    proxy.set_cut(true);
    let cut = Instant::now();
    // h2 gives its shards up by itself (it can no longer be sure of its lease) ...
    eventually(
        Duration::from_millis(LEASE_TTL_MS),
        "h2 stops serving",
        || owned(h2).filter(|s| s.is_empty()),
    )
    .await;
    let fenced = cut.elapsed();
    // ... and only then, once etcd expired its lease, h1 takes them.
    let after = settled(
        &[("h1".to_string(), cluster.hosts["h1"].addr)],
        Duration::from_millis(LEASE_TTL_MS + 5000),
    )
    .await;
    let taken = cut.elapsed();
    eprintln!(
        "cut from etcd: h2 stopped serving after {} ms, h1 served its shards after {} ms (lease TTL {LEASE_TTL_MS} ms)",
        fenced.as_millis(),
        taken.as_millis()
    );
    assert!(fenced < taken);
    assert_eq!(after.len(), SHARDS);
    // Meanwhile h2, reachable by clients and peers, forwards enqueues to h1.
    let mut c = Client::connect(h2, Proto::Binary);
    let ids = eventually(Duration::from_secs(5), "h2 forwards", || {
        let r = c.try_enqueue(vec![item(NS, "cut", 0, b"x")]).ok()?;
        r[0].id.clone()
    })
    .await;
    let shard: i32 = ids.split(':').next().unwrap().parse().unwrap();
    assert_eq!(after[&shard], "h1");

    // Reconnected, h2 registers again and takes its share back from h1 (the shards that
    // move go to h2; which ones is the assignment's choice, not necessarily its old ones).
    proxy.set_cut(false);
    let back = settled(
        &cluster.addrs(),
        Duration::from_secs(LEASE_TTL_MS / 1000 + 15),
    )
    .await;
    let wrong: Vec<_> = back
        .iter()
        .filter(|(s, o)| after[*s] != **o && o.as_str() != "h2")
        .collect();
    assert!(wrong.is_empty(), "{after:?} -> {back:?}");
    stop_watch.store(true, Ordering::SeqCst);
    let violations = watcher.join().unwrap();
    assert!(violations.is_empty(), "{violations:?}");
}

/// libfaketime (Debian's `libfaketime`), preloaded into a foqsd: its wall clock runs at
/// the offset written in `file` (re-read every second); its monotonic clock is left
/// alone, as the fences use it.
fn faketime_env(file: &std::path::Path) -> Vec<(&'static str, String)> {
    const LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
    assert!(
        std::path::Path::new(LIB).exists(),
        "{LIB} is missing: install Debian's libfaketime (scripts/test.sh does)"
    );
    vec![
        ("LD_PRELOAD", LIB.to_string()),
        ("FAKETIME_TIMESTAMP_FILE", file.display().to_string()),
        ("FAKETIME_CACHE_DURATION", "1".to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ]
}

/// A host whose wall clock runs 3 s ahead of its two peers' (`cluster.clock_skew_max_ms`
/// 500) finds itself out of bound on its peer polls, stops renewing its etcd lease and
/// gives its shards up; the two others serve every shard, never two at once. Its clock
/// back in bound, it registers again and takes its share. (Before: a host 2 s fast kept
/// its shards and handed out leases whose ends, in its clock, were up to 2 s later than
/// a correct clock's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_clock_is_off_gives_its_shards_up_until_it_is_back() {
    let _serial = SERIAL.lock().await;
    let db = TestDb::new(SHARDS);
    let etcd = Etcd::start();
    let prefix = format!("/foqs-test-{}", db.names[0]);
    let config = write_config(&db, &cluster_toml(&db, &etcd, &prefix, ""));
    let offset = config.with_file_name("faketime");
    std::fs::write(&offset, "+3s\n").unwrap();
    let mut cluster = Cluster::start(config.clone(), &["h1", "h2"]);
    let env = faketime_env(&offset);
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.push(("FOQS__SERVER__HOST_ID", "h3"));
    let skewed = Proc::spawn(&config, &env);
    let h3 = skewed.addr;
    cluster.hosts.insert("h3".into(), skewed);
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = watch_single_owner(cluster.addrs(), stop_watch.clone());
    let two: Vec<_> = cluster
        .addrs()
        .into_iter()
        .filter(|(id, _)| id != "h3")
        .collect();
    let started = Instant::now();
    settled(&two, Duration::from_millis(LEASE_TTL_MS + 20_000)).await;
    assert_eq!(
        owned(h3),
        Some(BTreeSet::new()),
        "the skewed host serves nothing"
    );
    eprintln!(
        "a host 3 s ahead: the two others served every shard after {} ms",
        started.elapsed().as_millis()
    );
    // Back in bound: it registers again and takes its share.
    std::fs::write(&offset, "+0s\n").unwrap();
    settled(
        &cluster.addrs(),
        Duration::from_millis(LEASE_TTL_MS + 20_000),
    )
    .await;
    stop_watch.store(true, Ordering::SeqCst);
    let violations = watcher.join().unwrap();
    assert!(violations.is_empty(), "{violations:?}");
}

/// A config for hosts on a [`netns::Stage`]: `shards` shards on the stage's MariaDB
/// (`mysql`), its etcd, the usual test timings, `extra` lines in `[cluster]`; written in
/// `dir` (made here).
fn stage_config(
    dir: &std::path::Path,
    mysql: &str,
    etcd: &str,
    shards: usize,
    extra: &str,
) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let config = dir.join("foqsd.toml");
    let shards: String = (0..shards)
        .map(|i| format!("[[shards]]\nid = {i}\nurl = \"{mysql}/foqs_ns_s{i}\"\n"))
        .collect();
    std::fs::write(
        &config,
        format!(
            "[server]\nallow_open = true\n{shards}\
             [engine]\nscan_interval_ms = 20\ncheckpoint_interval_ms = 100\nstore_timeout_ms = 1000\n\
             [defaults]\nlease_ms = 2000\n\
             [cluster]\nmanager = \"etcd\"\npeer_secret = \"foqs-test-peer-secret\"\npeer_poll_ms = 100\n{extra}\
             [cluster.etcd]\nendpoints = [\"{etcd}\"]\nprefix = \"/foqs-netns\"\nlease_ttl_ms = {LEASE_TTL_MS}\npoll_ms = 100\n"
        ),
    )
    .unwrap();
    config
}

/// On a network of its own (every host, the etcd member and the MariaDB server in its own
/// namespace, `scripts/netns.sh`), a host cut off from etcd by nftables, while it still
/// reaches MariaDB, its peers and its clients, stops serving its shards before the other
/// host takes them, and no shard ever has two owners; healed, it takes its share back.
/// (The in-process stand-in above drops its etcd connections; this is the network.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_real_network_a_host_cut_off_from_etcd_stops_serving_before_another_takes_over() {
    cut_from_etcd_on_a_real_network(false).await;
}

/// The same with a one-way cut: h2's packets to etcd are dropped, etcd's to h2 are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_real_network_a_host_whose_packets_to_etcd_are_lost_stops_serving_first() {
    cut_from_etcd_on_a_real_network(true).await;
}

async fn cut_from_etcd_on_a_real_network(one_way: bool) {
    let _serial = SERIAL.lock().await;
    let mut stage = netns::Stage::new(&["etcd", "db", "h1", "h2"]);
    let etcd = stage.etcd("etcd");
    let mysql = stage.mariadb("db");
    let dir = std::env::temp_dir().join(format!("foqs-netns-{}", std::process::id()));
    let config = stage_config(&dir, &mysql, &etcd, 4, "");
    let h1 = stage.foqsd("h1", &config, "h1");
    let h2 = stage.foqsd("h2", &config, "h2");
    let split = |hosts: Vec<SocketAddr>| {
        move || {
            let sets: Vec<BTreeSet<i32>> =
                hosts.iter().map(|a| owned(*a)).collect::<Option<_>>()?;
            let all: BTreeSet<i32> = sets.iter().flatten().copied().collect();
            let total: usize = sets.iter().map(BTreeSet::len).sum();
            (all.len() == 4 && total == 4 && sets.iter().all(|s| !s.is_empty())).then_some(sets)
        }
    };
    let before = eventually(
        Duration::from_secs(30),
        "h1 and h2 share the shards",
        split(vec![h1, h2]),
    )
    .await;
    assert!(!before[1].is_empty());
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = watch_single_owner(
        vec![("h1".to_string(), h1), ("h2".to_string(), h2)],
        stop_watch.clone(),
    );

    if one_way {
        stage.cut_one_way("h2", "etcd");
    } else {
        stage.cut("h2", "etcd");
    }
    let cut = Instant::now();
    eventually(
        Duration::from_millis(LEASE_TTL_MS + 2000),
        "h2 stops serving",
        || owned(h2).filter(|s| s.is_empty()),
    )
    .await;
    let stopped = cut.elapsed();
    let mut h2_seen_serving_after = None;
    let taken = eventually(
        Duration::from_millis(LEASE_TTL_MS + 10_000),
        "h1 serves all",
        || {
            if owned(h2).is_some_and(|s| !s.is_empty()) {
                h2_seen_serving_after = Some(cut.elapsed());
            }
            owned(h1).filter(|s| s.len() == 4)
        },
    )
    .await;
    let took_over = cut.elapsed();
    eprintln!(
        "netns, h2 cut from etcd{}: it stopped serving after {} ms, h1 served its shards after {} ms (lease TTL {LEASE_TTL_MS} ms)",
        if one_way { " one way" } else { "" },
        stopped.as_millis(),
        took_over.as_millis()
    );
    assert_eq!(taken.len(), 4);
    assert!(stopped < took_over);
    assert_eq!(h2_seen_serving_after, None, "h2 served again while cut off");
    // Cut from etcd only: h2 still serves its clients by forwarding to h1.
    let mut c = Client::connect(h2, Proto::Binary);
    eventually(Duration::from_secs(5), "h2 forwards", || {
        c.try_enqueue(vec![item(NS, "netns", 0, b"x")]).ok()?[0]
            .id
            .clone()
    })
    .await;

    stage.heal();
    eventually(
        Duration::from_millis(LEASE_TTL_MS + 15_000),
        "h2 takes its share back",
        split(vec![h1, h2]),
    )
    .await;
    stop_watch.store(true, Ordering::SeqCst);
    let violations = watcher.join().unwrap();
    assert!(violations.is_empty(), "{violations:?}");
    drop(stage);
    let _ = std::fs::remove_dir_all(dir);
}
