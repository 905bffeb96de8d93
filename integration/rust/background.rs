//! Background work (lease expiry, due items, TTL, checkpoints) runs at its interval however
//! busy the shard is: a shard worker whose queue never runs dry still ends leases on time.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use foqs::thrift_gen::TFoqsSyncClient;
use foqs::thrift_gen::*;

const NS: &str = "background";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_ends_on_time_while_the_shard_worker_never_runs_dry() {
    // One shard, scans every 20 ms (FAST_ENGINE).
    let srv = TestServer::start(1, "").await;
    let mut c = srv.client();
    // The flood: 8 clients enqueueing with one dedup key, so that every turn of the
    // worker takes one of them and puts the others off to the next turn: its queue is
    // never empty while the flood lasts.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let addr = srv.addr;
    let flood: Vec<_> = (0..8)
        .map(|_| {
            let (stop, done) = (stop.clone(), done.clone());
            std::thread::spawn(move || {
                let mut f = foqs::client::connect(addr, Proto::Binary, Duration::from_secs(20))
                    .expect("connect");
                while !stop.load(Ordering::Relaxed) {
                    let r = f.enqueue(EnqueueRequest {
                        forwarded_for: None,
                        items: Some(vec![EnqueueItem {
                            dedup_key: Some("the-same".into()),
                            ..item(NS, "flood", 0, b"f")
                        }]),
                        forwarded_by: None,
                        forward_token: None,
                    });
                    assert!(r.is_ok(), "{r:?}");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    eventually(Duration::from_secs(10), "the flood under way", || {
        (done.load(Ordering::Relaxed) >= 16).then_some(())
    })
    .await;
    // Delivered while the flood runs: its lease starts now.
    let id = c
        .enqueue(vec![EnqueueItem {
            lease_ms: Some(300),
            ..item(NS, "leased", 0, b"x")
        }])
        .remove(0);
    assert_eq!(
        c.dequeue(NS, "leased", 1)[0].id.as_deref(),
        Some(id.as_str())
    );
    let at_delivery = done.load(Ordering::Relaxed);
    // Within its lease, the scan interval and a bound, x is ready again (before the
    // fix: not after 4 s).
    let started = Instant::now();
    let mut back = None;
    while started.elapsed() < Duration::from_secs(4) {
        if !c.dequeue(NS, "leased", 1).is_empty() {
            back = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let during = done.load(Ordering::Relaxed) - at_delivery;
    stop.store(true, Ordering::Relaxed);
    for t in flood {
        t.join().unwrap();
    }
    assert!(during > 0, "the flood ran on: {during} enqueues");
    let back = back.unwrap_or_else(|| {
        panic!("x's 300 ms lease had not ended after 4 s of a flood of {during} enqueues")
    });
    assert!(
        back < Duration::from_secs(2),
        "x came back {back:?} after its delivery (lease 300 ms)"
    );
    srv.stop().await;
}
