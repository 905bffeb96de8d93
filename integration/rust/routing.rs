//! The routing layer with three real `foqsd` processes on etcd and eight shards: any host
//! serves dequeue, long poll, peek, topicStats and the dead-letter calls for its whole
//! tier; a host killed while others route to it costs its items' delay, never a failed
//! dequeue or a lost item.

use crate::common;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use foqs::thrift_gen::*;

const NS: &str = "rt";
const SHARDS: usize = 8;

struct Cluster {
    _etcd: Etcd,
    config: std::path::PathBuf,
    hosts: BTreeMap<String, Proc>,
    /// Each host's metrics listener.
    metrics: BTreeMap<String, SocketAddr>,
}

impl Cluster {
    async fn start(db: &TestDb) -> Cluster {
        let etcd = Etcd::start();
        let toml = format!(
            "{}\n[engine]\nscan_interval_ms = 20\ncheckpoint_interval_ms = 100\nstore_timeout_ms = 1000\n\
             [defaults]\nlease_ms = 5000\nmax_attempts = 1\n\
             [cluster]\nmanager = \"etcd\"\npeer_secret = \"foqs-test-peer-secret\"\npeer_poll_ms = 100\n\
             [cluster.etcd]\nendpoints = [\"{}\"]\nprefix = \"/routing\"\nlease_ttl_ms = 3000\npoll_ms = 100\n",
            db.shards_toml(),
            etcd.endpoint
        );
        let config = write_config(db, &toml);
        let mut hosts = BTreeMap::new();
        let mut metrics = BTreeMap::new();
        for id in ["h1", "h2", "h3"] {
            let m: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let listen = m.to_string();
            hosts.insert(
                id.to_string(),
                Proc::spawn(
                    &config,
                    &[
                        ("FOQS__SERVER__HOST_ID", id),
                        ("FOQS__METRICS__LISTEN", listen.as_str()),
                    ],
                ),
            );
            metrics.insert(id.to_string(), m);
        }
        let c = Cluster {
            _etcd: etcd,
            config,
            hosts,
            metrics,
        };
        // Every shard has an owner and every host serves some.
        let addrs = c.addrs();
        eventually(
            Duration::from_secs(20),
            "8 shards over 3 hosts",
            move || {
                let mut n = 0;
                for a in &addrs {
                    let mut cl = Client::connect(*a, Proto::Binary);
                    let s = cl.host_info().shards.unwrap().len();
                    if s == 0 {
                        return None;
                    }
                    n += s;
                }
                (n == SHARDS).then_some(())
            },
        )
        .await;
        c
    }

    /// How many polls of each peer host `id` has finished (`foqs_peer_polls_total`).
    fn polls(&self, id: &str) -> BTreeMap<String, f64> {
        let (_, scrape) = http_get(self.metrics[id], "/metrics");
        self.hosts
            .keys()
            .filter(|p| *p != id)
            .map(|p| {
                let series = format!("foqs_peer_polls_total{{peer=\"{p}\"}}");
                (p.clone(), sample(&scrape, &series))
            })
            .collect()
    }

    /// Waits until each of `ids` has finished two polls of every peer since the call (so
    /// one began after it): what each knows of its peers' ready items is then at least as
    /// new as the call. A signal, where a sleep of "one peer poll" is outlasted by a
    /// loaded machine (a merged dequeue then plans from an older summary, as documented).
    async fn heard(&self, ids: &[&str]) {
        for id in ids {
            let before = self.polls(id);
            eventually(
                Duration::from_secs(30),
                &format!("{id} to poll every peer twice"),
                || {
                    let now = self.polls(id);
                    before
                        .iter()
                        .all(|(p, n)| now.get(p).is_some_and(|m| *m >= n + 2.0))
                        .then_some(())
                },
            )
            .await;
        }
    }

    fn addr(&self, id: &str) -> SocketAddr {
        self.hosts[id].addr
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.hosts.values().map(|p| p.addr).collect()
    }

    fn client(&self, id: &str) -> Client {
        Client::connect(self.addr(id), Proto::Binary)
    }
}

/// Enqueues `n` items of `topic` through each host (each lands on that host's shards),
/// with priorities 0..10; returns every id.
fn fill(c: &Cluster, topic: &str, n: usize) -> HashSet<String> {
    let mut ids = HashSet::new();
    for id in ["h1", "h2", "h3"] {
        let mut cl = c.client(id);
        let items = (0..n)
            .map(|i| item(NS, topic, (i % 10) as i32, id.as_bytes()))
            .collect();
        ids.extend(cl.enqueue(items));
    }
    ids
}

