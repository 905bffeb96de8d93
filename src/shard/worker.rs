//! [`ShardWorker`]: the loop that owns one shard.
//!
//! Each turn takes every command already queued (so batches form by themselves under load
//! and a lone request waits for nobody) and applies them grouped by kind: peeks first
//! (in memory, refilling from storage when short), then every write of the turn at once, on
//! separate pooled connections so that their commits share fsyncs: the enqueues as
//! multi-row INSERTs, all claims as one UPDATE, all acks as one DELETE, all nacks and
//! releases in one transaction each. Between turns, once every scan interval, the
//! background scans run (`scans.rs`): when their time has come, before the next turn,
//! however much is queued.
//!
//! The writes of one turn never touch the same rows: claims take ready rows that the turn
//! removed from the index, acks and nacks settle leased rows, releases return staged ones,
//! inserts add new ones. And because this task is the shard's only writer, its ready index
//! is exact: no other process changes a row behind its back, which is why a claim needs
//! no `SELECT ... FOR UPDATE SKIP LOCKED`; the state guards in the SQL are safety nets.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::doubt::Doubts;
use super::forget::IdleTopics;
pub(super) use super::store_call::{storage_error, timed};
use super::worker_config::WorkerConfig;
use super::Result;
use super::{AckMemory, Breaker, Command, NsCounts, ReadyIndex, ShardHandle, ShardShared};
use crate::clock::SharedClock;
use crate::metrics::{ItemEvent, Metrics, ShardLabel};
use crate::model::{ItemState, ReadyKey, ShardId, TopicName, Totals};
use crate::store::{ShardStore, StoreError, StoreResult};
use crate::waiters::Waiters;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

/// Commands taken in one turn.
const TURN_COMMANDS_MAX: usize = 1024;
/// Timer scan steps per tick, so a huge backlog of due work cannot starve requests.
pub(super) const SCAN_STEPS_PER_TICK_MAX: usize = 16;

/// Where a scan resumes within a pass: after this (timestamp, key).
type Cursor = (i64, u64);

pub struct ShardWorker<S: ShardStore> {
    pub(super) id: ShardId,
    pub(super) store: Arc<S>,
    pub(super) clock: SharedClock,
    pub(super) cfg: WorkerConfig,
    pub(super) index: Arc<std::sync::Mutex<ReadyIndex>>,
    pub(super) breaker: Breaker,
    pub(super) shared: Arc<ShardShared>,
    pub(super) next_key: u64,
    /// The key high-water mark persisted in the shard: keys below it may have been used.
    pub(super) key_high_water: u64,
    /// Where the timer scan resumes.
    pub(super) cursor: Cursor,
    /// The checkpoint last saved.
    pub(super) saved: i64,
    pub(super) last_checkpoint_ms: i64,
    pub(super) lease_token: i64,
    pub(super) waiters: Arc<Waiters>,
    /// Enqueues put off to the next turn (see `resolve_dedup`).
    pub(super) deferred: Vec<Command>,
    /// Topic totals not saved yet (see `save_checkpoints`).
    pub(super) totals: HashMap<TopicName, Totals>,
    /// Topics holding nothing, and since when (see `forget.rs`).
    pub(super) idle: IdleTopics,
    /// Item events by namespace not published to the metrics yet (see `publish_events`).
    pub(super) events: HashMap<String, Totals>,
    /// Topics whose last write's outcome is unknown (see `doubt.rs`); a lock only so that
    /// the finish paths, which borrow the worker, can add to it. Never held across an
    /// `.await`.
    pub(super) doubts: std::sync::Mutex<Doubts>,
    /// Reads running beside the loop; at [`READS_BESIDE_MAX`] more are refused as busy.
    pub(super) reads: Arc<tokio::sync::Semaphore>,
    /// Of those, the dead-letter listings' storage reads running at once (see
    /// [`LISTING_READS_MAX`]).
    pub(super) listing_reads: Arc<tokio::sync::Semaphore>,
    pub(super) probes: Probes,
    /// Failed INSERTs with hand-offs, and when their outcome has settled (see
    /// `handoff.rs`).
    pub(super) handoff_doubts:
        std::collections::VecDeque<(std::time::Instant, crate::store::Handoff)>,
    /// Items acked lately, so that a retried ack answers as the first did.
    pub(super) acked: AckMemory,
    /// Topics with more dead items here than their bound (see `dlq.rs`); a lock only so
    /// that `died`, which borrows the worker, can add to it.
    pub(super) over_dlq: std::sync::Mutex<std::collections::HashSet<TopicName>>,
    /// A hold asked in the last turn (see [`Command::Hold`]).
    pub(super) hold: Option<(oneshot::Sender<()>, oneshot::Receiver<super::Resume>, bool)>,
}

