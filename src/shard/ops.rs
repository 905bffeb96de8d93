//! The writes of a shard worker's turn, each in three steps: plan (assign keys, take keys
//! out of the index; needs the worker), execute (SQL only; runs concurrently with the
//! turn's other writes), finish (apply the outcome to the index and answer the callers).
//!
//! After a storage error the outcome of a write is unknown (the commit may have happened),
//! so the index forgets the topics involved and reloads them from storage, the truth.
//!
//! Here: claims, acks, nacks, releases and touches; the enqueue's inserts are in
//! `inserts.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use super::exec::{AckFailure, AckOutcome, AckPlan, NackFailure, NackOutcome};
use super::worker::{storage_error, timed, ShardWorker};
use super::ShardError;
use super::{AckOp, NackOp, Recall, Reply, Settled, TouchOp};
use crate::model::{Item, ItemState, ReadyKey, TopicName};
use crate::store::{Change, ItemMeta, ShardStore, StoreResult};

/// All claims of a turn: one UPDATE under one token.
pub(super) struct ClaimPlan {
    pub keys: Vec<u64>,
    pub token: i64,
    parts: Vec<(TopicName, Vec<u64>, Reply<Vec<Item>>)>,
}

pub(super) fn fail_all<T, U>(requests: Vec<(T, Reply<U>)>, err: &ShardError) {
    for (_, reply) in requests {
        let _ = reply.send(Err(err.clone()));
    }
}

impl<S: ShardStore> ShardWorker<S> {
    /// `claims` already hold only free keys (taken out of the index).
    pub(super) fn plan_claim(
        &mut self,
        claims: Vec<(TopicName, Vec<u64>, Reply<Vec<Item>>)>,
    ) -> Option<ClaimPlan> {
        if claims.is_empty() {
            return None;
        }
        self.lease_token += 1;
        let plan = ClaimPlan {
            keys: claims
                .iter()
                .flat_map(|(_, k, _)| k.iter().copied())
                .collect(),
            token: self.lease_token,
            parts: claims,
        };
        // Staged before the statement runs (see `Staged`): whatever becomes of it, a
        // lease it makes is nobody's until a consumer is handed the item, and a host that
        // abandons this worker knows it without waiting for the statement's end. Once
        // abandoned, no claim runs: its lease would be one the successor never heard of.
        if !self.shared.staged.stage_claim(&plan.keys, plan.token) {
            for (_, _, reply) in plan.parts {
                let _ = reply.send(Err(ShardError::Gone(self.id)));
            }
            return None;
        }
        Some(plan)
    }