/// A routed dequeue through `c` that, finding nothing while `left` items are still in the
/// tier, long-polls before giving up: a routed dequeue knows its peers' heads as of their
/// last summary (at most one peer poll old), so the last items on a peer may not be in
/// its view yet; the peer's announcement or the next poll wakes the long poll.
fn dequeue_some(c: &mut Client, topic: &str, count: i32, left: usize) -> Vec<Item> {
    let items = c.dequeue(NS, topic, count);
    if !items.is_empty() {
        return items;
    }
    let items = c
        .try_dequeue_wait(vec![topic_req(NS, topic, count)], Some(5_000))
        .expect("dequeue");
    assert!(!items.is_empty(), "{left} left, none returned");
    items
}

fn priorities_in_order(items: &[Item]) -> bool {
    items
        .windows(2)
        .all(|w| w[0].priority.unwrap() <= w[1].priority.unwrap())
}

/// Drains `topic` through `hosts` in turn (10 per dequeue), acking each reply through the
/// same host; returns the ids and how long it took.
fn drain(hosts: &[SocketAddr], topic: &str, total: usize) -> (Vec<String>, Duration) {
    let mut clients: Vec<Client> = hosts
        .iter()
        .map(|a| Client::connect(*a, Proto::Binary))
        .collect();
    let mut seen = Vec::new();
    let start = Instant::now();
    let mut i = 0;
    while seen.len() < total {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} of {total}",
            seen.len()
        );
        let c = &mut clients[i % hosts.len()];
        i += 1;
        let items = c.dequeue(NS, topic, 10);
        assert!(priorities_in_order(&items), "reply out of order: {items:?}");
        let left = total - seen.len();
        assert!(
            items.len() == left.min(10) || items.len() < 10,
            "got {} with {left} left",
            items.len()
        );
        let ids: Vec<String> = items.into_iter().map(|i| i.id.unwrap()).collect();
        assert!(c.ack(&ids).iter().all(|r| r.error.is_none()));
        seen.extend(ids);
    }
    (seen, start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_host_serves_its_whole_tier() {
    let db = TestDb::new(SHARDS);
    let mut cluster = Cluster::start(&db).await;

    // 1. Items enqueued through all three hosts, dequeued through one: each exactly once,
    //    every reply in priority order, `count` honoured while enough are ready.
    let ids = fill(&cluster, "drain", 100);
    cluster.heard(&["h1"]).await;
    let (seen, took) = tokio::task::block_in_place(|| drain(&[cluster.addr("h1")], "drain", 300));
    let unique: HashSet<String> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "an item was delivered twice");
    assert_eq!(unique, ids, "every item delivered");
    eprintln!("300 items from 3 hosts drained through h1 alone in {took:?}");

    // 1b. The tier's most urgent items first: h1 holds only less urgent items (20..29),
    //     h2 and h3 the more urgent ones (0..9). The first reply through h1 holds the
    //     most urgent, and no item of h1's is delivered while a more urgent one is ready
    //     on a peer.
    for (id, base) in [("h1", 20), ("h2", 0), ("h3", 0)] {
        let items = (0..50)
            .map(|i| item(NS, "urgent", base + i % 10, id.as_bytes()))
            .collect();
        cluster.client(id).enqueue(items);
    }
    cluster.heard(&["h1"]).await;
    let mut h1 = cluster.client("h1");
    let first = h1.dequeue(NS, "urgent", 5);
    let priorities: Vec<i32> = first.iter().map(|i| i.priority.unwrap()).collect();
    assert_eq!(priorities, vec![0; 5], "the tier's most urgent first");
    let mut replies = vec![first];
    let mut left = 150 - 5;
    while left > 0 {
        // A routed dequeue merges the peers' heads h1 knows, at most one poll old: each
        // reply is checked against a fresh poll (under load a poll can come late, and a
        // reply right after the last one could still be planned on its heads).
        cluster.heard(&["h1"]).await;
        let items = dequeue_some(&mut h1, "urgent", 10, left);
        left -= items.len();
        replies.push(items);
    }
    // What was still ready elsewhere after each reply, counting the reply's own.
    let mut urgent_left = 100;
    for (n, reply) in replies.iter().enumerate() {
        let ids: Vec<String> = reply.iter().map(|i| i.id.clone().unwrap()).collect();
        assert!(h1.ack(&ids).iter().all(|r| r.error.is_none()));
        urgent_left -= reply.iter().filter(|i| i.priority.unwrap() < 20).count();
        let shown = || {
            // Which host each item came from, and its priority: "h2 7".
            let r: Vec<String> = reply
                .iter()
                .map(|i| {
                    let from = String::from_utf8_lossy(i.payload.as_deref().unwrap());
                    format!("{from} {}", i.priority.unwrap())
                })
                .collect();
            r.join(", ")
        };
        if reply.iter().any(|i| i.priority.unwrap() >= 20) {
            assert_eq!(
                urgent_left,
                0,
                "reply {n} holds h1's items while {urgent_left} more urgent ones were \
                 ready on h2 and h3: {}",
                shown()
            );
        }
    }
    assert_eq!(urgent_left, 0);

    // 1c. The tier's order, merged: each host holds two items of every priority 0..49
    //     (300 in all). A dequeue of 50 through h1 returns exactly the tier's 50 most
    //     urgent: six of each priority 0..7 and two of 8, from all three hosts at once.
    //     (Before the merge, taking from one peer at a time: up to priority 23.)
    for id in ["h1", "h2", "h3"] {
        let items = (0..100)
            .map(|i| item(NS, "merged", i % 50, id.as_bytes()))
            .collect();
        cluster.client(id).enqueue(items);
    }
    cluster.heard(&["h1"]).await;
    let mut h1 = cluster.client("h1");
    let first = h1.dequeue(NS, "merged", 50);
    let mut got: Vec<i32> = first.iter().map(|i| i.priority.unwrap()).collect();
    got.sort_unstable();
    let mut want: Vec<i32> = (0..8).flat_map(|p| [p; 6]).collect();
    want.extend([8, 8]);
    assert_eq!(got, want, "the first 50 of the tier's merged order");
    let ids: Vec<String> = first.iter().map(|i| i.id.clone().unwrap()).collect();
    assert!(h1.ack(&ids).iter().all(|r| r.error.is_none()));
    let mut left = 300 - 50;
    while left > 0 {
        let items = dequeue_some(&mut h1, "merged", 50, left);
        let ids: Vec<String> = items.iter().map(|i| i.id.clone().unwrap()).collect();
        assert!(h1.ack(&ids).iter().all(|r| r.error.is_none()));
        left -= items.len();
    }

    // 2. A long poll on h1 wakes when an item lands on h2's shards.
    let mut waiter = cluster.client("h1");
    let lp = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let got = waiter
            .try_dequeue_wait(vec![topic_req(NS, "poll", 1)], Some(10_000))
            .unwrap();
        (got, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = Instant::now();
    let id = cluster
        .client("h2")
        .enqueue(vec![item(NS, "poll", 0, b"wake up")])
        .remove(0);
    let (got, waited) = lp.await.unwrap();
    let after_enqueue = sent.elapsed();
    assert_eq!(
        got.len(),
        1,
        "the long poll returned empty after {waited:?}"
    );
    assert_eq!(got[0].id.as_deref(), Some(id.as_str()));
    eprintln!("long poll on h1 returned {after_enqueue:?} after the enqueue on h2");
    // Woken by h2's announcement (about 10 ms here) or, failing that, by h1's next polls
    // of h2 (every 100 ms), not by the long poll's own end (10 s). The bound leaves room
    // for a loaded machine: a fresh-clone run beside the replication tests on a slow day
    // took 478 ms (2026-12-07), past the 300 ms this asserted before.
    assert!(
        after_enqueue < Duration::from_millis(2_000),
        "woken {after_enqueue:?} after the enqueue"
    );

    // 3. peek, topicStats and the dead-letter calls cover the tier, with exact counts.
    let ids = fill(&cluster, "dl", 30);
    cluster.heard(&["h1", "h2"]).await;
    let mut h1 = cluster.client("h1");
    let mut h2 = cluster.client("h2");
    let mut h3 = cluster.client("h3");
    let peeked = h2.try_peek(NS, "dl", 1000).unwrap();
    assert_eq!(peeked.len(), 90);
    assert!(priorities_in_order(&peeked));
    let mut dead = 0;
    while dead < 90 {
        let items = dequeue_some(&mut h1, "dl", 50, 90 - dead);
        let r = h1.nack(
            items
                .iter()
                .map(|i| NackItem {
                    to_dlq: Some(true),
                    ..nack(i.id.as_deref().unwrap(), None, None)
                })
                .collect(),
        );
        assert!(r.iter().all(|r| r.error.is_none()), "{r:?}");
        dead += items.len();
    }
    let stats = h3.stats(NS, "dl");
    assert_eq!(
        (stats.dead, stats.ready, stats.enqueued),
        (Some(90), Some(0), Some(90))
    );
    let mut listed = Vec::new();
    let mut after = None;
    loop {
        let page = h2
            .call(|c| {
                c.dlq_list(DlqListRequest {
                    forwarded_for: None,
                    ns: Some(NS.into()),
                    topic: Some("dl".into()),
                    limit: Some(7),
                    after: after.clone(),
                    local_only: None,
                })
            })
            .unwrap();
        let items = page.items.unwrap();
        assert!(items.len() <= 7);
        listed.extend(items.into_iter().map(|d| d.item.unwrap()));
        after = page.next_after;
        if after.is_none() {
            break;
        }
    }
    assert!(priorities_in_order(&listed));
    let listed_ids: HashSet<String> = listed.iter().map(|i| i.id.clone().unwrap()).collect();
    assert_eq!(
        (listed.len(), &listed_ids),
        (90, &ids),
        "every dead item, once"
    );
    let requeued = h1
        .call(|c| {
            c.dlq_requeue_all(DlqRequeueAllRequest {
                forwarded_for: None,
                ns: Some(NS.into()),
                topic: Some("dl".into()),
                max: Some(40),
                local_only: None,
            })
        })
        .unwrap()
        .count;
    assert_eq!(requeued, Some(40));
    let stats = h2.stats(NS, "dl");
    assert_eq!((stats.ready, stats.dead), (Some(40), Some(50)));
    assert_eq!(h3.try_peek(NS, "dl", 1000).unwrap().len(), 40);
    let purged = h3
        .call(|c| {
            c.dlq_purge(DlqPurgeRequest {
                forwarded_for: None,
                ns: Some(NS.into()),
                topic: Some("dl".into()),
                local_only: None,
            })
        })
        .unwrap()
        .count;
    assert_eq!(purged, Some(50));
    assert_eq!(h1.stats(NS, "dl").dead, Some(0));
    // local_only still asks one host alone.
    let local = h1
        .call(|c| {
            c.topic_stats(TopicStatsRequest {
                forwarded_for: None,
                ns: Some(NS.into()),
                topic: Some("dl".into()),
                local_only: Some(true),
            })
        })
        .unwrap();
    assert!(local.ready.unwrap() < 40, "h1 alone holds part of them");

    // 4. Routed drain throughput: through one host vs through all three.
    let ids = fill(&cluster, "speed1", 1000);
    cluster.heard(&["h1"]).await;
    let (seen, one) =
        tokio::task::block_in_place(|| drain(&[cluster.addr("h1")], "speed1", ids.len()));
    assert_eq!(seen.len(), ids.len());
    let _ = fill(&cluster, "speed3", 1000);
    cluster.heard(&["h1", "h2", "h3"]).await;
    let (_, three) = tokio::task::block_in_place(|| drain(&cluster.addrs(), "speed3", 3000));
    eprintln!(
        "routed drain (10 per dequeue, acked): through h1 alone {:.0} items/s, through all three {:.0} items/s",
        3000.0 / one.as_secs_f64(),
        3000.0 / three.as_secs_f64()
    );

    // 5. A host killed while h1 routes dequeues to it: dequeues keep returning the
    //    survivors' items, and after failover the dead host's items come back.
    let ids = fill(&cluster, "kill", 100);
    cluster.heard(&["h1"]).await;
    let mut got = HashSet::new();
    let mut c = cluster.client("h1");
    for _ in 0..5 {
        for i in c.dequeue(NS, "kill", 10) {
            got.insert(i.id.unwrap());
        }
    }
    cluster.hosts.get_mut("h3").unwrap().sigkill();
    let start = Instant::now();
    let mut errors = 0;
    while got.len() < ids.len() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{} of {} after the kill ({errors} failed dequeues)",
            got.len(),
            ids.len()
        );
        match c.try_dequeue(vec![topic_req(NS, "kill", 10)]) {
            Ok(items) => {
                for i in items {
                    got.insert(i.id.unwrap());
                }
            }
            Err(_) => errors += 1,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "all 300 items delivered {:?} after killing h3 ({errors} dequeues failed meanwhile)",
        start.elapsed()
    );
    assert_eq!(got, ids, "nothing lost");
    let _ = std::fs::remove_dir_all(cluster.config.parent().unwrap());
}
