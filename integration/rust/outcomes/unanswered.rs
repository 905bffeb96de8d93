//! Outcomes of calls whose answer was lost on the way: an enqueue whose insert went
//! unanswered, a failed ack remembered, a requeue whose answer was lost.

use super::*;

/// An enqueue whose insert's outcome the store lost is answered with what happened, not
/// with "outcome unknown": the host asks the shard whether the insert's batch committed
/// (a tombstone decides it for good, see `store::batches`). Committed (the reply was lost
/// after the commit): OK with the item's id, and the item is there. Not committed (the
/// store never ran it, or its late commit meets the tombstone): `UNAVAILABLE` without
/// doubt, and the item never shows. (Before: `outcome_unknown` in every case, and the
/// client could not tell whether to retry.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_whose_insert_went_unanswered_is_answered_with_what_happened() {
    // Both stores: their late commits race the look differently.
    enqueue_in_doubt_over(TestDb::sqlite(1)).await;
    enqueue_in_doubt_over(TestDb::mysql(1)).await;
}

async fn enqueue_in_doubt_over(db: TestDb) {
    use foqs::clock::SystemClock;
    use foqs::core::{Caller, Host, TopicRequest};
    use std::sync::Arc;

    let engine = format!("{FAST_ENGINE}store_timeout_ms = 300\n");
    let (running, faults) = foqsd_with_faults(&db, &engine, Arc::new(SystemClock)).await;
    let host = running.host.clone();
    let caller = Caller::anonymous();
    let enqueue = |payload: &'static str| {
        let host = host.clone();
        async move { enqueue_one(&host, "doubt", payload.as_bytes()).await }
    };
    // Everything the topic hands out now (its items are ready at once).
    async fn drain(host: &Host, caller: &Caller) -> Vec<(String, Vec<u8>)> {
        let got = host
            .dequeue(
                caller,
                vec![TopicRequest {
                    ns: "doubt".into(),
                    topic: "t".into(),
                    count: 10,
                    before: (None, None),
                }],
                None,
                false,
            )
            .await
            .unwrap();
        got.into_iter()
            .map(|i| (i.id.to_string(), i.payload))
            .collect()
    }

    // The reply was lost after the commit: OK, with the id the item has.
    faults.arm("insert", Fault::FailAfterCommit);
    let (id, _) = enqueue("committed").await.expect("it committed: OK");
    assert_eq!(
        drain(&host, &caller).await,
        vec![(id.to_string(), b"committed".to_vec())]
    );
    // And it counts in the topic's totals (the worker adds it at its next turn).
    let enqueued = || async {
        let (s, _) = host.topic_stats(&caller, "doubt", "t", true).await.unwrap();
        s.totals.enqueued
    };
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while enqueued().await != 1 {
        assert!(
            std::time::Instant::now() < until,
            "the committed insert is not in the topic's totals: {}",
            enqueued().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The store never ran it: UNAVAILABLE, certain.
    faults.arm("insert", Fault::Hang);
    let e = enqueue("never").await.expect_err("it did not commit");
    assert!(!e.in_doubt, "decided, not in doubt: {e:?}");
    assert_eq!(e.code, foqs::error::ErrorCode::Unavailable, "{e:?}");
    assert!(e.message.contains("did not commit"), "{e:?}");

    // It commits late. Over SQLite's one writer the late job runs before the shard's
    // look (OK, and the item is there); over MySQL it starts after the look, meets the
    // tombstone and fails (UNAVAILABLE, and it never shows). Either way the answer is
    // what happened.
    faults.arm("insert", Fault::CommitLate(Duration::from_millis(100)));
    match enqueue("late").await {
        Ok((id, _)) => assert_eq!(
            drain(&host, &caller).await,
            vec![(id.to_string(), b"late".to_vec())]
        ),
        Err(e) => {
            assert!(!e.in_doubt, "decided, not in doubt: {e:?}");
            // The late commit starts 100 ms after the fault and is dropped 200 ms later
            // (`faulty::LATE_RUN_MAX`): past both, it has failed or never run.
            tokio::time::sleep(Duration::from_millis(600)).await;
            let mut last = Vec::new();
            for _ in 0..3 {
                last.extend(drain(&host, &caller).await);
            }
            assert!(last.is_empty(), "refused, but stored: {last:?}");
        }
    }
    let (id, _) = enqueue("after").await.expect("the shard works on");
    assert_eq!(
        drain(&host, &caller).await,
        vec![(id.to_string(), b"after".to_vec())]
    );
    running.shutdown().await;
}

/// An ack naming a lease that failed before any DELETE (its look at the row failed) is
/// remembered, yet a later ack of that lease, once the item is on another delivery's lease,
/// is "lease ended" (the row is there: no ack of that lease deleted it), not done. (Before:
/// done, from the memory, for an ack that provably never applied.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_ack_remembered_does_not_answer_done_for_a_row_on_another_lease() {
    let db = TestDb::mysql(1);
    let (shard, worker, faults) = start(&db).await;
    let x = delivered(&shard, "relet").await;
    let (key, first) = (x.id.key, x.lease_token);
    faults.arm("lookup", Fault::FailBefore);
    let failed = shard.ack(vec![ack_op(key, Some(first))]).await;
    assert!(failed.is_err(), "the look failed: {failed:?}");
    // Back to ready and delivered again: the row is on another lease.
    let nacked = shard
        .nack(vec![NackOp {
            key,
            delay_ms: 0,
            metadata: None,
            to_dlq: false,
            lease_id: Some(first),
            token: None,
        }])
        .await
        .unwrap();
    assert_eq!(nacked, vec![Settled::Done]);
    let keys = shard.peek(topic("relet"), 10, now_ms()).await.unwrap();
    let claimed = shard.claim(topic("relet"), keys).await.unwrap();
    let again = shard.hand_out(claimed);
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].lease_token, first);
    assert_eq!(
        shard.ack(vec![ack_op(key, Some(first))]).await.unwrap(),
        vec![Settled::LeaseEnded]
    );
    assert_eq!(db.count("1").await, 1, "the item is still there");
    shard.shutdown().await;
    worker.await.unwrap();
}

