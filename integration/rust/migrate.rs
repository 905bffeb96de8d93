//! Schema version 1 to 2: a shard written by a version-1 build (its DDL kept here,
//! verbatim) holding items in every state is migrated in place when this build opens it,
//! and every item then behaves through the API as it would have before. A shard written
//! by a newer build refuses to open.

use crate::common;

use std::time::Duration;

use common::*;
use foqs::store::{MySqlStore, ShardStore, StoreError};
use foqs::thrift_gen::*;

/// `src/store/mysql/mod.rs` at schema version 1.
const V1_DDL: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS items (
        id BIGINT UNSIGNED NOT NULL PRIMARY KEY,
        ns VARBINARY(255) NOT NULL,
        topic VARBINARY(255) NOT NULL,
        priority INT NOT NULL,
        state TINYINT NOT NULL,
        deliver_after_ms BIGINT NOT NULL,
        due_at_ms BIGINT NULL,
        died_at_ms BIGINT NULL,
        dedup_key VARBINARY(255) NULL,
        enqueued_at_ms BIGINT NOT NULL,
        lease_ms BIGINT NOT NULL,
        lease_expires_ms BIGINT NOT NULL DEFAULT 0,
        lease_token BIGINT NOT NULL DEFAULT 0,
        expires_at_ms BIGINT NULL,
        policy TINYINT NOT NULL,
        max_attempts INT NOT NULL,
        delivery_count INT NOT NULL DEFAULT 0,
        payload BLOB NOT NULL,
        metadata BLOB NOT NULL,
        KEY ready_order (ns, topic, state, priority, deliver_after_ms, id),
        KEY due (due_at_ms),
        KEY lease (lease_expires_ms),
        KEY ttl (expires_at_ms),
        UNIQUE KEY dedup (ns, topic, dedup_key)
    ) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS topic_totals (
        ns VARBINARY(255) NOT NULL,
        topic VARBINARY(255) NOT NULL,
        enqueued BIGINT NOT NULL DEFAULT 0,
        delivered BIGINT NOT NULL DEFAULT 0,
        acked BIGINT NOT NULL DEFAULT 0,
        nacked BIGINT NOT NULL DEFAULT 0,
        expired BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (ns, topic)
    ) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS foqs_meta (
        name VARBINARY(64) NOT NULL PRIMARY KEY,
        value BIGINT NOT NULL
    ) ENGINE=InnoDB",
];

const NS: &str = "mig";

