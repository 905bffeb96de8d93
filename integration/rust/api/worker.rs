//! `foqs::client::Worker`, the consumer loop for Rust programs, on the same foqsd as the
//! rest of `api`.

use super::*;

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
