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

fn keys(ks: &[ReadyKey]) -> Vec<u64> {
    ks.iter().map(|k| k.key).collect()
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
    assert_eq!(s.topic_snapshot("a", "t", NOW).await.unwrap().dead, 1);
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
    let snap = s.topic_snapshot("a", "t", NOW).await.unwrap();
    assert_eq!(
        (snap.ready, snap.deferred, snap.leased, snap.dead),
        (2, 2, 0, 0)
    );
    assert_eq!(snap.oldest_ready_ms, Some(NOW - 100));
    assert_eq!((snap.totals.enqueued, snap.totals.acked), (6, 2));
    assert_eq!(
        s.topic_snapshot("a", "never-enqueued", NOW)
            .await
            .unwrap()
            .totals
            .enqueued,
        3
    );
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
    let name = |ns: &str, topic: &str| TopicName {
        ns: ns.into(),
        topic: topic.into(),
    };
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
    assert_eq!(
        s.topic_snapshot("a", "t", NOW)
            .await
            .unwrap()
            .totals
            .enqueued,
        6
    );
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

/// A write that waits (here: on a row another connection holds locked) is stopped by the
/// server at the statement bound, so a write the worker gave up on cannot commit long
/// after (issue 18, risk 2). Without the bound it would wait for InnoDB's lock timeout
/// (50 s by default) and then could still commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_stops_a_mysql_write_at_the_statement_bound() {
    let db = TestDb::mysql(1);
    // One connection: the write after the unbounded count below runs on the connection
    // that count used.
    let s = MySqlStore::new(0, &db.url(0), 1)
        .unwrap()
        .with_statement_timeout(300);
    s.open().await.unwrap();
    s.insert(
        &[(1, new_item("a", "t", 0, NOW))],
        Some(100),
        &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
        &Handoff::NONE,
        NOW,
    )
    .await
    .unwrap();
    let claimed = s.claim(&[1], NOW, 7).await.unwrap();
    assert_eq!(claimed.len(), 1);
    // Another session locks the row and keeps the lock; a write of the row must stop.
    async fn locked_write_stops(s: &MySqlStore, url: String) {
        let mut locker = mysql_async::Conn::from_url(url).await.unwrap();
        locker
            .query_drop("START TRANSACTION; SELECT id FROM items WHERE id = 1 FOR UPDATE")
            .await
            .unwrap();
        let t = Instant::now();
        let r = s
            .apply(
                &[Change::Ready {
                    key: 1,
                    lease: 7,
                    deliver_after_ms: None,
                    metadata: None,
                    settle: Settle::Lease,
                }],
                NOW,
            )
            .await;
        let took = t.elapsed();
        let _ = locker.query_drop("ROLLBACK").await;
        let _ = locker.disconnect().await;
        assert!(r.is_err(), "the write waited out the lock and ran: {r:?}");
        assert!(took < Duration::from_secs(5), "stopped after {took:?}");
    }
    locked_write_stops(&s, db.url(0)).await;
    // Statements that may rightly take long (the schema, the full count) are not bound,
    // and the bound is back on the connection afterwards (the pool does not reset
    // connections; the unbounded one asks for its own reset).
    assert_eq!(s.state_counts(None).await.unwrap().len(), 1);
    locked_write_stops(&s, db.url(0)).await;
    s.close().await;
}

