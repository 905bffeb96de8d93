//! The enqueue writes of a shard worker's turn (see `ops.rs` for the plan / execute /
//! finish steps): dedup lookups, the planning of multi-row inserts with their keys and
//! hand-offs, and the finishing of an insert into the index and the callers' answers.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use super::ops::fail_all;
use super::worker::{storage_error, timed, ShardWorker};
use super::{Command, Enqueued, Forward, Reply, ShardError};
use crate::model::{ItemState, NewItem, ReadyKey, TopicName};
use crate::store::{ForwardMark, Handoff, Marks, ShardStore, StoreResult};

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
