//! Every semantic of the API, through a real Thrift client over TCP, against a foqsd on
//! real MariaDB/MySQL with 3 shards.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use foqs::model::ItemState;
use foqs::thrift_gen::{DeliveryPolicy, EnqueueItem, ErrorCode};

const NS: &str = "api";

/// Sorts like the spec: priority, then older deliver_after, then lower id.
fn spec_key(i: &foqs::thrift_gen::Item) -> (i32, i64, u64, u32) {
    let id = i.id.as_ref().unwrap();
    let (shard, key) = id.split_once(':').unwrap();
    (
        i.priority.unwrap(),
        i.deliver_after_ms.unwrap(),
        key.parse().unwrap(),
        shard.parse().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dequeue_is_most_urgent_first_across_shards() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let base = now_ms() - 10_000;
    // One request per item: the host spreads requests round-robin over the shards.
    let mut ids = Vec::new();
    for (i, (p, age)) in [
        (5, 0),
        (-7, 3),
        (5, 1),
        (i32::MAX, 0),
        (0, 2),
        (5, 1),
        (i32::MIN, 9),
        (0, 2),
        (3, 5),
    ]
    .iter()
    .enumerate()
    {
        let it = EnqueueItem {
            deliver_after_ms: Some(base - age * 1000),
            ..item(NS, "order", *p, format!("{i}").as_bytes())
        };
        ids.extend(c.enqueue(vec![it]));
    }
    let shards: HashSet<&str> = ids.iter().map(|id| id.split(':').next().unwrap()).collect();
    assert_eq!(
        shards.len(),
        3,
        "items should be spread over all shards: {ids:?}"
    );

    let mut got = c.dequeue(NS, "order", 4);
    got.extend(c.dequeue(NS, "order", 100));
    assert_eq!(got.len(), 9);
    let keys: Vec<_> = got.iter().map(spec_key).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "delivery order");
    assert_eq!(got[0].priority, Some(i32::MIN));
    assert_eq!(got[8].priority, Some(i32::MAX));
    // Ties on priority go to the older deliver_after.
    let fives: Vec<i64> = got
        .iter()
        .filter(|i| i.priority == Some(5))
        .map(|i| i.deliver_after_ms.unwrap())
        .collect();
    assert_eq!(fives, vec![base - 1000, base - 1000, base]);
    for i in &got {
        assert_eq!(i.delivery_count, Some(1));
        assert_eq!(i.policy, Some(DeliveryPolicy::AT_LEAST_ONCE));
        assert!(
            i.lease_expires_ms.unwrap() >= now_ms() + 25_000,
            "default lease is 30 s"
        );
        assert_eq!(i.metadata.as_deref(), Some(&b""[..]));
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dequeue_fills_on_demand_and_an_empty_topic_is_an_empty_list() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    assert!(c.dequeue(NS, "nothing-here", 10).is_empty());
    let ids = c.enqueue((0..25).map(|i| item(NS, "fill", i, b"x")).collect());
    // Right after the enqueue, within the same call: no background tick involved.
    let got = c.dequeue(NS, "fill", 10);
    assert_eq!(got.len(), 10);
    assert_eq!(
        got.iter().map(|i| i.priority.unwrap()).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );
    let rest = c.dequeue(NS, "fill", 1000);
    assert_eq!(rest.len(), 15, "min(count, ready)");
    let all: HashSet<String> = got
        .iter()
        .chain(&rest)
        .map(|i| i.id.clone().unwrap())
        .collect();
    assert_eq!(all, ids.into_iter().collect());
    // Several topics in one request, each in its own order.
    c.enqueue(vec![
        item(NS, "a", 2, b"a2"),
        item(NS, "b", 1, b"b1"),
        item(NS, "a", 1, b"a1"),
    ]);
    let got = c
        .try_dequeue(vec![topic_req(NS, "a", 5), topic_req(NS, "b", 5)])
        .unwrap();
    let payloads: Vec<&[u8]> = got.iter().map(|i| i.payload.as_deref().unwrap()).collect();
    assert_eq!(payloads, vec![&b"a1"[..], b"a2", b"b1"]);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_and_topics_are_exact_byte_strings() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    for t in ["Orders", "orders", "ordérs", "orders "] {
        c.enqueue(vec![item(NS, t, 0, t.as_bytes())]);
    }
    c.enqueue(vec![item("API", "orders", 0, b"other-ns")]);
    for t in ["Orders", "orders", "ordérs", "orders "] {
        let got = c.dequeue(NS, t, 10);
        assert_eq!(got.len(), 1, "topic {t:?}");
        assert_eq!(got[0].payload.as_deref(), Some(t.as_bytes()));
        assert_eq!(got[0].topic.as_deref(), Some(t));
    }
    let got = c.dequeue("API", "orders", 10);
    assert_eq!(got[0].payload.as_deref(), Some(&b"other-ns"[..]));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_is_never_delivered_before_deliver_after() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let due = now_ms() + 600;
    c.enqueue(vec![EnqueueItem {
        deliver_after_ms: Some(due),
        ..item(NS, "later", -100, b"deferred")
    }]);
    c.enqueue(vec![item(NS, "later", 100, b"now")]);
    // The deferred item is more urgent but not due: only the other one is delivered.
    let got = c.dequeue(NS, "later", 10);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload.as_deref(), Some(&b"now"[..]));
    assert_eq!(c.topics(NS), vec![("later".to_string(), 0, 1, 1)]);
    let got = eventually(Duration::from_secs(5), "the deferred item", || {
        let g = c.dequeue(NS, "later", 10);
        assert!(
            g.is_empty() || now_ms() >= due,
            "delivered before deliver_after"
        );
        (!g.is_empty()).then_some(g)
    })
    .await;
    assert_eq!(got[0].payload.as_deref(), Some(&b"deferred"[..]));
    assert_eq!(got[0].deliver_after_ms, Some(due));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_hides_the_item_and_its_expiry_redelivers_with_a_higher_count() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let id = c
        .enqueue(vec![EnqueueItem {
            lease_ms: Some(400),
            ..item(NS, "lease", 0, b"x")
        }])
        .remove(0);
    let first = c.dequeue(NS, "lease", 10);
    assert_eq!(first.len(), 1);
    let t0 = now_ms();
    assert!((first[0].lease_expires_ms.unwrap() - t0).abs() < 400 + 100);
    assert!(
        c.dequeue(NS, "lease", 10).is_empty(),
        "leased items are not delivered again"
    );
    let again = eventually(Duration::from_secs(5), "redelivery", || {
        let g = c.dequeue(NS, "lease", 10);
        (!g.is_empty()).then_some(g)
    })
    .await;
    assert!(
        now_ms() >= first[0].lease_expires_ms.unwrap(),
        "redelivered before the lease expired"
    );
    assert_eq!(again[0].id.as_deref(), Some(id.as_str()));
    assert_eq!(again[0].delivery_count, Some(2));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_attempts_leave_the_item_dead_not_deleted() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let id = c
        .enqueue(vec![EnqueueItem {
            lease_ms: Some(100),
            max_attempts: Some(2),
            ..item(NS, "dies", 0, b"x")
        }])
        .remove(0);
    assert_eq!(c.dequeue(NS, "dies", 1)[0].delivery_count, Some(1));
    // The second attempt ends in a nack: nacks count too.
    let second = eventually(Duration::from_secs(5), "second delivery", || {
        c.dequeue(NS, "dies", 1).pop()
    })
    .await;
    assert_eq!(second.delivery_count, Some(2));
    let r = c.nack(vec![nack(&id, None, None)]);
    assert!(r[0].error.is_none());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        c.dequeue(NS, "dies", 1).is_empty(),
        "a dead item is not delivered"
    );
    assert!(
        c.topics(NS).is_empty(),
        "a dead item does not keep its topic active"
    );
    assert_eq!(
        srv.db.count_in(ItemState::Dead, "").await,
        1,
        "the dead item is kept"
    );

    // Lease expiry exhausts attempts the same way.
    c.enqueue(vec![EnqueueItem {
        lease_ms: Some(100),
        max_attempts: Some(1),
        ..item(NS, "dies2", 0, b"x")
    }]);
    assert_eq!(c.dequeue(NS, "dies2", 1).len(), 1);
    eventually(Duration::from_secs(5), "expiry to dead", || {
        let n = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(srv.db.count_in(ItemState::Dead, ""))
        });
        (n == 2).then_some(())
    })
    .await;
    assert!(c.dequeue(NS, "dies2", 1).is_empty());
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_items_are_deleted_when_their_lease_expires() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    c.enqueue(vec![EnqueueItem {
        lease_ms: Some(100),
        policy: Some(DeliveryPolicy::AT_MOST_ONCE),
        ..item(NS, "amo", 0, b"x")
    }]);
    let got = c.dequeue(NS, "amo", 1);
    assert_eq!(got[0].policy, Some(DeliveryPolicy::AT_MOST_ONCE));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(c.dequeue(NS, "amo", 1).is_empty(), "never delivered twice");
    assert_eq!(srv.db.count("1").await, 0, "deleted at lease expiry");
    let r = c.ack(&[got[0].id.clone().unwrap()]);
    assert_eq!(code_of(&r[0].error), Some(ErrorCode::NOT_FOUND));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_reschedules_after_its_delay_with_new_metadata() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let id = c
        .enqueue(vec![EnqueueItem {
            metadata: Some(b"old".to_vec()),
            ..item(NS, "nack", 0, b"payload")
        }])
        .remove(0);
    assert_eq!(
        c.dequeue(NS, "nack", 1)[0].metadata.as_deref(),
        Some(&b"old"[..])
    );
    let at = now_ms();
    let r = c.nack(vec![nack(&id, Some(500), Some(b"new"))]);
    assert!(r[0].error.is_none(), "{:?}", r[0].error);
    assert_eq!(r[0].id.as_deref(), Some(id.as_str()));
    assert!(c.dequeue(NS, "nack", 1).is_empty(), "not before its delay");
    assert_eq!(c.topics(NS), vec![("nack".to_string(), 0, 1, 0)]);
    let got = eventually(Duration::from_secs(5), "nacked item", || {
        c.dequeue(NS, "nack", 1).pop()
    })
    .await;
    assert!(now_ms() >= at + 500);
    assert_eq!(got.metadata.as_deref(), Some(&b"new"[..]));
    assert_eq!(
        got.payload.as_deref(),
        Some(&b"payload"[..]),
        "the payload is immutable"
    );
    assert_eq!(got.delivery_count, Some(2));
    // Without a delay or metadata: ready at once, metadata kept.
    c.nack(vec![nack(&id, None, None)]);
    let got = c.dequeue(NS, "nack", 1);
    assert_eq!(got[0].metadata.as_deref(), Some(&b"new"[..]));
    assert_eq!(got[0].delivery_count, Some(3));

    let r = c.nack(vec![
        nack("0:999999", None, None),
        nack("zzz", None, None),
        nack(&id, Some(-1), None),
    ]);
    assert_eq!(code_of(&r[0].error), Some(ErrorCode::NOT_FOUND));
    assert_eq!(code_of(&r[1].error), Some(ErrorCode::INVALID_ARGUMENT));
    assert_eq!(code_of(&r[2].error), Some(ErrorCode::INVALID_ARGUMENT));
    // Acked, then nacked: gone.
    assert!(c.ack(std::slice::from_ref(&id))[0].error.is_none());
    assert_eq!(
        code_of(&c.nack(vec![nack(&id, None, None)])[0].error),
        Some(ErrorCode::NOT_FOUND)
    );
    // A ready (not leased) item cannot be nacked.
    let ready = c.enqueue(vec![item(NS, "nack2", 0, b"x")]).remove(0);
    assert_eq!(
        code_of(&c.nack(vec![nack(&ready, None, None)])[0].error),
        Some(ErrorCode::NOT_FOUND)
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_deletes_and_a_retried_ack_is_done_again() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let ids = c.enqueue(vec![item(NS, "ack", 0, b"a"), item(NS, "ack", 1, b"b")]);
    let got = c.dequeue(NS, "ack", 2);
    let r = c.ack(&[
        got[0].id.clone().unwrap(),
        "not-an-id".into(),
        "7:1".into(),
        "0:123456789".into(),
    ]);
    assert!(r[0].error.is_none());
    assert_eq!(code_of(&r[1].error), Some(ErrorCode::INVALID_ARGUMENT));
    assert_eq!(
        code_of(&r[2].error),
        Some(ErrorCode::NOT_FOUND),
        "no shard 7 on this host"
    );
    assert_eq!(code_of(&r[3].error), Some(ErrorCode::NOT_FOUND));
    // A retry (its first reply lost, say) answers what the first ack did, within
    // engine.ack_memory_ms: done, not NOT_FOUND.
    let r = c.ack(&[got[0].id.clone().unwrap()]);
    assert!(
        r[0].error.is_none(),
        "a retried ack is done: {:?}",
        r[0].error
    );
    assert_eq!(srv.db.count("1").await, 1);
    assert_eq!(c.topics(NS), vec![("ack".to_string(), 0, 0, 1)]);
    c.ack(&ids[1..]);
    assert_eq!(srv.db.count("1").await, 0);
    assert!(c.topics(NS).is_empty());
    srv.stop().await;
}

