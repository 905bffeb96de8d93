//! Every semantic of the API, through a real Thrift client over TCP, against a foqsd on
//! real MariaDB/MySQL with 3 shards.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use foqs::model::ItemState;
use foqs::thrift_gen::{DeliveryPolicy, EnqueueItem, ErrorCode};

mod inspect;
mod worker;

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
