//! The writes of a shard worker's turn, each in three steps: plan (assign keys, take keys
//! out of the index; needs the worker), execute (SQL only; runs concurrently with the
//! turn's other writes), finish (apply the outcome to the index and answer the callers).
//!
//! After a storage error the outcome of a write is unknown (the commit may have happened),
//! so the index forgets the topics involved and reloads them from storage, the truth.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use super::exec::{AckFailure, AckOutcome, AckPlan, NackFailure, NackOutcome};
use super::worker::{storage_error, timed, ShardWorker};
use super::ShardError;
use super::{AckOp, Command, Enqueued, Forward, NackOp, Recall, Reply, Settled, TouchOp};
use crate::model::{Item, ItemState, NewItem, ReadyKey, TopicName};
use crate::store::{Change, ForwardMark, Handoff, ItemMeta, Marks, ShardStore, StoreResult};

/// An enqueue request as the worker takes it: its items, their places in a forwarded
/// request, and whom to answer.
pub(super) type EnqueueReq = (Vec<NewItem>, Option<Forward>, Reply<Vec<Enqueued>>);

/// Keys are reserved in blocks so that the high-water mark is written once per block.
const KEY_BLOCK: u64 = 100_000;

/// (ns, topic, dedup key): at most one item exists per value.
pub(super) type DedupKey = (String, String, String);

fn dedup_key(it: &NewItem) -> Option<DedupKey> {
    it.dedup_key
        .as_ref()
        .map(|k| (it.ns.clone(), it.topic.clone(), k.clone()))
}

/// One multi-row INSERT and the enqueues it answers.
pub(super) struct InsertGroup {
    pub rows: Vec<(u64, NewItem)>,
    /// Written with the rows when they reach past the persisted high-water mark.
    pub key_high_water: Option<u64>,
    /// The rows written leased, handed to waiting consumers (see `handoff.rs`).
    pub handoff: Handoff,
    /// The worker's clock when the rows were written (their timers and leases).
    pub written_at_ms: i64,
    /// The insert's batch mark (see `store::batches`; 0: none written) and its forwarded
    /// requests' items (see `store::forwards`).
    pub marks: Marks,
    replies: Vec<(Vec<Enqueued>, Reply<Vec<Enqueued>>)>,
}

/// All claims of a turn: one UPDATE under one token.
pub(super) struct ClaimPlan {
    pub keys: Vec<u64>,
    pub token: i64,
    parts: Vec<(TopicName, Vec<u64>, Reply<Vec<Item>>)>,
}

fn fail_all<T, U>(requests: Vec<(T, Reply<U>)>, err: &ShardError) {
    for (_, reply) in requests {
        let _ = reply.send(Err(err.clone()));
    }
}

impl<S: ShardStore> ShardWorker<S> {
    /// Deduplication before planning: a request that repeats a dedup key that an earlier
    /// request of this turn introduced waits for the next turn (by then the first is
    /// committed and found); the others' keys are looked up. Returns the requests to plan
    /// now and the existing items by (ns, topic, dedup key).
    pub(super) async fn resolve_dedup(
        &mut self,
        requests: Vec<EnqueueReq>,
    ) -> (Vec<EnqueueReq>, HashMap<DedupKey, u64>) {
        if requests
            .iter()
            .all(|(items, _, _)| items.iter().all(|i| i.dedup_key.is_none()))
        {
            return (requests, HashMap::new());
        }
        let mut claimed: HashSet<DedupKey> = HashSet::new();
        let mut now = Vec::with_capacity(requests.len());
        for (items, forward, reply) in requests {
            let keys: HashSet<DedupKey> = items.iter().filter_map(dedup_key).collect();
            if keys.iter().any(|k| claimed.contains(k)) {
                self.deferred.push(Command::Enqueue {
                    items,
                    forward,
                    reply,
                });
            } else {
                claimed.extend(keys);
                now.push((items, forward, reply));
            }
        }
        let mut by_topic: HashMap<(String, String), Vec<String>> = HashMap::new();
        for (ns, topic, key) in &claimed {
            by_topic
                .entry((ns.clone(), topic.clone()))
                .or_default()
                .push(key.clone());
        }
        let mut existing = HashMap::new();
        for ((ns, topic), keys) in by_topic {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let (r, took) =
                timed(self.timeout(), self.store.dedup_lookup(&ns, &topic, &refs)).await;
            self.record(&r, took);
            match r {
                Ok(found) => {
                    for (key, id) in found {
                        existing.insert((ns.clone(), topic.clone(), key), id);
                    }
                }
                Err(e) => {
                    // Without knowing what exists, items with keys of this topic cannot be
                    // written: fail their requests (retryably), let the rest through.
                    let err = storage_error(self.id, &e);
                    let (fail, keep): (Vec<_>, Vec<_>) =
                        now.into_iter().partition(|(items, _, _)| {
                            items
                                .iter()
                                .any(|i| i.dedup_key.is_some() && i.ns == ns && i.topic == topic)
                        });
                    fail_all(fail.into_iter().map(|(i, _, r)| (i, r)).collect(), &err);
                    now = keep;
                }
            }
        }
        (now, existing)
    }

