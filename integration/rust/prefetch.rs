//! The prefetch buffer and the bounded index in the running system: busy topics stage
//! items ahead, staged items count as ready and go back to ready on shutdown; a shard that
//! has forgotten topics (index_topics_max) still serves every one of them.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use foqs::model::ItemState;

const NS: &str = "prefetch";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_topic_stages_ahead_and_shutdown_releases_what_was_staged() {
    let srv = TestServer::start(3, "").await;
    let mut c = srv.client();
    for _ in 0..4 {
        c.enqueue((0..500).map(|i| item(NS, "busy", i % 7, b"x")).collect());
    }
    // Dequeue fast enough for the topic to count as busy.
    let mut delivered = HashSet::new();
    for _ in 0..60 {
        for i in c.dequeue(NS, "busy", 10) {
            assert!(delivered.insert(i.id.unwrap()), "delivered twice");
        }
    }
    assert_eq!(delivered.len(), 600);
    let leased_in_store = srv.db.count_in(ItemState::Leased, "").await;
    assert!(
        leased_in_store > 600,
        "nothing was staged ahead: {leased_in_store} leased rows"
    );
    // Staged items are leased rows, but ready as far as clients can tell.
    let topics = c.topics(NS);
    assert_eq!(topics, vec![("busy".to_string(), 1400, 0, 600)]);

    let db = srv.stop().await;
    assert_eq!(
        db.count_in(ItemState::Leased, "").await,
        600,
        "only what consumers hold stays leased"
    );
    assert_eq!(
        db.count_in(ItemState::Ready, "delivery_count > 0").await,
        0,
        "released items were not counted as delivered"
    );
    assert_eq!(db.count_in(ItemState::Ready, "").await, 1400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_items_expire_back_to_ready_if_nobody_takes_them() {
    let srv = TestServer::start(3, "[engine]\nscan_interval_ms = 20\ncheckpoint_interval_ms = 100\nprefetch_stage_max_ms = 200\n").await;
    let mut c = srv.client();
    c.enqueue((0..1000).map(|i| item(NS, "aging", i % 3, b"x")).collect());
    for _ in 0..40 {
        c.dequeue(NS, "aging", 10);
    }
    assert!(
        srv.db.count_in(ItemState::Leased, "").await > 400,
        "items were staged"
    );
    // Nobody dequeues: staged items are released after prefetch_stage_max_ms.
    eventually(Duration::from_secs(5), "staged items released", || {
        let leased = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(srv.db.count_in(ItemState::Leased, ""))
        });
        (leased == 400).then_some(())
    })
    .await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_topics_than_the_index_holds_are_all_served() {
    // 3 shards, each indexing at most 20 topics; 300 topics with a few items each.
    let srv = TestServer::start(
        3,
        "[engine]\nscan_interval_ms = 20\nindex_topics_max = 20\n",
    )
    .await;
    let mut c = srv.client();
    let topics: Vec<String> = (0..300).map(|i| format!("t{i}")).collect();
    for chunk in topics.chunks(50) {
        let items = chunk
            .iter()
            .flat_map(|t| (0..3).map(move |p| item(NS, t, p, t.as_bytes())))
            .collect();
        c.enqueue(items);
    }
    // Two passes, so that every topic is forgotten and reloaded at least once.
    for pass in 0..2 {
        for t in &topics {
            let got = c.dequeue(NS, t, 1);
            assert_eq!(got.len(), 1, "pass {pass}, topic {t}");
            assert_eq!(
                got[0].priority,
                Some(pass),
                "pass {pass}, topic {t}: most urgent first"
            );
            assert_eq!(got[0].payload.as_deref(), Some(t.as_bytes()));
        }
    }
    assert_eq!(
        c.topics(NS).len(),
        300,
        "each topic still has one ready item"
    );
    srv.stop().await;
}
