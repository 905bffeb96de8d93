//! The API's views of a host and its topics (host info, peek, topic stats), the host's
//! clock for leases and deferral, touch, and the bounded dequeue a routing peer sends; on
//! the same foqsd as the rest of `api`.

use super::*;

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
            forwarded_for: None,
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