/// A busy shard's statements run on the pool's few connections, not each on a new one.
/// mysql_async's defaults kept one idle connection per pool and closed every other one as
/// it came back: a 200k-item drain made thousands of connections (issue 21).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_mysql_shard_reuses_its_connections() {
    const POOL: usize = 4;
    let db = TestDb::mysql(1);
    let s = Arc::new(MySqlStore::new(0, &db.url(0), POOL).unwrap());
    s.open().await.unwrap();
    let rows: Vec<(u64, NewItem)> = (1..=400).map(|k| (k, new_item("a", "t", 0, NOW))).collect();
    s.insert(
        &rows,
        Some(1_000),
        &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
        &Handoff::NONE,
        NOW,
    )
    .await
    .unwrap();
    // Every connection to this shard's database, sampled until the work is done (the
    // sampler's own connection names no database).
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (done, base, name) = (done.clone(), db.base.clone(), db.names[0].clone());
        tokio::spawn(async move {
            let mut c = mysql_async::Conn::from_url(base).await.unwrap();
            let mut seen = std::collections::BTreeSet::new();
            let mut samples = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) || samples == 0 {
                let ids: Vec<u64> = c
                    .exec(
                        "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ?",
                        (&name,),
                    )
                    .await
                    .unwrap();
                seen.extend(ids);
                samples += 1;
            }
            let _ = c.disconnect().await;
            (seen, samples)
        })
    };
    // Four at once, as a worker's concurrent writes and the reads beside it are.
    let work: Vec<_> = (0..4u64)
        .map(|w| {
            let s = s.clone();
            tokio::spawn(async move {
                for i in 0..100u64 {
                    let keys = [1 + w * 100 + i];
                    assert_eq!(s.claim(&keys, NOW, 1 + w as i64).await.unwrap().len(), 1);
                    assert_eq!(s.delete(&keys).await.unwrap().len(), 1);
                }
            })
        })
        .collect();
    for w in work {
        w.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (seen, samples) = sampler.await.unwrap();
    // Each pool connection may show up twice: mysql_async opens it over TCP, then moves
    // to the server's socket when the server is local.
    assert!(
        seen.len() <= 2 * POOL,
        "{} connections to the shard seen in {samples} samples of 800 statements: {seen:?}",
        seen.len()
    );
    assert!(s.state_counts(None).await.unwrap().is_empty());
    s.close().await;
}

