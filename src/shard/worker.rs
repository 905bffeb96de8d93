//! [`ShardWorker`]: the loop that owns one shard.
//!
//! Each turn takes every command already queued (so batches form by themselves under load
//! and a lone request waits for nobody), then applies them grouped by kind: all enqueues
//! as multi-row INSERTs, all acks as one DELETE, all nacks in one transaction, then peeks
//! and claims in arrival order. Between turns, a ticker runs the background scans.
//!
//! Because this task is the shard's only writer and runs one step at a time, its ready
//! index is exact: no other process can change a row behind its back, which is why a claim
//! needs no `SELECT ... FOR UPDATE SKIP LOCKED`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::{Breaker, Command, NackOp, ReadyIndex, Reply, Settled, ShardHandle, ShardShared};
use crate::clock::SharedClock;
use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::model::{Item, ItemState, NewItem, Policy, ReadyKey, ShardId, TopicName};
use crate::store::{Change, Checkpoints, ItemMeta, Scan, ShardStore, StoreError};

/// Keys are reserved in blocks so that the high-water mark is written once per block.
const KEY_BLOCK: u64 = 100_000;
/// Commands taken in one turn.
const TURN_COMMANDS_MAX: usize = 1024;
/// Scan steps per scan kind per tick, so a huge backlog of due work cannot starve requests.
const SCAN_STEPS_PER_TICK_MAX: usize = 8;

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub enqueue_batch_rows_max: usize,
    pub worker_queue_max: usize,
    pub index_keys_per_topic_max: usize,
    pub scan_interval_ms: u64,
    pub scan_rows_max: usize,
    pub checkpoint_interval_ms: u64,
    pub breaker_failures_max: u32,
    pub breaker_open_ms: u64,
}

impl From<&EngineConfig> for WorkerConfig {
    fn from(e: &EngineConfig) -> Self {
        WorkerConfig {
            enqueue_batch_rows_max: e.enqueue_batch_rows_max,
            worker_queue_max: e.worker_queue_max,
            index_keys_per_topic_max: e.index_keys_per_topic_max,
            scan_interval_ms: e.scan_interval_ms,
            scan_rows_max: e.scan_rows_max,
            checkpoint_interval_ms: e.checkpoint_interval_ms,
            breaker_failures_max: e.breaker_failures_max,
            breaker_open_ms: e.breaker_open_ms,
        }
    }
}

/// Where a scan resumes within a pass: after this (timestamp, key).
type Cursor = (i64, u64);

pub struct ShardWorker<S: ShardStore> {
    id: ShardId,
    store: Arc<S>,
    clock: SharedClock,
    cfg: WorkerConfig,
    index: ReadyIndex,
    breaker: Breaker,
    shared: Arc<ShardShared>,
    next_key: u64,
    key_high_water: u64,
    cursors: HashMap<ScanKind, Cursor>,
    saved: Checkpoints,
    last_checkpoint_ms: i64,
    lease_token: i64,
}

/// `Scan` as a map key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ScanKind {
    Due,
    Lease,
    Ttl,
}

impl From<Scan> for ScanKind {
    fn from(s: Scan) -> Self {
        match s {
            Scan::Due => ScanKind::Due,
            Scan::Lease => ScanKind::Lease,
            Scan::Ttl => ScanKind::Ttl,
        }
    }
}

fn storage_error(id: ShardId, e: &StoreError) -> Error {
    Error::unavailable(format!("shard {id}: storage error: {e}"))
}

