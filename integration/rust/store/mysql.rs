//! What holds for the MySQL store only: the server's statement bound, connection reuse,
//! rows without an event, and the payload cache in front of its claims.

use super::*;

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