/// What a claim returns is the row as it is now, whatever happened to it since it was
/// inserted: a nack with new metadata, a touch and an expiry, a TTL's delete, a
/// dead-lettering and a requeue, a release (what any store that keeps items in memory
/// must also get right).
async fn claims_show_the_rows_current_state<S: ShardStore>(s: &S) {
    s.open().await.unwrap();
    let mut mortal = new_item("c", "t", 4, NOW - 10);
    mortal.expires_at_ms = Some(NOW + 500);
    let mut big = new_item("c", "t", 6, NOW - 10);
    big.payload = vec![b'x'; 2_000];
    let rows: Vec<(u64, NewItem)> = vec![
        (1, new_item("c", "t", 1, NOW - 10)),
        (2, new_item("c", "t", 2, NOW - 10)),
        (3, new_item("c", "t", 3, NOW - 10)),
        (4, mortal),
        (5, new_item("c", "t", 5, NOW - 10)),
        (6, big),
        (7, new_item("c", "t", 7, NOW - 10)),
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
    let claim = |keys: Vec<u64>, at: i64, token: i64| async move {
        let mut got = s.claim(&keys, at, token).await.unwrap();
        got.sort_by_key(|i| i.id.key);
        got
    };

    // As inserted, on its first lease.
    let one = claim(vec![1], NOW, 10).await;
    assert_eq!(one.len(), 1);
    let i = &one[0];
    assert_eq!(
        (
            i.id.key,
            i.priority,
            i.payload.as_slice(),
            i.metadata.as_slice()
        ),
        (1, 1, &b"p1"[..], &b"m"[..])
    );
    assert_eq!(
        (
            i.delivery_count,
            i.lease_expires_ms,
            i.lease_token,
            i.deliver_after_ms,
            i.enqueued_at_ms
        ),
        (1, NOW + LEASE, 10, NOW - 10, NOW)
    );
    // A nack with new metadata: the next delivery shows it, byte for byte (it travels in
    // the statement's text, as a hex literal: quotes, backslashes, `?`, NULs and
    // non-UTF-8 bytes must come back as they went in).
    let m2 = b"m2 '\\\" ? \0 \xff\x00".to_vec();
    s.apply(
        &[Change::Ready {
            key: 1,
            lease: 10,
            deliver_after_ms: None,
            metadata: Some(m2.clone()),
            settle: Settle::Lease,
        }],
        NOW,
    )
    .await
    .unwrap();
    let again = claim(vec![1], NOW + 1, 11).await;
    assert_eq!(
        (
            again[0].metadata.as_slice(),
            again[0].delivery_count,
            again[0].lease_token
        ),
        (m2.as_slice(), 2, 11)
    );

    // A touch, then the lease ends: redelivered, counted twice.
    claim(vec![2], NOW, 12).await;
    s.apply(
        &[Change::Extend {
            key: 2,
            lease: 12,
            lease_expires_ms: NOW + 9_000,
        }],
        NOW,
    )
    .await
    .unwrap();
    s.apply(
        &[Change::Ready {
            key: 2,
            lease: 12,
            deliver_after_ms: None,
            metadata: None,
            settle: Settle::Lease,
        }],
        NOW + 9_000,
    )
    .await
    .unwrap();
    let two = claim(vec![2], NOW + 9_001, 13).await;
    assert_eq!(
        (two[0].delivery_count, two[0].lease_expires_ms),
        (2, NOW + 9_001 + LEASE)
    );

    // Dead, then requeued: its count starts over.
    claim(vec![3], NOW, 14).await;
    s.apply(
        &[Change::Dead {
            key: 3,
            lease: 14,
            at_ms: NOW,
            settle: Settle::Not,
        }],
        NOW,
    )
    .await
    .unwrap();
    assert!(
        claim(vec![3], NOW + 1, 15).await.is_empty(),
        "a dead item is not claimed"
    );
    s.apply(
        &[Change::Revive {
            key: 3,
            token: None,
        }],
        NOW + 2,
    )
    .await
    .unwrap();
    let three = claim(vec![3], NOW + 3, 16).await;
    assert_eq!((three[0].delivery_count, three[0].lease_token), (1, 16));

    // A TTL's delete, never claimed before: gone.
    s.apply(&[Change::Delete { key: 4 }], NOW + 600)
        .await
        .unwrap();
    assert!(claim(vec![4], NOW + 601, 17).await.is_empty());

    // Released unseen: the delivery nobody saw is not counted.
    claim(vec![5], NOW, 18).await;
    s.apply(&[Change::Release { key: 5, token: 18 }], NOW)
        .await
        .unwrap();
    let five = claim(vec![5], NOW + 1, 19).await;
    assert_eq!((five[0].delivery_count, five[0].lease_token), (1, 19));

    // A claim of several at once, one not ready any more: the others, as they are.
    s.apply(&[Change::Delete { key: 7 }], NOW).await.unwrap();
    let mixed = claim(vec![6, 7], NOW + 1, 20).await;
    assert_eq!(mixed.len(), 1);
    assert_eq!(
        (
            mixed[0].id.key,
            mixed[0].payload.len(),
            mixed[0].delivery_count
        ),
        (6, 2_000, 1)
    );
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_show_the_rows_current_state_on_every_store() {
    on_every_store!(claims_show_the_rows_current_state);
}

/// Rows an insert hands to waiting consumers are written as a claim at the same time
/// would leave them (leased under the hand-off's token, delivered once, timer at the
/// lease's end); the rest of the batch is ready. A release under that token undoes the
/// delivery nobody saw; another token's release and a claim do nothing to them.
async fn handed_rows_are_written_as_claimed<S: ShardStore>(s: &S) {
    s.open().await.unwrap();
    let mut amo = new_item("h", "t", 3, NOW - 10);
    amo.policy = Policy::AtMostOnce;
    amo.expires_at_ms = Some(NOW + 10_000);
    let rows: Vec<(u64, NewItem)> = vec![
        (1, new_item("h", "t", 1, NOW - 10)),
        (2, new_item("h", "t", 2, NOW - 10)),
        (3, amo),
    ];
    let handoff = Handoff {
        token: 77,
        keys: vec![1, 3],
    };
    s.insert(
        &rows,
        Some(100),
        &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
        &handoff,
        NOW,
    )
    .await
    .unwrap();
    let m1 = meta(s, 1).await.unwrap();
    assert_eq!(
        (
            m1.state,
            m1.lease_token,
            m1.delivery_count,
            m1.lease_expires_ms,
            m1.next_event_ms
        ),
        (ItemState::Leased, 77, 1, NOW + LEASE, Some(NOW + LEASE))
    );
    let m3 = meta(s, 3).await.unwrap();
    assert_eq!(
        (m3.state, m3.next_event_ms),
        (ItemState::Leased, Some(NOW + 10_000)),
        "the TTL comes before the lease's end"
    );
    let m2 = meta(s, 2).await.unwrap();
    assert_eq!(
        (
            m2.state,
            m2.lease_token,
            m2.delivery_count,
            m2.next_event_ms
        ),
        (ItemState::Ready, 0, 0, None)
    );
    assert_eq!(
        keys(&s.ready_keys("h", "t", None, NOW, 10).await.unwrap()),
        vec![2]
    );
    assert!(s.claim(&[1, 3], NOW, 78).await.unwrap().is_empty());
    s.apply(&[Change::Release { key: 1, token: 5 }], NOW)
        .await
        .unwrap();
    assert_eq!(meta(s, 1).await.unwrap().state, ItemState::Leased);
    s.apply(&[Change::Release { key: 1, token: 77 }], NOW)
        .await
        .unwrap();
    let m1 = meta(s, 1).await.unwrap();
    assert_eq!((m1.state, m1.delivery_count), (ItemState::Ready, 0));
    let got = s.claim(&[1], NOW, 79).await.unwrap();
    assert_eq!((got[0].delivery_count, got[0].lease_token), (1, 79));
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handed_rows_are_written_as_claimed_on_every_store() {
    on_every_store!(handed_rows_are_written_as_claimed);
}

/// Names and dedup keys that a statement's text must carry safely (quotes, backslashes,
/// `?`, `%`, a NUL, non-ASCII) come back exactly through the reads that spell them in
/// their text: the dedup lookup and the per-topic counts.
async fn awkward_names_round_trip<S: ShardStore>(s: &S) {
    s.open().await.unwrap();
    let awkward = [
        "it's",
        "back\\slash",
        "q?",
        "50%",
        "nul\0byte",
        "ordérs",
        "\"x\"",
    ];
    let ns = "n's\\";
    let rows: Vec<(u64, NewItem)> = awkward
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let mut item = new_item(ns, k, 0, NOW - 10);
            item.dedup_key = Some((*k).into());
            (i as u64 + 1, item)
        })
        .collect();
    s.insert(
        &rows,
        Some(100),
        &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
        &Handoff::NONE,
        NOW,
    )
    .await
    .unwrap();
    for (i, k) in awkward.iter().enumerate() {
        // Near misses beside it, none of which may match.
        let asked = [*k, "it", "q", "", "backslash"];
        assert_eq!(
            s.dedup_lookup(ns, k, &asked).await.unwrap(),
            vec![(k.to_string(), i as u64 + 1)],
            "dedup key {k:?}"
        );
    }
    // Another namespace that differs only by the escaped character sees nothing.
    assert!(s
        .dedup_lookup("n's", "it's", &["it's"])
        .await
        .unwrap()
        .is_empty());
    let mut counted: Vec<(String, i64)> = s
        .topic_counts(ns, None, NOW, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.topic, t.ready))
        .collect();
    counted.sort();
    let mut expected: Vec<(String, i64)> = awkward.iter().map(|k| (k.to_string(), 1)).collect();
    expected.sort();
    assert_eq!(counted, expected);
    // Paging after a name with a quote continues after it, byte order.
    let after: Vec<String> = s
        .topic_counts(ns, Some("it's"), NOW, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.topic)
        .collect();
    let mut later: Vec<String> = awkward
        .iter()
        .filter(|k| k.as_bytes() > "it's".as_bytes())
        .map(|k| k.to_string())
        .collect();
    later.sort();
    assert_eq!(after, later);
    assert!(s
        .topic_counts("n's", None, NOW, 100)
        .await
        .unwrap()
        .is_empty());
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awkward_names_round_trip_on_every_store() {
    on_every_store!(awkward_names_round_trip);
}

/// An insert's batch mark answers whether it committed, for good: a batch inserted is
/// committed; one never seen is not, and its tombstone makes a late insert of it fail
/// without writing a row (see `store::batches`); marks are forgotten by age.
async fn batch_marks_decide_an_insert<S: ShardStore>(s: &S) {
    use foqs::store::BatchOutcome::*;
    s.open().await.unwrap();
    let (done, late) = (
        foqs::store::new_batch_token(NOW),
        foqs::store::new_batch_token(NOW + 2),
    );
    s.insert(
        &[(1, new_item("b", "t", 0, NOW))],
        None,
        &foqs::store::Marks::batch(done),
        &Handoff::NONE,
        NOW,
    )
    .await
    .unwrap();
    assert_eq!(s.batch_committed(done).await.unwrap(), Committed);
    // Asked again: the same answer (the tombstone was ignored).
    assert_eq!(s.batch_committed(done).await.unwrap(), Committed);
    assert_eq!(s.batch_committed(late).await.unwrap(), NotCommitted);
    let r = s
        .insert(
            &[(2, new_item("b", "t", 0, NOW))],
            None,
            &foqs::store::Marks::batch(late),
            &Handoff::NONE,
            NOW + 3,
        )
        .await;
    assert!(r.is_err(), "a late insert after its tombstone: {r:?}");
    assert_eq!(s.batch_committed(late).await.unwrap(), NotCommitted);
    assert!(meta(s, 2).await.is_none(), "the late insert wrote its row");
    assert!(meta(s, 1).await.is_some());
    // Forgotten by age: `done`'s token was drawn before NOW + 1, `late`'s after.
    assert_eq!(s.forget_batches(NOW + 1).await.unwrap(), 1);
    assert_eq!(s.forget_batches(NOW + 1).await.unwrap(), 0);
    // A mark forgotten (here, as if the worker's clock had jumped past it while its insert
    // was in doubt) is unknown, not "not committed", and asking writes no tombstone.
    assert_eq!(s.batch_committed(done).await.unwrap(), Forgotten);
    let unseen = foqs::store::new_batch_token(NOW - 5);
    assert_eq!(s.batch_committed(unseen).await.unwrap(), Forgotten);
    assert_eq!(s.batch_committed(late).await.unwrap(), NotCommitted);
    // The watermark never goes back.
    assert_eq!(s.forget_batches(NOW - 60_000).await.unwrap(), 0);
    assert_eq!(s.batch_committed(done).await.unwrap(), Forgotten);
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_marks_decide_an_insert_on_every_store() {
    on_every_store!(batch_marks_decide_an_insert);
}

/// A forwarded request's items are marked under its token with their keys, in the
/// insert's transaction: asked, a shard answers the positions it stored, and its
/// tombstones on every position make a late insert of any of them fail without writing a
/// row (see `store::forwards`); marks are forgotten with the batch marks, and a token past
/// the watermark is `forgotten`, with what is left of it.
async fn forward_marks_decide_what_a_forwarded_request_stored<S: ShardStore>(s: &S) {
    use foqs::store::{ForwardMark, Marks};
    s.open().await.unwrap();
    let (early, late) = (
        foqs::store::new_batch_token(NOW),
        foqs::store::new_batch_token(NOW + 2),
    );
    let marks = |token: i64, at: &[(u32, u64, bool)]| Marks {
        batch: foqs::store::new_batch_token(NOW),
        forwarded: at
            .iter()
            .map(|&(position, key, dup)| ForwardMark {
                token,
                position,
                key,
                dup,
            })
            .collect(),
    };
    // Positions 0 and 2 of a request of three stored here (2 a dedup hit of key 1).
    s.insert(
        &[
            (1, new_item("f", "t", 0, NOW)),
            (2, new_item("f", "t", 0, NOW)),
        ],
        None,
        &marks(early, &[(0, 2, false), (2, 1, true)]),
        &Handoff::NONE,
        NOW,
    )
    .await
    .unwrap();
    let o = s.forward_committed(early, 3).await.unwrap();
    assert_eq!(o.stored, vec![(0, 2, false), (2, 1, true)]);
    assert!(!o.forgotten);
    // Asked again: the same answer.
    assert_eq!(s.forward_committed(early, 3).await.unwrap(), o);
    // Asked before its insert: nothing, and the late insert fails, writing nothing.
    let o = s.forward_committed(late, 2).await.unwrap();
    assert!(o.stored.is_empty() && !o.forgotten, "{o:?}");
    let r = s
        .insert(
            &[(3, new_item("f", "t", 0, NOW))],
            None,
            &marks(late, &[(1, 3, false)]),
            &Handoff::NONE,
            NOW + 3,
        )
        .await;
    assert!(r.is_err(), "a late insert after its tombstones: {r:?}");
    assert!(meta(s, 3).await.is_none(), "the late insert wrote its row");
    assert!(s
        .forward_committed(late, 2)
        .await
        .unwrap()
        .stored
        .is_empty());
    // Forgotten by age with the batch marks: `early`'s rows go, `late`'s stay.
    while s.forget_batches(NOW + 1).await.unwrap() > 0 {}
    let o = s.forward_committed(early, 3).await.unwrap();
    assert!(o.forgotten && o.stored.is_empty(), "{o:?}");
    assert!(!s.forward_committed(late, 2).await.unwrap().forgotten);
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_marks_decide_what_a_forwarded_request_stored_on_every_store() {
    on_every_store!(forward_marks_decide_what_a_forwarded_request_stored);
}

/// On MySQL a row with no next event holds 0 in `next_event_ms`, not NULL (InnoDB moved
/// an index entry away from NULL at twice the cost: see `Dialect::no_event`). Both read
/// as no event, neither is ever scanned, not even from a cursor at 0, and a NULL left by
/// an earlier build is claimed, timed and released like any row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_rows_without_an_event_hold_zero() {
    let db = TestDb::mysql(1);
    let s = MySqlStore::new(0, &db.url(0), 2).unwrap();
    s.open().await.unwrap();
    let rows: Vec<(u64, NewItem)> = (1..=3)
        .map(|k| (k, new_item("z", "t", 0, NOW - 10)))
        .collect();
    s.insert(
        &rows,
        Some(100),
        &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
        &Handoff::NONE,
        NOW,
    )
    .await
    .unwrap();
    let raw = |key: u64| {
        let db = &db;
        async move {
            db.column(
                0,
                &format!("SELECT COALESCE(next_event_ms, -1) FROM items WHERE id = {key}"),
            )
            .await[0]
        }
    };
    assert_eq!(raw(1).await, 0);
    // As an earlier build wrote it.
    db.exec(0, "UPDATE items SET next_event_ms = NULL WHERE id = 2")
        .await;
    for key in [1, 2] {
        assert_eq!(meta(&s, key).await.unwrap().next_event_ms, None);
    }
    for cursor in [(0, 0), (-5, 7), (0, u64::MAX), (NOW - 1, u64::MAX)] {
        assert!(
            s.scan(cursor, NOW + 10 * LEASE, 100)
                .await
                .unwrap()
                .is_empty(),
            "a row with no event was scanned from {cursor:?}"
        );
    }
    // Claimed: both get the lease's end; released under the claim's token: none again,
    // spelled 0 whatever the row held before.
    assert_eq!(s.claim(&[1, 2], NOW, 9).await.unwrap().len(), 2);
    for key in [1, 2] {
        assert_eq!(raw(key).await, NOW + LEASE);
    }
    let due: Vec<u64> = s
        .scan((0, 0), NOW + LEASE, 100)
        .await
        .unwrap()
        .iter()
        .map(|m| m.key)
        .collect();
    assert_eq!(due, vec![1, 2]);
    s.apply(
        &[
            Change::Release { key: 1, token: 9 },
            Change::Release { key: 2, token: 9 },
        ],
        NOW + 1,
    )
    .await
    .unwrap();
    for key in [1, 2] {
        assert_eq!(raw(key).await, 0, "row {key} after its release");
        assert_eq!(meta(&s, key).await.unwrap().next_event_ms, None);
    }
    // A row whose timer is cleared by a change (`Change::Timer` to none) holds 0 too.
    s.apply(
        &[Change::Timer {
            key: 3,
            at_ms: None,
            seen_ms: None,
        }],
        NOW + 1,
    )
    .await
    .unwrap();
    assert_eq!(raw(3).await, 0);
    s.close().await;
}

/// A claim of rows found in the payload cache returns what reading them back would: the
/// same rows claimed again at the same time and token after a release (which drops them
/// from the cache, and undoes the delivery) come from MySQL, field for field. Rows of
/// every shape: a TTL, at-most-once, empty and large payloads and metadata, deferred
/// then due, two namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_claims_equal_what_mysql_reads_back() {
    let db = TestDb::mysql(1);
    let cache = PayloadCache::new(64 << 20);
    let s = Cached::new(MySqlStore::new(0, &db.url(0), 4).unwrap(), 0, cache.clone());
    s.open().await.unwrap();
    let mut rows: Vec<(u64, NewItem)> = Vec::new();
    for k in 1..=40u64 {
        let mut it = new_item(
            if k % 2 == 0 { "a" } else { "b" },
            "t",
            k as i32 % 7,
            NOW - k as i64,
        );
        match k % 5 {
            0 => it.expires_at_ms = Some(NOW + 60_000),
            1 => it.policy = Policy::AtMostOnce,
            2 => (it.payload, it.metadata) = (Vec::new(), Vec::new()),
            3 => (it.payload, it.metadata) = (vec![0xff; 10_240], vec![0; 1_000]),
            _ => it.lease_ms = 1_234,
        }
        rows.push((k, it));
    }
    s.insert(
        &rows,
        Some(100),
        &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
        &Handoff::NONE,
        NOW,
    )
    .await
    .unwrap();
    let keys: Vec<u64> = (1..=40).collect();
    let sorted = |mut v: Vec<foqs::model::Item>| {
        v.sort_by_key(|i| i.id.key);
        v
    };
    let from_cache = sorted(s.claim(&keys, NOW, 9).await.unwrap());
    assert_eq!(cache.hits_misses(), (40, 0), "every row was in the cache");
    assert!(cache.is_empty(), "a claim drops what it used");
    let releases: Vec<Change> = keys
        .iter()
        .map(|&key| Change::Release { key, token: 9 })
        .collect();
    s.apply(&releases, NOW).await.unwrap();
    let from_mysql = sorted(s.claim(&keys, NOW, 9).await.unwrap());
    assert_eq!(cache.hits_misses(), (40, 40));
    assert_eq!((from_cache.len(), from_mysql.len()), (40, 40));
    // Shown without their bytes (up to 10 KiB each), which are compared all the same.
    let shown = |i: &foqs::model::Item| {
        let (p, m) = (i.payload.len(), i.metadata.len());
        let bare = foqs::model::Item {
            payload: vec![],
            metadata: vec![],
            ..i.clone()
        };
        format!("{bare:?} with {p} payload and {m} metadata bytes")
    };
    for (c, m) in from_cache.iter().zip(&from_mysql) {
        assert!(
            c == m,
            "from the cache: {}\nfrom MySQL: {}",
            shown(c),
            shown(m)
        );
    }
    s.close().await;
}

/// The budget is never exceeded, the oldest rows go first, and rows the cache no longer
/// holds are read back as before (a tiny budget: a few rows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payload_cache_keeps_to_its_budget() {
    let db = TestDb::mysql(1);
    let cache = PayloadCache::new(2_000);
    let s = Cached::new(MySqlStore::new(0, &db.url(0), 4).unwrap(), 0, cache.clone());
    s.open().await.unwrap();
    for k in 1..=60u64 {
        let mut it = new_item("n", "t", 1, NOW - 10);
        it.payload = vec![k as u8; 100 + (k as usize % 3) * 200];
        s.insert(
            &[(k, it)],
            Some(k + 1),
            &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
            &Handoff::NONE,
            NOW,
        )
        .await
        .unwrap();
        assert!(
            cache.bytes() <= 2_000,
            "{} bytes held after row {k}",
            cache.bytes()
        );
    }
    // A row larger than the whole budget is not kept (and evicts nothing).
    let held = cache.len();
    let mut huge = new_item("n", "t", 1, NOW - 10);
    huge.payload = vec![7; 5_000];
    s.insert(
        &[(61, huge)],
        Some(62),
        &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
        &Handoff::NONE,
        NOW,
    )
    .await
    .unwrap();
    assert_eq!(cache.len(), held);
    assert!(held >= 2, "only {held} rows held");
    // The newest rows are the ones held.
    let newest: Vec<u64> = (61 - held as u64..=60).collect();
    let mut got = s.claim(&newest, NOW, 3).await.unwrap();
    assert_eq!(cache.hits_misses(), (held as u64, 0));
    let rest: Vec<u64> = (1..61 - held as u64).chain([61]).collect();
    got.extend(s.claim(&rest, NOW, 3).await.unwrap());
    assert_eq!(cache.hits_misses(), (held as u64, 61 - held as u64));
    got.sort_by_key(|i| i.id.key);
    assert_eq!(got.len(), 61);
    for (i, k) in got.iter().zip(1u64..) {
        let want = if k == 61 {
            vec![7; 5_000]
        } else {
            vec![k as u8; 100 + (k as usize % 3) * 200]
        };
        assert_eq!(
            (i.id.key, &i.payload, i.delivery_count, i.lease_token),
            (k, &want, 1, 3)
        );
    }
    assert!(cache.is_empty());
    s.close().await;
}