/// Reads beside the loop one shard runs at once at most (each holds a pooled connection
/// or a place in SQLite's reader queue while it runs): a burst beyond it is answered
/// "busy" at once, retryable, instead of piling up tasks that wait on the pool.
pub const READS_BESIDE_MAX: usize = 128;
/// Dead-letter listings read storage beside the loop one at a time per shard, the rest
/// waiting their turn: however many callers list, they hold at most one of the shard's
/// database connections (4 by default), and the writes and claims keep the others.
pub const LISTING_READS_MAX: usize = 1;

/// This shard's metrics, resolved once.
pub(super) struct Probes {
    pub metrics: Arc<Metrics>,
    store_duration: Histogram,
    store_errors: Counter,
    turn_duration: Histogram,
}

/// How long after a write failed with an unknown outcome it may still commit: the store
/// timeout (MariaDB's `max_statement_time` bounds a statement to it, see `doubt.rs`),
/// plus a second for the statement to reach the server and the commit to be written.
pub(super) fn settle_window(cfg: &WorkerConfig) -> Duration {
    Duration::from_millis(cfg.store_timeout_ms + 1000)
}

impl<S: ShardStore> ShardWorker<S> {
    /// Opens the shard's store (creating its schema when missing) and starts its worker.
    pub async fn start(
        id: ShardId,
        store: S,
        clock: SharedClock,
        cfg: WorkerConfig,
        waiters: Arc<Waiters>,
        metrics: Arc<Metrics>,
    ) -> std::result::Result<(ShardHandle, JoinHandle<()>), StoreError> {
        Self::start_inheriting(id, store, clock, cfg, waiters, metrics, None).await
    }

    /// [`Self::start`] after a previous worker of this shard died (`unseen`: `Some`): it
    /// knows from the start the leases (key, token) that worker claimed and nobody was
    /// handed (when they end, they are given back uncounted, even before the first scan),
    /// and it doubts everything that worker's last writes did, as after a write whose
    /// outcome is unknown (see `doubt.rs`): a write it gave up on may still commit.
    pub async fn start_inheriting(
        id: ShardId,
        store: S,
        clock: SharedClock,
        cfg: WorkerConfig,
        waiters: Arc<Waiters>,
        metrics: Arc<Metrics>,
        unseen: Option<&[(u64, i64)]>,
    ) -> std::result::Result<(ShardHandle, JoinHandle<()>), StoreError> {
        Self::start_with(id, store, clock, cfg, waiters, metrics, unseen, None).await
    }

    /// [`Self::start_inheriting`], the worker held before its first turn (see
    /// [`Command::Hold`]: it writes nothing, and refuses every command, until the
    /// returned sender resumes it on a store moved elsewhere); for a shard opened during a
    /// switch of its replica set, on the frozen old primary.
    #[allow(clippy::too_many_arguments)]
    pub async fn start_held(
        id: ShardId,
        store: S,
        clock: SharedClock,
        cfg: WorkerConfig,
        waiters: Arc<Waiters>,
        metrics: Arc<Metrics>,
        unseen: Option<&[(u64, i64)]>,
    ) -> std::result::Result<
        (ShardHandle, JoinHandle<()>, oneshot::Sender<super::Resume>),
        StoreError,
    > {
        let (held, _) = oneshot::channel();
        let (resume_tx, resume) = oneshot::channel();
        let (handle, join) = Self::start_with(
            id,
            store,
            clock,
            cfg,
            waiters,
            metrics,
            unseen,
            Some((held, resume, false)),
        )
        .await?;
        Ok((handle, join, resume_tx))
    }

