//! Cases run on every store (`on_every_store!`): what a claim shows of a row, how handed
//! rows are written, names that are awkward bytes, and the marks that decide whether a
//! retried batch or forwarded request was stored.

use super::*;

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

/// A topic that holds nothing is forgotten with its row, totals and dedup keys; one that
/// holds an item is kept, whatever the caller believed; a forgotten name used again gets
/// a new id, and a reopen finds every row's topic.
async fn idle_topics_are_forgotten<S: ShardStore>(s: &S) {
    s.open().await.unwrap();
    let name = |topic: &str| TopicName {
        ns: "f".into(),
        topic: topic.into(),
    };
    let mut keyed = new_item("f", "gone", 1, NOW - 10);
    keyed.dedup_key = Some("k".into());
    let rows = vec![
        (1, keyed),
        (2, new_item("f", "kept", 1, NOW - 10)),
        (3, new_item("f", "gone2", 1, NOW - 10)),
    ];
    let marks = foqs::store::Marks::batch(foqs::store::new_batch_token(NOW));
    s.insert(&rows, Some(100), &marks, &Handoff::NONE, NOW)
        .await
        .unwrap();
    let one = Totals {
        enqueued: 1,
        ..Totals::default()
    };
    s.add_totals(&[(name("gone"), one), (name("kept"), one)])
        .await
        .unwrap();
    s.delete(&[1, 3]).await.unwrap();

    let mut gone = s
        .forget_topics(&[name("gone"), name("kept"), name("gone2"), name("never")])
        .await
        .unwrap();
    gone.sort_by(|a, b| a.topic.cmp(&b.topic));
    assert_eq!(gone, vec![name("gone"), name("gone2")]);
    let totals: Vec<TopicName> = s.totals().await.unwrap().into_iter().map(|t| t.0).collect();
    assert_eq!(totals, vec![name("kept")]);
    assert!(s
        .ready_keys("f", "gone", None, NOW, 10)
        .await
        .unwrap()
        .is_empty());
    // Forgotten twice: nothing left to forget.
    assert!(s.forget_topics(&[name("gone")]).await.unwrap().is_empty());

    // The name again: a new id, its own rows; the old key names nothing.
    let mut again = new_item("f", "gone", 2, NOW - 10);
    again.dedup_key = Some("k".into());
    let marks = foqs::store::Marks::batch(foqs::store::new_batch_token(NOW + 1));
    s.insert(&[(4, again)], Some(100), &marks, &Handoff::NONE, NOW)
        .await
        .unwrap();
    assert_eq!(
        s.dedup_lookup("f", "gone", &["k"]).await.unwrap(),
        vec![("k".to_string(), 4)]
    );
    s.close().await;
    s.open().await.unwrap();
    let mut counts: Vec<(String, i64)> = s
        .state_counts(None)
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.1, c.4))
        .collect();
    counts.sort();
    assert_eq!(counts, vec![("gone".into(), 1), ("kept".into(), 1)]);
    assert_eq!(
        keys(&s.ready_keys("f", "gone", None, NOW, 10).await.unwrap()),
        vec![4]
    );
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_topics_are_forgotten_on_every_store() {
    on_every_store!(idle_topics_are_forgotten);
}