impl<S: ShardStore> ShardWorker<S> {
    /// Opens the shard's store (creating its schema when missing) and starts its worker.
    pub async fn start(
        id: ShardId,
        store: S,
        clock: SharedClock,
        cfg: WorkerConfig,
    ) -> std::result::Result<(ShardHandle, JoinHandle<()>), StoreError> {
        let recovered = store.open().await?;
        let shared = Arc::new(ShardShared {
            healthy: AtomicBool::new(true),
            items: AtomicI64::new(recovered.items),
        });
        let (tx, rx) = mpsc::channel(cfg.worker_queue_max);
        let cp = recovered.checkpoints;
        let cursors = Scan::ALL
            .iter()
            .map(|s| (ScanKind::from(*s), (cp.get(*s), u64::MAX)))
            .collect();
        let now = clock.now_ms();
        let worker = ShardWorker {
            id,
            store: Arc::new(store),
            index: ReadyIndex::new(cfg.index_keys_per_topic_max),
            breaker: Breaker::new(cfg.breaker_failures_max, cfg.breaker_open_ms),
            shared: shared.clone(),
            next_key: recovered.key_high_water,
            key_high_water: recovered.key_high_water,
            cursors,
            saved: cp,
            last_checkpoint_ms: now,
            // Tokens only need to differ from every earlier claim's, across restarts too.
            lease_token: now.saturating_mul(1000),
            clock,
            cfg,
        };
        tracing::info!(
            shard = id,
            items = recovered.items,
            next_key = recovered.key_high_water,
            "shard opened"
        );
        let join = tokio::spawn(worker.run(rx));
        Ok((ShardHandle { id, tx, shared }, join))
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        let mut ticker = tokio::time::interval(Duration::from_millis(self.cfg.scan_interval_ms));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut shutdown: Option<oneshot::Sender<()>> = None;
        loop {
            tokio::select! {
                biased;
                first = rx.recv() => {
                    let Some(first) = first else { break };
                    let mut turn = vec![first];
                    while turn.len() < TURN_COMMANDS_MAX {
                        match rx.try_recv() {
                            Ok(c) => turn.push(c),
                            Err(_) => break,
                        }
                    }
                    if let Some(done) = self.turn(turn).await {
                        shutdown = Some(done);
                        break;
                    }
                }
                _ = ticker.tick() => self.background().await,
            }
        }
        // Finish what was already accepted: nothing queued is dropped unanswered.
        rx.close();
        let mut rest = Vec::new();
        while let Some(c) = rx.recv().await {
            rest.push(c);
        }
        if !rest.is_empty() {
            self.turn(rest).await;
        }
        self.save_checkpoints(true).await;
        tracing::info!(shard = self.id, "shard worker stopped");
        if let Some(done) = shutdown {
            let _ = done.send(());
        }
    }

    /// Applies one turn's commands; returns the shutdown acknowledgement if one was asked.
    async fn turn(&mut self, commands: Vec<Command>) -> Option<oneshot::Sender<()>> {
        let mut enqueues = Vec::new();
        let mut acks = Vec::new();
        let mut nacks = Vec::new();
        let mut rest = Vec::new();
        let mut shutdown = None;
        for c in commands {
            match c {
                Command::Enqueue { items, reply } => enqueues.push((items, reply)),
                Command::Ack { keys, reply } => acks.push((keys, reply)),
                Command::Nack { nacks: n, reply } => nacks.push((n, reply)),
                Command::Shutdown { done } => shutdown = Some(done),
                other => rest.push(other),
            }
        }
        if !enqueues.is_empty() {
            self.enqueue(enqueues).await;
        }
        if !acks.is_empty() {
            self.ack(acks).await;
        }
        if !nacks.is_empty() {
            self.nack(nacks).await;
        }
        // Claims first take their keys out of the index, so that this turn's peeks do not
        // offer them again; then all claims of the turn are one UPDATE and one SELECT.
        let mut claims = Vec::new();
        let mut others = Vec::new();
        for c in rest {
            match c {
                Command::Claim { topic, keys, reply } => {
                    let t = self.index.topic(&topic);
                    // Only keys still indexed are free: another dequeue may have claimed
                    // the rest since they were peeked.
                    let free: Vec<u64> =
                        keys.iter().filter(|k| t.remove(k)).map(|k| k.key).collect();
                    claims.push((topic, free, reply));
                }
                other => others.push(other),
            }
        }
        for c in others {
            match c {
                Command::Release { items, reply } => {
                    let r = self.release(items).await;
                    let _ = reply.send(r);
                }
                Command::Peek { topic, n, reply } => {
                    let r = self.peek(&topic, n).await;
                    let _ = reply.send(r);
                }
                Command::TopicCounts {
                    ns,
                    after,
                    limit,
                    reply,
                } => {
                    // A GROUP BY over a namespace can be slow: run it beside the loop.
                    let store = self.store.clone();
                    let (id, now) = (self.id, self.clock.now_ms());
                    tokio::spawn(async move {
                        let r = store.topic_counts(&ns, after.as_deref(), now, limit).await;
                        let _ = reply.send(r.map_err(|e| storage_error(id, &e)));
                    });
                }
                Command::Enqueue { .. }
                | Command::Ack { .. }
                | Command::Nack { .. }
                | Command::Claim { .. }
                | Command::Shutdown { .. } => {
                    unreachable!("sorted out above")
                }
            }
        }
        if !claims.is_empty() {
            self.claim(claims).await;
        }
        shutdown
    }

