//! Serving dequeues on one host: the long poll around them, the prefetch stage they take
//! from, the claims that restock it (a k-way merge of the shards' ready indexes), and the
//! hand-out through each item's shard. Routing across hosts is `routed_dequeue.rs`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::future::join_all;

use super::access::{Caller, Kind};
use super::host::{in_range, Host, ShardMap};
use super::validate::limits;
use super::{kway_merge, TopicRequest};
use crate::error::{Error, Result};
use crate::metrics::ItemEvent;
use crate::model::{Head, Item, ReadyKey, ShardId, TopicName};

/// Merge-and-claim rounds per topic in one dequeue. A round comes up short only when a
/// concurrent dequeue claimed some of the same keys, so a few rounds are plenty.
const DEQUEUE_ROUNDS_MAX: usize = 4;
/// Most items one merge-and-claim asks for: the largest dequeue count.
const CLAIM_ITEMS_MAX: usize = 1000;

impl Host {
    /// Dequeues from each requested topic, most urgent first across every shard. With
    /// `wait_ms`, when nothing is ready, waits up to that long for an item to become ready
    /// in any of the topics (a long poll; waiting costs no storage query).
    /// Dequeues across the namespace's tier (see `routed_dequeue.rs`), or from this host's
    /// shards only with `local_only`. Every item leaves with at least half its lease left
    /// (see `useful_lease.rs`).
    pub async fn dequeue(
        &self,
        caller: &Caller,
        topics: Vec<TopicRequest>,
        wait_ms: Option<i64>,
        local_only: bool,
    ) -> Result<Vec<Item>> {
        let items = self
            .dequeue_waiting(caller, topics, wait_ms, local_only)
            .await?;
        Ok(self.with_useful_leases(caller, items).await)
    }

    async fn dequeue_waiting(
        &self,
        caller: &Caller,
        topics: Vec<TopicRequest>,
        wait_ms: Option<i64>,
        local_only: bool,
    ) -> Result<Vec<Item>> {
        if topics.len() > limits::TOPICS_PER_DEQUEUE_MAX {
            return Err(Error::invalid(format!(
                "{} topics in one request; at most {}",
                topics.len(),
                limits::TOPICS_PER_DEQUEUE_MAX
            )));
        }
        let wait_ms = wait_ms.unwrap_or(0);
        if !(0..=limits::WAIT_MS_MAX).contains(&wait_ms) {
            return Err(Error::invalid(format!(
                "wait_ms must be in 0..={}, got {wait_ms}",
                limits::WAIT_MS_MAX
            )));
        }
        let mut wanted = Vec::with_capacity(topics.len());
        let mut seen = std::collections::HashSet::with_capacity(topics.len());
        for t in topics {
            self.allow(caller, &t.ns, Kind::Consume)?;
            // One topic named 100 times with count 1,000 was a 100,000-item reply.
            if !seen.insert((t.ns.clone(), t.topic.clone())) {
                return Err(Error::invalid(format!(
                    "topic {:?} of namespace {:?} is listed twice: name each topic once, with the count wanted",
                    t.topic, t.ns
                )));
            }
            let count = in_range("count", t.count, limits::DEQUEUE_COUNT_MAX)?;
            let before =
                match t.before {
                    (None, None) => None,
                    (Some(priority), Some(deliver_after_ms)) if local_only => Some(Head {
                        priority,
                        deliver_after_ms,
                    }),
                    (Some(_), Some(_)) => {
                        return Err(Error::invalid(
                            "before_priority and before_deliver_after_ms are for a host routing \
                         a dequeue to a peer: they need local_only",
                        ))
                    }
                    _ => return Err(Error::invalid(
                        "before_priority and before_deliver_after_ms go together: both or neither",
                    )),
                };
            wanted.push((self.topic_name(&t.ns, &t.topic)?, count, before));
        }
        let deadline =
            tokio::time::Instant::now() + std::time::Duration::from_millis(wait_ms as u64);
        loop {
            if caller.is_hung_up() {
                return Ok(Vec::new());
            }
            // Watch before looking, so that an item made ready between the look and the
            // wait still wakes us.
            let notifies: Vec<Arc<tokio::sync::Notify>> = if wait_ms > 0 {
                wanted.iter().map(|(t, ..)| self.waiters.watch(t)).collect()
            } else {
                Vec::new()
            };
            let mut notified: Vec<_> = notifies.iter().map(|n| Box::pin(n.notified())).collect();
            for n in &mut notified {
                n.as_mut().enable();
            }
            // Only a long poll parks (and needs where each topic's ready events stood).
            let since: Vec<u64> = if wait_ms > 0 {
                wanted
                    .iter()
                    .map(|(t, ..)| self.waiters.demand().epoch(t))
                    .collect()
            } else {
                Vec::new()
            };
            let out = self
                .dequeue_once(&wanted, local_only, self.acting_identity(caller))
                .await?;
            if !out.is_empty()
                || notified.is_empty()
                || self.waiters.is_closing()
                || caller.is_hung_up()
            {
                return Ok(out);
            }
            // While parked, an item enqueued for these topics is handed to this poll
            // directly (see `crate::demand`); leaving takes the demand away.
            let _parked: Vec<_> = wanted
                .iter()
                .zip(&since)
                .map(|((t, count, _), since)| self.waiters.demand().park(t, *count, *since))
                .collect();
            tokio::select! {
                _ = futures::future::select_all(notified) => {}
                _ = tokio::time::sleep_until(deadline) => return Ok(out),
                _ = self.waiters.closed() => return Ok(out),
                // Nobody would receive what it takes: what was handed to it stays staged
                // for the next dequeue.
                _ = caller.hung_up() => return Ok(out),
            }
        }
    }