/// Acks with `lease_ids`: an ack naming a lease deletes the item only while it is on
/// that delivery's lease; its retry is done again, one naming another lease is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_naming_a_lease_settles_only_that_delivery() {
    let srv = TestServer::start(1, "").await;
    let mut c = srv.client();
    let ids = c.enqueue(vec![EnqueueItem {
        lease_ms: Some(60_000),
        ..item(NS, "ackl", 0, b"a")
    }]);
    let got = c.dequeue(NS, "ackl", 1);
    let lease = got[0].lease_id.unwrap();
    assert_ne!(lease, 0);
    let ack = |c: &mut Client, lease_ids: Option<Vec<i64>>| {
        c.call(|c| {
            foqs::thrift_gen::TFoqsSyncClient::ack(
                c,
                foqs::thrift_gen::AckRequest {
                    ids: Some(ids.clone()),
                    forwarded_by: None,
                    forwarded_for: None,
                    lease_ids: lease_ids.clone(),
                },
            )
        })
    };
    // Another delivery's lease: the item is left alone.
    let r = ack(&mut c, Some(vec![lease + 1])).unwrap().results.unwrap();
    assert_eq!(code_of(&r[0].error), Some(ErrorCode::NOT_FOUND));
    assert!(
        r[0].error
            .as_ref()
            .unwrap()
            .message
            .as_deref()
            .unwrap()
            .contains("lease ended"),
        "{:?}",
        r[0].error
    );
    assert_eq!(srv.db.count("1").await, 1, "still there");
    // A list of another length than ids: the request is refused whole.
    let e = ack(&mut c, Some(vec![lease, lease])).expect_err("lease_ids too long");
    assert_eq!(foqs_error(e).code, Some(ErrorCode::INVALID_ARGUMENT));
    // Its own lease: deleted; the same ack again, or one naming no lease: done.
    for lease_ids in [Some(vec![lease]), Some(vec![lease]), None, Some(vec![0])] {
        let r = ack(&mut c, lease_ids.clone()).unwrap().results.unwrap();
        assert!(r[0].error.is_none(), "{lease_ids:?}: {:?}", r[0].error);
    }
    assert_eq!(srv.db.count("1").await, 0);
    // A retry naming another lease keeps its answer.
    let r = ack(&mut c, Some(vec![lease + 1])).unwrap().results.unwrap();
    assert_eq!(code_of(&r[0].error), Some(ErrorCode::NOT_FOUND));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_ttl_deletes_the_item_whatever_its_state() {
    // The TTL leaves room for the enqueues and the dequeue on a loaded machine (300 ms
    // did not: the leased item expired before its dequeue).
    const TTL_MS: i64 = 2_000;
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    c.enqueue(vec![EnqueueItem {
        ttl_ms: Some(TTL_MS),
        ..item(NS, "ttl-leased", 0, b"leased")
    }]);
    assert_eq!(c.dequeue(NS, "ttl-leased", 1).len(), 1);
    c.enqueue(vec![EnqueueItem {
        ttl_ms: Some(TTL_MS),
        ..item(NS, "ttl", 0, b"ready")
    }]);
    c.enqueue(vec![EnqueueItem {
        ttl_ms: Some(TTL_MS),
        deliver_after_ms: Some(now_ms() + 60_000),
        ..item(NS, "ttl-deferred", 0, b"deferred")
    }]);
    c.enqueue(vec![item(NS, "ttl", 1, b"no ttl")]);
    // Past the TTL of every item with one (each enqueued before now).
    tokio::time::sleep(Duration::from_millis(TTL_MS as u64 + 50)).await;
    // Expired but perhaps not purged yet: never delivered either way.
    let got = c.dequeue(NS, "ttl", 10);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload.as_deref(), Some(&b"no ttl"[..]));
    eventually(Duration::from_secs(5), "TTL purge", || {
        let n = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(srv.db.count("1"))
        });
        (n == 1).then_some(())
    })
    .await;
    assert_eq!(c.topics(NS), vec![("ttl".to_string(), 0, 0, 1)]);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_topics_appear_count_and_disappear_with_paging() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    assert!(c.topics(NS).is_empty());
    for t in ["t3", "t1", "t2", "t4"] {
        c.enqueue(vec![item(NS, t, 0, b"x"), item(NS, t, 1, b"y")]);
    }
    c.enqueue(vec![EnqueueItem {
        deliver_after_ms: Some(now_ms() + 60_000),
        ..item(NS, "t2", 0, b"later")
    }]);
    c.enqueue(vec![item("elsewhere", "t0", 0, b"x")]);
    c.dequeue(NS, "t1", 1);
    assert_eq!(
        c.topics(NS),
        vec![
            ("t1".to_string(), 1, 0, 1),
            ("t2".to_string(), 2, 1, 0),
            ("t3".to_string(), 2, 0, 0),
            ("t4".to_string(), 2, 0, 0)
        ]
    );
    let p1 = c.try_topics(NS, Some(3), None).unwrap();
    let names: Vec<String> = p1
        .topics
        .unwrap()
        .into_iter()
        .map(|t| t.topic.unwrap())
        .collect();
    assert_eq!(names, vec!["t1", "t2", "t3"]);
    assert_eq!(p1.next_after.as_deref(), Some("t3"));
    let p2 = c.try_topics(NS, Some(3), Some("t3")).unwrap();
    assert_eq!(p2.topics.unwrap().len(), 1);
    assert_eq!(p2.next_after, None, "absent on the last page");
    // Draining a topic makes it disappear.
    let items = c.dequeue(NS, "t3", 10);
    let ids: Vec<String> = items.into_iter().map(|i| i.id.unwrap()).collect();
    c.ack(&ids);
    let names: Vec<String> = c.topics(NS).into_iter().map(|t| t.0).collect();
    assert_eq!(names, vec!["t1", "t2", "t4"]);
    let e = foqs_error(c.try_topics(NS, Some(0), None).unwrap_err());
    assert_eq!(e.code, Some(ErrorCode::INVALID_ARGUMENT));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_item_fails_alone_and_requests_are_validated() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let results = c
        .try_enqueue(vec![
            item(NS, "batch", 0, b"ok-1"),
            item(NS, "batch", 0, &vec![0; 10_241]),
            item(NS, "", 0, b"no topic"),
            EnqueueItem {
                metadata: Some(vec![0; 4_097]),
                ..item(NS, "batch", 0, b"x")
            },
            EnqueueItem {
                lease_ms: Some(-1),
                ..item(NS, "batch", 0, b"x")
            },
            EnqueueItem {
                ttl_ms: Some(-5),
                ..item(NS, "batch", 0, b"x")
            },
            item(&"n".repeat(256), "batch", 0, b"x"),
            item(NS, "batch", 0, &vec![7; 10_240]),
        ])
        .unwrap();
    let codes: Vec<Option<ErrorCode>> = results.iter().map(|r| code_of(&r.error)).collect();
    use ErrorCode as E;
    assert_eq!(
        codes,
        vec![
            None,
            Some(E::PAYLOAD_TOO_LARGE),
            Some(E::INVALID_ARGUMENT),
            Some(E::PAYLOAD_TOO_LARGE),
            Some(E::INVALID_ARGUMENT),
            Some(E::INVALID_ARGUMENT),
            Some(E::INVALID_ARGUMENT),
            None
        ]
    );
    assert!(results[0].id.is_some() && results[7].id.is_some());
    assert!(results[1].id.is_none());
    assert_eq!(
        c.dequeue(NS, "batch", 10).len(),
        2,
        "the good items were enqueued"
    );

    let too_many = (0..1001).map(|_| item(NS, "batch", 0, b"x")).collect();
    assert_eq!(
        foqs_error(c.try_enqueue(too_many).unwrap_err()).code,
        Some(E::INVALID_ARGUMENT)
    );
    for count in [0, -1, 1001] {
        let e = foqs_error(
            c.try_dequeue(vec![topic_req(NS, "batch", count)])
                .unwrap_err(),
        );
        assert_eq!(e.code, Some(E::INVALID_ARGUMENT), "count {count}");
        assert_eq!(e.retryable, Some(false));
    }
    let e = foqs_error(c.try_dequeue(vec![topic_req(NS, "", 1)]).unwrap_err());
    assert_eq!(e.code, Some(E::INVALID_ARGUMENT));
    // The connection is still fine after declared errors.
    assert_eq!(c.host_info().shards.unwrap().len(), 3);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listed_namespaces_reject_others_and_apply_their_settings() {
    let srv = TestServer::start(
        3,
        "[defaults]\nlease_ms = 1000\n[[namespaces]]\nname = \"Listed\"\nlease_ms = 200\nmax_attempts = 1\n",
    )
    .await;
    let mut c = srv.client();
    let r = c
        .try_enqueue(vec![
            item("Listed", "t", 0, b"x"),
            item("listed", "t", 0, b"x"),
        ])
        .unwrap();
    assert!(r[0].error.is_none());
    assert_eq!(code_of(&r[1].error), Some(ErrorCode::UNKNOWN_NAMESPACE));
    let e = foqs_error(c.try_dequeue(vec![topic_req("other", "t", 1)]).unwrap_err());
    assert_eq!(e.code, Some(ErrorCode::UNKNOWN_NAMESPACE));
    assert_eq!(
        foqs_error(c.try_topics("other", None, None).unwrap_err()).code,
        Some(ErrorCode::UNKNOWN_NAMESPACE)
    );
    let got = c.dequeue("Listed", "t", 1);
    let lease = got[0].lease_expires_ms.unwrap() - now_ms();
    assert!(
        lease <= 200 && lease > 0,
        "the namespace's lease_ms applies: {lease}"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_consumers_never_share_a_lease() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let mut all = HashSet::new();
    for chunk in 0..4 {
        all.extend(
            c.enqueue(
                (0..100)
                    .map(|i| item(NS, "race", (i * 7 + chunk) % 13, b"x"))
                    .collect(),
            ),
        );
    }
    let addr = srv.addr;
    let consumers: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                let mut c = Client::connect(addr, Proto::Binary);
                let mut mine = Vec::new();
                loop {
                    let got = c.dequeue(NS, "race", 7);
                    if got.is_empty() {
                        break;
                    }
                    mine.extend(got.into_iter().map(|i| i.id.unwrap()));
                }
                mine
            })
        })
        .collect();
    let mut seen = Vec::new();
    for h in consumers {
        seen.extend(h.await.unwrap());
    }
    let unique: HashSet<String> = seen.iter().cloned().collect();
    assert_eq!(
        unique.len(),
        seen.len(),
        "an item was delivered to two consumers"
    );
    assert_eq!(unique, all, "every item was delivered");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_info_lists_shards_with_item_counts() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    c.enqueue((0..5).map(|i| item(NS, "info", i, b"x")).collect());
    let info = c.host_info();
    assert_eq!(info.version.as_deref(), Some(foqs::VERSION));
    assert!(info.host_id.unwrap().starts_with("127.0.0.1:"));
    let shards = info.shards.unwrap();
    assert_eq!(
        shards
            .iter()
            .map(|s| s.shard_id.unwrap())
            .collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert!(shards.iter().all(|s| s.healthy == Some(true)));
    assert_eq!(shards.iter().map(|s| s.items.unwrap()).sum::<i64>(), 5);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_deferral_and_ttl_follow_the_hosts_clock() {
    // Hours pass in milliseconds: every time decision uses foqsd's clock, never MySQL's.
    let clock = foqs::clock::ManualClock::new(1_000_000_000_000);
    let srv =
        TestServer::start_with_clock(TestDb::new(3), "", "", std::sync::Arc::new(clock.clone()))
            .await;
    let mut c = srv.client();
    const HOUR: i64 = 3_600_000;
    let leased = c.enqueue(vec![EnqueueItem {
        lease_ms: Some(HOUR),
        ..item(NS, "clock", 0, b"leased")
    }]);
    assert_eq!(c.dequeue(NS, "clock", 10).len(), 1);
    c.enqueue(vec![EnqueueItem {
        deliver_after_ms: Some(1_000_000_000_000 + 2 * HOUR),
        ..item(NS, "clock", 1, b"deferred")
    }]);
    c.enqueue(vec![EnqueueItem {
        ttl_ms: Some(3 * HOUR),
        ..item(NS, "clock-ttl", 0, b"mortal")
    }]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(c.dequeue(NS, "clock", 10).is_empty(), "nothing is due yet");

    clock.advance(HOUR + 1);
    let got = eventually(Duration::from_secs(5), "lease expiry after an hour", || {
        c.dequeue(NS, "clock", 10).pop()
    })
    .await;
    assert_eq!(got.id.as_deref(), Some(leased[0].as_str()));
    assert_eq!(got.delivery_count, Some(2));
    assert_eq!(got.lease_expires_ms, Some(1_000_000_000_000 + 2 * HOUR + 1));
    assert!(c.ack(&leased)[0].error.is_none());

    clock.advance(HOUR);
    let got = eventually(Duration::from_secs(5), "the deferred item", || {
        c.dequeue(NS, "clock", 10).pop()
    })
    .await;
    assert_eq!(got.payload.as_deref(), Some(&b"deferred"[..]));

    const MORTAL: &str = "tid IN (SELECT tid FROM topics WHERE topic = X'636c6f636b2d74746c')";
    assert_eq!(srv.db.count(MORTAL).await, 1, "not yet purged");
    clock.advance(HOUR);
    eventually(
        Duration::from_secs(5),
        "TTL purge after three hours",
        || {
            let n = tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(srv.db.count(MORTAL))
            });
            (n == 0).then_some(())
        },
    )
    .await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn touch_keeps_an_item_from_being_redelivered_past_its_original_lease() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let id = c
        .enqueue(vec![EnqueueItem {
            lease_ms: Some(300),
            ..item(NS, "touch", 0, b"long job")
        }])
        .remove(0);
    let first = c.dequeue(NS, "touch", 1);
    let original = first[0].lease_expires_ms.unwrap();
    // Keep extending well past the original lease, as a long-running worker would.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let r = c.touch(&[(&id, 400)]);
        assert!(r[0].error.is_none(), "{:?}", r[0].error);
        assert!(
            c.dequeue(NS, "touch", 1).is_empty(),
            "redelivered while touched"
        );
    }
    assert!(
        now_ms() > original + 500,
        "the test ran past the original lease"
    );
    assert_eq!(c.topics(NS), vec![("touch".to_string(), 0, 0, 1)]);
    // Without touches, the extended lease runs out and the item comes back.
    let again = eventually(
        Duration::from_secs(5),
        "redelivery after the extended lease",
        || c.dequeue(NS, "touch", 1).pop(),
    )
    .await;
    assert_eq!(again.delivery_count, Some(2));

    let ready = c.enqueue(vec![item(NS, "touch2", 0, b"x")]).remove(0);
    let r = c.touch(&[
        (&ready, 1000),
        ("0:987654321", 1000),
        ("junk", 1000),
        (&id, 0),
        (&id, -5),
    ]);
    let codes: Vec<Option<ErrorCode>> = r.iter().map(|r| code_of(&r.error)).collect();
    use ErrorCode as E;
    assert_eq!(
        codes,
        vec![
            Some(E::NOT_FOUND),
            Some(E::NOT_FOUND),
            Some(E::INVALID_ARGUMENT),
            Some(E::INVALID_ARGUMENT),
            Some(E::INVALID_ARGUMENT)
        ],
        "a ready item is not leased; unknown ids are not found; bad input is invalid"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_shows_the_next_ready_items_in_order_without_leasing_them() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    for p in [5, 1, 9, 3, 7] {
        c.enqueue(vec![item(NS, "peek", p, format!("p{p}").as_bytes())]);
    }
    c.enqueue(vec![EnqueueItem {
        deliver_after_ms: Some(now_ms() + 60_000),
        ..item(NS, "peek", -1, b"deferred")
    }]);
    let peeked = c.try_peek(NS, "peek", 3).unwrap();
    let prios: Vec<i32> = peeked.iter().map(|i| i.priority.unwrap()).collect();
    assert_eq!(prios, vec![1, 3, 5], "ready items only, in delivery order");
    assert!(peeked
        .iter()
        .all(|i| i.lease_expires_ms == Some(0) && i.delivery_count == Some(0)));
    assert_eq!(
        c.try_peek(NS, "peek", 3).unwrap().len(),
        3,
        "peeking leases nothing"
    );
    let got = c.dequeue(NS, "peek", 2);
    assert_eq!(
        got.iter().map(|i| i.priority.unwrap()).collect::<Vec<_>>(),
        vec![1, 3]
    );
    let prios: Vec<i32> = c
        .try_peek(NS, "peek", 10)
        .unwrap()
        .iter()
        .map(|i| i.priority.unwrap())
        .collect();
    assert_eq!(prios, vec![5, 7, 9], "leased items are not shown");
    assert!(c.try_peek(NS, "nothing", 10).unwrap().is_empty());
    let e = foqs_error(c.try_peek(NS, "peek", 0).unwrap_err());
    assert_eq!(e.code, Some(ErrorCode::INVALID_ARGUMENT));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_on_a_busy_topic_shows_staged_items_as_ready() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    c.enqueue(
        (0..600)
            .map(|i| item(NS, "busy-peek", i % 10, b"x"))
            .collect(),
    );
    let mut taken = HashSet::new();
    for _ in 0..30 {
        taken.extend(
            c.dequeue(NS, "busy-peek", 10)
                .into_iter()
                .map(|i| i.id.unwrap()),
        );
    }
    assert!(
        srv.db.count_in(ItemState::Leased, "").await > 300,
        "items were staged ahead"
    );
    let peeked = c.try_peek(NS, "busy-peek", 100).unwrap();
    assert_eq!(peeked.len(), 100);
    assert!(
        peeked
            .iter()
            .all(|i| !taken.contains(i.id.as_ref().unwrap())),
        "a leased item was shown"
    );
    let keys: Vec<_> = peeked.iter().map(spec_key).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    // What peek showed first is what the next dequeue hands out.
    let next = c.dequeue(NS, "busy-peek", 10);
    let next_ids: Vec<_> = next.iter().map(|i| i.id.clone().unwrap()).collect();
    let peeked_ids: Vec<_> = peeked
        .iter()
        .take(10)
        .map(|i| i.id.clone().unwrap())
        .collect();
    assert_eq!(next_ids, peeked_ids);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_stats_count_states_and_traffic_and_the_oldest_age_grows_while_stalled() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let ids = c.enqueue(
        (0..6)
            .map(|i| EnqueueItem {
                lease_ms: Some(200),
                ..item(NS, "stats", i, b"x")
            })
            .collect(),
    );
    c.enqueue(vec![EnqueueItem {
        deliver_after_ms: Some(now_ms() + 60_000),
        ..item(NS, "stats", 0, b"later")
    }]);
    let got = c.dequeue(NS, "stats", 4);
    c.ack(&[got[0].id.clone().unwrap()]);
    c.nack(vec![nack(got[1].id.as_ref().unwrap(), None, None)]);
    c.nack(vec![foqs::thrift_gen::NackItem {
        to_dlq: Some(true),
        ..nack(got[2].id.as_ref().unwrap(), None, None)
    }]);
    // got[3] stays leased until its 200 ms lease runs out.
    let s = c.stats(NS, "stats");
    assert_eq!(
        (s.ready, s.deferred, s.leased, s.dead),
        (Some(3), Some(1), Some(1), Some(1))
    );
    assert_eq!(
        (s.enqueued, s.delivered, s.acked, s.nacked, s.expired),
        (Some(7), Some(4), Some(1), Some(2), Some(0))
    );
    eventually(Duration::from_secs(5), "the lease to expire", || {
        let s = c.stats(NS, "stats");
        (s.expired == Some(1)).then_some(())
    })
    .await;
    // Nobody dequeues: the oldest ready item keeps ageing.
    let a = c.stats(NS, "stats").oldest_ready_age_ms.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = c.stats(NS, "stats").oldest_ready_age_ms.unwrap();
    assert!(b >= a + 250, "age went from {a} to {b}");
    // Totals survive a restart (they are saved with the checkpoints and at shutdown).
    let db = srv.stop().await;
    let srv = TestServer::start_on(db, "").await;
    let mut c = srv.client();
    let s = c.stats(NS, "stats");
    assert_eq!(
        (s.enqueued, s.delivered, s.acked, s.nacked, s.expired),
        (Some(7), Some(4), Some(1), Some(2), Some(1))
    );
    assert_eq!(c.stats(NS, "none").oldest_ready_age_ms, Some(0));
    assert_eq!(ids.len(), 6);
    srv.stop().await;
}

