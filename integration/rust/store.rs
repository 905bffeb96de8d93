//! One conformance suite for every `ShardStore`, written once against the trait and run
//! against each backend (MySQL and SQLite) on real storage: what the shard worker relies
//! on, operation by operation, including the guards that keep a late write from touching
//! a row something else settled, the timer index, dedup keys that outlive their item,
//! what survives a reopen, the fence, one writer per shard and a newer schema's refusal.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use foqs::fence::Fence;
use foqs::model::{ItemState, NewItem, Policy, ReadyKey, TopicName, Totals};
use foqs::store::{
    Cached, Change, Fenced, Handoff, ItemMeta, MySqlStore, PayloadCache, Settle, ShardStore,
    SqliteStore, StoreError,
};
use mysql_async::prelude::*;

const NOW: i64 = 1_700_000_000_000;
const LEASE: i64 = 30_000;

fn new_item(ns: &str, topic: &str, priority: i32, deliver_after_ms: i64) -> NewItem {
    NewItem {
        ns: ns.into(),
        topic: topic.into(),
        priority,
        payload: format!("p{priority}").into_bytes(),
        metadata: b"m".to_vec(),
        deliver_after_ms,
        enqueued_at_ms: NOW,
        lease_ms: LEASE,
        expires_at_ms: None,
        policy: Policy::AtLeastOnce,
        max_attempts: 5,
        dedup_key: None,
    }
}

/// Runs `suite(&store)` on a fresh SQLite shard, then on a fresh MySQL one, bare and
/// behind the payload cache.
macro_rules! on_every_store {
    ($suite:ident) => {{
        let db = TestDb::sqlite(1);
        let path = foqs::store::sqlite_path(&db.url(0), std::path::Path::new("/")).unwrap();
        $suite(&SqliteStore::new(0, path)).await;
        let db = TestDb::mysql(1);
        $suite(&MySqlStore::new(0, &db.url(0), 4).unwrap()).await;
        // MySQL again with the payload cache in front of its claims, as foqsd runs it.
        let db = TestDb::mysql(1);
        let cache = PayloadCache::new(64 << 20);
        let store = Cached::new(MySqlStore::new(0, &db.url(0), 4).unwrap(), 0, cache.clone());
        $suite(&store).await;
    }};
}

mod every;
mod mysql;

fn keys(ks: &[ReadyKey]) -> Vec<u64> {
    ks.iter().map(|k| k.key).collect()
}

/// Every topic's saved totals, by name.
async fn saved_totals<S: ShardStore>(s: &S) -> std::collections::HashMap<TopicName, Totals> {
    s.totals().await.unwrap().into_iter().collect()
}

async fn meta<S: ShardStore>(s: &S, key: u64) -> Option<ItemMeta> {
    s.lookup(&[key]).await.unwrap().pop()
}