    /// How many items of a topic an enqueue here would hand to waiting consumers now, and
    /// whether at-most-once ones too (see [`crate::demand`]): a test signal, so that a
    /// test waits for a long poll to park instead of sleeping.
    pub fn handoff_grant(&self, ns: &str, topic: &str) -> crate::demand::Grant {
        let t = TopicName {
            ns: ns.to_string(),
            topic: topic.to_string(),
        };
        self.waiters.demand().grant(&t, self.clock.now_ms())
    }

    /// Ends in-flight long polls (they return what they have: nothing) and makes new ones
    /// return at once; called when shutting down.
    pub fn stop_waiting(&self) {
        self.waiters.close();
    }

    async fn dequeue_once(
        &self,
        wanted: &[(TopicName, usize, Option<Head>)],
        local_only: bool,
        acting: Option<&str>,
    ) -> Result<Vec<Item>> {
        // A topic whose shards fail is skipped (its items are delayed, not lost) rather
        // than failing the request and stranding what other topics already leased.
        let mut out = Vec::new();
        let mut failure = None;
        let mut bytes = 0;
        for (name, count, before) in wanted {
            // Within the reply's bounds: a topic claims no more than what is left of them,
            // each item counted at the largest an item can be, so that the reply never
            // passes `server.reply_bytes_max` (what it claimed is handed out whole).
            let count = (*count)
                .min(self.reply_bounds.items_max.saturating_sub(out.len()))
                .min(
                    self.reply_bounds.bytes_max.saturating_sub(bytes) / limits::ITEM_WIRE_BYTES_MAX,
                );
            if count == 0 {
                break;
            }
            match self
                .dequeue_across(name, count, local_only, *before, acting)
                .await
            {
                Ok(items) => {
                    bytes += items.iter().map(wire_bytes).sum::<usize>();
                    out.extend(items);
                }
                Err(e) => failure = Some(e),
            }
        }
        match failure {
            Some(e) if out.is_empty() => Err(e),
            _ => Ok(out),
        }
    }

