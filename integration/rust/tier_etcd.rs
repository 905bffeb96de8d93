//! Many lightweight hosts in one process against one real private etcd: each is the real
//! etcd shard manager (`EtcdManager`: lease, watches, the assignment from the current
//! owners, key hand-over) with no shards opened: it gives a shard back as soon as its view
//! stops giving it the shard, as foqsd does once it has stopped serving it. Steps: all
//! join; a tenth crash (their leases lapse); as many join. After each, every shard must be
//! owned by exactly one live host (by the hosts' own views), with the hosts within one
//! shard of each other, and at no moment by two; then every host's view must name those
//! same owners (a view that diverged for good fails). Per step it prints the time that took
//! (the goal after a crash or a join: the lease TTL + 2 s) and etcd's own counters
//! (requests handled, bytes sent to clients). The bounds it asserts are generous (TTL +
//! 20 s), for a loaded machine; the figures are for reading.
//!
//! Sizes: `FOQS_TIER_HOSTS` (default 30) and 5 shards per host; `bash scripts/tier-etcd.sh`
//! runs 200 (all in this one process: 200 followers on the test's two threads).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use foqs::cluster::config::EtcdConfig;
use foqs::cluster::{EtcdManager, Member, ShardManager};
use foqs::model::ShardId;

const LEASE_TTL_MS: u64 = 10_000;

struct Light {
    id: String,
    manager: Arc<EtcdManager>,
    metrics: Arc<foqs::metrics::Metrics>,
    /// The shards its view gives it now.
    owned: Arc<Mutex<BTreeSet<ShardId>>>,
    follow: tokio::task::JoinHandle<()>,
}