/// A dequeue of `count` with local_only and a `before` bound, as a host routing a
/// dequeue to its peer sends it.
fn dequeue_before(
    c: &mut Client,
    topic: &str,
    count: i32,
    before: (Option<i32>, Option<i64>),
    local_only: Option<bool>,
) -> thrift::Result<Vec<foqs::thrift_gen::Item>> {
    use foqs::thrift_gen::TFoqsSyncClient;
    c.call(|c| {
        c.dequeue(foqs::thrift_gen::DequeueRequest {
            topics: Some(vec![foqs::thrift_gen::TopicRequest {
                before_priority: before.0,
                before_deliver_after_ms: before.1,
                ..topic_req(NS, topic, count)
            }]),
            wait_ms: None,
            local_only,
            forwarded_by: None,
        })
    })
    .map(|r| r.items.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_dequeue_takes_only_items_more_urgent_than_its_bound() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    let base = now_ms() - 10_000;
    let mut ids = HashSet::new();
    // One request per item, so they spread over the shards.
    for p in [7, 2, 9, 0, 5, 3, 8, 1, 6, 4] {
        let it = EnqueueItem {
            deliver_after_ms: Some(base),
            ..item(NS, "before", p, b"x")
        };
        ids.extend(c.enqueue(vec![it]));
    }
    let priorities = |items: &[foqs::thrift_gen::Item]| -> Vec<i32> {
        items.iter().map(|i| i.priority.unwrap()).collect()
    };
    // Before the topic's index is read, its head here is unknown; a loaded machine may
    // have read it already (an insert past its store timeout has its topic reloaded), and
    // then it is the true head, never another.
    let head = |c: &mut Client| {
        let info = c.host_info();
        let t = info
            .ready_topics
            .unwrap()
            .into_iter()
            .find(|t| t.topic.as_deref() == Some("before"))
            .expect("listed");
        (t.head_priority, t.head_deliver_after_ms)
    };
    let first = head(&mut c);
    assert!(
        first == (None, None) || first == (Some(0), Some(base)),
        "the head before any dequeue: {first:?}"
    );
    let got = dequeue_before(&mut c, "before", 10, (Some(5), Some(base)), Some(true)).unwrap();
    assert_eq!(
        priorities(&got),
        vec![0, 1, 2, 3, 4],
        "only those before (5, base)"
    );
    // What was claimed beyond the bound is ready as far as anyone can tell: the head here
    // is now known, and the same priority with a later deliver_after comes after.
    assert_eq!(head(&mut c), (Some(5), Some(base)));
    let got5 = dequeue_before(&mut c, "before", 10, (Some(5), Some(base + 1)), Some(true)).unwrap();
    assert_eq!(priorities(&got5), vec![5]);
    assert!(
        dequeue_before(&mut c, "before", 10, (Some(-1), Some(0)), Some(true))
            .unwrap()
            .is_empty(),
        "nothing is more urgent than priority -1"
    );
    let rest = c.dequeue(NS, "before", 10);
    assert_eq!(priorities(&rest), vec![6, 7, 8, 9], "nothing lost");
    for i in got.iter().chain(&got5).chain(&rest) {
        assert_eq!(i.delivery_count, Some(1), "each delivered once: {i:?}");
    }
    let seen: HashSet<String> = got
        .iter()
        .chain(&got5)
        .chain(&rest)
        .map(|i| i.id.clone().unwrap())
        .collect();
    assert_eq!(seen, ids);
    // The bound is for hosts routing a dequeue: with local_only, and both halves.
    for (before, local_only) in [
        ((Some(5), Some(base)), None),
        ((Some(5), None), Some(true)),
        ((None, Some(base)), Some(true)),
    ] {
        let e = foqs_error(dequeue_before(&mut c, "before", 1, before, local_only).unwrap_err());
        assert_eq!(e.code, Some(ErrorCode::INVALID_ARGUMENT), "{before:?}");
    }
    srv.stop().await;
}

/// `foqs::client::Worker`, the consumer loop for Rust programs: each item goes to the
/// handler, and is settled by its verdict (ack, retry after a delay, dead letter); a
/// handler longer than the lease keeps it (renewed), so its item is delivered once; a
/// stop ends the loop with nothing left leased.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_worker_settles_items_by_their_handlers_verdicts() {
    use foqs::client::{Settled, Verdict, Worker, WorkerOptions};
    use std::sync::Mutex;

    let srv = TestServer::start(2, "").await;
    let mut c = srv.client();
    for p in ["ok", "retry", "dead", "slow"] {
        let mut it = item("worker", "jobs", 0, p.as_bytes());
        it.lease_ms = Some(1_500);
        c.enqueue(vec![it]);
    }
    let addr = srv.addr;
    let seen = tokio::task::spawn_blocking(move || {
        let worker = Worker::new(WorkerOptions {
            ns: "worker".into(),
            topics: vec!["jobs".into()],
            concurrency: 2,
            lease_ms: None,
            wait_ms: 200,
            grace: Duration::from_secs(5),
        });
        let stopper = worker.stopper();
        let open = || {
            foqs::client::connect(
                addr,
                foqs::client::Protocol::Binary,
                Duration::from_secs(10),
            )
            .map_err(|e| e.to_string())
        };
        let seen: Mutex<Vec<(String, i32, Settled)>> = Mutex::default();
        let handler = |job: &foqs::client::Job| {
            let p = String::from_utf8(job.item.payload.clone().unwrap()).unwrap();
            match (p.as_str(), job.item.delivery_count.unwrap()) {
                ("ok", _) | ("retry", 2..) => Verdict::Ack,
                ("retry", _) => Verdict::RetryAfter(Duration::from_millis(50)),
                ("dead", _) => Verdict::DeadLetter,
                _ => {
                    // Longer than its lease: kept by renewal.
                    std::thread::sleep(Duration::from_millis(2_000));
                    Verdict::Ack
                }
            }
        };
        let done = |item: &foqs::thrift_gen::Item, s: &Settled, _: Duration| {
            let p = String::from_utf8(item.payload.clone().unwrap()).unwrap();
            let mut seen = seen.lock().unwrap();
            seen.push((p, item.delivery_count.unwrap(), s.clone()));
            if seen.len() == 5 {
                stopper.stop();
            }
        };
        worker.run(&open, &handler, &done).unwrap();
        let mut v = seen.into_inner().unwrap();
        v.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        v
    })
    .await
    .unwrap();
    let ack = Settled::Applied(Verdict::Ack);
    assert_eq!(
        seen,
        vec![
            ("dead".into(), 1, Settled::Applied(Verdict::DeadLetter)),
            ("ok".into(), 1, ack.clone()),
            (
                "retry".into(),
                1,
                Settled::Applied(Verdict::RetryAfter(Duration::from_millis(50)))
            ),
            ("retry".into(), 2, ack.clone()),
            ("slow".into(), 1, ack),
        ]
    );
    // Nothing left: the dead one is dead, the rest acked, none leased.
    let stats = c.stats("worker", "jobs");
    assert_eq!(
        (stats.ready, stats.leased, stats.dead, stats.acked),
        (Some(0), Some(0), Some(1), Some(3)),
        "{stats:?}"
    );
}

