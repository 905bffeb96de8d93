//! Dead letters: nack to the DLQ, list with paging across shards, requeue by id and in
//! bulk (100k items in bounded batches), purge.

use crate::common;

use std::collections::HashSet;

use common::*;
use foqs::model::ItemState;
use foqs::thrift_gen::*;

const NS: &str = "dlq";

fn list(c: &mut Client, topic: &str, limit: Option<i32>, after: Option<String>) -> DlqListResponse {
    let req = DlqListRequest {
        forwarded_for: None,
        ns: Some(NS.into()),
        topic: Some(topic.into()),
        limit,
        after,
        local_only: None,
    };
    c.call(|c| c.dlq_list(req)).expect("dlqList")
}

/// One dlqRequeueAll call: (count, more).
fn requeue_all(c: &mut Client, topic: &str, max: Option<i64>) -> (i64, bool) {
    let req = DlqRequeueAllRequest {
        forwarded_for: None,
        ns: Some(NS.into()),
        topic: Some(topic.into()),
        max,
        local_only: None,
    };
    let r = c.call(|c| c.dlq_requeue_all(req)).expect("dlqRequeueAll");
    (r.count.unwrap(), r.more.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_to_dlq_then_list_and_requeue_by_id() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let id = c.enqueue(vec![item(NS, "t", 3, b"poison")]).remove(0);
    let got = c.dequeue(NS, "t", 1);
    let before = now_ms();
    assert!(c.nack(vec![to_dlq(&id)])[0].error.is_none());
    assert!(
        c.dequeue(NS, "t", 1).is_empty(),
        "a dead item is not delivered"
    );
    let page = list(&mut c, "t", None, None);
    let dead = page.items.unwrap();
    assert_eq!(dead.len(), 1);
    let item = dead[0].item.as_ref().unwrap();
    assert_eq!(item.id.as_deref(), Some(id.as_str()));
    assert_eq!(item.delivery_count, Some(1));
    assert_eq!(item.payload.as_deref(), Some(&b"poison"[..]));
    assert!((before..=now_ms()).contains(&dead[0].died_at_ms.unwrap()));
    assert_eq!(page.next_after, None);

    let req = DlqRequeueRequest {
        ids: Some(vec![
            id.clone(),
            got[0].id.clone().unwrap(),
            "9:1".into(),
            "bad".into(),
        ]),
        ..Default::default()
    };
    let r = c.call(|c| c.dlq_requeue(req)).unwrap().results.unwrap();
    assert!(r[0].error.is_none());
    assert_eq!(
        code_of(&r[1].error),
        Some(ErrorCode::NOT_FOUND),
        "already requeued: not dead any more"
    );
    assert_eq!(code_of(&r[2].error), Some(ErrorCode::NOT_FOUND));
    assert_eq!(code_of(&r[3].error), Some(ErrorCode::INVALID_ARGUMENT));
    let again = c.dequeue(NS, "t", 1);
    assert_eq!(again[0].id.as_deref(), Some(id.as_str()));
    assert_eq!(
        again[0].delivery_count,
        Some(1),
        "delivery count reset by the requeue"
    );
    assert!(list(&mut c, "t", None, None).items.unwrap().is_empty());
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_page_across_shards_in_delivery_order() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let mut ids = HashSet::new();
    for i in 0..25 {
        ids.insert(c.enqueue(vec![item(NS, "pages", i % 4, b"x")]).remove(0));
    }
    let got: Vec<String> = c
        .dequeue(NS, "pages", 100)
        .into_iter()
        .map(|i| i.id.unwrap())
        .collect();
    c.nack(got.iter().map(|id| to_dlq(id)).collect());
    let mut seen = Vec::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let page = list(&mut c, "pages", Some(10), after);
        pages += 1;
        seen.extend(page.items.unwrap().into_iter().map(|d| d.item.unwrap()));
        match page.next_after {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let seen_ids: HashSet<String> = seen.iter().map(|i| i.id.clone().unwrap()).collect();
    assert_eq!(seen_ids, ids, "every dead item exactly once");
    assert_eq!(seen.len(), 25);
    let prios: Vec<i32> = seen.iter().map(|i| i.priority.unwrap()).collect();
    let mut sorted = prios.clone();
    sorted.sort();
    assert_eq!(prios, sorted);
    let e = c
        .call(|c| {
            c.dlq_list(DlqListRequest {
                forwarded_for: None,
                ns: Some(NS.into()),
                topic: Some("pages".into()),
                limit: None,
                after: Some("nonsense".into()),
                local_only: None,
            })
        })
        .unwrap_err();
    assert_eq!(foqs_error(e).code, Some(ErrorCode::INVALID_ARGUMENT));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_all_brings_back_100k_dead_items_in_batches() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    // Touch the topic through foqsd once so every shard has its schema, then, with foqsd
    // stopped, bulk-load 100k dead rows straight into the shards and start it again (it
    // reads the shards' topics at start).
    c.enqueue(vec![item(NS, "bulk", 0, b"x")]);
    let db = srv.stop().await;
    let now = now_ms();
    for s in 0..3u64 {
        let n = if s < 2 { 33_333 } else { 33_334 };
        let first = 10_000_000 * (s + 1);
        let last = first + n - 1;
        // A sequence of keys: MariaDB's SEQUENCE engine, SQLite's recursive CTE.
        let (with, from) = if db.is_sqlite() {
            (
                format!("WITH RECURSIVE q(seq) AS (SELECT {first} UNION ALL SELECT seq + 1 FROM q WHERE seq < {last}) "),
                "q".to_string(),
            )
        } else {
            (String::new(), format!("seq_{first}_to_{last}"))
        };
        let sql = format!(
            "INSERT {} INTO topics (tid, ns, topic) VALUES (1000, X'646c71', X'62756c6b');
             INSERT INTO items (id, tid, priority, state, deliver_after_ms, enqueued_at_ms, lease_ms,
               policy, max_attempts, delivery_count, died_at_ms, payload, metadata)
             {with}SELECT seq, (SELECT tid FROM topics WHERE ns = X'646c71' AND topic = X'62756c6b'), seq % 7, 2,
               {now}, {now}, 30000, 1, 5, 5, {now}, X'78', X''
             FROM {from}",
            if db.is_sqlite() { "OR IGNORE" } else { "IGNORE" }
        );
        db.exec(s as usize, &sql).await;
    }
    // Each call works 300 ms at most, then says there is more.
    let srv = TestServer::start_on(db, &format!("{FAST_ENGINE}dlq_call_ms_max = 300\n")).await;
    let mut c = srv.client();
    assert_eq!(srv.db.count_in(ItemState::Dead, "").await, 100_000);
    assert_eq!(
        requeue_all(&mut c, "bulk", Some(10)),
        (10, false),
        "max is honoured"
    );
    let (mut total, mut calls) = (0, 0);
    loop {
        let (n, more) = requeue_all(&mut c, "bulk", None);
        calls += 1;
        total += n;
        if !more {
            break;
        }
        assert!(n >= 1_000, "every call makes progress: {n}");
    }
    assert_eq!(total, 99_990);
    assert!(calls > 1, "99,990 requeued in one call within 300 ms?");
    assert_eq!(srv.db.count_in(ItemState::Dead, "").await, 0);
    assert_eq!(
        srv.db
            .count_in(
                ItemState::Ready,
                "delivery_count = 0 AND tid IN (SELECT tid FROM topics WHERE topic = X'62756c6b')"
            )
            .await,
        100_001
    );
    assert_eq!(c.topics(NS), vec![("bulk".to_string(), 100_001, 0, 0)]);
    let got = c.dequeue(NS, "bulk", 1000);
    assert_eq!(got.len(), 1000);
    assert!(got.iter().all(|i| i.delivery_count == Some(1)));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_a_topics_dead_letters_only() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let ids = c.enqueue((0..50).map(|i| item(NS, "purge", i, b"x")).collect());
    c.enqueue(vec![item(NS, "purge", 100, b"alive")]);
    let got: Vec<String> = c
        .dequeue(NS, "purge", 50)
        .into_iter()
        .map(|i| i.id.unwrap())
        .collect();
    assert_eq!(got.len(), 50);
    c.nack(ids.iter().map(|id| to_dlq(id)).collect());
    let req = DlqPurgeRequest {
        forwarded_for: None,
        ns: Some(NS.into()),
        topic: Some("purge".into()),
        local_only: None,
    };
    let purged = c.call(|c| c.dlq_purge(req)).unwrap();
    assert_eq!((purged.count, purged.more), (Some(50), Some(false)));
    assert!(list(&mut c, "purge", None, None).items.unwrap().is_empty());
    assert_eq!(srv.db.count("1").await, 1, "the live item stays");
    assert_eq!(
        c.host_info()
            .shards
            .unwrap()
            .iter()
            .map(|s| s.items.unwrap())
            .sum::<i64>(),
        1
    );
    srv.stop().await;
}

/// `engine.dlq_max_items_per_topic` bounds a topic's dead items (per shard): past it the
/// oldest are purged by the background ticks and counted in `foqs_dlq_dropped_total`; a
/// namespace's own setting overrides it (0: unbounded). On both stores (the suite runs
/// this file on SQLite too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topics_dead_letters_keep_to_their_bound_oldest_out_first() {
    let srv = TestServer::start(
        1,
        "[engine]\nscan_interval_ms = 20\ncheckpoint_interval_ms = 100\ndlq_max_items_per_topic = 3\n\
         [[namespaces]]\nname = \"dlq\"\n[[namespaces]]\nname = \"keep\"\ndlq_max_items_per_topic = 0\n",
    )
    .await;
    let mut c = srv.client();
    let mut kept = Vec::new();
    // "keep" first: by the time the other is trimmed, ticks have passed over it too.
    for ns in ["keep", NS] {
        let mut ids = Vec::new();
        for i in 0..5u8 {
            let id = c.enqueue(vec![item(ns, "bound", 0, &[b'0' + i])]).remove(0);
            let got = c.dequeue(ns, "bound", 1);
            assert_eq!(got[0].id.as_deref(), Some(id.as_str()));
            assert!(c.nack(vec![to_dlq(&id)])[0].error.is_none());
            ids.push(id);
        }
        let dead_ids = |c: &mut Client| -> Vec<String> {
            let req = DlqListRequest {
                forwarded_for: None,
                ns: Some(ns.into()),
                topic: Some("bound".into()),
                limit: None,
                after: None,
                local_only: None,
            };
            let mut v: Vec<String> = c
                .call(|c| c.dlq_list(req))
                .unwrap()
                .items
                .unwrap_or_default()
                .into_iter()
                .filter_map(|d| d.item?.id)
                .collect();
            v.sort();
            v
        };
        if ns == NS {
            // The two that died first go, within a few ticks.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let mut want = ids[2..].to_vec();
            want.sort();
            loop {
                let now = dead_ids(&mut c);
                if now == want {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "dead letters: {now:?}, want {want:?}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            let text = srv.running.as_ref().unwrap().host.metrics().encode();
            assert!(
                text.contains("foqs_dlq_dropped_total{ns=\"dlq\"} 2"),
                "{text}"
            );
            // Unbounded: all five stay, after the ticks that trimmed the other.
            let req = DlqListRequest {
                forwarded_for: None,
                ns: Some("keep".into()),
                topic: Some("bound".into()),
                limit: None,
                after: None,
                local_only: None,
            };
            let n = c
                .call(|c| c.dlq_list(req))
                .unwrap()
                .items
                .unwrap_or_default()
                .len();
            assert_eq!(n, kept.len());
        } else {
            kept = ids;
            assert_eq!(dead_ids(&mut c).len(), 5);
        }
    }
}