    /// Serves a dequeue from the prefetch buffer's stage, and claims on demand what the
    /// stage lacks, plus enough to restock it when the topic is busy; with `before`, only
    /// items more urgent than it (see [`Self::gather`]).
    pub(super) async fn dequeue_topic(
        &self,
        topic: &TopicName,
        count: usize,
        before: Option<Head>,
    ) -> Result<Vec<Item>> {
        // The shards as this dequeue found them: an item claimed on a shard that is being
        // removed meanwhile is still handed out through it (its lease is real).
        // This namespace's turn at the shards (see `tenants`), taken before the shards'
        // lock: a dequeue waiting its turn holds nothing others need.
        let _turn = self.fair_turn(&topic.ns, "dequeue", count, 0).await?;
        let _claiming = self.claiming.read().await;
        let shards = self.shards();
        let gathered = self.gather(topic, count, true, before).await?;
        Ok(self.deliver(&shards, topic, count, gathered, before).await)
    }

    /// Hands out what [`Self::gather`] got for a dequeue of `count`. Items are handed out
    /// through their shards, which drop any that an ack, nack or expiry settled since they
    /// were claimed; when that leaves the reply short, it gathers again. Called under
    /// `claiming`, with the shards it found.
    async fn deliver(
        &self,
        shards: &ShardMap,
        topic: &TopicName,
        count: usize,
        mut gathered: Vec<Item>,
        before: Option<Head>,
    ) -> Vec<Item> {
        let mut out: Vec<Item> = Vec::new();
        for _ in 0..DEQUEUE_ROUNDS_MAX {
            let n = gathered.len();
            let delivered = self.hand_out(shards, gathered);
            let short = delivered.len() < n;
            out.extend(delivered);
            if !short || out.len() >= count {
                break;
            }
            gathered = match self.gather(topic, count - out.len(), false, before).await {
                Ok(g) => g,
                Err(_) => break,
            };
        }
        out.sort_by_key(Item::global_key);
        out
    }

    /// Hands claimed items to a consumer: each shard keeps those still waiting under
    /// their claim (see [`crate::shard::Staged`]) and drops the rest.
    ///
    /// An item whose lease has already ended (its claim was slow to come back, under a
    /// stalled store) is not handed out: it stays staged, and the shard's scan gives it
    /// back uncounted, instead of reaching a consumer on a lease that another consumer may
    /// already hold.
    ///
    /// Through the shards this dequeue found, except one abandoned since (its primary
    /// fenced): its successor here, if any, claimed what a later round got on it.
    fn hand_out(&self, shards: &ShardMap, items: Vec<Item>) -> Vec<Item> {
        let now = self.clock.now_ms();
        let mut by_shard: BTreeMap<ShardId, Vec<Item>> = BTreeMap::new();
        for i in items.into_iter().filter(|i| i.lease_expires_ms > now) {
            by_shard.entry(i.id.shard).or_default().push(i);
        }
        // The current map, read only when the one it started with will not do.
        let mut current: Option<ShardMap> = None;
        let mut delivered: Vec<Item> = Vec::new();
        for (id, items) in by_shard {
            let h = match shards.get(&id) {
                Some(h) if !h.is_abandoned() => Some(h),
                _ => current.get_or_insert_with(|| self.shards()).get(&id),
            };
            if let Some(h) = h {
                delivered.extend(h.hand_out(items));
            }
        }
        if let Some(first) = delivered.first() {
            // A dequeue's items are of one topic.
            self.metrics
                .item_event(&first.ns, ItemEvent::Delivered, delivered.len() as u64);
            self.metrics.ns_delivered_after(
                &first.ns,
                delivered
                    .iter()
                    .map(|i| now - i.enqueued_at_ms.max(i.deliver_after_ms)),
            );
        }
        delivered
    }

    /// Whether a staged copy may still be handed out (its shard still has it waiting
    /// under its claim): the `live` test of the prefetch stage.
    pub(super) fn staged_live(&self) -> impl Fn(&Item) -> bool {
        let shards = self.shards();
        move |i: &Item| shards.get(&i.id.shard).is_some_and(|s| s.is_staged(i))
    }

