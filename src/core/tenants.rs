//! Namespaces sharing a host: each enqueue and each local dequeue passes the host's
//! [`FairGate`] under its namespace's share before it goes to the shards, and what the
//! tenants feel is counted per namespace (refusals by reason; enqueue-to-delivery latency,
//! observed where items are handed out).
//!
//! A shard's turn cannot be preempted (it is one transaction, and SQLite has one writer),
//! so an item of a namespace within its guarantee that lands on a shard busy with a
//! flood's batch waits for that batch's commit, whatever the order of the queues. So,
//! while a namespace with a guarantee has enqueued within [`PROTECT_MS`], one shard (the
//! healthy one with the highest id) is kept for such namespaces: their enqueues try it
//! first, the others' try it last (they still use it when every other shard refuses:
//! work-conserving), and with no guaranteed namespace active every shard serves everyone.
//! Meanwhile the SQLite threads of the other shards run at a lower OS priority
//! (`engine.best_effort_nice`): when the flood's shards and the kept one compete for the
//! cores, the kernel serves the kept one first.
//!
//! A namespace's weight is its guaranteed rate (`enqueues_per_minute`, its own or the
//! defaults'); one without a rate weighs [`WEIGHT_WITHOUT_RATE`] (so namespaces without
//! rates share equally) and has no guarantee: it is the first shed when the host's
//! waiting room is full.

use std::sync::atomic::Ordering;

use super::host::Host;
use crate::error::{Error, Result};
use crate::fair::{Permit, Share};

/// The weight of a namespace without a configured rate: as if it were guaranteed 1,000
/// items/s.
pub const WEIGHT_WITHOUT_RATE: f64 = 60_000.0;

/// How long after a guaranteed namespace's last enqueue a shard stays kept for such
/// namespaces.
pub const PROTECT_MS: i64 = 1_000;

/// The shard kept for guaranteed namespaces among the healthy ones (see the module's
/// notes): the highest id, when there are at least two; `None` otherwise. Enqueues and
/// the threads' priorities both go by it.
fn kept_among(
    healthy: impl Iterator<Item = crate::model::ShardId>,
) -> Option<crate::model::ShardId> {
    let (mut n, mut highest) = (0, None);
    for id in healthy {
        n += 1;
        highest = highest.max(Some(id));
    }
    if n >= 2 {
        highest
    } else {
        None
    }
}

impl Host {
    /// The share of namespace `ns` (see the module's notes).
    pub(super) fn share(&self, ns: &str) -> Share {
        match self.namespaces.get(ns).and_then(|p| p.enqueues_per_minute) {
            Some(rate) => Share {
                weight: rate.max(1) as f64,
                guaranteed: true,
            },
            None => Share {
                weight: WEIGHT_WITHOUT_RATE,
                guaranteed: false,
            },
        }
    }

    /// Waits for this namespace's turn at the shards for `cost` items of `bytes`; past the
    /// waiting room's bounds, `RATE_LIMITED` with a retry hint (only for a namespace
    /// without a guarantee).
    /// Where in `order` (healthy shards, the enqueue's order of preference) the shard
    /// kept for guaranteed namespaces is, and whether `ns` is one of them; `None` when
    /// no shard is kept now (see the module's notes).
    pub(super) fn reserved_position(
        &self,
        order: &[&crate::shard::ShardHandle],
        ns: &str,
    ) -> Option<(usize, bool)> {
        let guaranteed = self.share(ns).guaranteed;
        let now = self.clock.now_ms();
        if guaranteed {
            self.guaranteed_at.store(now, Ordering::Relaxed);
        }
        if now - self.guaranteed_at.load(Ordering::Relaxed) > PROTECT_MS {
            return None;
        }
        let kept = kept_among(order.iter().map(|s| s.id()))?;
        let at = order.iter().position(|s| s.id() == kept)?;
        Some((at, guaranteed))
    }