/// A worker that opens the shard never uses what the cache held for an earlier worker of
/// it: another host (here, another store) may have claimed and nacked the rows meanwhile,
/// and the earlier worker's entries are dropped when it closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_worker_does_not_use_an_earlier_workers_rows() {
    let db = TestDb::mysql(2);
    let cache = PayloadCache::new(64 << 20);
    let first = Cached::new(MySqlStore::new(0, &db.url(0), 4).unwrap(), 0, cache.clone());
    first.open().await.unwrap();
    let other_shard = Cached::new(MySqlStore::new(1, &db.url(1), 4).unwrap(), 1, cache.clone());
    other_shard.open().await.unwrap();
    let row = || vec![(1, new_item("o", "t", 1, NOW - 10))];
    first
        .insert(
            &row(),
            Some(2),
            &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
            &Handoff::NONE,
            NOW,
        )
        .await
        .unwrap();
    other_shard
        .insert(
            &row(),
            Some(2),
            &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
            &Handoff::NONE,
            NOW,
        )
        .await
        .unwrap();
    assert_eq!(cache.len(), 2);
    // Elsewhere: claimed, nacked with new metadata.
    let elsewhere = MySqlStore::new(0, &db.url(0), 4).unwrap();
    elsewhere.open().await.unwrap();
    assert_eq!(elsewhere.claim(&[1], NOW, 5).await.unwrap().len(), 1);
    let nack = Change::Ready {
        key: 1,
        lease: 5,
        deliver_after_ms: None,
        metadata: Some(b"new".to_vec()),
        settle: Settle::Lease,
    };
    elsewhere.apply(&[nack], NOW).await.unwrap();
    elsewhere.close().await;
    // Back here, under a new worker (the first one not stopped yet): read from MySQL.
    let again = Cached::new(MySqlStore::new(0, &db.url(0), 4).unwrap(), 0, cache.clone());
    again.open().await.unwrap();
    let got = again.claim(&[1], NOW + 1, 6).await.unwrap();
    assert_eq!(
        (got[0].metadata.as_slice(), got[0].delivery_count),
        (&b"new"[..], 2)
    );
    assert_eq!(cache.hits_misses(), (0, 1));
    // The first worker's entry goes when it closes; the other shard's stays, and its
    // claim (the same key) is built from it.
    assert_eq!(cache.len(), 2);
    first.close().await;
    assert_eq!(cache.len(), 1);
    let theirs = other_shard.claim(&[1], NOW + 1, 7).await.unwrap();
    assert_eq!(
        (theirs[0].id.shard, theirs[0].metadata.as_slice()),
        (1, &b"m"[..])
    );
    assert_eq!(cache.hits_misses(), (1, 1));
    assert!(cache.is_empty());
    for s in [&again, &other_shard] {
        s.close().await;
    }
}