    fn record<T>(&mut self, r: &std::result::Result<T, StoreError>) {
        match r {
            Ok(_) => {
                if self.breaker.is_open() {
                    tracing::info!(
                        shard = self.id,
                        "shard healthy again: circuit breaker closed"
                    );
                }
                self.breaker.success();
            }
            Err(e) => {
                let was_open = self.breaker.is_open();
                self.breaker.failure(self.clock.now_ms());
                if self.breaker.is_open() && !was_open {
                    tracing::warn!(shard = self.id, error = %e, "circuit breaker opened: no new enqueues go to this shard");
                } else {
                    tracing::warn!(shard = self.id, error = %e, "storage error");
                }
            }
        }
        self.shared
            .healthy
            .store(!self.breaker.is_open(), Ordering::Relaxed);
    }

    async fn enqueue(&mut self, batches: Vec<(Vec<NewItem>, Reply<Vec<u64>>)>) {
        // Cut the requests into INSERTs of at most enqueue_batch_rows_max rows, never
        // splitting one request across two transactions: its reply needs one outcome.
        let mut group: Vec<(Vec<NewItem>, Reply<Vec<u64>>)> = Vec::new();
        let mut rows = 0;
        for (items, reply) in batches {
            if rows > 0 && rows + items.len() > self.cfg.enqueue_batch_rows_max {
                self.insert(std::mem::take(&mut group)).await;
                rows = 0;
            }
            rows += items.len();
            group.push((items, reply));
        }
        if !group.is_empty() {
            self.insert(group).await;
        }
    }

