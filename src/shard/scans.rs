//! The background scan of a shard: deferred items coming due, leases expiring, TTLs
//! passing, all read from one timer index from a cursor that starts at a checkpoint
//! persisted in the shard, so a pass reads only new work, whatever the backlog.

use std::sync::atomic::Ordering;

use super::doubt::Settled;
use super::staged::IN_REPLY_MAX_MS;
use super::worker::{settle_window, timed, ShardWorker, SCAN_STEPS_PER_TICK_MAX};
use super::worker_config::WorkerConfig;
use crate::model::{ItemState, Policy, TopicName, Totals};
use crate::store::{next_event, Change, Settle, ShardStore, StoreError};

/// See `ShardWorker::load_unindexed`.
const UNINDEXED_LOADS_PER_TICK: usize = 8;

/// An item's move between states, for the counts: (ns, topic, from, to; `None`: deleted),
/// each state with its `deliver_after_ms` (see `NsCounts`).
type Move = (String, String, (ItemState, i64), Option<(ItemState, i64)>);

impl<S: ShardStore> ShardWorker<S> {
    /// One tick: probe an open breaker, or run the scans and maybe save checkpoints.
    pub(super) async fn background(&mut self) {
        let now = self.clock.now_ms();
        if self.breaker.is_open() {
            if self.breaker.probe_due(now) {
                let (r, took) = timed(self.timeout(), self.store.ping()).await;
                if self.breaker.probe(r.is_ok(), took, self.clock.now_ms()) {
                    tracing::info!(
                        shard = self.id,
                        took_ms = took,
                        "shard healthy again: circuit breaker closed"
                    );
                    self.shared.healthy.store(true, Ordering::Relaxed);
                }
            }
            return;
        }
        self.settle_doubts().await;
        self.settle_handoffs().await;
        for _ in 0..SCAN_STEPS_PER_TICK_MAX {
            match self.scan_step(now).await {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!(shard = self.id, error = %e, "background scan failed");
                    return;
                }
            }
        }
        self.load_unindexed(now).await;
        self.trim_dead_letters().await;
        self.save_checkpoints(false).await;
    }

    /// Reads the index of a few topics that have ready items but no index here (new
    /// since the shard opened, and not dequeued yet), while the index has room for them:
    /// so the host's summary knows their heads, and a peer routing a dequeue can merge
    /// them (see `core::routed_dequeue`). At most `UNINDEXED_LOADS_PER_TICK` per tick, one
    /// index-ordered read each.
    async fn load_unindexed(&mut self, now: i64) {
        let topics: Vec<TopicName> = {
            let counts = self.counts().ready_topics(now);
            let index = self.index();
            if !index.has_room() {
                return;
            }
            counts
                .into_iter()
                .map(|(ns, topic, _)| TopicName { ns, topic })
                .filter(|t| !index.is_loaded(t))
                .take(UNINDEXED_LOADS_PER_TICK)
                .collect()
        };
        for t in topics {
            if let Err(e) = self.peek(&t, 1, true).await {
                tracing::debug!(shard = self.id, error = %e, "loading a topic's index failed");
                return;
            }
        }
    }

    /// Topics whose unknown write outcome has settled (see `doubt.rs`): their index is
    /// forgotten again, so the next refill reads what the late commit did, and their
    /// counts are read afresh from storage. Runs inside the worker, between turns, so no
    /// write of this worker moves the counts while they are read.
    async fn settle_doubts(&mut self) {
        let (settled, earliest) = {
            let mut d = self.doubts();
            let earliest = d.earliest_ms();
            (d.settled(std::time::Instant::now()), earliest)
        };
        let Some(settled) = settled else { return };
        // SQLite runs the shard's jobs one after another on its thread: once this probe is
        // answered, every job begun before it is done, a job whose caller gave up included.
        // (On MySQL it is a probe only; there `max_statement_time` is the bound.)
        let (r, took) = timed(self.timeout(), self.store.ping()).await;
        self.record(&r, took);
        if r.is_err() {
            self.doubts()
                .retry(settled, std::time::Instant::now(), earliest);
            return;
        }
        // A late commit ran with its turn's clock, which is at most a store timeout before
        // the failure: timers it set may lie behind the scan's cursor now, where the scan
        // would never look again. The scan goes back over that stretch (re-reading rows it
        // already handled changes nothing: each is handled by its state as it is now).
        if let Some(ms) = earliest {
            let back = rewind_point(ms, &self.cfg);
            if back < self.cursor.0 {
                self.cursor = (back, 0);
            }
        }
        let topic = match &settled {
            Settled::All => {
                self.index().clear();
                None
            }
            Settled::Topics(ts) => {
                let mut index = self.index();
                for t in ts {
                    index.invalidate(&t.ns, &t.topic);
                }
                drop(index);
                Some(ts.clone())
            }
        };
        let store = self.store.clone();
        let t = self.timeout();
        let fresh = match &topic {
            None => {
                // Reads (on SQLite, on the reader): not the breaker's business.
                let (r, _) = timed(t, store.state_counts(None)).await;
                r.map(|rows| vec![(None, rows)])
            }
            Some(ts) => {
                let mut all = Vec::with_capacity(ts.len());
                let mut failed = None;
                for name in ts {
                    let (r, _) = timed(t, store.state_counts(Some(name))).await;
                    match r {
                        Ok(rows) => all.push((Some(name.clone()), rows)),
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                match failed {
                    None => Ok(all),
                    Some(e) => Err(e),
                }
            }
        };
        match fresh {
            Ok(counted) => {
                let mut counts = self.counts();
                let mut delta = 0;
                for (name, rows) in counted {
                    delta += counts.recount(name.as_ref(), rows);
                }
                drop(counts);
                self.shared.items.fetch_add(delta, Ordering::Relaxed);
                tracing::info!(shard = self.id, what = ?topic, drift = delta, "counts read afresh after writes whose outcome was unknown");
            }
            Err(e) => {
                tracing::warn!(shard = self.id, error = %e, "re-counting after an unknown outcome failed; trying again");
                self.doubts()
                    .retry(settled, std::time::Instant::now(), earliest);
            }
        }
    }

    /// Processes the next rows of the timer index; true when there may be more due right
    /// now. Each row is there for the earliest event of its state (see
    /// [`crate::store::next_event`]); what is due is decided from the row itself, in the
    /// order the three separate scans of schema version 1 ran: a passed TTL deletes the
    /// item whatever its state, else an ended lease ends, else a deferred item comes due.
    async fn scan_step(&mut self, now: i64) -> std::result::Result<bool, StoreError> {
        let after = self.cursor;
        let limit = self.cfg.scan_rows_max;
        let (r, took) = timed(self.timeout(), self.store.scan(after, now, limit)).await;
        self.record(&r, took);
        let rows = r?;
        let full = rows.len() == limit;
        let mut changes = Vec::new();
        let mut readied = Vec::new();
        let mut removed = Vec::new();
        let mut expired = Vec::new();
        let mut unseen = Vec::new();
        let mut unseen_ttl: Vec<(u64, i64)> = Vec::new();
        // For the counts, once the changes are committed.
        let mut moves: Vec<Move> = Vec::new();
        for m in &rows {
            let ttl_passed = m.expires_at_ms.is_some_and(|t| t <= now);
            match m.state {
                _ if ttl_passed => {
                    for token in self.shared.staged.remove(m.key) {
                        unseen_ttl.push((m.key, token));
                    }
                    // A reply still carrying it finds it gone (not in reply) and leaves it out.
                    self.shared.staged.replied([(m.key, m.lease_token)]);
                    changes.push(Change::Delete { key: m.key });
                    moves.push((
                        m.ns.clone(),
                        m.topic.clone(),
                        (m.state, m.deliver_after_ms),
                        None,
                    ));
                    if m.state == ItemState::Ready {
                        removed.push((m.ns.clone(), m.topic.clone(), m.ready_key()));
                    }
                }
                // Claimed but never handed out: nobody saw this delivery, so it is given
                // back uncounted, whatever the policy (an at-most-once item is not lost).
                ItemState::Leased
                    if m.lease_expires_ms <= now
                        && self.shared.staged.take(m.key, m.lease_token) =>
                {
                    changes.push(Change::Release {
                        key: m.key,
                        token: m.lease_token,
                    });
                    unseen.push((m.ns.clone(), m.topic.clone(), m.key, m.lease_token));
                    readied.push((m.ns.clone(), m.topic.clone(), m.ready_key()));
                    let to = Some((ItemState::Ready, m.deliver_after_ms));
                    moves.push((m.ns.clone(), m.topic.clone(), (ItemState::Leased, 0), to));
                }
                // Handed out to a reply that has not left the host: its host renews the
                // lease (or lets it end) before the reply leaves; look again next pass.
                ItemState::Leased
                    if m.lease_expires_ms <= now
                        && now < m.lease_expires_ms.saturating_add(IN_REPLY_MAX_MS)
                        && self.shared.staged.is_in_reply(m.key, m.lease_token) =>
                {
                    changes.push(Change::Timer {
                        key: m.key,
                        at_ms: Some(now.saturating_add(self.cfg.scan_interval_ms as i64)),
                        seen_ms: m.next_event_ms,
                    });
                }
                ItemState::Leased if m.lease_expires_ms <= now => {
                    self.shared.staged.replied([(m.key, m.lease_token)]);
                    expired.push((m.ns.clone(), m.topic.clone()));
                    let from = (ItemState::Leased, 0);
                    if m.policy == Policy::AtMostOnce {
                        changes.push(Change::Delete { key: m.key });
                        moves.push((m.ns.clone(), m.topic.clone(), from, None));
                    } else if m.delivery_count >= m.max_attempts {
                        changes.push(Change::Dead {
                            key: m.key,
                            lease: m.lease_token,
                            at_ms: now,
                            settle: Settle::Not,
                        });
                        moves.push((
                            m.ns.clone(),
                            m.topic.clone(),
                            from,
                            Some((ItemState::Dead, 0)),
                        ));
                    } else {
                        changes.push(Change::Ready {
                            key: m.key,
                            lease: m.lease_token,
                            deliver_after_ms: None,
                            metadata: None,
                            settle: Settle::Not,
                        });
                        readied.push((m.ns.clone(), m.topic.clone(), m.ready_key()));
                        let to = Some((ItemState::Ready, m.deliver_after_ms));
                        moves.push((m.ns.clone(), m.topic.clone(), from, to));
                    }
                }
                // Came due. Its TTL, if any, is its next event; without one the row stays
                // where it is on the timer index, behind the cursor for good.
                ItemState::Ready if m.deliver_after_ms <= now => {
                    readied.push((m.ns.clone(), m.topic.clone(), m.ready_key()));
                    if m.expires_at_ms.is_some() {
                        changes.push(Change::Timer {
                            key: m.key,
                            at_ms: m.expires_at_ms,
                            seen_ms: m.next_event_ms,
                        });
                    }
                }
                // Nothing due yet (the row's timer was early): put it at its next event.
                _ => changes.push(Change::Timer {
                    key: m.key,
                    at_ms: next_event(
                        m.state,
                        m.deliver_after_ms,
                        m.lease_expires_ms,
                        m.expires_at_ms,
                        now,
                    ),
                    seen_ms: m.next_event_ms,
                }),
            }
        }
        if !changes.is_empty() {
            let (r, took) = timed(self.timeout(), self.store.apply(&changes, now)).await;
            self.record(&r, took);
            if let Err(e) = r {
                for (ns, topic, _) in readied.iter().chain(&removed) {
                    self.outcome_unknown(ns, topic);
                }
                // Still unseen: the next pass gives them back (or deletes them).
                for (_, _, key, token) in &unseen {
                    self.shared.staged.insert(*key, *token);
                }
                for (key, token) in &unseen_ttl {
                    self.shared.staged.insert(*key, *token);
                }
                return Err(e);
            }
        }
        for (ns, topic, from, to) in moves {
            match to {
                Some((ItemState::Dead, _)) => self.died(&ns, &topic, from),
                Some(to) => self.counts().moved(&ns, &topic, from, to),
                None => self.counts().add(&ns, &topic, from.0, from.1, -1),
            }
        }
        let deleted = changes
            .iter()
            .filter(|c| matches!(c, Change::Delete { .. }))
            .count();
        self.shared
            .items
            .fetch_sub(deleted as i64, Ordering::Relaxed);
        for (ns, topic) in expired {
            self.tally(&ns, &topic, |t| t.expired += 1);
        }
        for (ns, topic, _, _) in unseen {
            self.tally(&ns, &topic, |t| t.delivered -= 1);
        }
        for (ns, topic, k) in readied {
            self.ready(&ns, &topic, k);
        }
        for (ns, topic, k) in removed {
            self.index().remove(&ns, &topic, &k);
        }
        self.cursor = match rows.last() {
            Some(last) if full => (last.next_event_ms.unwrap_or(now), last.key),
            // Everything up to now - 1 is done. Not `now`: a row may still get this very
            // millisecond (a claim with lease_ms 0, a nack without delay).
            _ => (now - 1, u64::MAX),
        };
        Ok(full)
    }

    /// Persists the scans' checkpoints (each is the last millisecond fully processed) and
    /// the topics' totals gathered since the last save; at the same pace (not at a stop),
    /// forgets a chunk of the enqueue batches' marks past their memory and the topics idle
    /// long enough (see `forget.rs`).
    pub(super) async fn save_checkpoints(&mut self, force: bool) {
        let now = self.clock.now_ms();
        if !force && now - self.last_checkpoint_ms < self.cfg.checkpoint_interval_ms as i64 {
            return;
        }
        if !force {
            let before = now.saturating_sub(crate::store::BATCH_MEMORY_MS);
            let (r, took) = timed(self.timeout(), self.store.forget_batches(before)).await;
            self.record(&r, took);
        }
        if !self.totals.is_empty() {
            let deltas: Vec<(TopicName, Totals)> = self.totals.drain().collect();
            let (r, took) = timed(self.timeout(), self.store.add_totals(&deltas)).await;
            self.record(&r, took);
            if r.is_err() {
                // Keep them for the next save.
                for (t, d) in deltas {
                    self.totals.entry(t).or_default().add(&d);
                }
            }
        }
        if !force {
            // After the totals' save: a topic with totals still to save is not forgotten
            // (their save would write its row back).
            self.forget_idle_topics().await;
        }
        let (ms, key) = self.cursor;
        let mut cp = if key == u64::MAX { ms } else { ms - 1 };
        // Not past a write still in doubt: a late commit may yet set timers from a store
        // timeout (and a second) before its failure on, and the next worker of this shard
        // (after a death, or a restart) starts its scan at the checkpoint.
        if let Some(earliest) = self.doubts().earliest_ms() {
            cp = cp.min(rewind_point(earliest, &self.cfg));
        }
        if cp == self.saved {
            self.last_checkpoint_ms = now;
            return;
        }
        let (r, took) = timed(self.timeout(), self.store.save_checkpoint(cp)).await;
        self.record(&r, took);
        if r.is_ok() {
            self.saved = cp;
            self.last_checkpoint_ms = now;
        }
    }
}

impl<S: ShardStore> ShardWorker<S> {
    /// Forgets the topics idle long enough (see `forget.rs`); at most once per sweep pause. Not while a
    /// write is in doubt: its late commit could add rows to a forgotten topic's id.
    pub(super) async fn forget_idle_topics(&mut self) {
        let now = self.clock.now_ms();
        let after = self.cfg.topic_forget_after_ms as i64;
        if !self.idle.sweep_due(now, after) {
            return;
        }
        let emptied = self.shared.counts.lock().expect("counts").take_emptied();
        self.idle.emptied(emptied, now);
        let (in_doubt, noted) = {
            let d = self.doubts();
            (d.earliest_ms().is_some(), d.noted())
        };
        if !self.idle.may_forget(in_doubt, noted, now) {
            return;
        }
        let due = {
            let counts = self.shared.counts.lock().expect("counts");
            let pending = &self.totals;
            self.idle.due(now, after, |t| {
                counts.topics_of(&t.ns, &t.topic).0 || pending.contains_key(t)
            })
        };
        if due.is_empty() {
            return;
        }
        let (r, took) = timed(self.timeout(), self.store.forget_topics(&due)).await;
        self.record(&r, took);
        match r {
            Ok(gone) => {
                let mut totals = self.shared.totals.lock().expect("totals");
                for t in &gone {
                    totals.remove(t);
                }
                drop(totals);
                tracing::debug!(
                    shard = self.id,
                    forgotten = gone.len(),
                    "idle topics forgotten"
                );
            }
            // Tried again once they are idle again (from the next time they empty).
            Err(e) => tracing::warn!(shard = self.id, error = %e, "forgetting idle topics"),
        }
    }
}

/// How far back the scan must read again for a write that failed with an unknown outcome
/// at `failed_ms`: one settle window (its statement ran with its turn's clock, at most a
/// store timeout before, and a second more for the clocks of the statement's way).
fn rewind_point(failed_ms: i64, cfg: &WorkerConfig) -> i64 {
    failed_ms - settle_window(cfg).as_millis() as i64
}