    /// Cuts the turn's enqueues into INSERTs of at most `enqueue_batch_rows_max` rows,
    /// never splitting one request (its reply needs one outcome), and assigns keys. Items
    /// whose dedup key exists, in storage or earlier in the same request, are not written:
    /// they answer with the existing key.
    pub(super) fn plan_inserts(
        &mut self,
        batches: Vec<EnqueueReq>,
        existing: &HashMap<DedupKey, u64>,
    ) -> Vec<InsertGroup> {
        let mut groups: Vec<InsertGroup> = Vec::new();
        for (items, forward, reply) in batches {
            // A forwarded request is an insert of its own: a tombstone its forwarding host
            // wrote meanwhile (it gave up on the answer and decided "not stored", see
            // `store::forwards`) fails that insert, and must not fail others' with it.
            let fits = forward.is_none()
                && groups.last().is_some_and(|g| {
                    g.marks.forwarded.is_empty()
                        && g.rows.len() + items.len() <= self.cfg.enqueue_batch_rows_max
                });
            if !fits {
                groups.push(InsertGroup {
                    rows: Vec::new(),
                    key_high_water: None,
                    handoff: Handoff::default(),
                    written_at_ms: 0,
                    marks: Marks::batch(if self.cfg.enqueue_marks {
                        crate::store::new_batch_token(self.clock.now_ms())
                    } else {
                        0
                    }),
                    replies: Vec::new(),
                });
            }
            let g = groups.last_mut().expect("just ensured");
            let mut seen: HashMap<DedupKey, u64> = HashMap::new();
            let mut out = Vec::with_capacity(items.len());
            for it in items {
                let dk = dedup_key(&it);
                if let Some(id) = dk
                    .as_ref()
                    .and_then(|k| existing.get(k).or_else(|| seen.get(k)))
                {
                    out.push((*id, true));
                    continue;
                }
                let key = self.next_key;
                self.next_key += 1;
                if let Some(k) = dk {
                    seen.insert(k, key);
                }
                g.rows.push((key, it));
                out.push((key, false));
            }
            // A forwarded request's items are marked under its token, dedup hits too (the
            // answer they got), whatever else the group holds.
            if let Some(f) = forward {
                g.marks.forwarded.extend(f.positions.iter().zip(&out).map(
                    |(&position, &(key, dup))| ForwardMark {
                        token: f.token,
                        position,
                        key,
                        dup,
                    },
                ));
            }
            g.replies.push((out, reply));
        }
        // The groups commit concurrently, in any order: each that reaches past the
        // persisted mark carries the new one (the store keeps the greatest).
        if self.next_key > self.key_high_water {
            let mark = self.next_key + KEY_BLOCK;
            for g in &mut groups {
                if g.rows
                    .last()
                    .is_some_and(|(k, _)| *k >= self.key_high_water)
                {
                    g.key_high_water = Some(mark);
                }
            }
        }
        groups
    }