    pub(super) fn finish_claim(
        &mut self,
        plan: ClaimPlan,
        (r, took): (StoreResult<Vec<Item>>, u64),
    ) {
        self.record(&r, took);
        match r {
            Ok(items) => {
                // Nobody holds these leases until the host hands the items out (staged
                // since the plan); the keys it did not lease (gone, or no longer ready)
                // come out.
                let leased: HashSet<u64> = items.iter().map(|i| i.id.key).collect();
                for k in plan.keys.iter().filter(|k| !leased.contains(k)) {
                    self.shared.staged.take(*k, plan.token);
                }
                self.shared.staged.add(&items);
                {
                    let mut counts = self.counts();
                    for i in &items {
                        counts.moved(
                            &i.ns,
                            &i.topic,
                            (ItemState::Ready, i.deliver_after_ms),
                            (ItemState::Leased, 0),
                        );
                    }
                }
                for i in &items {
                    self.tally(&i.ns, &i.topic, |t| t.delivered += 1);
                }
                let mut by_key: HashMap<u64, Item> =
                    items.into_iter().map(|i| (i.id.key, i)).collect();
                for (_, free, reply) in plan.parts {
                    let mine = free.iter().filter_map(|k| by_key.remove(k)).collect();
                    let _ = reply.send(Ok(mine));
                }
            }
            Err(e) => {
                // The UPDATE may have committed: the rows it leased under this token are
                // nobody's, so they stay staged (since the plan), and an expiry gives them
                // back uncounted (a release needs the same token, so nothing else is
                // touched).
                let err = storage_error(self.id, &e);
                for (topic, _, reply) in plan.parts {
                    self.outcome_unknown(&topic.ns, &topic.topic);
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }

    pub(super) fn finish_ack(
        &mut self,
        requests: Vec<(Vec<AckOp>, Reply<Vec<Settled>>)>,
        plan: AckPlan,
        (r, took): (Result<AckOutcome, AckFailure>, u64),
    ) {
        let now = self.clock.now_ms();
        let r = r.map_err(|(e, gone)| {
            self.record::<()>(&Err(e.clone()), took);
            (e, gone)
        });
        let outcome = match r {
            Ok(o) => {
                self.record::<()>(&Ok(()), took);
                o
            }
            Err((e, gone)) => return self.ack_failed(requests, plan, e, gone, now),
        };
        let found: HashMap<u64, ItemMeta> =
            outcome.deleted.into_iter().map(|m| (m.key, m)).collect();
        {
            let mut counts = self.counts();
            for m in found.values() {
                counts.add(&m.ns, &m.topic, m.state, m.deliver_after_ms, -1);
            }
        }
        for m in found.values() {
            self.tally(&m.ns, &m.topic, |t| t.acked += 1);
            if m.state == ItemState::Ready {
                self.index().remove(&m.ns, &m.topic, &m.ready_key());
            }
            // Claims of it whose outcome was unknown have nothing left to give back.
            self.shared.staged.remove(m.key);
            self.acked.remember(m.key, Some(m.lease_token), now);
        }
        self.shared
            .items
            .fetch_sub(found.len() as i64, Ordering::Relaxed);
        for (ops, reply) in requests {
            let out = ops
                .iter()
                .map(|op| {
                    if found.contains_key(&op.key) {
                        return Settled::Done;
                    }
                    // The row is there on another lease: no ack of this lease deleted it
                    // (whatever an earlier failed one is remembered as).
                    if outcome.kept.contains(&op.key) {
                        return Settled::LeaseEnded;
                    }
                    match self.acked.recall(op.key, op.lease_id, now) {
                        Recall::Same => Settled::Done,
                        Recall::Other => Settled::LeaseEnded,
                        Recall::Unknown => Settled::NotFound,
                    }
                })
                .collect();
            let _ = reply.send(Ok(out));
        }
    }

    /// The acks' DELETE failed. The keys found gone on a second look were deleted (the
    /// DELETE committed and its reply was lost, or it committed before failing): those
    /// acks are done, and answered so. The rest fail retryably; as a DELETE that timed
    /// out may still commit, they are remembered too (a retry that finds the row gone is
    /// answered done, see [`super::AckMemory`]). What was staged stays staged (an expiry
    /// gives it back, uncounted), the index reloads.
    fn ack_failed(
        &mut self,
        requests: Vec<(Vec<AckOp>, Reply<Vec<Settled>>)>,
        plan: AckPlan,
        e: crate::store::StoreError,
        gone: Option<HashSet<u64>>,
        now: i64,
    ) {
        let gone = gone.unwrap_or_default();
        for (key, token) in plan.unstaged {
            if !gone.contains(&key) {
                self.shared.staged.insert(key, token);
            }
        }
        for t in plan.unclaimed {
            self.outcome_unknown(&t.ns, &t.topic);
        }
        if !gone.is_empty() {
            // Rows deleted without their namespaces and states read: every count is
            // read again once the outcome has settled.
            self.all_unknown();
        }
        let err = storage_error(self.id, &e);
        for (ops, reply) in requests {
            for op in &ops {
                self.acked.remember(op.key, op.lease_id, now);
            }
            if !ops.iter().any(|op| gone.contains(&op.key)) {
                let _ = reply.send(Err(err.clone()));
                continue;
            }
            // Some of this call's acks were applied: each is answered for itself.
            let out = ops
                .iter()
                .map(|op| match gone.contains(&op.key) {
                    true => Settled::Done,
                    false => Settled::Unapplied,
                })
                .collect();
            let _ = reply.send(Ok(out));
        }
    }

    pub(super) fn finish_nack(
        &mut self,
        requests: Vec<(Vec<NackOp>, Reply<Vec<Settled>>)>,
        (r, took): (Result<NackOutcome, NackFailure>, u64),
    ) {
        let r = r.map_err(|(e, topics)| {
            match topics {
                Some(topics) => {
                    for (ns, topic) in &topics {
                        self.outcome_unknown(ns, topic);
                    }
                }
                None => self.all_unknown(),
            }
            e
        });
        self.record(&r, took);
        let outcome = match r {
            Ok(o) => o,
            Err(e) => return fail_all(requests, &storage_error(self.id, &e)),
        };
        for (ns, topic) in &outcome.nacked {
            self.tally(ns, topic, |t| t.nacked += 1);
        }
        for (ns, topic, state, at) in &outcome.moves {
            match state {
                ItemState::Dead => self.died(ns, topic, (ItemState::Leased, 0)),
                _ => self
                    .counts()
                    .moved(ns, topic, (ItemState::Leased, 0), (*state, *at)),
            }
        }
        for (ns, topic, k) in outcome.readied {
            self.ready(&ns, &topic, k);
        }
        for ((_, reply), out) in requests.into_iter().zip(outcome.settled) {
            let _ = reply.send(Ok(out));
        }
    }

    pub(super) fn finish_release(
        &mut self,
        requests: Vec<(Vec<Item>, Reply<()>)>,
        (r, took): (StoreResult<()>, u64),
    ) {
        self.record(&r, took);
        if let Err(e) = r {
            for (items, _) in &requests {
                for i in items {
                    self.outcome_unknown(&i.ns, &i.topic);
                    // Still nobody's: lease expiry gives it back if nothing else does.
                    self.shared.staged.insert(i.id.key, i.lease_token);
                }
            }
            return fail_all(requests, &storage_error(self.id, &e));
        }
        for (items, reply) in requests {
            for i in items {
                self.given_back(&i.ns, &i.topic, i.deliver_after_ms);
                let k = ReadyKey {
                    priority: i.priority,
                    deliver_after_ms: i.deliver_after_ms,
                    key: i.id.key,
                };
                self.ready(&i.ns, &i.topic, k);
            }
            let _ = reply.send(Ok(()));
        }
    }
}

impl<S: ShardStore> ShardWorker<S> {
    /// A released lease in the counts: ready again, the delivery nobody saw not counted.
    fn given_back(&mut self, ns: &str, topic: &str, deliver_after_ms: i64) {
        self.counts().moved(
            ns,
            topic,
            (ItemState::Leased, 0),
            (ItemState::Ready, deliver_after_ms),
        );
        self.tally(ns, topic, |t| t.delivered -= 1);
    }

    /// On a stop: gives back every lease nobody was handed that this worker still holds
    /// (claims and hand-offs whose outcome it never learned, releases that failed): ready
    /// again, the delivery nobody saw not counted. Without it the shard's next owner
    /// (another host, after a planned move) would count each one's end as a delivery: an
    /// attempt used up, an at-most-once item deleted unseen. One read and one write,
    /// each within the store timeout; what is left (a failed write) is recorded for a
    /// successor on this host, as before. Nothing is written by an abandoned worker.
    pub(super) async fn release_unseen(&mut self) {
        let leases: HashSet<(u64, i64)> = self.shared.staged.entries().into_iter().collect();
        if leases.is_empty() || self.shared.abandoned.load(Ordering::Relaxed) {
            return;
        }
        let mut keys: Vec<u64> = leases.iter().map(|(k, _)| *k).collect();
        keys.sort_unstable();
        keys.dedup();
        let (r, took) = timed(self.timeout(), self.store.lookup(&keys)).await;
        self.record(&r, took);
        let rows = match r {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(shard = self.id, leases = leases.len(), error = %e, "cannot read the leases nobody was handed before stopping; a successor here gives them back");
                return;
            }
        };
        // Only rows still on such a lease: the rest were settled (or never leased).
        let held: Vec<ItemMeta> = rows
            .into_iter()
            .filter(|m| m.state == ItemState::Leased && leases.contains(&(m.key, m.lease_token)))
            .collect();
        if held.is_empty() {
            return;
        }
        let changes: Vec<Change> = held
            .iter()
            .map(|m| Change::Release {
                key: m.key,
                token: m.lease_token,
            })
            .collect();
        let now = self.clock.now_ms();
        let (r, took) = timed(self.timeout(), self.store.apply(&changes, now)).await;
        self.record(&r, took);
        if let Err(e) = r {
            tracing::warn!(shard = self.id, leases = held.len(), error = %e, "cannot give back the leases nobody was handed before stopping; a successor here gives them back");
            return;
        }
        for m in &held {
            self.shared.staged.take(m.key, m.lease_token);
            self.given_back(&m.ns, &m.topic, m.deliver_after_ms);
        }
        tracing::info!(
            shard = self.id,
            released = held.len(),
            "gave back the leases nobody was handed before stopping"
        );
    }

    pub(super) fn finish_touch(
        &mut self,
        requests: Vec<(Vec<TouchOp>, Reply<Vec<Settled>>)>,
        (r, took): (StoreResult<Vec<Vec<Settled>>>, u64),
    ) {
        self.record(&r, took);
        match r {
            Ok(settled) => {
                for ((_, reply), out) in requests.into_iter().zip(settled) {
                    let _ = reply.send(Ok(out));
                }
            }
            Err(e) => fail_all(requests, &storage_error(self.id, &e)),
        }
    }
}