/// A deferred row that comes due (its timer moved, nothing else) keeps its entry; any
/// other change drops it (a TTL's delete here), and a claim of a row gone is no item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_timer_move_keeps_a_cached_row() {
    let db = TestDb::mysql(1);
    let cache = PayloadCache::new(64 << 20);
    let s = Cached::new(MySqlStore::new(0, &db.url(0), 4).unwrap(), 0, cache.clone());
    s.open().await.unwrap();
    let rows = vec![
        (1, new_item("d", "t", 1, NOW + 1_000)),
        (2, new_item("d", "t", 1, NOW - 10)),
    ];
    s.insert(
        &rows,
        Some(3),
        &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
        &Handoff::NONE,
        NOW,
    )
    .await
    .unwrap();
    let due = Change::Timer {
        key: 1,
        at_ms: None,
        seen_ms: None,
    };
    s.apply(&[due, Change::Delete { key: 2 }], NOW + 1_000)
        .await
        .unwrap();
    assert_eq!(cache.len(), 1);
    let got = s.claim(&[1], NOW + 1_001, 4).await.unwrap();
    assert_eq!((got.len(), got[0].deliver_after_ms), (1, NOW + 1_000));
    assert!(s.claim(&[2], NOW + 1_001, 5).await.unwrap().is_empty());
    assert_eq!(cache.hits_misses(), (1, 1));
    s.close().await;
}
