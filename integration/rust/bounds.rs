//! Every wait has a bound and every queue a limit: running into one is a typed, retryable
//! "busy" error at once, never a wait without end. Faults are injected around the real
//! store ([`common::shard`]).

mod common;

use std::time::{Duration, Instant};

use common::shard as faulty;
use common::*;
use foqs::error::ErrorCode;
use foqs::shard::READS_BESIDE_MAX;
use foqs::store::faulty::Fault;

/// A slow read (a GROUP BY on a busy server) held `READS_BESIDE_MAX` of them in flight:
/// more are refused at once as busy instead of piling up tasks waiting on the pool; the
/// worker's writes go on meanwhile, and the reads it took are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_beyond_the_limit_are_busy_at_once_and_writes_go_on() {
    let db = TestDb::new(1);
    let (shard, _worker, faults) = faulty::faulty_worker(&db, faulty::worker_config()).await;
    faults.always("topic_counts", Fault::Delay(Duration::from_millis(1500)));
    let burst = READS_BESIDE_MAX + 72;
    let t = Instant::now();
    let reads: Vec<_> = (0..burst)
        .map(|_| {
            let shard = shard.clone();
            tokio::spawn(async move {
                let r = shard.topic_counts("b".into(), None, 10).await;
                (r, Instant::now())
            })
        })
        .collect();
    // A write is not held up by the reads.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let w = Instant::now();
    shard
        .submit_enqueue(vec![faulty::new_item("b", "t", 0)])
        .map_err(|(_, e)| e)
        .unwrap()
        .wait()
        .await
        .unwrap();
    let write = w.elapsed();
    let (mut answered, mut busy) = (0, 0);
    for r in reads {
        let (r, at) = r.await.unwrap();
        match r {
            Ok(_) => {
                answered += 1;
                assert!(at - t >= Duration::from_millis(1400), "answered early");
            }
            Err(e) => {
                let e = foqs::error::Error::from(e);
                assert_eq!(
                    (e.code, e.retryable),
                    (ErrorCode::Unavailable, true),
                    "{e:?}"
                );
                assert!(e.message.contains("busy"), "{}", e.message);
                assert!(
                    at - t < Duration::from_millis(1000),
                    "busy after {:?}",
                    at - t
                );
                busy += 1;
            }
        }
    }
    assert_eq!(
        (answered, busy),
        (READS_BESIDE_MAX, burst - READS_BESIDE_MAX)
    );
    assert!(
        write < Duration::from_millis(1000),
        "a write took {write:?}"
    );
}