/// The suite. `make` builds a store over the same shard each time it is called.
async fn conforms<S: ShardStore>(db: &TestDb, make: impl Fn() -> S) {
    let s = make();
    let r = s.open().await.unwrap();
    assert_eq!((r.key_high_water, r.checkpoint_ms), (1, 0));
    assert!(s.state_counts(None).await.unwrap().is_empty());

    // One writer: a second store on the same shard refuses while the first is open.
    match make().open().await {
        Err(StoreError::Owned(m)) => assert!(m.contains("another foqsd"), "{m}"),
        other => panic!("a second writer opened the shard: {other:?}"),
    }

    let mut mortal = new_item("a", "u", 0, NOW - 10);
    mortal.expires_at_ms = Some(NOW + 500);
    mortal.dedup_key = Some("d1".into());
    let rows = vec![
        (1, new_item("a", "t", 5, NOW - 100)),
        (2, new_item("a", "t", 1, NOW - 50)),
        (3, new_item("a", "t", 1, NOW - 200)),
        (4, new_item("a", "t", 0, NOW + 1_000)),
        (5, mortal),
        (6, new_item("b", "t", 0, NOW - 10)),
    ];
    s.insert(
        &rows,
        Some(100),
        &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
        &Handoff::NONE,
        NOW,
    )
    .await
    .unwrap();

    // Ready order: priority, then deliver_after, then key; deferred items are not ready.
    let ready = s.ready_keys("a", "t", None, NOW, 10).await.unwrap();
    assert_eq!(keys(&ready), vec![3, 2, 1]);
    let after = s
        .ready_keys("a", "t", Some(ready[0]), NOW, 10)
        .await
        .unwrap();
    assert_eq!(keys(&after), vec![2, 1]);
    assert_eq!(
        keys(&s.ready_keys("a", "t", None, NOW, 1).await.unwrap()),
        vec![3]
    );
    assert_eq!(
        keys(&s.ready_keys("a", "t", None, NOW + 1_000, 10).await.unwrap()),
        vec![4, 3, 2, 1]
    );
    assert!(s
        .ready_keys("a", "nope", None, NOW, 10)
        .await
        .unwrap()
        .is_empty());
    assert!(s
        .ready_keys("c", "t", None, NOW, 10)
        .await
        .unwrap()
        .is_empty());
    let fetched = s.fetch_ready(&[1, 4, 5], NOW).await.unwrap();
    let mut got: Vec<u64> = fetched.iter().map(|i| i.id.key).collect();
    got.sort();
    assert_eq!(got, vec![1, 5]);
    assert_eq!(
        s.dedup_lookup("a", "u", &["d1", "zz"]).await.unwrap(),
        vec![("d1".to_string(), 5)]
    );
    assert!(s.dedup_lookup("a", "t", &["d1"]).await.unwrap().is_empty());

    // Claims lease only what is ready and due, under their token.
    let claimed = s.claim(&[3, 2, 4], NOW, 7).await.unwrap();
    let mut c: Vec<(u64, i32, i64, i64)> = claimed
        .iter()
        .map(|i| {
            (
                i.id.key,
                i.delivery_count,
                i.lease_expires_ms,
                i.lease_token,
            )
        })
        .collect();
    c.sort();
    assert_eq!(c, vec![(2, 1, NOW + LEASE, 7), (3, 1, NOW + LEASE, 7)]);
    assert_eq!(
        (claimed[0].ns.as_str(), claimed[0].topic.as_str()),
        ("a", "t")
    );
    assert_eq!(
        keys(&s.ready_keys("a", "t", None, NOW, 10).await.unwrap()),
        vec![1]
    );
    assert!(
        s.claim(&[3], NOW, 8).await.unwrap().is_empty(),
        "a leased row is not claimed twice"
    );

    // The timer index: one row per pending event, in time order, from a cursor.
    let scan = |at: i64| {
        let s = &s;
        async move {
            s.scan((NOW - 1, u64::MAX), at, 100)
                .await
                .unwrap()
                .iter()
                .map(|m| (m.key, m.next_event_ms))
                .collect::<Vec<_>>()
        }
    };
    assert!(scan(NOW).await.is_empty());
    assert_eq!(scan(NOW + 600).await, vec![(5, Some(NOW + 500))]);
    assert_eq!(
        scan(NOW + LEASE).await,
        vec![
            (5, Some(NOW + 500)),
            (4, Some(NOW + 1_000)),
            (2, Some(NOW + LEASE)),
            (3, Some(NOW + LEASE))
        ]
    );
    let page = s.scan((NOW + 500, 5), NOW + LEASE, 2).await.unwrap();
    assert_eq!(
        page.iter().map(|m| m.key).collect::<Vec<_>>(),
        vec![4, 2],
        "resumes after the cursor"
    );

    // Touch moves the lease and the timer.
    s.apply(
        &[Change::Extend {
            key: 3,
            lease: 7,
            lease_expires_ms: NOW + 2_000,
        }],
        NOW,
    )
    .await
    .unwrap();
    let m = meta(&s, 3).await.unwrap();
    assert_eq!(
        (m.lease_expires_ms, m.next_event_ms),
        (NOW + 2_000, Some(NOW + 2_000))
    );

    // A release needs the claim's token; it does not count the unseen delivery.
    s.apply(&[Change::Release { key: 2, token: 8 }], NOW)
        .await
        .unwrap();
    assert_eq!(meta(&s, 2).await.unwrap().state, ItemState::Leased);
    s.apply(&[Change::Release { key: 2, token: 7 }], NOW)
        .await
        .unwrap();
    let m = meta(&s, 2).await.unwrap();
    assert_eq!(
        (m.state, m.delivery_count, m.lease_token, m.next_event_ms),
        (ItemState::Ready, 0, 0, None)
    );

    // A change on another lease (a late commit after the row was claimed anew) does
    // nothing: neither a nack nor a death nor a touch.
    s.apply(
        &[
            Change::Ready {
                key: 3,
                lease: 6,
                deliver_after_ms: None,
                metadata: Some(b"late".to_vec()),
                settle: Settle::Lease,
            },
            Change::Ready {
                key: 3,
                lease: 6,
                deliver_after_ms: None,
                metadata: None,
                settle: Settle::Lease,
            },
            Change::Dead {
                key: 3,
                lease: 6,
                at_ms: NOW,
                settle: Settle::Not,
            },
            Change::Extend {
                key: 3,
                lease: 6,
                lease_expires_ms: NOW + 9_000,
            },
        ],
        NOW,
    )
    .await
    .unwrap();
    let m = meta(&s, 3).await.unwrap();
    assert_eq!(
        (m.state, m.lease_token, m.lease_expires_ms),
        (ItemState::Leased, 7, NOW + 2_000)
    );
    // A nack with a delay and new metadata: deferred until then, with its timer.
    s.apply(
        &[Change::Ready {
            key: 3,
            lease: 7,
            deliver_after_ms: Some(NOW + 300),
            metadata: Some(b"m2".to_vec()),
            settle: Settle::Lease,
        }],
        NOW,
    )
    .await
    .unwrap();
    let m = meta(&s, 3).await.unwrap();
    assert_eq!(
        (m.state, m.deliver_after_ms, m.next_event_ms),
        (ItemState::Ready, NOW + 300, Some(NOW + 300))
    );
    // A consumer's nack records the lease it settled (a retry of it is answered done).
    assert_eq!(m.settled_token, 7);
    assert_eq!(
        keys(&s.ready_keys("a", "t", None, NOW, 10).await.unwrap()),
        vec![2, 1]
    );
    let again = s.fetch_ready(&[3], NOW + 300).await.unwrap();
    assert_eq!(again[0].metadata, b"m2");
    // Settling changes apply only to leased rows: a late nack of a ready row does nothing.
    s.apply(
        &[Change::Ready {
            key: 1,
            lease: 0,
            deliver_after_ms: Some(NOW + 9_999),
            metadata: None,
            settle: Settle::Lease,
        }],
        NOW,
    )
    .await
    .unwrap();
    assert_eq!(meta(&s, 1).await.unwrap().deliver_after_ms, NOW - 100);

    // Dead letters: only from a lease; listed in order with the time they died; revived.
    s.claim(&[1, 6], NOW, 9).await.unwrap();
    s.apply(
        &[
            Change::Dead {
                key: 1,
                lease: 9,
                at_ms: NOW + 5,
                settle: Settle::Not,
            },
            Change::Dead {
                key: 6,
                lease: 9,
                at_ms: NOW + 6,
                settle: Settle::Lease,
            },
        ],
        NOW,
    )
    .await
    .unwrap();
    s.apply(
        &[Change::Dead {
            key: 2,
            lease: 0,
            at_ms: NOW,
            settle: Settle::Not,
        }],
        NOW,
    )
    .await
    .unwrap();
    assert_eq!(
        meta(&s, 2).await.unwrap().state,
        ItemState::Ready,
        "not leased: not dead"
    );
    let dead = s.dead_items("a", "t", None, 10).await.unwrap();
    assert_eq!(
        dead.iter()
            .map(|(i, at)| (i.id.key, *at))
            .collect::<Vec<_>>(),
        vec![(1, NOW + 5)]
    );
    let dead: i64 = s
        .state_counts(None)
        .await
        .unwrap()
        .iter()
        .filter(|c| (c.0.as_str(), c.1.as_str(), c.2) == ("a", "t", ItemState::Dead))
        .map(|c| c.4)
        .sum();
    assert_eq!(dead, 1);
    // Only a consumer's dead-lettering records the lease it settled; the lease's own end
    // (attempts used up) does not.
    assert_eq!(meta(&s, 1).await.unwrap().settled_token, 0);
    assert_eq!(meta(&s, 6).await.unwrap().settled_token, 9);
    s.apply(
        &[Change::Revive {
            key: 1,
            token: Some(-5),
        }],
        NOW,
    )
    .await
    .unwrap();
    let m = meta(&s, 1).await.unwrap();
    assert_eq!((m.state, m.delivery_count), (ItemState::Ready, 0));
    // A requeue's token is what the row was settled by.
    assert_eq!(m.settled_token, -5);
    assert_eq!(s.purge_dead("b", "t", 10).await.unwrap(), 1);
    assert!(meta(&s, 6).await.is_none());
    assert_eq!(s.purge_dead("b", "t", 10).await.unwrap(), 0);

    // The timer alone.
    s.apply(
        &[Change::Timer {
            key: 2,
            at_ms: Some(NOW + 50),
            seen_ms: None,
        }],
        NOW,
    )
    .await
    .unwrap();
    assert_eq!(meta(&s, 2).await.unwrap().next_event_ms, Some(NOW + 50));
    // Only where the timer is still what the scan read: a late write of a scan that saw
    // an older timer leaves the row's newer one alone (else the row could fall behind the
    // scan's cursor for good).
    s.apply(
        &[Change::Timer {
            key: 2,
            at_ms: Some(NOW + 10),
            seen_ms: Some(NOW + 20),
        }],
        NOW,
    )
    .await
    .unwrap();
    assert_eq!(
        meta(&s, 2).await.unwrap().next_event_ms,
        Some(NOW + 50),
        "a stale timer write moved the row"
    );
    s.apply(
        &[Change::Timer {
            key: 2,
            at_ms: Some(NOW + 60),
            seen_ms: Some(NOW + 50),
        }],
        NOW,
    )
    .await
    .unwrap();
    assert_eq!(meta(&s, 2).await.unwrap().next_event_ms, Some(NOW + 60));
    s.apply(
        &[Change::Timer {
            key: 2,
            at_ms: None,
            seen_ms: None,
        }],
        NOW,
    )
    .await
    .unwrap();
    assert_eq!(meta(&s, 2).await.unwrap().next_event_ms, None);

    // Ack: delete returns what was deleted; a dedup key is free again once its item is gone.
    let gone = s.delete(&[5, 999]).await.unwrap();
    assert_eq!(
        gone.iter()
            .map(|m| (m.key, m.ns.as_str(), m.topic.as_str()))
            .collect::<Vec<_>>(),
        vec![(5, "a", "u")]
    );
    assert!(s.dedup_lookup("a", "u", &["d1"]).await.unwrap().is_empty());
    let mut keyed = new_item("a", "u", 0, NOW);
    keyed.dedup_key = Some("d1".into());
    s.insert(
        &[(7, keyed)],
        None,
        &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
        &Handoff::NONE,
        NOW,
    )
    .await
    .unwrap();
    assert_eq!(
        s.dedup_lookup("a", "u", &["d1"]).await.unwrap(),
        vec![("d1".to_string(), 7)]
    );
    s.apply(&[Change::Delete { key: 7 }], NOW).await.unwrap();
    assert!(s.dedup_lookup("a", "u", &["d1"]).await.unwrap().is_empty());
    // A key whose item still lives keeps answering with it, even if a second item with
    // the key gets written (a lookup that raced an insert of unknown outcome).
    let mut first = new_item("a", "u", 0, NOW);
    first.dedup_key = Some("d2".into());
    let mut second = first.clone();
    second.priority = 1;
    s.insert(
        &[(8, first)],
        None,
        &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
        &Handoff::NONE,
        NOW,
    )
    .await
    .unwrap();
    s.insert(
        &[(9, second)],
        None,
        &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
        &Handoff::NONE,
        NOW,
    )
    .await
    .unwrap();
    assert_eq!(
        s.dedup_lookup("a", "u", &["d2"]).await.unwrap(),
        vec![("d2".to_string(), 8)]
    );
    s.delete(&[8, 9]).await.unwrap();
    // A timer is never set behind the scan (a TTL that passed before the write).
    let mut late = new_item("a", "late", 0, NOW - 10);
    late.expires_at_ms = Some(NOW - 1);
    s.insert(
        &[(10, late)],
        None,
        &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
        &Handoff::NONE,
        NOW,
    )
    .await
    .unwrap();
    assert_eq!(meta(&s, 10).await.unwrap().next_event_ms, Some(NOW + 1));
    s.delete(&[10]).await.unwrap();

    // Counts and totals.
    let counts = s.topic_counts("a", None, NOW, 10).await.unwrap();
    let c: Vec<(String, i64, i64, i64)> = counts
        .iter()
        .map(|t| (t.topic.clone(), t.ready, t.deferred, t.leased))
        .collect();
    assert_eq!(c, vec![("t".to_string(), 2, 2, 0)]);
    assert!(s
        .topic_counts("a", Some("t"), NOW, 10)
        .await
        .unwrap()
        .is_empty());
    let t = TopicName {
        ns: "a".into(),
        topic: "t".into(),
    };
    let fresh = TopicName {
        ns: "a".into(),
        topic: "never-enqueued".into(),
    };
    let name = |ns: &str, topic: &str| TopicName {
        ns: ns.into(),
        topic: topic.into(),
    };
    let d = Totals {
        enqueued: 3,
        delivered: 2,
        acked: 1,
        nacked: 1,
        expired: 0,
    };
    s.add_totals(&[(t.clone(), d), (fresh.clone(), d)])
        .await
        .unwrap();
    s.add_totals(&[(t.clone(), d)]).await.unwrap();
    let totals = saved_totals(&s).await;
    assert_eq!((totals[&t].enqueued, totals[&t].acked), (6, 2));
    assert_eq!(totals[&fresh].enqueued, 3);
    assert!(!totals.contains_key(&name("a", "nope")));
    let mut sc = s.state_counts(None).await.unwrap();
    sc.sort_by_key(|c| c.3);
    // Grouped by the second of deliver_after (NOW - 100 and NOW - 50 share one).
    let t = |sec: i64, n: i64| ("a".to_string(), "t".to_string(), ItemState::Ready, sec, n);
    assert_eq!(
        sc,
        vec![
            t((NOW - 100).div_euclid(1000), 2),
            t((NOW + 300).div_euclid(1000), 1),
            t((NOW + 1_000).div_euclid(1000), 1),
        ]
    );
    // One topic's counts alone (after a write whose outcome was unknown), and a topic that
    // has no id has none.
    let mut one = s.state_counts(Some(&name("a", "t"))).await.unwrap();
    one.sort_by_key(|c| c.3);
    assert_eq!(one, sc);
    assert!(s
        .state_counts(Some(&name("a", "nope")))
        .await
        .unwrap()
        .is_empty());

    // What survives a reopen: rows, topic names, the key high-water mark, the checkpoint.
    s.save_checkpoint(NOW - 5).await.unwrap();
    s.close().await;
    let s = make();
    let r = s.open().await.unwrap();
    assert_eq!((r.key_high_water, r.checkpoint_ms), (100, NOW - 5));
    let items: i64 = s
        .state_counts(None)
        .await
        .unwrap()
        .iter()
        .map(|c| c.4)
        .sum();
    assert_eq!(items, 4);
    assert_eq!(
        keys(&s.ready_keys("a", "t", None, NOW, 10).await.unwrap()),
        vec![2, 1]
    );
    assert_eq!(saved_totals(&s).await[&name("a", "t")].enqueued, 6);
    s.close().await;

    // The fence: while closed, nothing reaches the store.
    let fence = Fence::closed();
    let f = Fenced::new(make(), fence.clone());
    assert!(matches!(f.open().await, Err(StoreError::Fenced)));
    fence.extend_to(Instant::now() + Duration::from_secs(60));
    f.open().await.unwrap();
    assert_eq!(f.lookup(&[1]).await.unwrap().len(), 1);
    fence.close();
    assert!(matches!(f.lookup(&[1]).await, Err(StoreError::Fenced)));
    assert!(matches!(
        f.insert(
            &[(50, new_item("a", "t", 0, NOW))],
            None,
            &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
            &Handoff::NONE,
            NOW
        )
        .await,
        Err(StoreError::Fenced)
    ));
    f.close().await;

    // A shard written by a newer build refuses to open.
    db.exec(
        0,
        "UPDATE foqs_meta SET value = 3 WHERE name = 'schema_version'",
    )
    .await;
    let s = make();
    match s.open().await {
        Err(StoreError::Schema(m)) => assert!(m.contains("newer"), "{m}"),
        other => panic!("opened a newer schema: {other:?}"),
    }
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mysql_store_conforms() {
    let db = TestDb::mysql(1);
    let url = db.url(0);
    conforms(&db, || {
        MySqlStore::new(0, &url, 4)
            .unwrap()
            .with_owner_lock(Arc::new(|| {}), 2_000)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mysql_store_behind_the_payload_cache_conforms() {
    let db = TestDb::mysql(1);
    let url = db.url(0);
    let cache = PayloadCache::new(64 << 20);
    conforms(&db, || {
        let store = MySqlStore::new(0, &url, 4)
            .unwrap()
            .with_owner_lock(Arc::new(|| {}), 2_000);
        Cached::new(store, 0, cache.clone())
    })
    .await;
    assert!(
        cache.hits_misses().0 > 0,
        "no claim found its rows in the cache"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_store_conforms() {
    let db = TestDb::sqlite(1);
    let path = foqs::store::sqlite_path(&db.url(0), std::path::Path::new("/")).unwrap();
    conforms(&db, || SqliteStore::new(0, path.clone())).await;
}
