//! A fixed (static) cluster of in-process hosts over real MariaDB: ack/nack/touch routed
//! to the owner or answered with WRONG_HOST, enqueues forwarded to another tier or away
//! from a host whose shards are all sick, topics listed across hosts, host info.
//! (The etcd-managed cluster, with real processes, is in `cluster_etcd.rs`.)

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use foqs::clock::SystemClock;
use foqs::config::Config;
use foqs::thrift_gen::ErrorCode;

mod peers;

const ENGINE: &str = "[engine]\nscan_interval_ms = 20\ncheckpoint_interval_ms = 100\n";

/// Engine settings (for `extra`) under which a frozen shard fails fast and its breaker
/// opens soon. Only for the test that freezes one: at 400 ms, a test beside it saw an
/// enqueue on the shared MariaDB fail while the private server started (its files synced).
const SICK_FAST: &str = "store_timeout_ms = 400\nbreaker_open_ms = 300\nbreaker_failures_max = 3\n";

/// One host of a static cluster: `hosts` is every host's (id, port, tier, shards).
/// `extra` follows the `[engine]` table: lines before its first table header are engine
/// settings.
fn host_config(
    shards_toml: &str,
    me: &str,
    hosts: &[(&str, u16, &str, &[u32])],
    forwarding: bool,
    extra: &str,
) -> Config {
    let port = hosts.iter().find(|h| h.0 == me).unwrap().1;
    let mut toml = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nhost_id = \"{me}\"\n{shards_toml}\n{ENGINE}\n{extra}\n\
         [cluster]\nmanager = \"static\"\npeer_secret = \"foqs-test-peer-secret\"\nforwarding = {forwarding}\npeer_poll_ms = 50\n"
    );
    let tier = hosts.iter().find(|h| h.0 == me).unwrap().2;
    toml.push_str(&format!("tier = \"{tier}\"\n"));
    for (id, port, tier, shards) in hosts {
        toml.push_str(&format!(
            "[[cluster.hosts]]\nid = \"{id}\"\naddr = \"127.0.0.1:{port}\"\ntier = \"{tier}\"\nshards = {shards:?}\n"
        ));
    }
    Config::from_toml(&toml).expect("cluster config")
}

async fn start(cfg: &Config) -> foqs::daemon::Running {
    foqs::daemon::start(cfg, Arc::new(SystemClock))
        .await
        .expect("foqsd starts")
}