async fn exec(db: &TestDb, sql: &str) {
    let mut conn = mysql_async::Conn::from_url(db.base.clone()).await.unwrap();
    use mysql_async::prelude::*;
    conn.query_drop(format!("CREATE DATABASE IF NOT EXISTS `{}`", db.names[0]))
        .await
        .unwrap();
    conn.query_drop(format!("USE `{}`", db.names[0]))
        .await
        .unwrap();
    conn.query_drop(sql).await.unwrap();
    let _ = conn.disconnect().await;
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn topic_of(c: &mut Client, topic: &str, n: i32) -> Vec<Item> {
    c.dequeue(NS, topic, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_shard_is_migrated_in_place_and_every_item_behaves_as_before() {
    let db = TestDb::new(1);
    for ddl in V1_DDL {
        exec(&db, ddl).await;
    }
    let now = now_ms();
    let soon = now + 2_500;
    let cp = now - 3_000;
    // (id, topic, priority, state, deliver_after, due_at, died_at, dedup, lease_expires,
    //  token, expires_at, policy, max_attempts, delivery_count, payload, metadata)
    let rows = format!(
        "INSERT INTO items (id, ns, topic, priority, state, deliver_after_ms, due_at_ms, died_at_ms, dedup_key,
           enqueued_at_ms, lease_ms, lease_expires_ms, lease_token, expires_at_ms, policy, max_attempts,
           delivery_count, payload, metadata) VALUES
         (1, 'mig', 'ready', 5, 0, {now} - 10000, NULL, NULL, NULL, {now} - 10000, 30000, 0, 0, NULL, 1, 5, 0, 'r5', 'm5'),
         (2, 'mig', 'ready', 1, 0, {now} - 5000, NULL, NULL, 'k1', {now} - 5000, 30000, 0, 0, NULL, 1, 5, 0, 'r1', 'm1'),
         (3, 'mig', 'ready', 1, 0, {now} - 9000, {now} - 9000, NULL, NULL, {now} - 20000, 30000, 0, 0, NULL, 1, 5, 1, 'r1old', ''),
         (4, 'mig', 'later', 0, 0, {soon}, {soon}, NULL, NULL, {now} - 1000, 30000, 0, 0, NULL, 1, 5, 0, 'deferred', ''),
         (5, 'mig', 'held', 0, 1, {now} - 10000, NULL, NULL, NULL, {now} - 10000, 30000, {soon}, 77, NULL, 1, 5, 1, 'leased', ''),
         (6, 'mig', 'held', 0, 1, {now} - 10000, NULL, NULL, NULL, {now} - 10000, 600000, {now} + 600000, 78, NULL, 1, 5, 1, 'held', ''),
         (7, 'mig', 'dead', 3, 2, {now} - 10000, NULL, {now} - 1000, NULL, {now} - 10000, 30000, 0, 0, NULL, 1, 5, 5, 'dead', 'dm'),
         (8, 'mig', 'ttl', 0, 0, {now} - 1000, NULL, NULL, NULL, {now} - 1000, 30000, 0, 0, {soon}, 1, 5, 0, 'ttl', ''),
         (9, 'mig', 'amo', 0, 1, {now} - 1000, NULL, NULL, NULL, {now} - 1000, 30000, {soon}, 79, NULL, 2, 1, 1, 'amo', '')"
    );
    exec(&db, &rows).await;
    exec(
        &db,
        "INSERT INTO topic_totals (ns, topic, enqueued, delivered, acked, nacked, expired)
         VALUES ('mig', 'ready', 10, 8, 7, 1, 0), ('mig', 'gone', 4, 4, 4, 0, 0)",
    )
    .await;
    exec(
        &db,
        &format!(
            "INSERT INTO foqs_meta (name, value) VALUES ('schema_version', 1), ('key_high_water', 1000),
             ('checkpoint_due_ms', {cp}), ('checkpoint_lease_ms', {cp}), ('checkpoint_ttl_ms', {cp})"
        ),
    )
    .await;

    let srv = TestServer::start_on(db, "").await;
    let mut c = srv.client();
    assert_eq!(
        srv.db
            .column(
                0,
                "SELECT value FROM foqs_meta WHERE name = 'schema_version'"
            )
            .await,
        vec![2]
    );
    assert_eq!(
        srv.db
            .column(
                0,
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()
                 AND table_name IN ('items_v1', 'items_v2', 'topic_totals')"
            )
            .await,
        vec![0],
        "the old tables are gone"
    );
    // Rows with no pending event (ready without a TTL, dead) hold MySQL's 0 for none,
    // those with one a time (a lease's end, a deferred item's due time, a TTL).
    assert_eq!(
        srv.db
            .column(
                0,
                "SELECT COALESCE(next_event_ms, -1) = 0 FROM items WHERE id IN (1, 2, 4, 5, 7, 8) ORDER BY id"
            )
            .await,
        vec![1, 1, 0, 0, 1, 0]
    );

    // Totals, and a topic that only had totals.
    let s = c.stats(NS, "ready");
    assert_eq!(
        (s.ready, s.enqueued, s.delivered, s.acked, s.nacked),
        (Some(3), Some(10), Some(8), Some(7), Some(1))
    );
    assert_eq!(c.stats(NS, "gone").acked, Some(4));

    // Dedup keys survive: the same key answers with the existing item.
    let r = c
        .try_enqueue(vec![EnqueueItem {
            dedup_key: Some("k1".into()),
            ..item(NS, "ready", 0, b"again")
        }])
        .unwrap()
        .remove(0);
    assert_eq!((r.id.as_deref(), r.deduplicated), (Some("0:2"), Some(true)));

    // Ready items, in order, with their payloads, metadata and delivery counts.
    let got = topic_of(&mut c, "ready", 10);
    let seen: Vec<(String, Vec<u8>, Vec<u8>, i32)> = got
        .iter()
        .map(|i| {
            (
                i.id.clone().unwrap(),
                i.payload.clone().unwrap(),
                i.metadata.clone().unwrap_or_default(),
                i.delivery_count.unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("0:3".into(), b"r1old".to_vec(), vec![], 2),
            ("0:2".into(), b"r1".to_vec(), b"m1".to_vec(), 1),
            ("0:1".into(), b"r5".to_vec(), b"m5".to_vec(), 1),
        ]
    );
    let ids: Vec<String> = seen.iter().map(|s| s.0.clone()).collect();
    assert!(c.ack(&ids).iter().all(|r| r.error.is_none()));

    // Keys are never reused: new items get keys from the old high-water mark.
    let fresh = c.enqueue(vec![item(NS, "new", 0, b"n")]).remove(0);
    let key: u64 = fresh.split(':').nth(1).unwrap().parse().unwrap();
    assert!(
        key >= 1000,
        "new key {key} reuses a key below the high-water mark"
    );

    // Leased: still held; the one with a long lease can be acked by its id.
    assert!(topic_of(&mut c, "held", 10).is_empty());
    assert!(c.ack(&["0:6".to_string()])[0].error.is_none());

    // Dead: listed with its time, and requeued.
    let dead = c
        .call(|c| {
            c.dlq_list(DlqListRequest {
                forwarded_for: None,
                ns: Some(NS.into()),
                topic: Some("dead".into()),
                limit: None,
                after: None,
                local_only: None,
            })
        })
        .unwrap()
        .items
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].died_at_ms, Some(now - 1000));
    assert_eq!(
        dead[0].item.as_ref().unwrap().metadata.as_deref(),
        Some(&b"dm"[..])
    );

    // Deferred: not yet; TTL: still there; both change when their time comes.
    assert!(topic_of(&mut c, "later", 1).is_empty());
    assert_eq!(c.stats(NS, "later").deferred, Some(1));
    assert_eq!(c.stats(NS, "ttl").ready, Some(1));
    let later = wait_for("the deferred item comes due", || {
        topic_of(&mut c, "later", 1).pop()
    });
    assert_eq!(later.payload.as_deref(), Some(&b"deferred"[..]));
    assert!(now_ms() >= soon);
    // The lease ends: at-least-once comes back counted, at-most-once is gone.
    let back = wait_for("the leased item comes back", || {
        topic_of(&mut c, "held", 1).pop()
    });
    assert_eq!(
        (back.id.as_deref(), back.delivery_count),
        (Some("0:5"), Some(2))
    );
    wait_for("the TTL passes and the at-most-once lease ends", || {
        let t = c.stats(NS, "ttl");
        let a = c.stats(NS, "amo");
        (t.ready == Some(0) && a.leased == Some(0) && a.ready == Some(0)).then_some(())
    });
    assert_eq!(
        srv.db.count("1").await,
        4,
        "0:4 and 0:5 leased, the new item, 0:7"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_of_a_newer_schema_refuses_to_open() {
    let db = TestDb::new(1);
    exec(
        &db,
        "CREATE TABLE foqs_meta (name VARBINARY(64) NOT NULL PRIMARY KEY, value BIGINT NOT NULL)",
    )
    .await;
    exec(&db, "INSERT INTO foqs_meta VALUES ('schema_version', 3)").await;
    let store = MySqlStore::new(0, &db.url(0), 1).unwrap();
    match store.open().await {
        Err(StoreError::Schema(m)) => assert!(m.contains("newer"), "{m}"),
        other => panic!("opened a newer schema: {other:?}"),
    }
    store.close().await;
}

/// A shard made by a build before `settled_token` (the lease a consumer's nack last
/// settled) gains the column when this build opens it, and its rows read 0 (no nack
/// settled): the column is added in place, not a new schema version, so an earlier build
/// keeps working with the table too (it never names the column).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_of_an_earlier_build_gains_the_settled_token_column() {
    let db = TestDb::mysql(1);
    let store = MySqlStore::new(0, &db.url(0), 1).unwrap();
    store.open().await.unwrap();
    store.close().await;
    exec(&db, "ALTER TABLE items DROP COLUMN settled_token").await;
    let store = MySqlStore::new(0, &db.url(0), 1).unwrap();
    store.open().await.expect("opens, adding the column");
    store.close().await;
    let mut conn = mysql_async::Conn::from_url(db.url(0)).await.unwrap();
    use mysql_async::prelude::*;
    let n: Option<i64> = conn
        .query_first(
            "SELECT COUNT(*) FROM information_schema.columns
             WHERE table_schema = DATABASE() AND table_name = 'items' AND column_name = 'settled_token'",
        )
        .await
        .unwrap();
    assert_eq!(n, Some(1));
    let _ = conn.disconnect().await;
}