/// `Worker::run_async`: the same loop with async handlers (awaiting the runtime's timer
/// past the lease, which renewal keeps); a handler that panics releases its item; a stop
/// past the grace drops a handler that never ends, and its item is released, not left
/// leased.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_worker_runs_async_handlers_and_drops_a_cancelled_one() {
    use foqs::client::{Settled, Verdict, Worker, WorkerOptions};
    use std::sync::{Arc, Mutex};

    let srv = TestServer::start(2, "").await;
    let mut c = srv.client();
    for p in ["ok", "retry", "dead", "slow", "stuck", "panic"] {
        let mut it = item("async-worker", "jobs", 0, p.as_bytes());
        it.lease_ms = Some(1_500);
        c.enqueue(vec![it]);
    }
    let addr = srv.addr;
    let worker = Worker::new(WorkerOptions {
        ns: "async-worker".into(),
        topics: vec!["jobs".into()],
        concurrency: 3,
        lease_ms: None,
        wait_ms: 200,
        grace: Duration::from_millis(300),
    });
    let stopper = worker.stopper();
    let open = move || {
        foqs::client::connect(
            addr,
            foqs::client::Protocol::Binary,
            Duration::from_secs(10),
        )
        .map_err(|e| e.to_string())
    };
    // The stuck job says when it runs; the test stops the worker once every other job
    // has ended, so the stuck one is what the stop must cancel.
    let (stuck_tx, stuck_rx) = tokio::sync::watch::channel(false);
    let handler = move |item: foqs::thrift_gen::Item| {
        let stuck_tx = stuck_tx.clone();
        async move {
            let p = String::from_utf8(item.payload.clone().unwrap()).unwrap();
            match (p.as_str(), item.delivery_count.unwrap()) {
                ("ok", _) | ("retry", 2..) => Verdict::Ack,
                ("retry", _) => Verdict::RetryAfter(Duration::from_millis(50)),
                ("dead", _) => Verdict::DeadLetter,
                ("panic", 1) => panic!("a handler's bug: its item is released, not lost"),
                ("panic", _) => Verdict::Ack,
                ("slow", _) => {
                    // Longer than its lease, awaiting the runtime's timer: kept by renewal.
                    tokio::time::sleep(Duration::from_millis(2_000)).await;
                    Verdict::Ack
                }
                _ => {
                    let _ = stuck_tx.send(true);
                    std::future::pending::<Verdict>().await
                }
            }
        }
    };
    let seen: Arc<Mutex<Vec<(String, i32, Settled)>>> = Arc::default();
    let s = seen.clone();
    let done = move |item: &foqs::thrift_gen::Item, end: &Settled, _: Duration| {
        let p = String::from_utf8(item.payload.clone().unwrap()).unwrap();
        s.lock()
            .unwrap()
            .push((p, item.delivery_count.unwrap(), end.clone()));
    };
    // The worker on a runtime of its own thread: were a stop not to end it, the test fails
    // at its timeout instead of hanging in its runtime's drop (which waits for the loop).
    let (ended_tx, ended) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let _ = ended_tx.send(rt.block_on(worker.run_async(open, handler, done)));
    });
    let s = seen.clone();
    common::eventually(Duration::from_secs(60), "seven jobs ended", || {
        (s.lock().unwrap().len() == 7).then_some(())
    })
    .await;
    let mut rx = stuck_rx;
    rx.wait_for(|started| *started).await.unwrap();
    stopper.stop();
    tokio::time::timeout(Duration::from_secs(30), ended)
        .await
        .expect("the stop ends the worker within its grace")
        .unwrap()
        .unwrap();
    let mut v = seen.lock().unwrap().clone();
    v.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    let ack = Settled::Applied(Verdict::Ack);
    assert_eq!(
        v,
        vec![
            ("dead".into(), 1, Settled::Applied(Verdict::DeadLetter)),
            ("ok".into(), 1, ack.clone()),
            ("panic".into(), 1, Settled::Applied(Verdict::Release)),
            ("panic".into(), 2, ack.clone()),
            (
                "retry".into(),
                1,
                Settled::Applied(Verdict::RetryAfter(Duration::from_millis(50)))
            ),
            ("retry".into(), 2, ack.clone()),
            ("slow".into(), 1, ack),
            ("stuck".into(), 1, Settled::Applied(Verdict::Release)),
        ]
    );
    // The stuck one was given back: ready again, nothing leased.
    let stats = c.stats("async-worker", "jobs");
    assert_eq!(
        (stats.ready, stats.leased, stats.dead, stats.acked),
        (Some(1), Some(0), Some(1), Some(4)),
        "{stats:?}"
    );
}
