//! Dedup keys: while an item with the same (ns, topic, dedup_key) exists in any state,
//! another enqueue with that key writes nothing and returns the existing id; across
//! shards (keys hash to one shard), across restarts, under concurrent enqueues.

use crate::common;

/// `s` as a hex literal: names and keys are stored as bytes on every backend.
fn hex(s: &str) -> String {
    let h: String = s.bytes().map(|b| format!("{b:02x}")).collect();
    format!("X'{h}'")
}

use std::collections::HashSet;

use common::*;
use foqs::thrift_gen::{EnqueueItem, EnqueueResult, TFoqsSyncClient};

const NS: &str = "dedup";

fn keyed(topic: &str, key: &str, payload: &[u8]) -> EnqueueItem {
    EnqueueItem {
        dedup_key: Some(key.into()),
        ..item(NS, topic, 0, payload)
    }
}

fn one(c: &mut Client, it: EnqueueItem) -> EnqueueResult {
    let r = c.try_enqueue(vec![it]).unwrap().remove(0);
    assert!(r.error.is_none(), "{:?}", r.error);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_enqueue_with_the_same_key_returns_the_existing_item() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let first = one(&mut c, keyed("t", "order-42", b"first"));
    assert_eq!(first.deduplicated, Some(false));
    let again = one(&mut c, keyed("t", "order-42", b"second"));
    assert_eq!(again.deduplicated, Some(true));
    assert_eq!(again.id, first.id);
    // Other topics, other keys and key-less items are unaffected.
    assert_ne!(one(&mut c, keyed("other", "order-42", b"x")).id, first.id);
    assert_eq!(
        one(&mut c, keyed("t", "order-43", b"x")).deduplicated,
        Some(false)
    );
    // Within one request too.
    let r = c
        .try_enqueue(vec![
            keyed("t", "batch", b"a"),
            keyed("t", "batch", b"b"),
            item(NS, "t", 0, b"plain"),
        ])
        .unwrap();
    assert_eq!(
        (r[0].deduplicated, r[1].deduplicated, r[2].deduplicated),
        (Some(false), Some(true), Some(false))
    );
    assert_eq!(r[0].id, r[1].id);
    // While leased, and while dead, the key still holds.
    let got = c.dequeue(NS, "t", 10);
    assert!(
        got.iter()
            .any(|i| i.payload.as_deref() == Some(&b"first"[..])),
        "the first payload was kept"
    );
    assert_eq!(one(&mut c, keyed("t", "order-42", b"third")).id, first.id);
    c.nack(vec![foqs::thrift_gen::NackItem {
        to_dlq: Some(true),
        ..nack(first.id.as_ref().unwrap(), None, None)
    }]);
    assert_eq!(one(&mut c, keyed("t", "order-42", b"fourth")).id, first.id);
    // Once the item is gone, the key is free again.
    let req = foqs::thrift_gen::DlqPurgeRequest {
        forwarded_for: None,
        ns: Some(NS.into()),
        topic: Some("t".into()),
        local_only: None,
    };
    c.call(|c| c.dlq_purge(req)).unwrap();
    let fresh = one(&mut c, keyed("t", "order-42", b"fifth"));
    assert_eq!(fresh.deduplicated, Some(false));
    assert_ne!(fresh.id, first.id);
    assert_eq!(
        srv.db.count(&format!(
            "id IN (SELECT d.id FROM dedup d JOIN topics t ON t.tid = d.tid WHERE d.dedup_key = {} AND t.topic = {})",
            hex("order-42"),
            hex("t")
        )).await,
        1
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_enqueues_of_one_key_yield_exactly_one_item() {
    let srv = TestServer::start(3, "").await;
    for round in 0..5 {
        let key = format!("race-{round}");
        let addr = srv.addr;
        let results: Vec<EnqueueResult> = {
            let handles: Vec<_> = (0..8)
                .map(|n| {
                    let key = key.clone();
                    std::thread::spawn(move || {
                        let mut c = Client::connect(addr, Proto::Binary);
                        c.try_enqueue(vec![keyed("race", &key, format!("{n}").as_bytes())])
                            .unwrap()
                            .remove(0)
                    })
                })
                .collect();
            tokio::task::spawn_blocking(move || {
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            })
            .await
            .unwrap()
        };
        let ids: HashSet<String> = results
            .iter()
            .map(|r| r.id.clone().expect("an id"))
            .collect();
        assert_eq!(ids.len(), 1, "round {round}: {results:?}");
        assert_eq!(
            results
                .iter()
                .filter(|r| r.deduplicated == Some(false))
                .count(),
            1,
            "round {round}"
        );
        assert_eq!(
            srv.db
                .count(&format!(
                    "id IN (SELECT id FROM dedup WHERE dedup_key = {})",
                    hex(&key)
                ))
                .await,
            1
        );
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_holds_across_a_restart() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let first = one(&mut c, keyed("t", "survivor", b"x"));
    let db = srv.stop().await;
    let srv = TestServer::start_on(db, "").await;
    let mut c = srv.client();
    let again = one(&mut c, keyed("t", "survivor", b"y"));
    assert_eq!((again.id, again.deduplicated), (first.id, Some(true)));
    srv.stop().await;
}