    /// Stages claimed items not handed out; those the stage refuses (at-most-once) go back
    /// before this returns, so that a crash can hardly catch them leased by nobody.
    async fn stage(&self, topic: &TopicName, items: Vec<Item>) {
        let refused = self.prefetch.stage(topic, items, self.clock.now_ms());
        if refused.is_empty() {
            return;
        }
        let shards = self.shards();
        let mut by_shard: HashMap<ShardId, Vec<Item>> = HashMap::new();
        for i in refused {
            by_shard.entry(i.id.shard).or_default().push(i);
        }
        join_all(by_shard.into_iter().map(|(id, items)| {
            let shard = shards.get(&id).cloned();
            async move {
                let Some(shard) = shard else { return };
                if let Err(e) = shard.release(items).await {
                    tracing::warn!(shard = id, error = %e, "release of items not staged failed");
                }
            }
        }))
        .await;
    }

    /// The heads of the `max` most urgent ready items of `topic` this host holds, in
    /// order: staged ones and those the shards' indexes hold (from memory, unless an
    /// index must be read first). What a dequeue would get, as of now.
    pub(super) async fn local_heads(&self, topic: &TopicName, max: usize) -> Vec<Head> {
        let mut heads =
            self.prefetch
                .staged_heads(topic, max, self.clock.now_ms(), self.staged_live());
        let shards = self.shards();
        let indexed = join_all(
            shards
                .values()
                .filter(|s| s.is_healthy())
                .map(|s| s.peek(topic.clone(), max, self.clock.now_ms())),
        )
        .await;
        heads.extend(indexed.into_iter().flatten().flatten().map(Head::from));
        heads.sort_unstable();
        heads.truncate(max);
        heads
    }

    /// Up to `count` claimed items for one dequeue, in order: staged ones first, then
    /// claimed on demand; `first` counts the dequeue's demand (only once per dequeue).
    /// With `before`, only items more urgent than it: as many are taken as the stage and
    /// the shards' indexes show, and any taken beyond it (a race) go back to the stage.
    async fn gather(
        &self,
        topic: &TopicName,
        count: usize,
        first: bool,
        before: Option<Head>,
    ) -> Result<Vec<Item>> {
        let count = match before {
            Some(b) => {
                let heads = self.local_heads(topic, count).await;
                heads.partition_point(|h| *h < b)
            }
            None => count,
        };
        if count == 0 {
            return Ok(Vec::new());
        }
        let now = self.clock.now_ms();
        let taken = self.prefetch.take_before(topic, count, before, now, first);
        self.release(taken.release);
        let mut got = taken.items;
        if got.len() < count {
            let lock = self.prefetch.claim_lock(topic);
            let _claiming = lock.lock().await;
            // Whatever a claim finished while we waited was staged: look again first.
            let more = self.prefetch.take_before(
                topic,
                count - got.len(),
                before,
                self.clock.now_ms(),
                false,
            );
            self.release(more.release);
            got.extend(more.items);
            if got.len() < count {
                // The stage's room as it is now (a claim that finished while this one
                // waited for the lock may have filled it).
                let want = (count - got.len() + more.ahead).min(CLAIM_ITEMS_MAX);
                match self.claim_best(topic, want).await {
                    Ok(claimed) => got.extend(claimed),
                    Err(e) if got.is_empty() => return Err(e),
                    Err(_) => {} // serve what the stage had; the claim's items are delayed
                }
            }
            got.sort_by_key(Item::global_key);
            // Beyond `count`, or not before the bound: staged while the lock is held, so
            // no dequeue finds them in neither the index nor the stage.
            let keep = got
                .partition_point(|i| before.is_none_or(|b| Head::of(i) < b))
                .min(count);
            if got.len() > keep {
                let rest = got.split_off(keep);
                self.stage(topic, rest).await;
            }
        }
        Ok(got)
    }

