//! Hosts as peers: a forward after the peer restarted, and the fan-out of peer polls.

use super::*;

/// Host a (tier default, shard 0) and host b (tier gold, shard 1), whose namespace "g"
/// a's clients reach through b.
fn gold_tier_pair(db: &TestDb) -> (Config, Config) {
    let (pa, pb) = (free_port(), free_port());
    let hosts: &[(&str, u16, &str, &[u32])] =
        &[("a", pa, "default", &[0]), ("b", pb, "gold", &[1])];
    let tiers =
        "[[tiers]]\nname = \"gold\"\nshards = [1]\n[[namespaces]]\nname = \"g\"\ntier = \"gold\"\n";
    (
        host_config(&db.shards_toml(), "a", hosts, true, tiers),
        host_config(&db.shards_toml(), "b", hosts, true, tiers),
    )
}

/// A peer that restarted closed the connections the forwarding host kept pooled to it:
/// the next forwarded enqueue takes a fresh connection and succeeds. (Before: it was
/// written into the closed one, read EOF, and answered UNAVAILABLE `outcome_unknown` for
/// items the peer never received.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_after_the_peer_restarted_goes_through_a_fresh_connection() {
    let db = TestDb::new(2);
    let (mut cfg_a, cfg_b) = gold_tier_pair(&db);
    // No peer polls between the two enqueues: only the forward itself uses the pool.
    cfg_a.cluster.peer_poll_ms = 600_000;
    let a = start(&cfg_a).await;
    let b = start(&cfg_b).await;
    let a_addr = a.addr;
    let first = tokio::task::spawn_blocking(move || {
        Client::connect(a_addr, Proto::Binary).try_enqueue(vec![item("g", "t", 0, b"1")])
    })
    .await
    .unwrap()
    .unwrap();
    assert!(first[0].error.is_none(), "{first:?}");
    b.shutdown().await;
    let b = start(&cfg_b).await;
    let second = tokio::task::spawn_blocking(move || {
        Client::connect(a_addr, Proto::Binary).try_enqueue(vec![item("g", "t", 0, b"2")])
    })
    .await
    .unwrap()
    .unwrap();
    assert!(
        second[0].error.is_none(),
        "forwarded after the peer restarted: {:?}",
        second[0].error
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// Issue 36: with `cluster.peer_fanout` below the tier's size, each host polls that many
/// peers (its successors on the tier's ring), not all of them, and is polled by as many;
/// a host's items are still routed to the hosts that poll it. (Before: every host polled
/// every other host, and listed them all in getHostInfo.peers.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_host_polls_its_fanout_of_the_tier_and_is_routed_to_by_its_pollers() {
    let db = TestDb::new(4);
    let first = free_ports(4);
    let ids = ["a", "b", "c", "d"];
    let shards: [&[u32]; 4] = [&[0], &[1], &[2], &[3]];
    let hosts: Vec<(&str, u16, &str, &[u32])> = (0..4)
        .map(|i| (ids[i], first + i as u16, "default", shards[i]))
        .collect();
    let mut running = Vec::new();
    for id in ids {
        let mut cfg = host_config(&db.shards_toml(), id, &hosts, true, "");
        cfg.cluster.peer_fanout = 1;
        running.push(start(&cfg).await);
    }
    let addrs: Vec<std::net::SocketAddr> = running.iter().map(|r| r.addr).collect();
    // Each host lists (and polls) exactly one peer; every host is someone's.
    let polled: Vec<String> = tokio::task::spawn_blocking(move || {
        addrs
            .iter()
            .map(|addr| {
                let peers = Client::connect(*addr, Proto::Binary)
                    .host_info()
                    .peers
                    .unwrap();
                assert_eq!(peers.len(), 1, "{peers:?}");
                peers[0].host_id.clone().unwrap()
            })
            .collect()
    })
    .await
    .unwrap();
    let mut all = polled.clone();
    all.sort();
    assert_eq!(all, vec!["a", "b", "c", "d"], "a ring: {polled:?}");
    // An item on a host's own shard is dequeued through the host that polls it.
    for (i, id) in ids.iter().enumerate() {
        let poller = polled.iter().position(|p| p == id).unwrap();
        let (owner_addr, poller_addr) = (running[i].addr, running[poller].addr);
        let topic = format!("ring-{id}");
        let got = tokio::task::spawn_blocking(move || {
            let enqueued = Client::connect(owner_addr, Proto::Binary)
                .enqueue(vec![item("ns", &topic, 0, b"x")]);
            let mut c = Client::connect(poller_addr, Proto::Binary);
            let start = Instant::now();
            loop {
                let got = c.dequeue("ns", &topic, 1);
                if !got.is_empty() || start.elapsed() > Duration::from_secs(10) {
                    return (enqueued, got);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .await
        .unwrap();
        assert_eq!(owner_shard(&got.0[0]), i as u32, "written on {id}'s shard");
        assert_eq!(got.1.len(), 1, "{id}'s item reached through its poller");
        assert_eq!(got.1[0].id, Some(got.0[0].clone()));
    }
    for r in running {
        r.shutdown().await;
    }
}

/// Hosts prove they are peers with the cluster's secret (`peerLogin`), and nothing else
/// makes a caller one: on a host of a cluster, a client's forged `forwarded_by` and its
/// `notifyReady` are refused until its connection logs in with the secret, and a host
/// configured with another secret cannot forward to its peers (nothing is stored for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_connection_with_the_clusters_secret_is_a_peer() {
    use foqs::thrift_gen::{EnqueueRequest, NotifyReadyRequest, PeerLoginRequest, TFoqsSyncClient};
    let db = TestDb::new(2);
    let (mut cfg_a, cfg_b) = gold_tier_pair(&db);
    cfg_a.cluster.peer_secret = Some("not-the-clusters-secret".into());
    let a = start(&cfg_a).await;
    let b = start(&cfg_b).await;

    let denied = |r: thrift::Result<()>| {
        let e = foqs_error(r.expect_err("refused"));
        assert_eq!(e.code, Some(ErrorCode::PERMISSION_DENIED), "{e:?}");
    };
    let mut client = Client::connect(b.addr, Proto::Binary);
    let forged = client.call(|c| {
        c.enqueue(EnqueueRequest {
            forwarded_for: None,
            items: Some(vec![item("g", "t", 0, b"forged")]),
            forwarded_by: Some("a".into()),
            forward_token: None,
        })
    });
    denied(forged.map(|_| ()));
    let ready = || NotifyReadyRequest {
        host_id: Some("a".into()),
        topics: Some(vec![one_ready("g", "t")]),
    };
    denied(client.call(|c| c.notify_ready(ready())));
    let login = |secret: &str| PeerLoginRequest {
        host_id: Some("a".into()),
        secret: Some(secret.as_bytes().to_vec()),
    };
    denied(client.call(|c| c.peer_login(login("not-the-clusters-secret"))));
    denied(client.call(|c| c.notify_ready(ready())));
    // The secret makes the connection a peer's: the same call is answered.
    client
        .call(|c| c.peer_login(login("foqs-test-peer-secret")))
        .expect("the cluster's secret");
    client
        .call(|c| c.notify_ready(ready()))
        .expect("a peer's announcement");
    // A peer speaks for itself only: not for the host it did not log in as.
    denied(client.call(|c| {
        c.notify_ready(NotifyReadyRequest {
            host_id: Some("b".into()),
            ..ready()
        })
    }));

    // Host a logs in with the wrong secret: b refuses it, so a's enqueue for b's tier
    // cannot be forwarded and fails; nothing is stored.
    let a_addr = a.addr;
    let r = tokio::task::spawn_blocking(move || {
        Client::connect(a_addr, Proto::Binary).try_enqueue(vec![item("g", "t", 0, b"via a")])
    })
    .await
    .unwrap();
    let failed = match r {
        Ok(ref results) => results[0].error.is_some(),
        Err(_) => true,
    };
    assert!(failed, "a host with another secret forwarded: {r:?}");
    assert_eq!(
        Client::connect(b.addr, Proto::Binary).stats("g", "t").ready,
        Some(0)
    );
    a.shutdown().await;
    b.shutdown().await;
}
