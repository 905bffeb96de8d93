//! [`Worker`]: the consumer loop for Rust programs, as `foqsctl work` runs it. It
//! long-polls the topics for as many items as it has free slots (`concurrency`), hands
//! each to the handler on a thread of its own, renews the item's lease while the handler
//! runs (`touch` naming the lease, every third of it), and settles the item by the
//! handler's [`Verdict`]: ack, nack with a delay, or to the dead letters.
//!
//! Stopping ([`Stopper::stop`], e.g. from a signal): no more dequeues; running handlers
//! have `grace` to finish; then (or at a second stop) each [`Job::cancelled`] turns true,
//! and a handler that gives up returns [`Verdict::Release`]: its item is given back
//! (nacked with no delay). A job
//! whose lease renewal is refused (the lease was lost) is cancelled too, and its item is
//! left alone: it is someone else's delivery now.
//!
//! Two front doors, one loop. [`Worker::run`] takes a blocking handler: it runs on its
//! own thread, and should look at `cancelled()` now and then if it runs long.
//! [`Worker::run_async`] takes an async handler (a function of the item returning a
//! future of its verdict), driven on the caller's Tokio runtime from the job's thread; a
//! cancelled job's future is dropped at its next `.await` and the item released. The
//! dequeue, renewal and settle calls stay on the blocking client, off the runtime's
//! worker threads. Where it differs from Sidekiq's or
//! Celery's workers: retries are the queue's own (a nack with a delay; the delivery count
//! travels with the item), so a worker that dies loses nothing: its items come back when
//! their leases end.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::client::SyncClient;
use crate::thrift_gen::{
    AckRequest, DequeueRequest, Item, ItemResult, NackItem, NackRequest, TFoqsSyncClient,
    TopicRequest, TouchItem, TouchRequest,
};

/// What to do with an item once its handler is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Done: ack it.
    Ack,
    /// Failed: deliver it again after this long.
    RetryAfter(Duration),
    /// Never to be retried: to the dead letters.
    DeadLetter,
    /// Give it back at once, as if never taken.
    Release,
}

/// How a job ended, as the worker settled it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// The verdict, applied (`Release` also for a job cancelled by a stop).
    Applied(Verdict),
    /// The verdict could not be applied (the settle call failed): the lease ends and the
    /// item comes back.
    Failed(Verdict, String),
    /// The lease was lost while the handler ran: nothing was settled.
    LeaseLost(String),
    /// No connection for the job: nothing was run, nothing settled.
    NotRun(String),
}

/// The item a handler works on, and whether it should give up.
pub struct Job<'a> {
    pub item: &'a Item,
    cancel: &'a AtomicBool,
}

impl Job<'_> {
    /// True once the job should end now: the worker stops at once, or the lease was lost.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }
}

#[derive(Debug, Clone)]
pub struct WorkerOptions {
    pub ns: String,
    pub topics: Vec<String>,
    /// Handlers running at once, at most (each item is dequeued only when a slot is free).
    pub concurrency: usize,
    /// The lease kept while a handler runs (renewed every third of it); `None`: the
    /// item's own.
    pub lease_ms: Option<i64>,
    /// How long one long poll waits for items.
    pub wait_ms: i64,
    /// After a stop, how long running handlers may go on.
    pub grace: Duration,
}

/// Stops a running [`Worker`]: the first call gracefully, the second at once.
#[derive(Clone, Default)]
pub struct Stopper(Arc<AtomicUsize>);