async fn light(cfg: &EtcdConfig, id: String, shards: &[ShardId]) -> Light {
    let member = Member {
        host_id: id.clone(),
        addr: "127.0.0.1:1".into(),
        tier: "default".into(),
        region: String::new(),
        tier_shards: shards.to_vec(),
        primaries: BTreeMap::new(),
    };
    let metrics = Arc::new(foqs::metrics::Metrics::new());
    let clock = Arc::new(foqs::cluster::ClockCheck::new(500));
    let (manager, _client) = EtcdManager::start(cfg, member, 1000, metrics.clone(), clock)
        .await
        .expect("etcd manager starts");
    let owned = Arc::new(Mutex::new(BTreeSet::new()));
    let follow = tokio::spawn({
        let (manager, owned, id) = (manager.clone(), owned.clone(), id.clone());
        async move {
            let mut rx = manager.watch();
            loop {
                let view = rx.borrow_and_update().clone();
                let mine: BTreeSet<ShardId> = view
                    .owners
                    .iter()
                    .filter(|(_, o)| **o == id)
                    .map(|(s, _)| *s)
                    .collect();
                let lost: Vec<ShardId> = {
                    let mut owned = owned.lock().unwrap();
                    let lost = owned.difference(&mine).copied().collect();
                    *owned = mine;
                    lost
                };
                // Stopped serving them (nothing to stop here): the manager may hand them on;
                // and so may it those withdrawn before this host saw them given (as foqsd
                // does for withdrawn shards it does not serve).
                let never_seen = view
                    .withdrawn
                    .iter()
                    .filter(|s| !lost.contains(s))
                    .copied()
                    .collect::<Vec<_>>();
                for s in lost.into_iter().chain(never_seen) {
                    manager.released(s);
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        }
    });
    Light {
        id,
        manager,
        metrics,
        owned,
        follow,
    }
}

/// Shards owned by no live host, by two or more, and the most and fewest a host owns.
fn ownership(hosts: &[Light], shards: usize) -> (usize, usize, usize, usize) {
    let mut by_shard: BTreeMap<ShardId, usize> = BTreeMap::new();
    let mut loads = Vec::new();
    for h in hosts {
        let owned = h.owned.lock().unwrap();
        loads.push(owned.len());
        for s in owned.iter() {
            *by_shard.entry(*s).or_default() += 1;
        }
    }
    let doubled = by_shard.values().filter(|n| **n > 1).count();
    let unowned = shards - by_shard.len();
    let max = loads.iter().copied().max().unwrap_or(0);
    let min = loads.iter().copied().min().unwrap_or(0);
    (unowned, doubled, max, min)
}

/// Waits until every shard has exactly one live owner and the loads are even; panics on
/// a moment with two owners, or after `within`.
async fn settle(hosts: &[Light], shards: usize, within: Duration, step: &str) {
    let start = Instant::now();
    loop {
        let (unowned, doubled, max, min) = ownership(hosts, shards);
        assert_eq!(
            doubled, 0,
            "{step}: {doubled} shards had two owners at once"
        );
        if unowned == 0 && max - min <= 1 {
            return;
        }
        if start.elapsed() >= within {
            let owned: BTreeSet<ShardId> = hosts
                .iter()
                .flat_map(|h| h.owned.lock().unwrap().clone())
                .collect();
            let missing: Vec<usize> = (0..shards)
                .filter(|s| !owned.contains(&(*s as ShardId)))
                .collect();
            // What the hosts' views say of them: owner (or none) -> how many hosts say so.
            let said: Vec<BTreeMap<String, usize>> = missing
                .iter()
                .take(3)
                .map(|s| {
                    let mut by: BTreeMap<String, usize> = BTreeMap::new();
                    for h in hosts {
                        let v = h.manager.watch().borrow().clone();
                        let o = v.owners.get(&(*s as ShardId)).cloned().unwrap_or_default();
                        let w = if v.withdrawn.contains(&(*s as ShardId)) {
                            "+withdrawn"
                        } else {
                            ""
                        };
                        *by.entry(format!("{o}{w}")).or_default() += 1;
                    }
                    by
                })
                .collect();
            panic!("{step}: not settled after {within:?}: {unowned} shards unowned ({missing:?}), loads {min}..{max}; views: {said:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every host's view names the same owner for every shard, and that owner
/// is the host that serves it (a quiet tier: a view that diverged for good, as a wrong
/// watch cache would leave it, fails here); returns how long that took.
async fn views_agree(hosts: &[Light], within: Duration, step: &str) -> Duration {
    let start = Instant::now();
    loop {
        let served: BTreeMap<ShardId, String> = hosts
            .iter()
            .flat_map(|h| {
                let owned = h.owned.lock().unwrap().clone();
                owned.into_iter().map(|s| (s, h.id.clone()))
            })
            .collect();
        let differ: Vec<&str> = hosts
            .iter()
            .filter(|h| h.manager.watch().borrow().owners != served)
            .map(|h| h.id.as_str())
            .collect();
        if differ.is_empty() {
            return start.elapsed();
        }
        if start.elapsed() >= within {
            let h = hosts.iter().find(|h| h.id == differ[0]).expect("a host");
            let view = h.manager.watch().borrow().owners.clone();
            let wrong: Vec<_> = served
                .iter()
                .filter(|(s, o)| view.get(s) != Some(o))
                .map(|(s, o)| (*s, o.clone(), view.get(s).cloned()))
                .take(5)
                .collect();
            panic!("{step}: {} hosts' views still differ from what is served after {within:?}; {}: (shard, served by, its view) {wrong:?}", differ.len(), differ[0]);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// etcd's own counters: gRPC requests handled, and bytes sent to its clients.
fn etcd_counters(endpoint: &str) -> (f64, f64) {
    let (_, body) = http_get(endpoint.parse().expect("etcd's host:port"), "/metrics");
    let sum = |name: &str| {
        body.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    (
        sum("grpc_server_handled_total"),
        sum("etcd_network_client_grpc_sent_bytes_total"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tier_of_many_hosts_keeps_one_owner_per_shard_through_joins_and_crashes() {
    let n: usize = std::env::var("FOQS_TIER_HOSTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    if let Ok(level) = std::env::var("FOQS_TEST_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(level).try_init();
    }
    let change = (n / 10).max(1);
    let shards: Vec<ShardId> = (0..(n * 5) as ShardId).collect();
    let etcd = Etcd::start();
    let cfg = EtcdConfig {
        endpoints: vec![etcd.endpoint.clone()],
        prefix: format!("/foqs-tier-{}", std::process::id()),
        lease_ttl_ms: LEASE_TTL_MS,
        poll_ms: 1000,
    };
    // Generous bounds for the suite on a loaded machine; the goal (lease TTL + 2 s after a
    // crash or a join) is printed beside each figure.
    let bound = Duration::from_millis(LEASE_TTL_MS + 20_000);
    let mut report = Vec::new();
    let mut counters = etcd_counters(&etcd.endpoint);
    let mut step = |name: &str, took: Duration, agreed: Duration, hosts: &[Light]| {
        let now = etcd_counters(&etcd.endpoint);
        // Whole reads of the cluster by every host so far, by reason (the watch cache's).
        let reads: BTreeMap<&str, u64> = [
            "start",
            "watch_ended",
            "watch_behind",
            "watch_silent",
            "count_differs",
            "verify_differs",
        ]
        .into_iter()
        .map(|r| (r, hosts.iter().map(|h| h.metrics.view_reads_for(r)).sum()))
        .collect();
        let line = serde_json::json!({
            "step": name, "hosts": hosts.len(), "shards": shards.len(),
            "settled_ms": took.as_millis() as u64,
            "views_agree_ms": agreed.as_millis() as u64,
            "goal_ms": if name == "join all" { serde_json::Value::Null } else { (LEASE_TTL_MS + 2000).into() },
            "etcd_requests": now.0 - counters.0,
            "etcd_sent_bytes": now.1 - counters.1,
            "view_reads": reads,
        });
        eprintln!("{line}");
        counters = now;
        report.push(line);
    };

    let mut hosts = Vec::new();
    let start = Instant::now();
    for i in 0..n {
        hosts.push(light(&cfg, format!("light-{i:04}"), &shards).await);
    }
    settle(&hosts, shards.len(), bound, "join all").await;
    let took = start.elapsed();
    let agreed = views_agree(&hosts, bound, "join all").await;
    step("join all", took, agreed, &hosts);

    let before: BTreeMap<String, BTreeSet<ShardId>> = hosts
        .iter()
        .map(|h| (h.id.clone(), h.owned.lock().unwrap().clone()))
        .collect();
    let start = Instant::now();
    let crashed: Vec<Light> = hosts.drain(..change).collect();
    for h in &crashed {
        h.manager.crash();
        h.follow.abort();
    }
    settle(&hosts, shards.len(), bound, "crash").await;
    let took = start.elapsed();
    let agreed = views_agree(&hosts, bound, "crash").await;
    step("crash", took, agreed, &hosts);
    // Only the crashed hosts' shards moved.
    for h in &hosts {
        let now = h.owned.lock().unwrap().clone();
        assert!(
            before[&h.id].is_subset(&now),
            "{} lost shards on another's crash: {:?} -> {:?}",
            h.id,
            before[&h.id],
            now
        );
    }
    drop(crashed);

    let start = Instant::now();
    for i in n..n + change {
        hosts.push(light(&cfg, format!("light-{i:04}"), &shards).await);
    }
    settle(&hosts, shards.len(), bound, "join").await;
    let took = start.elapsed();
    let agreed = views_agree(&hosts, bound, "join").await;
    step("join", took, agreed, &hosts);

    // Gone at once, as on a crash: leaving one by one would move every shard 200 times
    // over (each leave a storm of its own), for nothing the test looks at.
    for h in &hosts {
        h.manager.crash();
        h.follow.abort();
    }
    assert_eq!(report.len(), 3);
}