    /// Gives staged items back to their shards, in the background: a release that fails
    /// only delays those items until their leases expire.
    fn release(&self, items: Vec<Item>) {
        if items.is_empty() {
            return;
        }
        let mut by_shard: HashMap<ShardId, Vec<Item>> = HashMap::new();
        for i in items {
            by_shard.entry(i.id.shard).or_default().push(i);
        }
        for (id, items) in by_shard {
            if let Some(shard) = self.shards().get(&id).cloned() {
                tokio::spawn(async move {
                    if let Err(e) = shard.release(items).await {
                        tracing::warn!(shard = id, error = %e, "release of staged items failed");
                    }
                });
            }
        }
    }

    /// Restocks busy topics' stages and releases aged staged items until `stop` turns
    /// true. (`shutdown` then releases whatever is still staged.)
    pub async fn run_prefetch(
        self: std::sync::Arc<Self>,
        tick_ms: u64,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(tick_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => break,
            }
            let now = self.clock.now_ms();
            self.waiters.forget_idle(now);
            let (restock, release) = self.prefetch.sweep(now, self.staged_live());
            self.release(release);
            for (topic, n) in restock {
                // Taken before the topic's claim lock, as a dequeue takes them.
                let _in_flight = self.claiming.read().await;
                let lock = self.prefetch.claim_lock(&topic);
                // A dequeue claiming for this topic restocks it already.
                let Ok(_claiming) = lock.try_lock() else {
                    continue;
                };
                if let Ok(items) = self.claim_best(&topic, n.min(CLAIM_ITEMS_MAX)).await {
                    self.stage(&topic, items).await;
                }
            }
        }
    }

    /// Merges the shards' index heads, claims the `want` most urgent on their shards (one
    /// statement per shard), and returns them in order.
    async fn claim_best(&self, topic: &TopicName, want: usize) -> Result<Vec<Item>> {
        let shards = self.shards();
        let count = want;
        let mut got: Vec<Item> = Vec::with_capacity(count);
        let mut last_err = None;
        for _ in 0..DEQUEUE_ROUNDS_MAX {
            let need = count - got.len();
            if need == 0 {
                break;
            }
            // A shard whose breaker is open is left out: its items wait there, and a
            // dequeue does not wait for its storage timeout.
            let peeks = join_all(
                shards
                    .values()
                    .filter(|s| s.is_healthy())
                    .map(|s| async move {
                        (
                            s.id(),
                            s.peek(topic.clone(), need, self.clock.now_ms()).await,
                        )
                    }),
            )
            .await;
            let mut heads: Vec<(ShardId, Vec<ReadyKey>)> = Vec::with_capacity(peeks.len());
            for (id, r) in peeks {
                match r {
                    Ok(keys) => heads.push((id, keys)),
                    // A sick shard delays its items; it does not fail the others'.
                    Err(e) => {
                        tracing::debug!(shard = id, error = %e, "peek failed");
                        last_err = Some(e);
                    }
                }
            }
            let winners = kway_merge(&heads, need);
            if winners.is_empty() {
                break;
            }
            let mut by_shard: HashMap<ShardId, Vec<ReadyKey>> = HashMap::new();
            for g in &winners {
                by_shard.entry(g.shard).or_default().push(ReadyKey {
                    priority: g.priority,
                    deliver_after_ms: g.deliver_after_ms,
                    key: g.key,
                });
            }
            let claims = join_all(by_shard.into_iter().map(|(id, keys)| {
                let shard = &shards[&id];
                async move { shard.claim(topic.clone(), keys).await }
            }))
            .await;
            let before = got.len();
            for r in claims {
                match r {
                    Ok(items) => got.extend(items),
                    Err(e) => last_err = Some(e),
                }
            }
            let claimed = got.len() - before;
            if claimed == winners.len() && winners.len() < need {
                break; // every shard was drained of ready items
            }
        }
        if got.is_empty() {
            if let Some(e) = last_err {
                return Err(e.into());
            }
        }
        got.sort_by_key(Item::global_key);
        Ok(got)
    }
}

/// About how many bytes `item` takes in a reply (see `limits::ITEM_WIRE_BYTES_MAX`).
fn wire_bytes(item: &Item) -> usize {
    item.payload.len() + item.metadata.len() + item.ns.len() + item.topic.len() + 256
}