    #[allow(clippy::too_many_arguments)]
    #[allow(clippy::type_complexity)]
    async fn start_with(
        id: ShardId,
        store: S,
        clock: SharedClock,
        cfg: WorkerConfig,
        waiters: Arc<Waiters>,
        metrics: Arc<Metrics>,
        unseen: Option<&[(u64, i64)]>,
        hold: Option<(oneshot::Sender<()>, oneshot::Receiver<super::Resume>, bool)>,
    ) -> std::result::Result<(ShardHandle, JoinHandle<()>), StoreError> {
        // Bounded, as every other wait: a stalled store fails the open, which is retried.
        let open_timeout = Duration::from_millis(cfg.open_timeout_ms);
        let recovered = timed(open_timeout, store.open()).await.0?;
        // The one read of every item at open (a scan of the narrow `ready_order` index);
        // the total comes from it too, not from a second scan.
        let mut counts = NsCounts::default();
        let mut items = 0;
        for (ns, topic, state, sec, n) in timed(open_timeout, store.state_counts(None)).await.0? {
            counts.add(&ns, &topic, state, sec * 1000, n);
            items += n;
        }
        let totals: HashMap<TopicName, Totals> = timed(open_timeout, store.totals())
            .await
            .0?
            .into_iter()
            .collect();
        let idle = IdleTopics::at_open(totals.keys(), &counts, clock.now_ms());
        let shared = Arc::new(ShardShared {
            healthy: AtomicBool::new(true),
            died: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            items: AtomicI64::new(items),
            acks_remembered: AtomicUsize::new(0),
            nice: store.nice_knob(),
            staged: Default::default(),
            counts: std::sync::Mutex::new(counts),
            totals: std::sync::Mutex::new(totals),
            late_enqueues: Default::default(),
        });
        for (key, token) in unseen.unwrap_or_default() {
            shared.staged.inherit(*key, *token);
        }
        let label = ShardLabel {
            shard: id.to_string(),
        };
        let store_duration = metrics.store_duration.get_or_create(&label).clone();
        let store_errors = metrics.store_errors.get_or_create(&label).clone();
        let turn_duration = metrics.shard_turn_duration.get_or_create(&label).clone();
        let probes = Probes {
            store_duration,
            store_errors,
            turn_duration,
            metrics,
        };
        let (tx, rx) = mpsc::channel(cfg.worker_queue_max);
        let index = Arc::new(std::sync::Mutex::new(ReadyIndex::new(
            cfg.index_keys_per_topic_max,
            cfg.index_topics_max,
        )));
        let cp = recovered.checkpoint_ms;
        let now = clock.now_ms();
        let worker = ShardWorker {
            id,
            store: Arc::new(store),
            index: index.clone(),
            breaker: Breaker::new(
                cfg.breaker_failures_max,
                cfg.breaker_slow_ms,
                cfg.breaker_open_ms,
            ),
            shared: shared.clone(),
            next_key: recovered.key_high_water,
            key_high_water: recovered.key_high_water,
            cursor: (cp, u64::MAX),
            saved: cp,
            last_checkpoint_ms: now,
            // Tokens only need to differ from every earlier claim's, across restarts too.
            lease_token: now.saturating_mul(1000),
            waiters,
            totals: HashMap::new(),
            idle,
            events: HashMap::new(),
            deferred: Vec::new(),
            doubts: std::sync::Mutex::new({
                let mut d = Doubts::new(settle_window(&cfg));
                if unseen.is_some() {
                    // Once settled, the scan goes back to where this worker began (the
                    // checkpoint), over every timer a late write could have set.
                    let from = cp.saturating_add(settle_window(&cfg).as_millis() as i64);
                    d.everything(std::time::Instant::now(), from.min(now));
                }
                d
            }),
            reads: Arc::new(tokio::sync::Semaphore::new(READS_BESIDE_MAX)),
            listing_reads: Arc::new(tokio::sync::Semaphore::new(LISTING_READS_MAX)),
            handoff_doubts: Default::default(),
            acked: AckMemory::new(cfg.ack_memory_ms, cfg.ack_memory_items_max),
            over_dlq: Default::default(),
            hold,
            clock,
            cfg,
            probes,
        };
        tracing::info!(
            shard = id,
            items,
            next_key = recovered.key_high_water,
            "shard opened"
        );
        let bounds = super::CallBounds::for_store_timeout(worker.cfg.store_timeout_ms);
        let cfg_cap = worker.cfg.index_keys_per_topic_max;
        let join = tokio::spawn(worker.run(rx));
        Ok((
            ShardHandle {
                id,
                tx,
                shared,
                index,
                index_cap: cfg_cap,
                bounds,
            },
            join,
        ))
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        let interval = Duration::from_millis(self.cfg.scan_interval_ms);
        let mut background_at = tokio::time::Instant::now() + interval;
        let mut shutdown: Option<oneshot::Sender<()>> = None;
        loop {
            // A hold asked in the last turn, or at start (see `Command::Hold`).
            if let Some((held, resume, flush)) = self.hold.take() {
                if !self.held(held, resume, flush, &mut rx).await {
                    // Not resumed (the shard moved, or its primary failed over), or its
                    // store could not move: nothing more is written, and what was queued
                    // meanwhile fails as gone, applied nowhere.
                    rx.close();
                    while rx.try_recv().is_ok() {}
                    self.deferred.clear();
                    self.store.close().await;
                    tracing::info!(shard = self.id, "held shard worker stopped");
                    return;
                }
                background_at = tokio::time::Instant::now();
            }
            // Background work runs when its time has come, whatever is queued: a load
            // that keeps the queue (or the put-off enqueues) from running dry must not
            // stop lease expiry, due items, TTL and checkpoints. Its own work is bounded
            // per tick (SCAN_STEPS_PER_TICK_MAX), so requests are not starved either.
            if tokio::time::Instant::now() >= background_at {
                self.background().await;
                self.publish_events();
                background_at = tokio::time::Instant::now() + interval;
            }
            // Put-off enqueues go first, without waiting for a new command.
            let mut turn = std::mem::take(&mut self.deferred);
            if turn.is_empty() {
                tokio::select! {
                    biased;
                    first = rx.recv() => {
                        let Some(first) = first else { break };
                        turn.push(first);
                    }
                    _ = tokio::time::sleep_until(background_at) => continue,
                }
            }
            while turn.len() < TURN_COMMANDS_MAX {
                match rx.try_recv() {
                    Ok(c) => turn.push(c),
                    Err(_) => break,
                }
            }
            let started = std::time::Instant::now();
            let done = self.turn(turn).await;
            self.probes
                .turn_duration
                .observe(started.elapsed().as_secs_f64());
            self.publish_events();
            if let Some(done) = done {
                shutdown = Some(done);
                break;
            }
        }
        // Finish what was already accepted: nothing queued is dropped unanswered.
        rx.close();
        let mut rest = Vec::new();
        while let Some(c) = rx.recv().await {
            rest.push(c);
        }
        rest.append(&mut self.deferred);
        while !rest.is_empty() {
            self.turn(rest).await;
            rest = std::mem::take(&mut self.deferred);
        }
        self.release_unseen().await;
        self.publish_events();
        self.save_checkpoints(true).await;
        self.store.close().await;
        tracing::info!(shard = self.id, "shard worker stopped");
        if let Some(done) = shutdown {
            let _ = done.send(());
        }
    }