    /// Lets an enqueue of `items` from namespace `ns` through the shedder (see
    /// `crate::overload`): while the CPUs are saturated beside a guaranteed namespace, one
    /// without a guarantee waits for its turn at the shedder's rate (up to 100 ms) or is
    /// refused `RATE_LIMITED`; one with a guarantee passes at once.
    pub(super) async fn shed(&self, ns: &str, items: usize) -> Result<()> {
        if self.share(ns).guaranteed {
            // At work here, whichever shard its items go to (see `reserved_position`).
            self.guaranteed_at
                .store(self.clock.now_ms(), Ordering::Relaxed);
            return Ok(());
        }
        if !self.shedder.enabled() {
            return Ok(());
        }
        match self
            .shedder
            .admit(ns, items, crate::overload::monotonic_ms())
        {
            Ok(0) => Ok(()),
            Ok(ms) => {
                // Its turn at the rate, close enough to wait for here.
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                Ok(())
            }
            Err(retry_after_ms) => {
                self.metrics.ns_refused(ns, "overload");
                Err(Error::rate_limited(
                    format!(
                        "this host's CPUs are saturated while a namespace with a guaranteed \
                         rate is at work, and namespace {ns:?} has none: its enqueue is shed; \
                         retry after {retry_after_ms} ms"
                    ),
                    retry_after_ms,
                ))
            }
        }
    }

    /// Every `overload::TICK_MS` until `stop`: sets the shards' threads' priorities (see
    /// [`Host::set_priorities`]), samples the machine's CPUs and adjusts the shedder's
    /// rate. Without `/proc/stat` (not Linux) nothing is ever shed.
    pub async fn run_overload(
        self: std::sync::Arc<Self>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        use crate::overload::{CpuTimes, TICK_MS};
        if !self.shedder.configured() && self.best_effort_nice == 0 {
            return;
        }
        let mut last = CpuTimes::read();
        if self.shedder.configured() {
            if last.is_some() {
                self.shedder.start();
            } else {
                tracing::warn!(
                    "cannot read /proc/stat: enqueues are never shed for the CPUs' load"
                );
            }
        }
        let mut every = tokio::time::interval(std::time::Duration::from_millis(TICK_MS as u64));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stop.changed() => return,
            }
            let at = self.clock.now_ms();
            let protect = at - self.guaranteed_at.load(Ordering::Relaxed) <= PROTECT_MS;
            self.set_priorities(protect);
            if !self.shedder.enabled() {
                continue;
            }
            let Some(now) = CpuTimes::read() else {
                continue;
            };
            let Some(busy) = last.and_then(|l| now.busy_since(&l)) else {
                last = Some(now);
                continue;
            };
            last = Some(now);
            let t = self
                .shedder
                .tick(crate::overload::monotonic_ms(), busy, protect);
            self.metrics.overload_cpu_busy.set(t.busy);
            self.metrics
                .overload_rate
                .set(t.rate.map_or(0, |r| r as i64));
        }
    }

    /// While a guaranteed namespace is at work (`protect`), the SQLite threads of every
    /// healthy shard but the kept one run at `engine.best_effort_nice`, and every shard's
    /// at 0 otherwise (see the module's notes; MySQL shards have no threads of their own).
    fn set_priorities(&self, protect: bool) {
        // Nothing to do while nothing is lowered and nothing should be (every tick of a
        // host without guaranteed namespaces).
        if self.best_effort_nice == 0 || (!protect && !self.lowered.load(Ordering::Relaxed)) {
            return;
        }
        let shards = self.shards();
        let kept = if protect {
            kept_among(shards.values().filter(|s| s.is_healthy()).map(|s| s.id()))
        } else {
            None
        };
        for (id, s) in shards.iter() {
            s.set_nice(match kept {
                Some(k) if k != *id => self.best_effort_nice,
                _ => 0,
            });
        }
        self.lowered.store(kept.is_some(), Ordering::Relaxed);
    }

    /// Requests waiting for a slot at the shards now, and their bytes (see `crate::fair`).
    pub fn fair_waiting(&self) -> (usize, usize) {
        self.fair.waiting()
    }

    pub(super) async fn fair_turn(
        &self,
        ns: &str,
        what: &'static str,
        cost: usize,
        bytes: usize,
    ) -> Result<Permit> {
        let r = self.fair.enter(ns, self.share(ns), cost, bytes).await;
        let (waiting, waiting_bytes) = self.fair.waiting();
        self.metrics.fair_waiting.set(waiting as i64);
        self.metrics.fair_waiting_bytes.set(waiting_bytes as i64);
        match r {
            Ok(p) => Ok(p),
            Err(r) => {
                self.metrics.ns_refused(ns, r.bound);
                Err(Error::rate_limited(
                    format!(
                        "this host is overloaded ({} of its waiting room for shard work is \
                         full) and namespace {ns:?} has no guaranteed rate: its {what} is shed; \
                         retry after {} ms",
                        r.bound, r.retry_after_ms
                    ),
                    r.retry_after_ms,
                ))
            }
        }
    }
}