    pub(super) fn finish_insert(&mut self, g: InsertGroup, (r, took): (StoreResult<()>, u64)) {
        self.record(&r, took);
        if let Err(e) = r {
            // Rows it would have handed stay staged: if the INSERT did commit, their
            // leases are nobody's and come back uncounted when they end.
            for (_, it) in &g.rows {
                self.outcome_unknown(&it.ns, &it.topic);
            }
            self.handoff_failed(g.handoff);
            let forwarded = !g.marks.forwarded.is_empty();
            let err = if forwarded && matches!(e, crate::store::StoreError::Corrupt(_)) {
                // Most likely its forwarding host's tombstones (a duplicate key on the
                // marks): that host has answered "not stored" already. Certain and
                // retryable, not this build's data problem.
                tracing::info!(shard = self.id, error = %e, "a forwarded request's insert failed, its forwarding host having decided it was not stored");
                ShardError::Busy {
                    shard: self.id,
                    why: format!("the insert did not commit ({e}): nothing was stored; retry"),
                }
            } else {
                storage_error(self.id, &e)
            };
            if !err.in_doubt() || g.marks.batch == 0 {
                fail_all(g.replies, &err);
                return;
            }
            // Whether it committed is for the caller to ask (see `store::batches`),
            // with what each request was to get if it did.
            let rows: HashMap<u64, &NewItem> = g.rows.iter().map(|(k, it)| (*k, it)).collect();
            for (planned, reply) in g.replies {
                // What it stored if it did commit (dedup hits stored nothing), by topic.
                let stored = planned.iter().filter(|(_, dup)| !dup);
                let tally = by_topic(stored.filter_map(|(k, _)| rows.get(k).copied()));
                let _ = reply.send(Err(ShardError::InsertInDoubt {
                    shard: self.id,
                    error: e.clone(),
                    batch: g.marks.batch,
                    planned,
                    tally,
                }));
            }
            return;
        }
        if let Some(mark) = g.key_high_water {
            self.key_high_water = self.key_high_water.max(mark);
        }
        let now = self.clock.now_ms();
        {
            let mut counts = self.counts();
            for (key, it) in &g.rows {
                if g.handoff.holds(*key) {
                    counts.add(&it.ns, &it.topic, ItemState::Leased, 0, 1);
                } else {
                    counts.add(&it.ns, &it.topic, ItemState::Ready, it.deliver_after_ms, 1);
                }
            }
        }
        for (key, it) in &g.rows {
            if it.deliver_after_ms <= now && !g.handoff.holds(*key) {
                let k = ReadyKey {
                    priority: it.priority,
                    deliver_after_ms: it.deliver_after_ms,
                    key: *key,
                };
                self.ready(&it.ns, &it.topic, k);
            }
        }
        self.shared
            .items
            .fetch_add(g.rows.len() as i64, Ordering::Relaxed);
        for (key, it) in &g.rows {
            let handed = g.handoff.holds(*key);
            self.tally(&it.ns, &it.topic, |t| {
                t.enqueued += 1;
                t.delivered += i64::from(handed);
            });
        }
        // Handed over before the enqueue is answered: a consumer waiting for the item has
        // it (or is woken for it) by the time its producer hears it is stored.
        self.hand_over(&g.handoff, g.rows, g.written_at_ms);
        for (keys, reply) in g.replies {
            let _ = reply.send(Ok(keys));
        }
    }

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

/// Items counted by topic.
fn by_topic<'a>(items: impl Iterator<Item = &'a NewItem>) -> Vec<(TopicName, i64)> {
    let mut n: HashMap<(&str, &str), i64> = HashMap::new();
    for it in items {
        *n.entry((&it.ns, &it.topic)).or_default() += 1;
    }
    n.into_iter()
        .map(|((ns, topic), n)| {
            let name = TopicName {
                ns: ns.to_string(),
                topic: topic.to_string(),
            };
            (name, n)
        })
        .collect()
}