    /// Feeds an operation's outcome to the circuit breaker and publishes its state.
    pub(super) fn record<T>(&mut self, r: &StoreResult<T>, took_ms: u64) {
        self.probes.store_duration.observe(took_ms as f64 / 1000.0);
        if let Err(e) = r {
            self.probes.store_errors.inc();
            tracing::warn!(shard = self.id, error = %e, took_ms, "storage error");
        }
        // Data this build cannot read says nothing of the storage's health: one bad row
        // must not isolate the shard.
        let sick =
            matches!(r, Err(e) if !matches!(e, StoreError::Corrupt(_) | StoreError::Schema(_)));
        if let Some(why) = self.breaker.observe(!sick, took_ms, self.clock.now_ms()) {
            tracing::warn!(
                shard = self.id,
                why,
                "circuit breaker opened: no new enqueues go to this shard"
            );
        }
        self.shared
            .healthy
            .store(!self.breaker.is_open(), Ordering::Relaxed);
    }

    pub(super) fn timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.store_timeout_ms)
    }

    /// `may_reload`: false while a claim of this turn on the topic is under way (its keys
    /// are out of the index, its rows not yet leased: a reload would take them back in).
    pub(super) async fn peek(
        &mut self,
        topic: &TopicName,
        n: usize,
        may_reload: bool,
    ) -> Result<Vec<ReadyKey>> {
        let now = self.clock.now_ms();
        let counted = self.counts().ready_upto(
            &topic.ns,
            &topic.topic,
            now,
            self.cfg.index_keys_per_topic_max as i64 + 1,
        );
        let (cap, after, asked) = {
            let mut index = self.index();
            let cap = index.cap();
            let t = index.topic(topic);
            if may_reload && t.misses_items(counted) && t.reload(now) {
                tracing::debug!(shard = self.id, ns = %topic.ns, topic = %topic.topic, counted,
                    "the topic's index misses ready items: read again");
            }
            if t.len() >= n || !t.is_partial() {
                return Ok(t.head(n));
            }
            (cap, t.refill_after(), cap - t.len())
        };
        let (r, took) = timed(
            self.timeout(),
            self.store
                .ready_keys(&topic.ns, &topic.topic, after, now, asked),
        )
        .await;
        self.record(&r, took);
        let loaded = r.map_err(|e| storage_error(self.id, &e))?;
        let mut index = self.index();
        let t = index.topic(topic);
        // Only this worker writes the index and nothing else ran meanwhile, so the topic
        // still starts where the refill read from; were it not (an entry evicted and made
        // afresh), the keys read would cover a gap and must not be applied.
        if t.refill_after() == after && (after.is_some() || t.is_empty()) {
            t.apply_refill(&loaded, asked, cap);
        } else {
            tracing::warn!(shard = self.id, topic = %topic.topic, "index changed during a refill; not applied");
        }
        Ok(t.head(n))
    }

    /// Counts traffic of a topic, for `topicStats` and the metrics.
    pub(super) fn tally(&mut self, ns: &str, topic: &str, f: impl FnOnce(&mut Totals)) {
        let mut d = Totals::default();
        f(&mut d);
        // For the metrics, by namespace, published after the turn (see `publish_events`).
        match self.events.get_mut(ns) {
            Some(e) => e.add(&d),
            None => {
                self.events.insert(ns.to_string(), d);
            }
        }
        let key = TopicName {
            ns: ns.to_string(),
            topic: topic.to_string(),
        };
        let mut all = self.shared.totals.lock().expect("totals");
        match all.get_mut(&key) {
            Some(t) => t.add(&d),
            None => {
                all.insert(key.clone(), d);
            }
        }
        drop(all);
        self.totals.entry(key).or_default().add(&d);
    }

    /// Hands the item events counted since the last call to the metrics: once per turn
    /// and per tick, not per item.
    pub(super) fn publish_events(&mut self) {
        self.shared
            .acks_remembered
            .store(self.acked.len(), Ordering::Relaxed);
        let late = std::mem::take(
            &mut *self
                .shared
                .late_enqueues
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for (t, n) in late {
            self.tally(&t.ns, &t.topic, |d| d.enqueued += n);
        }
        let m = &self.probes.metrics;
        for (ns, d) in self.events.drain() {
            // Deliveries are counted by the host as it hands items out.
            for (event, n) in [
                (ItemEvent::Enqueued, d.enqueued),
                (ItemEvent::Acked, d.acked),
                (ItemEvent::Nacked, d.nacked),
                (ItemEvent::Expired, d.expired),
            ] {
                m.item_event(&ns, event, n.max(0) as u64);
            }
        }
    }

    /// The shard's items by namespace and state (see [`NsCounts`]). Never held across an
    /// `.await`.
    pub(super) fn counts(&self) -> std::sync::MutexGuard<'_, NsCounts> {
        self.shared.counts.lock().expect("not poisoned")
    }

    /// An item became dead: counted, and seen by the metrics.
    pub(super) fn died(&self, ns: &str, topic: &str, from: (ItemState, i64)) {
        self.counts().moved(ns, topic, from, (ItemState::Dead, 0));
        if self
            .cfg
            .dlq_bounds
            .of(ns)
            .is_some_and(|b| self.counts().dead_of(ns, topic) > b as i64)
        {
            self.over_dlq
                .lock()
                .expect("not poisoned")
                .insert(TopicName {
                    ns: ns.to_string(),
                    topic: topic.to_string(),
                });
        }
        self.probes
            .metrics
            .item_event(ns, ItemEvent::DeadLettered, 1);
    }

    /// An item became ready: index it (when its topic is loaded) and wake long polls.
    pub(super) fn ready(&self, ns: &str, topic: &str, k: ReadyKey) {
        self.index().offer(ns, topic, k);
        self.waiters.wake(ns, topic);
    }

    /// The ready index; shared with the shard's handle, which answers peeks from memory.
    /// Never held across an `.await`.
    pub(super) fn index(&self) -> std::sync::MutexGuard<'_, ReadyIndex> {
        self.index.lock().expect("not poisoned")
    }

    /// A write to `ns`/`topic` failed with an outcome the worker cannot know (a timeout,
    /// a lost reply: the commit may have happened): its index forgets the topic, so that
    /// the next use reloads it from storage, the truth. Every write's failure path comes
    /// here, so that none leaves a topic indexed as holding nothing while storage may
    /// hold rows the failed write made ready.
    pub(super) fn outcome_unknown(&self, ns: &str, topic: &str) {
        self.index().invalidate(ns, topic);
        let t = TopicName {
            ns: ns.to_string(),
            topic: topic.to_string(),
        };
        let now_ms = self.clock.now_ms();
        self.doubts().topic(t, std::time::Instant::now(), now_ms);
    }

    /// A write whose rows (and so topics) are unknown failed: the whole index is forgotten
    /// now and again once the outcome has settled, and every count is re-read then.
    pub(super) fn all_unknown(&self) {
        self.index().clear();
        let now_ms = self.clock.now_ms();
        self.doubts().everything(std::time::Instant::now(), now_ms);
    }

    pub(super) fn doubts(&self) -> std::sync::MutexGuard<'_, Doubts> {
        // Plain data, consistent after any panic: a poisoned lock is taken over.
        self.doubts.lock().unwrap_or_else(|p| p.into_inner())
    }
}