fn owner_shard(id: &str) -> u32 {
    id.split(':').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_nacks_and_touches_reach_the_owner_or_get_wrong_host() {
    let db = TestDb::new(4);
    let (pa, pb) = (free_port(), free_port());
    let hosts: &[(&str, u16, &str, &[u32])] =
        &[("a", pa, "default", &[0, 1]), ("b", pb, "default", &[2, 3])];
    let a = start(&host_config(
        &db.shards_toml(),
        "a",
        hosts,
        true,
        "[console]\nlisten = \"127.0.0.1:0\"\n",
    ))
    .await;
    // b does not forward: it redirects.
    let b = start(&host_config(&db.shards_toml(), "b", hosts, false, "")).await;
    let mut ca = Client::connect(a.addr, Proto::Binary);
    let mut cb = Client::connect(b.addr, Proto::Binary);

    let ids = ca.enqueue((0..6).map(|i| item("ns", "t", i, b"x")).collect());
    assert!(
        ids.iter().all(|id| owner_shard(id) < 2),
        "a writes its own shards: {ids:?}"
    );
    let got = ca.dequeue("ns", "t", 6);
    assert_eq!(got.len(), 6);

    // b redirects a's items to a, by address.
    let r = cb.ack(&ids[..2]);
    for res in &r {
        let e = res.error.as_ref().expect("WRONG_HOST");
        assert_eq!(e.code, Some(ErrorCode::WRONG_HOST));
        assert_eq!(
            e.redirect_host.as_deref(),
            Some(&*format!("127.0.0.1:{pa}"))
        );
    }
    // a forwards b's items to b: enqueue on b, dequeue on b, settle through a.
    let b_ids = cb.enqueue((0..3).map(|i| item("ns", "u", i, b"y")).collect());
    assert!(b_ids.iter().all(|id| owner_shard(id) >= 2));
    assert_eq!(cb.dequeue("ns", "u", 3).len(), 3);
    let mixed = vec![ids[0].clone(), b_ids[0].clone(), ids[1].clone()];
    let r = ca.ack(&mixed);
    assert!(r.iter().all(|x| x.error.is_none()), "{r:?}");
    // A retry (a lost reply) is done again, each by its owner's memory of the ack
    // (engine.ack_memory_ms); forwarded with the lease it names, another lease is not.
    let r = ca.ack(&mixed);
    assert!(r.iter().all(|x| x.error.is_none()), "{r:?}");
    let r = ca
        .call(|c| {
            use foqs::thrift_gen::TFoqsSyncClient;
            c.ack(foqs::thrift_gen::AckRequest {
                ids: Some(mixed.clone()),
                forwarded_by: None,
                forwarded_for: None,
                lease_ids: Some(vec![1, 1, 1]),
            })
        })
        .unwrap()
        .results
        .unwrap();
    assert!(
        r.iter()
            .all(|x| code_of(&x.error) == Some(ErrorCode::NOT_FOUND)),
        "another lease's retry: {r:?}"
    );
    let r = ca.nack(vec![nack(&b_ids[1], None, Some(b"again"))]);
    assert!(r[0].error.is_none(), "{r:?}");
    let again = cb.dequeue("ns", "u", 1);
    assert_eq!(again[0].id.as_deref(), Some(&*b_ids[1]));
    assert_eq!(again[0].metadata.as_deref(), Some(&b"again"[..]));
    let r = ca.touch(&[(&b_ids[1], 60_000)]);
    assert!(r[0].error.is_none(), "{r:?}");
    assert_eq!(db.count("1").await, 4 + 2, "only the acked items are gone");

    // A shard nobody has: NOT_FOUND.
    let r = ca.ack(&["9:1".to_string()]);
    assert_eq!(code_of(&r[0].error), Some(ErrorCode::NOT_FOUND));

    // Host info names the peer, its shards and its state.
    let info = ca.host_info();
    assert_eq!(info.tier.as_deref(), Some("default"));
    assert_eq!(info.manager.as_deref(), Some("static"));
    let shards: Vec<i32> = info
        .shards
        .unwrap()
        .iter()
        .map(|s| s.shard_id.unwrap())
        .collect();
    assert_eq!(shards, vec![0, 1]);
    let peer = eventually(Duration::from_secs(5), "a sees b", || {
        let peers = ca.host_info().peers.unwrap();
        peers
            .into_iter()
            .find(|p| p.reachable == Some(true) && p.spare_capacity.unwrap_or(0) > 0)
    })
    .await;
    assert_eq!(peer.host_id.as_deref(), Some("b"));
    assert_eq!(peer.shards, Some(vec![2, 3]));

    // a's console shows every host with its shards and their states, and each shard's
    // owner.
    let web = a.console_addr.expect("a serves a console");
    let cluster = console_get(web, "/api/v1/cluster");
    let hosts = cluster["hosts"].as_array().unwrap();
    let shards_of = |id: &str| -> Vec<(u64, String)> {
        hosts.iter().find(|h| h["host_id"] == id).unwrap()["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["shard"].as_u64().unwrap(),
                    s["state"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let serving = |ids: [u64; 2]| ids.map(|i| (i, "serving".to_string())).to_vec();
    assert_eq!(shards_of("a"), serving([0, 1]), "{cluster}");
    assert_eq!(shards_of("b"), serving([2, 3]), "{cluster}");
    let owners: Vec<(u64, String)> = cluster["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["shard"].as_u64().unwrap(),
                s["owner"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        owners,
        [(0, "a"), (1, "a"), (2, "b"), (3, "b")]
            .map(|(s, o)| (s, o.to_string()))
            .to_vec()
    );
    assert_eq!(cluster["tiers"]["default"], serde_json::json!(["a", "b"]));
    // The pages say so too: the cluster page and the overview's peers.
    for page in ["/cluster", "/"] {
        let html = console_text(web, page);
        assert!(
            html.contains(
                r#"<span class="good">2 serving</span> <span class="good">3 serving</span>"#
            ),
            "{page}: {html}"
        );
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// GET from a console's JSON API (no auth configured), as JSON.
fn console_get(addr: std::net::SocketAddr, path: &str) -> serde_json::Value {
    serde_json::from_str(&console_text(addr, path)).unwrap()
}

/// GET from a console (no auth configured): the body of a 200.
fn console_text(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tiers_namespace_is_forwarded_and_topics_list_their_hosts() {
    let db = TestDb::new(4);
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let hosts: &[(&str, u16, &str, &[u32])] = &[
        ("a", pa, "default", &[0]),
        ("c", pc, "default", &[1]),
        ("b", pb, "gold", &[2, 3]),
    ];
    let tiers = "[[tiers]]\nname = \"gold\"\nshards = [2, 3]\n[[namespaces]]\nname = \"g\"\ntier = \"gold\"\n[[namespaces]]\nname = \"ns\"\n";
    let a = start(&host_config(&db.shards_toml(), "a", hosts, true, tiers)).await;
    let b = start(&host_config(&db.shards_toml(), "b", hosts, true, tiers)).await;
    let c = start(&host_config(&db.shards_toml(), "c", hosts, false, tiers)).await;
    let mut ca = Client::connect(a.addr, Proto::Binary);
    let mut cb = Client::connect(b.addr, Proto::Binary);
    let mut cc = Client::connect(c.addr, Proto::Binary);

    // a forwards gold's namespace to b; the client sees ordinary ids on b's shards.
    let ids = ca.enqueue((0..5).map(|i| item("g", "t", i, b"gold")).collect());
    assert!(ids.iter().all(|id| owner_shard(id) >= 2), "{ids:?}");
    assert_eq!(cb.dequeue("g", "t", 5).len(), 5);
    // c does not forward: it redirects to the gold host.
    let r = cc.try_enqueue(vec![item("g", "t", 0, b"x")]).unwrap();
    let e = r[0].error.as_ref().expect("WRONG_HOST");
    assert_eq!(e.code, Some(ErrorCode::WRONG_HOST));
    assert_eq!(
        e.redirect_host.as_deref(),
        Some(&*format!("127.0.0.1:{pb}"))
    );

    // The default tier's topic on both of its hosts: listed once, with both hosts.
    ca.enqueue(vec![
        item("ns", "shared", 0, b"1"),
        item("ns", "shared", 1, b"2"),
    ]);
    cc.enqueue(vec![item("ns", "shared", 0, b"3")]);
    cc.enqueue(vec![item("ns", "only-c", 0, b"4")]);
    for client in [&mut ca, &mut cc] {
        let r = client.try_topics("ns", None, None).unwrap();
        let topics = r.topics.unwrap();
        let names: Vec<_> = topics.iter().map(|t| t.topic.clone().unwrap()).collect();
        assert_eq!(names, vec!["only-c", "shared"]);
        assert_eq!(topics[1].ready, Some(3));
        assert_eq!(
            topics[1].hosts,
            Some(vec!["a".to_string(), "c".to_string()])
        );
        assert_eq!(topics[0].hosts, Some(vec!["c".to_string()]));
        // Paging across hosts.
        let p1 = client.try_topics("ns", Some(1), None).unwrap();
        assert_eq!(p1.topics.unwrap().len(), 1);
        let p2 = client
            .try_topics("ns", Some(1), p1.next_after.as_deref())
            .unwrap();
        assert_eq!(p2.topics.unwrap()[0].topic.as_deref(), Some("shared"));
        assert_eq!(p2.next_after, None);
    }
    a.shutdown().await;
    b.shutdown().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_shards_are_all_sick_forwards_enqueues_and_the_client_sees_success() {
    let shared = TestDb::new(2);
    let private = PrivateMariaDb::start();
    // Shards 0 and 1 (host a) live on a private MariaDB that the test freezes.
    let shards_toml = format!(
        "[[shards]]\nid = 0\nurl = \"{}\"\n[[shards]]\nid = 1\nurl = \"{}\"\n[[shards]]\nid = 2\nurl = \"{}\"\n[[shards]]\nid = 3\nurl = \"{}\"\n",
        private.url("foqs_cl0"),
        private.url("foqs_cl1"),
        shared.url(0),
        shared.url(1),
    );
    let (pa, pb) = (free_port(), free_port());
    let hosts: &[(&str, u16, &str, &[u32])] =
        &[("a", pa, "default", &[0, 1]), ("b", pb, "default", &[2, 3])];
    let a = start(&host_config(&shards_toml, "a", hosts, true, SICK_FAST)).await;
    let b = start(&host_config(&shards_toml, "b", hosts, true, SICK_FAST)).await;
    let mut ca = Client::connect(a.addr, Proto::Binary);
    eventually(Duration::from_secs(5), "a knows b's capacity", || {
        ca.host_info()
            .peers
            .unwrap()
            .iter()
            .any(|p| p.spare_capacity.unwrap_or(0) > 0)
            .then_some(())
    })
    .await;
    let before = ca.enqueue(vec![item("ns", "t", 0, b"local")]);
    assert!(owner_shard(&before[0]) < 2);

    private.pause();
    // Until a's breakers open, some enqueues fail (retryably); after, every one succeeds
    // through b.
    let started = Instant::now();
    let mut forwarded = Vec::new();
    while forwarded.len() < 20 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never forwarded"
        );
        let r = ca.try_enqueue(vec![item("ns", "t", 1, b"fwd")]).unwrap();
        match (&r[0].id, &r[0].error) {
            (Some(id), None) => {
                assert!(owner_shard(id) >= 2, "written on a frozen shard? {id}");
                forwarded.push(id.clone());
            }
            (_, Some(e)) => assert_eq!(e.code, Some(ErrorCode::UNAVAILABLE), "{e:?}"),
            _ => unreachable!(),
        }
    }
    // Once isolated, forwarding is immediate and total.
    let r = ca
        .try_enqueue((0..10).map(|i| item("ns", "t", i, b"batch")).collect())
        .unwrap();
    assert!(r.iter().all(|x| x.error.is_none()), "{r:?}");
    private.resume();
    let mut cb = Client::connect(b.addr, Proto::Binary);
    let got: Vec<String> = cb
        .dequeue("ns", "t", 100)
        .into_iter()
        .map(|i| i.id.unwrap())
        .collect();
    for id in &forwarded {
        assert!(got.contains(id), "forwarded item {id} not on b");
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// Host a, forwarding with a 300 ms `peer_timeout_ms`, owns shard 0; host b owns shard 1,
/// whose store runs through the fault injector the test arms.
async fn forwarding_to_a_faulty_owner(
    db: &TestDb,
) -> (
    foqs::daemon::Running,
    foqs::daemon::Running,
    foqs::store::faulty::Faults,
) {
    let (pa, pb) = (free_port(), free_port());
    let hosts: &[(&str, u16, &str, &[u32])] =
        &[("a", pa, "default", &[0]), ("b", pb, "default", &[1])];
    let mut cfg_a = host_config(&db.shards_toml(), "a", hosts, true, "");
    cfg_a.cluster.peer_timeout_ms = 300;
    let a = start(&cfg_a).await;
    let faults = foqs::store::faulty::Faults::default();
    let b = foqs::daemon::start_with_faults(
        &host_config(&db.shards_toml(), "b", hosts, false, ""),
        Arc::new(SystemClock),
        std::collections::BTreeMap::from([(1, faults.clone())]),
    )
    .await
    .expect("b starts");
    (a, b, faults)
}

/// An ack forwarded to the shard's owner, whose answer never came back (the owner's delete
/// was held past the forward's `peer_timeout_ms`, and then went through): the forwarding
/// host does not answer `UNAVAILABLE` ("nothing applied") for an item its ack deleted; it
/// acks again until it knows, and answers OK. (Before: `UNAVAILABLE`, and the item gone.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_ack_whose_answer_was_lost_is_resolved_before_the_reply() {
    let db = TestDb::new(2);
    let (a, b, faults) = forwarding_to_a_faulty_owner(&db).await;
    let (a_addr, b_addr) = (a.addr, b.addr);
    let id = tokio::task::spawn_blocking(move || {
        let mut cb = Client::connect(b_addr, Proto::Binary);
        let ids = cb.enqueue(vec![item("ns", "doubt", 0, b"x")]);
        assert_eq!(owner_shard(&ids[0]), 1, "b writes its own shard");
        let got = cb.dequeue("ns", "doubt", 1);
        assert_eq!(got.len(), 1);
        ids[0].clone()
    })
    .await
    .unwrap();
    faults.arm("delete", foqs::store::faulty::Fault::Hold);
    let acking = {
        let id = id.clone();
        tokio::task::spawn_blocking(move || Client::connect(a_addr, Proto::Binary).ack(&[id]))
    };
    // b's delete has started: a's forward has been out at least this long. Past a's
    // timeout (300 ms), the delete goes through.
    faults.waiting().notified().await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    faults.release();
    let results = acking.await.unwrap();
    assert!(
        results[0].error.is_none(),
        "the ack deleted the item, so its answer is OK: {:?}",
        results[0].error
    );
    let left = tokio::task::spawn_blocking(move || {
        Client::connect(b_addr, Proto::Binary).dequeue("ns", "doubt", 1)
    })
    .await
    .unwrap();
    assert!(left.is_empty(), "the item is gone: {left:?}");
    a.shutdown().await;
    b.shutdown().await;
}

/// A nack and a touch forwarded to the shard's owner, each naming its lease, whose
/// answers never came back (the owner's write was held past the forward's
/// `peer_timeout_ms`, and then went through): the forwarding host resolves each before it
/// replies (a nack again, which finds its own lease settled in the row; a touch again),
/// and answers OK, not `UNAVAILABLE` `outcome_unknown`. A nack naming a lease that another
/// nack settled stays `lease_ended`. (Before: both `UNAVAILABLE`, outcome unknown, for
/// changes that were applied.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_nack_or_touch_whose_answer_was_lost_is_resolved_before_the_reply() {
    use foqs::store::faulty::Fault;
    use foqs::thrift_gen::{NackItem, TFoqsSyncClient, TouchItem, TouchRequest};
    let db = TestDb::new(2);
    let (a, b, faults) = forwarding_to_a_faulty_owner(&db).await;
    let (a_addr, b_addr) = (a.addr, b.addr);
    let delivered = move |topic: &'static str| {
        tokio::task::spawn_blocking(move || {
            let mut cb = Client::connect(b_addr, Proto::Binary);
            let ids = cb.enqueue(vec![item("ns", topic, 0, b"x")]);
            assert_eq!(owner_shard(&ids[0]), 1, "b writes its own shard");
            let got = cb.dequeue("ns", topic, 1);
            assert_eq!(got.len(), 1);
            (ids[0].clone(), got[0].lease_id.expect("a lease id"))
        })
    };
    // Held at b past a's timeout, then let through.
    let held = |faults: foqs::store::faulty::Faults| async move {
        faults.waiting().notified().await;
        tokio::time::sleep(Duration::from_millis(800)).await;
        faults.release();
    };

    let (id, lease) = delivered("nacked").await.unwrap();
    faults.arm("apply", Fault::Hold);
    let nacking = {
        let id = id.clone();
        tokio::task::spawn_blocking(move || {
            Client::connect(a_addr, Proto::Binary).nack(vec![NackItem {
                lease_id: Some(lease),
                ..nack(&id, None, Some(b"m2"))
            }])
        })
    };
    held(faults.clone()).await;
    let results = nacking.await.unwrap();
    assert!(
        results[0].error.is_none(),
        "the nack was applied, so its answer is OK: {:?}",
        results[0].error
    );
    let again = tokio::task::spawn_blocking(move || {
        let mut cb = Client::connect(b_addr, Proto::Binary);
        let got = cb.dequeue("ns", "nacked", 1);
        // Delivered again: a nack of the first lease is still done (its row remembers);
        // one naming a lease nobody settled is not.
        let repeat = cb.nack(vec![NackItem {
            lease_id: Some(lease),
            ..nack(&id, None, None)
        }]);
        let other = cb.nack(vec![NackItem {
            lease_id: Some(lease + 1_000_000),
            ..nack(&id, None, None)
        }]);
        (got, repeat, other)
    })
    .await
    .unwrap();
    let (got, repeat, other) = again;
    assert_eq!(got.len(), 1, "the nacked item is ready again");
    assert_eq!(got[0].metadata.as_deref(), Some(&b"m2"[..]));
    assert!(repeat[0].error.is_none(), "{:?}", repeat[0].error);
    assert_eq!(code_of(&other[0].error), Some(ErrorCode::NOT_FOUND));

    // A touch through a, held at b past a's timeout: its answer.
    let held_touch = |id: String, lease_id: Option<i64>| {
        let faults = faults.clone();
        async move {
            faults.arm("apply", Fault::Hold);
            let touching = tokio::task::spawn_blocking(move || {
                Client::connect(a_addr, Proto::Binary).call(|c| {
                    c.touch(TouchRequest {
                        items: Some(vec![TouchItem {
                            id: Some(id),
                            extend_ms: Some(60_000),
                            lease_id,
                        }]),
                        forwarded_by: None,
                        forwarded_for: None,
                    })
                })
            });
            held(faults).await;
            touching.await.unwrap().expect("touch").results.unwrap()
        }
    };
    let (id, lease) = delivered("touched").await.unwrap();
    let results = held_touch(id, Some(lease)).await;
    assert!(
        results[0].error.is_none(),
        "the touch was applied, so its answer is OK: {:?}",
        results[0].error
    );

    // The same without lease_id: the nack's token, kept in the row, tells its retry that
    // the first try applied; the touch is tried again. (Before: both UNAVAILABLE,
    // outcome unknown.)
    let (id, _) = delivered("unnamed").await.unwrap();
    faults.arm("apply", Fault::Hold);
    let nacking = {
        let id = id.clone();
        tokio::task::spawn_blocking(move || {
            Client::connect(a_addr, Proto::Binary).nack(vec![nack(&id, None, Some(b"m3"))])
        })
    };
    held(faults.clone()).await;
    let results = nacking.await.unwrap();
    assert!(
        results[0].error.is_none(),
        "the unnamed nack was applied, so its answer is OK: {:?}",
        results[0].error
    );
    let id2 = id.clone();
    let got = tokio::task::spawn_blocking(move || {
        Client::connect(b_addr, Proto::Binary).dequeue("ns", "unnamed", 1)
    })
    .await
    .unwrap();
    assert_eq!(got.len(), 1, "the nacked item is ready again");
    assert_eq!(got[0].metadata.as_deref(), Some(&b"m3"[..]));
    assert_eq!(
        got[0].delivery_count,
        Some(2),
        "nacked once, delivered again"
    );
    let results = held_touch(id2, None).await;
    assert!(
        results[0].error.is_none(),
        "the unnamed touch was applied, so its answer is OK: {:?}",
        results[0].error
    );
    a.shutdown().await;
    b.shutdown().await;
}
