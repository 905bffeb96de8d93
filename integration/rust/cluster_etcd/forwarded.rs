//! An enqueue forwarded to a peer that is killed mid-call: answered with what happened.

use super::*;

/// A dedup key of `NS`/`topic` whose shard is one of `shards` (FNV-1a over the tier's
/// shards, as the host places dedup keys), so that an enqueue of it through another host
/// is forwarded to their owner.
fn dedup_key_on(topic: &str, shards: &BTreeSet<i32>) -> String {
    (0..)
        .map(|i| format!("k{i}"))
        .find(|k| {
            let h = foqs::hash::fnv1a([NS.as_bytes(), &[0], topic.as_bytes(), &[0], k.as_bytes()]);
            shards.contains(&((h % SHARDS as u64) as i32))
        })
        .unwrap()
}

/// An enqueue forwarded to a peer that is killed mid-call is answered with what happened,
/// not "outcome unknown": the forwarding host asks every shard of the tier, through its
/// owner after the failover, what the peer stored under the request's token.
/// - killed after it stored the item (paused at `forwarded-enqueue-answered`): OK, with
///   the item's id, and the item is there;
/// - killed before it stored anything (`forwarded-enqueue-received`): `UNAVAILABLE`
///   without `outcome_unknown` ("nothing was stored; retry"), and nothing is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_forwarded_to_a_peer_killed_mid_call_is_answered_with_what_happened() {
    use foqs::thrift_gen::{EnqueueRequest, TFoqsSyncClient};
    let _serial = SERIAL.lock().await;
    let db = TestDb::new(SHARDS);
    let etcd = Etcd::start();
    let prefix = format!("/foqs-test-{}", db.names[0]);
    let config = write_config(&db, &cluster_toml(&db, &etcd, &prefix, ""));
    let mut cluster = Cluster::start(config.clone(), &["h1", "h3"]);
    let log = std::env::temp_dir().join(format!("foqs-forward-doubt-{}.log", db.names[0]));
    for (case, failpoint) in [
        ("stored", "forwarded-enqueue-answered"),
        ("not-stored", "forwarded-enqueue-received"),
    ] {
        // The victim, h2, holds every forwarded request it gets at the failpoint.
        let err = std::fs::File::create(&log).unwrap();
        let victim = Proc::spawn_with_stderr(
            &config,
            &[
                ("FOQS__SERVER__HOST_ID", "h2"),
                ("FAILPOINTS", &format!("{failpoint}=return(60000)")),
            ],
            err,
        );
        cluster.hosts.insert("h2".into(), victim);
        let owners = settled(&cluster.addrs(), Duration::from_secs(20)).await;
        let theirs: BTreeSet<i32> = owners
            .iter()
            .filter(|(_, o)| *o == "h2")
            .map(|(s, _)| *s)
            .collect();
        // h1 has polled h2 since it started (and so knows it marks forwarded items), and
        // its view of the owners has caught up with what h2 serves (the hosts settle
        // first, each host's view of the others a moment after).
        let h1 = cluster.hosts["h1"].addr;
        eventually(
            Duration::from_secs(10),
            "h1 reaches h2 and knows its shards",
            || {
                let info = Client::connect(h1, Proto::Binary).host_info();
                info.peers?
                    .iter()
                    .any(|p| {
                        p.host_id.as_deref() == Some("h2")
                            && p.reachable == Some(true)
                            && p.shards
                                .as_ref()
                                .map(|s| s.iter().copied().collect::<BTreeSet<_>>())
                                == Some(theirs.clone())
                    })
                    .then_some(())
            },
        )
        .await;
        let key = dedup_key_on("fwd", &theirs);
        let payload = format!("fwd-{case}");
        let (k, p) = (key.clone(), payload.clone());
        let call = std::thread::spawn(move || {
            let mut c = foqs::client::connect(h1, Proto::Binary, Duration::from_secs(30)).unwrap();
            let mut it = foqs::client::new_item(NS, "fwd", 0, p.into_bytes());
            it.dedup_key = Some(k);
            let started = Instant::now();
            let r = c.enqueue(EnqueueRequest {
                forwarded_for: None,
                items: Some(vec![it]),
                forwarded_by: None,
                forward_token: None,
            });
            (r, started.elapsed())
        });
        eventually(
            Duration::from_secs(20),
            "h2 holds the forwarded call",
            || {
                let text = std::fs::read_to_string(&log).ok()?;
                text.contains("paused at a failpoint").then_some(())
            },
        )
        .await;
        let there = db.count(&format!("payload = '{payload}'")).await;
        assert_eq!(
            there,
            (case == "stored") as i64,
            "{case}: rows before the kill"
        );
        cluster.hosts.get_mut("h2").unwrap().sigkill();
        cluster.hosts.remove("h2");
        let (r, took) = call.join().unwrap();
        let r = r.expect("the enqueue call itself answers").results.unwrap();
        eprintln!("{case}: answered after {} ms: {:?}", took.as_millis(), r[0]);
        assert!(
            took < Duration::from_millis(LEASE_TTL_MS + 8_000),
            "{case}: answered within the bound: {took:?}"
        );
        match case {
            "stored" => {
                let id = r[0].id.clone().unwrap_or_else(|| {
                    panic!("stored: answered {:?}, not the item's id", r[0].error)
                });
                let shard: i32 = id.split(':').next().unwrap().parse().unwrap();
                assert!(theirs.contains(&shard), "{id} on h2's shards {theirs:?}");
                let seen = drain_topic(&cluster, "fwd", &id).await;
                assert!(seen, "the item answered OK is delivered");
            }
            _ => {
                let e = r[0].error.as_ref().expect("not stored: an error");
                assert_eq!(e.code, Some(ErrorCode::UNAVAILABLE), "{e:?}");
                assert_ne!(
                    e.outcome_unknown,
                    Some(true),
                    "certain, not in doubt: {e:?}"
                );
                assert_eq!(db.count(&format!("payload = '{payload}'")).await, 0);
            }
        }
    }
    let _ = std::fs::remove_file(&log);
    for p in cluster.hosts.values_mut() {
        assert_eq!(p.sigterm().code(), Some(0));
    }
}

/// Dequeues `topic` through every host until `id` is delivered (acked then), up to 20 s.
async fn drain_topic(cluster: &Cluster, topic: &str, id: &str) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        for (_, addr) in cluster.addrs() {
            let mut c = Client::connect(addr, Proto::Binary);
            let items = c.dequeue(NS, topic, 10);
            let ids: Vec<String> = items.into_iter().map(|i| i.id.unwrap()).collect();
            if !ids.is_empty() {
                ack_retrying(addr, ids.clone()).await;
            }
            if ids.iter().any(|i| i == id) {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}
