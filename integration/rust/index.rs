//! The ready index has one writer, its shard's worker. An earlier build let peeks answered
//! beside the worker (`ShardHandle::peek`) add topics to the index, and so evict others,
//! while the worker was refilling a topic from storage: the refill then landed in a fresh
//! entry that claimed to cover every key, and the topic's most urgent items were hidden.
//! Here the refill is held at a gate (`common::faulty`'s hold, around the real MySQL
//! store, before `ready_keys`), so the interleaving is certain.

use crate::common;

use std::time::Duration;

use common::shard as faulty;
use common::*;
use foqs::model::{NewItem, TopicName};
use foqs::store::faulty::Fault;

fn new_item(topic: &str, priority: i32) -> NewItem {
    faulty::new_item("ix", topic, priority)
}

fn topic(t: &str) -> TopicName {
    faulty::topic("ix", t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refill_racing_other_topics_never_hides_the_most_urgent_items() {
    let db = TestDb::new(1);
    let (shard, worker, gate) = faulty::faulty_worker(&db, faulty::worker_config()).await;
    let enqueue = |items: Vec<NewItem>| {
        let s = shard.clone();
        async move {
            s.submit_enqueue(items, None)
                .map_err(|(_, e)| e)
                .unwrap()
                .wait()
                .await
                .unwrap()
        }
    };
    for _ in 0..3 {
        enqueue((0..500).map(|_| new_item("a", 5)).collect()).await;
    }
    // The index loads 1000 of the 1500 keys of "a" (partial), 990 are claimed: 10 left.
    let keys = shard.peek(topic("a"), 990, now_ms()).await.unwrap();
    assert_eq!(shard.claim(topic("a"), keys).await.unwrap().len(), 990);
    let urgent = enqueue(vec![new_item("a", 0)]).await[0].0;

    // A peek of 50 needs a refill of "a": held at the gate.
    gate.arm("ready_keys", Fault::Hold);
    let waiting = gate.waiting().notified();
    let refill = tokio::spawn({
        let s = shard.clone();
        async move { s.peek(topic("a"), 50, now_ms()).await.unwrap() }
    });
    waiting.await;
    // Meanwhile, peeks of 10 other topics ("a" plus them: one more than index_topics_max).
    let others: Vec<_> = (0..10)
        .map(|i| {
            let s = shard.clone();
            tokio::spawn(async move { s.peek(topic(&format!("b{i}")), 1, now_ms()).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate.release();
    let head = refill.await.unwrap();
    for o in others {
        assert!(o.await.unwrap().unwrap().is_empty());
    }
    assert_eq!(
        head.first().map(|k| k.key),
        Some(urgent),
        "the most urgent item is hidden: the refill's head is {:?}",
        &head[..head.len().min(3)]
    );
    assert_eq!(head.len(), 50);
    shard.shutdown().await;
    worker.await.unwrap();
}