impl Stopper {
    pub fn stop(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    fn stops(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Opens a connection to foqsd (two per job, for the settle and the renewal, and one for
/// the loop).
pub type Connect<'a> = &'a (dyn Fn() -> Result<SyncClient, String> + Sync);

pub struct Worker {
    opts: WorkerOptions,
    stopper: Stopper,
}

/// How long one long poll waits at most, so that a stop is noticed within it.
const POLL_MS_MAX: i64 = 1_000;

impl Worker {
    pub fn new(opts: WorkerOptions) -> Worker {
        Worker {
            opts: WorkerOptions {
                concurrency: opts.concurrency.max(1),
                ..opts
            },
            stopper: Stopper::default(),
        }
    }

    /// What stops this worker (clone it into a signal handler's thread).
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// Runs until stopped: each item goes to `handler`; `done` hears how each job ended.
    /// Returns once every job has ended and been settled.
    pub fn run(
        &self,
        connect: Connect<'_>,
        handler: &(dyn Fn(&Job) -> Verdict + Sync),
        done: &(dyn Fn(&Item, &Settled, Duration) + Sync),
    ) -> Result<(), String> {
        let o = &self.opts;
        let running = AtomicUsize::new(0);
        let stop_now = AtomicBool::new(false);
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let mut c = connect()?;
        std::thread::scope(|s| {
            let mut next_topic = 0usize;
            while self.stopper.stops() == 0 {
                let free = o.concurrency - running.load(Ordering::SeqCst);
                if free == 0 {
                    let _ = done_rx.recv_timeout(Duration::from_millis(200));
                    continue;
                }
                let topic = &o.topics[next_topic % o.topics.len()];
                next_topic += 1;
                let req = DequeueRequest {
                    forwarded_for: None,
                    topics: Some(vec![TopicRequest {
                        ns: Some(o.ns.clone()),
                        topic: Some(topic.clone()),
                        count: Some(free as i32),
                        before_priority: None,
                        before_deliver_after_ms: None,
                    }]),
                    wait_ms: Some(o.wait_ms.clamp(0, POLL_MS_MAX)),
                    local_only: None,
                    forwarded_by: None,
                };
                let items = match c.dequeue(req) {
                    Ok(r) => r.items.unwrap_or_default(),
                    Err(e) => {
                        tracing::warn!(error = %e, "worker: dequeue failed; retrying");
                        std::thread::sleep(Duration::from_secs(1));
                        if let Ok(fresh) = connect() {
                            c = fresh;
                        }
                        continue;
                    }
                };
                for item in items {
                    if self.stopper.stops() > 0 {
                        // Dequeued as the stop came: given back untouched.
                        let r = settle(&mut c, &item, Verdict::Release);
                        done(&item, &applied(Verdict::Release, r), Duration::ZERO);
                        continue;
                    }
                    running.fetch_add(1, Ordering::SeqCst);
                    let (running, done_tx, stop_now) = (&running, done_tx.clone(), &stop_now);
                    s.spawn(move || {
                        let started = Instant::now();
                        let end = self.job(connect, handler, &item, stop_now);
                        done(&item, &end, started.elapsed());
                        running.fetch_sub(1, Ordering::SeqCst);
                        let _ = done_tx.send(());
                    });
                }
            }
            // Stopping: the running jobs get the grace period, or a second stop ends it.
            let deadline = Instant::now() + o.grace;
            while running.load(Ordering::SeqCst) > 0 {
                if self.stopper.stops() >= 2 || Instant::now() >= deadline {
                    stop_now.store(true, Ordering::SeqCst);
                }
                let _ = done_rx.recv_timeout(Duration::from_millis(100));
            }
        });
        Ok(())
    }

    /// Runs until stopped, as [`Worker::run`], with an async handler: `handler(item)`'s
    /// future decides each item's verdict. Call it within a multi-threaded Tokio runtime
    /// with its timer enabled: each job's future is driven on that runtime's handle from
    /// the job's own thread, so it may await anything that runtime serves. A job cancelled
    /// (a stop past the grace, a second stop, or its lease lost) has its future dropped at
    /// its next `.await`: its item is released, or, with the lease lost, left alone. A
    /// handler that panics releases its item. Dropping this future stops the loop at once
    /// (as a second stop).
    pub async fn run_async<H, F>(
        &self,
        connect: impl Fn() -> Result<SyncClient, String> + Send + Sync + 'static,
        handler: H,
        done: impl Fn(&Item, &Settled, Duration) + Send + Sync + 'static,
    ) -> Result<(), String>
    where
        H: Fn(Item) -> F + Send + Sync + 'static,
        F: Future<Output = Verdict> + Send,
    {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "Worker::run_async needs a Tokio runtime".to_string())?;
        let worker = Worker {
            opts: self.opts.clone(),
            stopper: self.stopper.clone(),
        };
        // Dropped before the loop ended (the caller gave up on this future, or its runtime
        // shuts down): the loop stops at once and releases its items, rather than run on,
        // unowned, on the blocking pool.
        struct StopOnDrop(Stopper, bool);
        impl Drop for StopOnDrop {
            fn drop(&mut self) {
                if !self.1 {
                    self.0.stop();
                    self.0.stop();
                }
            }
        }
        let mut guard = StopOnDrop(self.stopper.clone(), false);
        let blocking = move || {
            let handler = |job: &Job| {
                runtime.block_on(async {
                    tokio::select! {
                        v = handler(job.item.clone()) => v,
                        () = cancelled(job) => Verdict::Release,
                    }
                })
            };
            worker.run(&connect, &handler, &done)
        };
        let ended = tokio::task::spawn_blocking(blocking).await;
        guard.1 = true;
        ended.map_err(|e| format!("the worker's loop ended abnormally: {e}"))?
    }

    /// One job: the handler on this thread, the lease renewed beside it.
    fn job(
        &self,
        connect: Connect<'_>,
        handler: &(dyn Fn(&Job) -> Verdict + Sync),
        item: &Item,
        stop_now: &AtomicBool,
    ) -> Settled {
        let (mut c, mut renewer) = match (connect(), connect()) {
            (Ok(c), Ok(r)) => (c, r),
            (Err(e), _) | (_, Err(e)) => return Settled::NotRun(e),
        };
        let lease_ms = self
            .opts
            .lease_ms
            .or(item.lease_ms)
            .filter(|ms| *ms > 0)
            .unwrap_or(30_000);
        let every = Duration::from_millis((lease_ms / 3).max(1) as u64);
        let cancel = AtomicBool::new(false);
        let finished = AtomicBool::new(false);
        let mut lost = None;
        let verdict = std::thread::scope(|s| {
            let renewal = s.spawn(|| {
                let mut at = Instant::now() + every;
                while !finished.load(Ordering::SeqCst) {
                    if stop_now.load(Ordering::SeqCst) {
                        cancel.store(true, Ordering::SeqCst);
                    }
                    if Instant::now() >= at {
                        at += every;
                        if let Err(e) = renew(&mut renewer, item, lease_ms) {
                            cancel.store(true, Ordering::SeqCst);
                            return Some(e);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                None
            });
            // A handler that panics gives its item back (and the panic is logged): the
            // renewal must end, and the job with it, or the item would stay leased and
            // the worker wait for it for ever.
            let job = Job {
                item,
                cancel: &cancel,
            };
            let v = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(&job)))
                .unwrap_or_else(|_| {
                    tracing::error!(id = ?item.id, "worker: the handler panicked; releasing its item");
                    Verdict::Release
                });
            finished.store(true, Ordering::SeqCst);
            lost = renewal.join().expect("the renewal thread does not panic");
            v
        });
        if let Some(e) = lost {
            return Settled::LeaseLost(e);
        }
        // A handler cancelled by a stop says so itself (`Release`); one that finished its
        // work as the stop came is settled as it says.
        applied(verdict, settle(&mut c, item, verdict))
    }
}

/// Resolves once the job is cancelled (looked at every 10 ms: the flag is the blocking
/// loop's own).
async fn cancelled(job: &Job<'_>) {
    while !job.cancelled() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn applied(v: Verdict, r: Result<(), String>) -> Settled {
    match r {
        Ok(()) => Settled::Applied(v),
        Err(e) => Settled::Failed(v, e),
    }
}

fn describe(e: thrift::Error) -> String {
    match e {
        thrift::Error::User(u) => match u.downcast_ref::<crate::thrift_gen::FoqsError>() {
            Some(f) => f.message.clone().unwrap_or_default(),
            None => u.to_string(),
        },
        other => other.to_string(),
    }
}

fn first_error(results: Option<Vec<ItemResult>>) -> Result<(), String> {
    match results
        .unwrap_or_default()
        .into_iter()
        .find_map(|r| r.error)
    {
        None => Ok(()),
        Some(e) => Err(e.message.unwrap_or_default()),
    }
}

/// Extends the item's lease to now + `lease_ms`, naming this delivery's lease.
fn renew(c: &mut SyncClient, item: &Item, lease_ms: i64) -> Result<(), String> {
    let r = c
        .touch(TouchRequest {
            items: Some(vec![TouchItem {
                id: item.id.clone(),
                extend_ms: Some(lease_ms),
                lease_id: item.lease_id,
            }]),
            forwarded_by: None,
            forwarded_for: None,
        })
        .map_err(describe)?;
    first_error(r.results)
}

/// Applies a verdict to the item's delivery (naming its lease).
pub fn settle(c: &mut SyncClient, item: &Item, v: Verdict) -> Result<(), String> {
    let nack = |c: &mut SyncClient, delay_ms: i64, to_dlq: bool| {
        c.nack(NackRequest {
            items: Some(vec![NackItem {
                id: item.id.clone(),
                delay_ms: Some(delay_ms),
                metadata: None,
                to_dlq: Some(to_dlq),
                lease_id: item.lease_id,
            }]),
            forwarded_by: None,
            forwarded_for: None,
            nack_token: None,
        })
        .map_err(describe)
        .and_then(|r| first_error(r.results))
    };
    match v {
        Verdict::Ack => c
            .ack(AckRequest {
                ids: Some(vec![item.id.clone().unwrap_or_default()]),
                forwarded_by: None,
                forwarded_for: None,
                lease_ids: item.lease_id.map(|l| vec![l]),
            })
            .map_err(describe)
            .and_then(|r| first_error(r.results)),
        Verdict::RetryAfter(d) => nack(c, d.as_millis() as i64, false),
        Verdict::DeadLetter => nack(c, 0, true),
        Verdict::Release => nack(c, 0, false),
    }
}