    async fn insert(&mut self, group: Vec<(Vec<NewItem>, Reply<Vec<u64>>)>) {
        let total: u64 = group.iter().map(|(items, _)| items.len() as u64).sum();
        let first = self.next_key;
        self.next_key += total;
        let new_high_water =
            (self.next_key > self.key_high_water).then(|| self.next_key + KEY_BLOCK);
        let mut rows = Vec::with_capacity(total as usize);
        let mut key = first;
        for (items, _) in &group {
            for it in items {
                rows.push((key, it.clone()));
                key += 1;
            }
        }
        let r = self.store.insert(&rows, new_high_water).await;
        self.record(&r);
        let now = self.clock.now_ms();
        match r {
            Ok(()) => {
                if let Some(h) = new_high_water {
                    self.key_high_water = h;
                }
                for (key, it) in &rows {
                    if it.deliver_after_ms <= now {
                        let k = ReadyKey {
                            priority: it.priority,
                            deliver_after_ms: it.deliver_after_ms,
                            key: *key,
                        };
                        self.index.offer(&it.ns, &it.topic, k);
                    }
                }
                self.shared.items.fetch_add(total as i64, Ordering::Relaxed);
                let mut key = first;
                for (items, reply) in group {
                    let keys: Vec<u64> = (key..key + items.len() as u64).collect();
                    key += items.len() as u64;
                    let _ = reply.send(Ok(keys));
                }
            }
            Err(e) => {
                // The commit may or may not have happened: forget what the index knew of
                // these topics so that it reloads from MySQL, the truth.
                for (_, it) in &rows {
                    self.index.invalidate(&it.ns, &it.topic);
                }
                let err = storage_error(self.id, &e);
                for (_, reply) in group {
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }

    async fn peek(&mut self, topic: &TopicName, n: usize) -> Result<Vec<ReadyKey>> {
        let cap = self.index.cap();
        let t = self.index.topic(topic);
        if t.len() < n && t.is_partial() {
            let after = t.refill_after();
            let asked = cap - t.len();
            let now = self.clock.now_ms();
            let r = self
                .store
                .ready_keys(&topic.ns, &topic.topic, after, now, asked)
                .await;
            self.record(&r);
            let loaded = r.map_err(|e| storage_error(self.id, &e))?;
            self.index.topic(topic).apply_refill(&loaded, asked, cap);
        }
        Ok(self.index.topic(topic).head(n))
    }

    /// Leases the free keys of every claim in one statement and answers each claim with
    /// its own items.
    async fn claim(&mut self, claims: Vec<(TopicName, Vec<u64>, Reply<Vec<Item>>)>) {
        let all: Vec<u64> = claims
            .iter()
            .flat_map(|(_, free, _)| free.iter().copied())
            .collect();
        if all.is_empty() {
            for (_, _, reply) in claims {
                let _ = reply.send(Ok(vec![]));
            }
            return;
        }
        self.lease_token += 1;
        let r = self
            .store
            .claim(&all, self.clock.now_ms(), self.lease_token)
            .await;
        self.record(&r);
        match r {
            Ok(items) => {
                let mut by_key: HashMap<u64, Item> =
                    items.into_iter().map(|i| (i.id.key, i)).collect();
                for (_, free, reply) in claims {
                    let mine = free.iter().filter_map(|k| by_key.remove(k)).collect();
                    let _ = reply.send(Ok(mine));
                }
            }
            Err(e) => {
                let err = storage_error(self.id, &e);
                for (topic, _, reply) in claims {
                    self.index.invalidate(&topic.ns, &topic.topic);
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }

    async fn release(&mut self, items: Vec<Item>) -> Result<()> {
        let changes: Vec<Change> = items
            .iter()
            .map(|i| Change::Release {
                key: i.id.key,
                token: i.lease_token,
            })
            .collect();
        let r = self.store.apply(&changes).await;
        self.record(&r);
        if let Err(e) = r {
            for i in &items {
                self.index.invalidate(&i.ns, &i.topic);
            }
            return Err(storage_error(self.id, &e));
        }
        for i in items {
            let k = ReadyKey {
                priority: i.priority,
                deliver_after_ms: i.deliver_after_ms,
                key: i.id.key,
            };
            self.index.offer(&i.ns, &i.topic, k);
        }
        Ok(())
    }

    async fn ack(&mut self, requests: Vec<(Vec<u64>, Reply<Vec<Settled>>)>) {
        let keys: Vec<u64> = requests
            .iter()
            .flat_map(|(k, _)| k.iter().copied())
            .collect();
        let r = self.store.delete(&keys).await;
        self.record(&r);
        let metas = match r {
            Ok(m) => m,
            Err(e) => return fail_all(requests, storage_error(self.id, &e)),
        };
        let found: HashMap<u64, ItemMeta> = metas.into_iter().map(|m| (m.key, m)).collect();
        for m in found.values() {
            if m.state == ItemState::Ready {
                self.index.remove(&m.ns, &m.topic, &m.ready_key());
            }
        }
        self.shared
            .items
            .fetch_sub(found.len() as i64, Ordering::Relaxed);
        for (keys, reply) in requests {
            let out = keys
                .iter()
                .map(|k| {
                    if found.contains_key(k) {
                        Settled::Done
                    } else {
                        Settled::NotFound
                    }
                })
                .collect();
            let _ = reply.send(Ok(out));
        }
    }

    async fn nack(&mut self, requests: Vec<(Vec<NackOp>, Reply<Vec<Settled>>)>) {
        let keys: Vec<u64> = requests
            .iter()
            .flat_map(|(n, _)| n.iter().map(|(k, _, _)| *k))
            .collect();
        let r = self.store.lookup(&keys).await;
        self.record(&r);
        let metas = match r {
            Ok(m) => m,
            Err(e) => return fail_all(requests, storage_error(self.id, &e)),
        };
        let mut leased: HashMap<u64, ItemMeta> = metas
            .into_iter()
            .filter(|m| m.state == ItemState::Leased)
            .map(|m| (m.key, m))
            .collect();
        let now = self.clock.now_ms();
        let mut changes = Vec::new();
        let mut readied = Vec::new();
        let mut outcomes = Vec::with_capacity(requests.len());
        for (nacks, _) in &requests {
            let mut out = Vec::with_capacity(nacks.len());
            for (key, delay_ms, metadata) in nacks {
                // `remove`: a second nack of the same key in this turn finds it settled.
                let Some(m) = leased.remove(key) else {
                    out.push(Settled::NotFound);
                    continue;
                };
                if m.delivery_count >= m.max_attempts {
                    changes.push(Change::Dead { key: *key });
                } else {
                    let deliver_after_ms = now.saturating_add(*delay_ms);
                    changes.push(Change::Ready {
                        key: *key,
                        deliver_after_ms: Some(deliver_after_ms),
                        metadata: metadata.clone(),
                    });
                    if deliver_after_ms <= now {
                        readied.push((
                            m.ns.clone(),
                            m.topic.clone(),
                            ReadyKey {
                                deliver_after_ms,
                                ..m.ready_key()
                            },
                        ));
                    }
                }
                out.push(Settled::Done);
            }
            outcomes.push(out);
        }
        let r = self.store.apply(&changes).await;
        self.record(&r);
        if let Err(e) = r {
            for (ns, topic, _) in &readied {
                self.index.invalidate(ns, topic);
            }
            return fail_all(requests, storage_error(self.id, &e));
        }
        for (ns, topic, k) in readied {
            self.index.offer(&ns, &topic, k);
        }
        for ((_, reply), out) in requests.into_iter().zip(outcomes) {
            let _ = reply.send(Ok(out));
        }
    }

    /// One tick: probe an open breaker, or run the scans and maybe save checkpoints.
    async fn background(&mut self) {
        let now = self.clock.now_ms();
        if self.breaker.is_open() {
            if self.breaker.probe_due(now) {
                let r = self.store.ping().await;
                self.record(&r);
            }
            return;
        }
        for scan in Scan::ALL {
            for _ in 0..SCAN_STEPS_PER_TICK_MAX {
                match self.scan_step(scan, now).await {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(e) => {
                        tracing::warn!(shard = self.id, ?scan, error = %e, "background scan failed");
                        return;
                    }
                }
            }
        }
        self.save_checkpoints(false).await;
    }

    /// Processes the next rows of one scan; true when there may be more due right now.
    async fn scan_step(&mut self, scan: Scan, now: i64) -> std::result::Result<bool, StoreError> {
        let kind = ScanKind::from(scan);
        let after = self.cursors[&kind];
        let limit = self.cfg.scan_rows_max;
        let r = self.store.scan(scan, after, now, limit).await;
        self.record(&r);
        let rows = r?;
        let full = rows.len() == limit;
        let mut changes = Vec::new();
        let mut readied = Vec::new();
        let mut removed = Vec::new();
        for m in &rows {
            match scan {
                Scan::Due => readied.push((m.ns.clone(), m.topic.clone(), m.ready_key())),
                Scan::Lease => {
                    if m.policy == Policy::AtMostOnce {
                        changes.push(Change::Delete { key: m.key });
                    } else if m.delivery_count >= m.max_attempts {
                        changes.push(Change::Dead { key: m.key });
                    } else {
                        changes.push(Change::Ready {
                            key: m.key,
                            deliver_after_ms: None,
                            metadata: None,
                        });
                        readied.push((m.ns.clone(), m.topic.clone(), m.ready_key()));
                    }
                }
                Scan::Ttl => {
                    changes.push(Change::Delete { key: m.key });
                    if m.state == ItemState::Ready {
                        removed.push((m.ns.clone(), m.topic.clone(), m.ready_key()));
                    }
                }
            }
        }
        if !changes.is_empty() {
            let r = self.store.apply(&changes).await;
            self.record(&r);
            if let Err(e) = r {
                for (ns, topic, _) in readied.iter().chain(&removed) {
                    self.index.invalidate(ns, topic);
                }
                return Err(e);
            }
        }
        let deleted = changes
            .iter()
            .filter(|c| matches!(c, Change::Delete { .. }))
            .count();
        self.shared
            .items
            .fetch_sub(deleted as i64, Ordering::Relaxed);
        for (ns, topic, k) in readied {
            self.index.offer(&ns, &topic, k);
        }
        for (ns, topic, k) in removed {
            self.index.remove(&ns, &topic, &k);
        }
        let cursor = match rows.last() {
            Some(last) if full => (scan.time_of(last), last.key),
            // Everything up to now - 1 is done. Not `now`: a row may still get this very
            // millisecond (a claim with lease_ms 0, a nack without delay).
            _ => (now - 1, u64::MAX),
        };
        self.cursors.insert(kind, cursor);
        Ok(full)
    }

    /// Persists the scans' checkpoints: each is the last millisecond fully processed.
    async fn save_checkpoints(&mut self, force: bool) {
        let now = self.clock.now_ms();
        if !force && now - self.last_checkpoint_ms < self.cfg.checkpoint_interval_ms as i64 {
            return;
        }
        let mut cp = Checkpoints::default();
        for scan in Scan::ALL {
            let (ms, key) = self.cursors[&ScanKind::from(scan)];
            cp.set(scan, if key == u64::MAX { ms } else { ms - 1 });
        }
        if cp == self.saved {
            self.last_checkpoint_ms = now;
            return;
        }
        let r = self.store.save_checkpoints(cp).await;
        self.record(&r);
        if r.is_ok() {
            self.saved = cp;
            self.last_checkpoint_ms = now;
        }
    }
}

fn fail_all<T>(requests: Vec<(T, Reply<Vec<Settled>>)>, err: Error) {
    for (_, reply) in requests {
        let _ = reply.send(Err(err.clone()));
    }
}
