//! What only the SQLite store does, on real files: reads beside the writer run outside its
//! transaction, so a burst of them does not delay a commit; the writer's and the reader's
//! queues are bounded; and the breaker's probe fails on a full file, as writes do, and
//! passes again once there is room.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use foqs::model::{NewItem, Policy};
use foqs::store::{Handoff, ShardStore, SqliteStore, StoreError};

const NOW: i64 = 1_700_000_000_000;

fn item(topic: &str, priority: i32) -> NewItem {
    NewItem {
        ns: "sq".into(),
        topic: topic.into(),
        priority,
        payload: vec![b'x'; 200],
        metadata: Vec::new(),
        deliver_after_ms: NOW - 1,
        enqueued_at_ms: NOW,
        lease_ms: 30_000,
        expires_at_ms: None,
        policy: Policy::AtLeastOnce,
        max_attempts: 5,
        dedup_key: None,
    }
}

async fn opened(db: &TestDb) -> SqliteStore {
    let path = db.url(0).strip_prefix("sqlite://").unwrap().to_string();
    let s = SqliteStore::new(0, path.into());
    s.open().await.unwrap();
    s
}

/// Inserts `n` items into topic `t`, keys from `first`, in batches.
async fn fill(s: &SqliteStore, topic: &str, first: u64, n: u64) {
    for start in (first..first + n).step_by(2000) {
        let rows: Vec<(u64, NewItem)> = (start..(start + 2000).min(first + n))
            .map(|k| (k, item(topic, (k % 100) as i32)))
            .collect();
        s.insert(
            &rows,
            None,
            &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
            &Handoff::NONE,
            NOW,
        )
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_reads_does_not_delay_a_commit() {
    let db = TestDb::sqlite(1);
    let s = std::sync::Arc::new(opened(&db).await);
    fill(&s, "deep", 1, 15_000).await;
    // One read alone, for scale.
    let t = Instant::now();
    s.topic_counts("sq", None, NOW, 100).await.unwrap();
    let one_read = t.elapsed();

    // 24 GROUP BYs over the topic's rows, then one small insert behind them.
    let reads: Vec<_> = (0..24)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move { s.topic_counts("sq", None, NOW, 100).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let t = Instant::now();
    s.insert(
        &[(100_001, item("other", 0))],
        None,
        &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
        &Handoff::NONE,
        NOW,
    )
    .await
    .unwrap();
    let commit = t.elapsed();
    for r in reads {
        assert_eq!(r.await.unwrap().unwrap()[0].ready, 15_000);
    }
    let all_reads = t.elapsed();
    eprintln!(
        "one read {one_read:?}; a commit behind 24 reads {commit:?}; all reads {all_reads:?}"
    );
    // Inside the writer's transaction the insert waited for every read queued before it
    // (seen before the reader: commit ≈ all the reads); beside it, for none.
    assert!(
        commit < one_read * 4,
        "a commit took {commit:?} behind 24 reads of {one_read:?} each (all: {all_reads:?})"
    );
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_file_fails_the_probe_as_it_fails_writes_until_there_is_room() {
    let db = TestDb::sqlite(1);
    let s = opened(&db).await;
    fill(&s, "t", 1, 2_000).await;
    s.ping().await.expect("a shard with room passes the probe");

    s.simulate_full_disk(true).await.unwrap();
    let write = s
        .insert(
            &[(5_000, item("t", 0))],
            None,
            &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
            &Handoff::NONE,
            NOW,
        )
        .await;
    assert!(
        matches!(&write, Err(StoreError::Transient(m)) if m.contains("full")),
        "{write:?}"
    );
    // `SELECT 1` passed here, so the breaker closed on a shard that could not write.
    let probe = s.ping().await;
    assert!(
        matches!(&probe, Err(StoreError::Transient(m)) if m.contains("full")),
        "{probe:?}"
    );
    // Reads still work, and what was committed is intact.
    let counts = s.topic_counts("sq", None, NOW, 10).await.unwrap();
    assert_eq!(counts[0].ready, 2_000);

    s.simulate_full_disk(false).await.unwrap();
    s.ping().await.expect("room again: the probe passes");
    s.insert(
        &[(5_000, item("t", 0))],
        None,
        &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
        &Handoff::NONE,
        NOW,
    )
    .await
    .expect("room again: writes pass");
    let counts = s.topic_counts("sq", None, NOW, 10).await.unwrap();
    assert_eq!(counts[0].ready, 2_001);
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_of_reads_is_a_busy_error_not_a_wait() {
    let db = TestDb::sqlite(1);
    let s = std::sync::Arc::new(opened(&db).await);
    fill(&s, "deep", 1, 3_000).await;
    // Far more reads than the reader queues: the excess fails at once as busy, the rest
    // are answered, and the writer is not held up meanwhile.
    let reads: Vec<_> = (0..1_000)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move { s.topic_counts("sq", None, NOW, 100).await })
        })
        .collect();
    s.insert(
        &[(50_000, item("other", 0))],
        None,
        &foqs::store::Marks::batch(foqs::store::new_batch_token(NOW)),
        &Handoff::NONE,
        NOW,
    )
    .await
    .unwrap();
    let (mut ok, mut busy) = (0, 0);
    for r in reads {
        match r.await.unwrap() {
            Ok(c) => {
                assert_eq!(c[0].ready, 3_000);
                ok += 1;
            }
            Err(StoreError::Transient(m)) if m.starts_with("busy") => busy += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(busy > 0 && ok > 0, "{ok} answered, {busy} busy");
    assert_eq!(ok + busy, 1_000);
    s.close().await;
}

/// A file made by a build before `settled_token` gains the column when this build opens
/// it (see `migrate.rs`'s MySQL twin), with its rows at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_an_earlier_build_gains_the_settled_token_column() {
    let db = TestDb::sqlite(1);
    let s = opened(&db).await;
    fill(&s, "old", 1, 3).await;
    s.close().await;
    let path = db.url(0).strip_prefix("sqlite://").unwrap().to_string();
    let has = |c: &rusqlite::Connection| -> i64 {
        c.query_row(
            "SELECT COUNT(*) FROM pragma_table_info('items') WHERE name = 'settled_token'",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch("ALTER TABLE items DROP COLUMN settled_token")
            .unwrap();
        assert_eq!(has(&c), 0);
    }
    let s = opened(&db).await;
    let rows = s.lookup(&[1, 2, 3]).await.unwrap();
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|m| m.settled_token == 0));
    s.close().await;
    let c = rusqlite::Connection::open(&path).unwrap();
    assert_eq!(has(&c), 1);
}