/// A dead-letter requeue whose revive committed while the store's answer was lost is
/// answered OK through the host (its retry under the requeue's token finds its own work),
/// not `UNAVAILABLE` in doubt; a requeue of an item that is not dead stays `NOT_FOUND`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_whose_answer_was_lost_is_answered_with_what_happened() {
    use foqs::clock::SystemClock;
    use foqs::core::{Caller, EnqueueRequestItem, NackRequestItem, TopicRequest};
    use std::sync::Arc;

    let db = TestDb::mysql(1);
    let (running, faults) = foqsd_with_faults(&db, FAST_ENGINE, Arc::new(SystemClock)).await;
    let host = running.host.clone();
    let caller = Caller::anonymous();
    let item = |topic: &str| EnqueueRequestItem {
        ns: "rq".into(),
        topic: topic.into(),
        payload: b"x".to_vec(),
        ..Default::default()
    };
    let ids: Vec<String> = host
        .enqueue(
            &caller,
            vec![item("dead"), item("live")],
            (None, None),
            None,
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap().0.to_string())
        .collect();
    let got = host
        .dequeue(
            &caller,
            vec![TopicRequest {
                ns: "rq".into(),
                topic: "dead".into(),
                count: 1,
                before: (None, None),
            }],
            None,
            false,
        )
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    let nacked = host
        .nack(
            &caller,
            vec![NackRequestItem {
                id: ids[0].clone(),
                delay_ms: None,
                metadata: None,
                to_dlq: true,
                lease_id: None,
            }],
            (None, None),
            // A client's own nack token is ignored: 0, every fresh row's settled_token,
            // would otherwise answer OK without applying (the item would not be dead).
            Some(0),
        )
        .await
        .unwrap();
    assert!(nacked[0].is_ok(), "{nacked:?}");
    faults.arm("apply", Fault::FailAfterCommit);
    let r = host
        .dlq_requeue(&caller, ids.clone(), (None, None), None)
        .await
        .unwrap();
    assert!(r[0].is_ok(), "the requeue committed: OK, not {:?}", r[0]);
    let e = r[1].as_ref().expect_err("the live item was not dead");
    assert_eq!(e.code, foqs::error::ErrorCode::NotFound, "{e:?}");
    assert!(!e.in_doubt, "{e:?}");
    assert_eq!(
        db.column(0, "SELECT state FROM items ORDER BY id").await,
        vec![0, 0],
        "both ready"
    );
    running.shutdown().await;
}
