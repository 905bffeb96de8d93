//! [`Host`]: one `foqsd`'s engine over the shards it owns.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, RwLock};

use futures::future::{join_all, BoxFuture};
use tokio::task::JoinHandle;

use super::cluster::{ClusterSettings, ClusterState, Peers};
use super::prefetch::{Prefetch, PrefetchConfig};
use super::quota::QuotaBudget;
use super::validate::{check_duration, check_name, limits};
use super::{kway_merge, ActiveTopicsPage, NackRequestItem, TopicRequest};
use crate::clock::SharedClock;
use crate::config::{NamespacePolicy, Namespaces};
use crate::error::{Error, ErrorCode, Result};
use crate::model::{
    GlobalKey, Item, ItemId, ReadyKey, ShardId, ShardStatus, TopicCounts, TopicName, TopicSnapshot,
};
use crate::shard::{NackOp, Settled, ShardHandle};
use crate::waiters::Waiters;

/// `value` as a count, when it is in 1..=max.
fn in_range(what: &str, value: i32, max: i32) -> Result<usize> {
    if !(1..=max).contains(&value) {
        return Err(Error::invalid(format!(
            "{what} must be in 1..={max}, got {value}"
        )));
    }
    Ok(value as usize)
}

/// Requests carry at most ITEMS_PER_REQUEST_MAX items (or ids).
pub(super) fn check_batch(len: usize, what: &str) -> Result<()> {
    if len > limits::ITEMS_PER_REQUEST_MAX {
        return Err(Error::invalid(format!(
            "{len} {what} in one request; at most {}",
            limits::ITEMS_PER_REQUEST_MAX
        )));
    }
    Ok(())
}

/// A dead-letter page cursor: "priority:deliver_after:key:shard" of the last item shown.
fn parse_cursor(s: &str) -> Result<GlobalKey> {
    let bad = || Error::invalid(format!("malformed cursor {s:?}"));
    let parts: Vec<&str> = s.split(':').collect();
    let [p, d, k, sh] = parts.as_slice() else {
        return Err(bad());
    };
    Ok(GlobalKey {
        priority: p.parse().map_err(|_| bad())?,
        deliver_after_ms: d.parse().map_err(|_| bad())?,
        key: k.parse().map_err(|_| bad())?,
        shard: sh.parse().map_err(|_| bad())?,
    })
}

/// Sends the items at these positions of a request to the peer at this address.
type Remote<'a> = dyn Fn(String, Vec<usize>) -> BoxFuture<'a, Result<Vec<Result<()>>>> + Sync + 'a;

/// Merge-and-claim rounds per topic in one dequeue. A round comes up short only when a
/// concurrent dequeue claimed some of the same keys, so a few rounds are plenty.
const DEQUEUE_ROUNDS_MAX: usize = 4;
/// Most items one merge-and-claim asks for: the largest dequeue count.
const CLAIM_ITEMS_MAX: usize = 1000;

/// The shards a host serves now, as one snapshot: a request works on the snapshot it
/// took, while shards come and go underneath (see [`Host::add_shard`]).
pub(super) type ShardMap = Arc<BTreeMap<ShardId, ShardHandle>>;

pub struct Host {
    shards: RwLock<ShardMap>,
    pub(super) namespaces: Namespaces,
    pub(super) clock: SharedClock,
    pub(super) prefetch: Prefetch,
    waiters: Arc<Waiters>,
    pub(super) next_shard: AtomicUsize,
    workers: Mutex<HashMap<ShardId, JoinHandle<()>>>,
    pub(super) cluster: ClusterState,
}

impl Host {
    /// A host with no shards yet: they come with [`Host::add_shard`] as the shard manager
    /// gives them.
    pub fn new(
        namespaces: Namespaces,
        prefetch: PrefetchConfig,
        waiters: Arc<Waiters>,
        clock: SharedClock,
        cluster: ClusterSettings,
        peers: Arc<dyn Peers>,
        quota_budget: Arc<dyn QuotaBudget>,
    ) -> Host {
        Host {
            shards: RwLock::new(Arc::new(BTreeMap::new())),
            namespaces,
            clock,
            prefetch: Prefetch::new(prefetch),
            waiters,
            next_shard: AtomicUsize::new(0),
            workers: Mutex::new(HashMap::new()),
            cluster: ClusterState::new(cluster, peers, quota_budget),
        }
    }

    pub fn host_id(&self) -> &str {
        &self.cluster.settings.host_id
    }

    /// The shards served now.
    pub(super) fn shards(&self) -> ShardMap {
        self.shards.read().expect("not poisoned").clone()
    }

    /// Starts serving a shard whose worker was started (and its index rebuilt).
    pub fn add_shard(&self, handle: ShardHandle, worker: JoinHandle<()>) {
        let id = handle.id();
        let mut shards = self.shards.write().expect("not poisoned");
        let mut next = (**shards).clone();
        next.insert(id, handle);
        *shards = Arc::new(next);
        self.workers
            .lock()
            .expect("not poisoned")
            .insert(id, worker);
        tracing::info!(shard = id, "serving shard");
    }

    /// Stops serving a shard: no new work reaches it, its staged items go back, its
    /// worker flushes what it buffered (or fails it, retryably, when it may not write any
    /// more) and stops. Returns when the worker is gone.
    pub async fn remove_shard(&self, id: ShardId) {
        let handle = {
            let mut shards = self.shards.write().expect("not poisoned");
            let mut next = (**shards).clone();
            let handle = next.remove(&id);
            *shards = Arc::new(next);
            handle
        };
        let Some(handle) = handle else { return };
        let staged = self.prefetch.drain_shard(id);
        if !staged.is_empty() {
            if let Err(e) = handle.release(staged).await {
                tracing::warn!(shard = id, error = %e, "releasing staged items of a lost shard failed");
            }
        }
        handle.shutdown().await;
        let worker = self.workers.lock().expect("not poisoned").remove(&id);
        if let Some(w) = worker {
            let _ = w.await;
        }
        tracing::info!(shard = id, "stopped serving shard");
    }

    /// Ids of the shards served now.
    pub fn shard_ids(&self) -> Vec<ShardId> {
        self.shards().keys().copied().collect()
    }

    fn namespace(&self, ns: &str) -> Result<NamespacePolicy> {
        check_name("ns", ns)?;
        self.namespaces.get(ns).ok_or_else(|| {
            Error::new(
                ErrorCode::UnknownNamespace,
                format!("unknown namespace {ns:?}"),
            )
        })
    }

    /// Dequeues from each requested topic, most urgent first across every shard. With
    /// `wait_ms`, when nothing is ready, waits up to that long for an item to become ready
    /// in any of the topics (a long poll; waiting costs no MySQL query).
    pub async fn dequeue(
        &self,
        topics: Vec<TopicRequest>,
        wait_ms: Option<i64>,
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
        for t in topics {
            let count = in_range("count", t.count, limits::DEQUEUE_COUNT_MAX)?;
            wanted.push((self.topic_name(&t.ns, &t.topic)?, count));
        }
        let deadline =
            tokio::time::Instant::now() + std::time::Duration::from_millis(wait_ms as u64);
        loop {
            // Watch before looking, so that an item made ready between the look and the
            // wait still wakes us.
            let notifies: Vec<Arc<tokio::sync::Notify>> = if wait_ms > 0 {
                wanted.iter().map(|(t, _)| self.waiters.watch(t)).collect()
            } else {
                Vec::new()
            };
            let mut notified: Vec<_> = notifies.iter().map(|n| Box::pin(n.notified())).collect();
            for n in &mut notified {
                n.as_mut().enable();
            }
            let out = self.dequeue_once(&wanted).await?;
            if !out.is_empty() || notified.is_empty() || self.waiters.is_closing() {
                return Ok(out);
            }
            tokio::select! {
                _ = futures::future::select_all(notified) => {}
                _ = tokio::time::sleep_until(deadline) => return Ok(out),
                _ = self.waiters.closed() => return Ok(out),
            }
        }
    }

    /// Ends in-flight long polls (they return what they have: nothing) and makes new ones
    /// return at once; called when shutting down.
    pub fn stop_waiting(&self) {
        self.waiters.close();
    }

    async fn dequeue_once(&self, wanted: &[(TopicName, usize)]) -> Result<Vec<Item>> {
        // A topic whose shards fail is skipped (its items are delayed, not lost) rather
        // than failing the request and stranding what other topics already leased.
        let mut out = Vec::new();
        let mut failure = None;
        for (name, count) in wanted {
            match self.dequeue_topic(name, *count).await {
                Ok(items) => out.extend(items),
                Err(e) => failure = Some(e),
            }
        }
        match failure {
            Some(e) if out.is_empty() => Err(e),
            _ => Ok(out),
        }
    }

    /// Serves a dequeue from the prefetch buffer's stage, and claims on demand what the
    /// stage lacks, plus enough to restock it when the topic is busy.
    async fn dequeue_topic(&self, topic: &TopicName, count: usize) -> Result<Vec<Item>> {
        let taken = self.prefetch.take(topic, count, self.clock.now_ms());
        self.release(taken.release);
        let mut got = taken.items;
        if got.len() < count {
            let lock = self.prefetch.claim_lock(topic);
            let _claiming = lock.lock().await;
            // Whatever a claim finished while we waited was staged: look again first.
            let more = self
                .prefetch
                .take_more(topic, count - got.len(), self.clock.now_ms());
            self.release(more.release);
            got.extend(more.items);
            if got.len() < count {
                let want = (count - got.len() + taken.ahead).min(CLAIM_ITEMS_MAX);
                match self.claim_best(topic, want).await {
                    Ok(claimed) => got.extend(claimed),
                    Err(e) if got.is_empty() => return Err(e),
                    Err(_) => {} // serve what the stage had; the claim's items are delayed
                }
            }
            got.sort_by_key(Item::global_key);
            if got.len() > count {
                let rest = got.split_off(count);
                self.prefetch.stage(topic, rest, self.clock.now_ms());
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
            self.waiters.forget_idle();
            let (restock, release) = self.prefetch.sweep(now);
            self.release(release);
            for (topic, n) in restock {
                let lock = self.prefetch.claim_lock(&topic);
                // A dequeue claiming for this topic restocks it already.
                let Ok(_claiming) = lock.try_lock() else {
                    continue;
                };
                if let Ok(items) = self.claim_best(&topic, n.min(CLAIM_ITEMS_MAX)).await {
                    self.prefetch.stage(&topic, items, self.clock.now_ms());
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
                    .map(|s| async move { (s.id(), s.peek(topic.clone(), need).await) }),
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
                return Err(e);
            }
        }
        got.sort_by_key(Item::global_key);
        Ok(got)
    }

    /// Routes per-item operations to their shards and reassembles replies in request order.
    /// An item whose arguments already failed validation (`Err`) fails alone: it keeps its
    /// position and never reaches a shard. Items of shards owned by another host go to it
    /// through `remote` (their positions in `ids`), or fail with `WRONG_HOST` when there
    /// is no `remote` (forwarding off, or the request was forwarded already).
    async fn settle<T: Clone, F, Fut>(
        &self,
        ids: Vec<(String, Result<T>)>,
        op: F,
        remote: Option<&Remote<'_>>,
    ) -> Vec<Result<()>>
    where
        F: Fn(ShardHandle, Vec<(u64, T)>) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<Settled>>>,
    {
        let shards = self.shards();
        let mut results: Vec<Option<Result<()>>> = vec![None; ids.len()];
        // Per shard: the positions in `ids` and the keys with their extras.
        type Group<T> = (Vec<usize>, Vec<(u64, T)>);
        let mut groups: BTreeMap<ShardId, Group<T>> = BTreeMap::new();
        let mut elsewhere: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, (id, extra)) in ids.iter().enumerate() {
            let extra = match extra {
                Ok(x) => x,
                Err(e) => {
                    results[i] = Some(Err(e.clone()));
                    continue;
                }
            };
            let parsed: ItemId = match id.parse() {
                Ok(p) => p,
                Err(e) => {
                    results[i] = Some(Err(e));
                    continue;
                }
            };
            if shards.contains_key(&parsed.shard) {
                let g = groups.entry(parsed.shard).or_default();
                g.0.push(i);
                g.1.push((parsed.key, extra.clone()));
                continue;
            }
            match self
                .cluster
                .owner_for(parsed.shard, remote.is_some(), &format!("item {id}"))
            {
                Ok(addr) => elsewhere.entry(addr).or_default().push(i),
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        let local = join_all(groups.into_iter().map(|(shard, (positions, keys))| {
            let fut = op(shards[&shard].clone(), keys);
            async move { (positions, fut.await) }
        }));
        let forwarded = join_all(elsewhere.into_iter().map(|(addr, positions)| async move {
            let remote = remote.expect("only routed elsewhere with a remote");
            let r = remote(addr, positions.clone()).await;
            (positions, r)
        }));
        let (local, forwarded) = futures::join!(local, forwarded);
        for (positions, r) in local {
            for (n, pos) in positions.into_iter().enumerate() {
                results[pos] = Some(match &r {
                    Ok(settled) => match settled[n] {
                        Settled::Done => Ok(()),
                        Settled::NotFound => {
                            Err(Error::not_found(format!("item {} not found", ids[pos].0)))
                        }
                    },
                    Err(e) => Err(e.clone()),
                });
            }
        }
        for (positions, r) in forwarded {
            let n = positions.len();
            for (k, pos) in positions.into_iter().enumerate() {
                results[pos] = Some(match &r {
                    Ok(rs) if rs.len() == n => rs[k].clone(),
                    Ok(_) => Err(Error::new(
                        ErrorCode::Internal,
                        "a peer answered a different number of results",
                    )),
                    Err(e) => Err(e.clone()),
                });
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every position is filled"))
            .collect()
    }

    /// How per-item calls for another host's shards reach it, unless this request was
    /// forwarded already or forwarding is off.
    fn may_forward(&self, forwarded_by: Option<&str>) -> bool {
        forwarded_by.is_none() && self.cluster.settings.forwarding
    }

    /// Deletes each item. Unknown or already-deleted ids: `NOT_FOUND`.
    /// Ids of shards owned by another host are acked there (see [`Host::settle`]).
    pub async fn ack(
        &self,
        ids: Vec<String>,
        forwarded_by: Option<&str>,
    ) -> Result<Vec<Result<()>>> {
        check_batch(ids.len(), "ids")?;
        let remote = |addr: String, positions: Vec<usize>| -> BoxFuture<'_, _> {
            let sub = positions.iter().map(|&p| ids[p].clone()).collect();
            Box::pin(async move { self.cluster.peers.ack(&addr, sub, self.host_id()).await })
        };
        let checked = ids.iter().map(|id| (id.clone(), Ok(()))).collect();
        let remote: Option<&Remote> = self.may_forward(forwarded_by).then_some(&remote);
        Ok(self
            .settle(
                checked,
                |shard, keys| async move {
                    shard.ack(keys.into_iter().map(|(k, _)| k).collect()).await
                },
                remote,
            )
            .await)
    }

    /// Makes each leased item ready again after its delay, with new metadata when given.
    pub async fn nack(
        &self,
        items: Vec<NackRequestItem>,
        forwarded_by: Option<&str>,
    ) -> Result<Vec<Result<()>>> {
        check_batch(items.len(), "items")?;
        let remote = |addr: String, positions: Vec<usize>| -> BoxFuture<'_, _> {
            let sub = positions.iter().map(|&p| items[p].clone()).collect();
            Box::pin(async move { self.cluster.peers.nack(&addr, sub, self.host_id()).await })
        };
        let remote: Option<&Remote> = self.may_forward(forwarded_by).then_some(&remote);
        let checked = items
            .iter()
            .cloned()
            .map(|it| {
                let delay = it.delay_ms.unwrap_or(0);
                let ok = check_duration("delay_ms", delay).and_then(|()| match &it.metadata {
                    Some(m) if m.len() > limits::METADATA_BYTES_MAX => Err(Error::new(
                        ErrorCode::PayloadTooLarge,
                        format!(
                            "metadata is {} bytes; at most {}",
                            m.len(),
                            limits::METADATA_BYTES_MAX
                        ),
                    )),
                    _ => Ok((delay, it.metadata, it.to_dlq)),
                });
                (it.id, ok)
            })
            .collect();
        Ok(self
            .settle(
                checked,
                |shard, nacks| async move {
                    shard
                        .nack(
                            nacks
                                .into_iter()
                                .map(|(key, (delay_ms, metadata, to_dlq))| NackOp {
                                    key,
                                    delay_ms,
                                    metadata,
                                    to_dlq,
                                })
                                .collect(),
                        )
                        .await
                },
                remote,
            )
            .await)
    }

    fn topic_name(&self, ns: &str, topic: &str) -> Result<TopicName> {
        self.namespace(ns)?;
        check_name("topic", topic)?;
        Ok(TopicName {
            ns: ns.to_string(),
            topic: topic.to_string(),
        })
    }

    /// A page of a topic's dead items in delivery order, each with the time it died, and
    /// the cursor of the next page (an opaque string; absent on the last page).
    pub async fn dlq_list(
        &self,
        ns: &str,
        topic: &str,
        limit: Option<i32>,
        after: Option<String>,
    ) -> Result<(Vec<(Item, i64)>, Option<String>)> {
        let topic = self.topic_name(ns, topic)?;
        let limit = in_range(
            "limit",
            limit.unwrap_or(limits::DLQ_PAGE_DEFAULT),
            limits::DLQ_PAGE_MAX,
        )?;
        let cursor = after.as_deref().map(parse_cursor).transpose()?;
        // Each shard's page starts right after the cursor in the global order (ties on
        // (priority, deliver_after, key) go to the lower shard id).
        let shards = self.shards();
        let pages = join_all(shards.values().map(|s| {
            let after = cursor.and_then(|c| {
                if s.id() <= c.shard {
                    Some(ReadyKey {
                        priority: c.priority,
                        deliver_after_ms: c.deliver_after_ms,
                        key: c.key,
                    })
                } else {
                    Some(ReadyKey {
                        priority: c.priority,
                        deliver_after_ms: c.deliver_after_ms,
                        key: c.key.checked_sub(1)?,
                    })
                }
            });
            s.dead_items(topic.clone(), after, limit + 1)
        }))
        .await;
        let mut all = Vec::new();
        for p in pages {
            all.extend(p?);
        }
        all.sort_by_key(|(i, _)| i.global_key());
        let more = all.len() > limit;
        all.truncate(limit);
        let next = if more {
            all.last().map(|(i, _)| {
                let g = i.global_key();
                format!(
                    "{}:{}:{}:{}",
                    g.priority, g.deliver_after_ms, g.key, g.shard
                )
            })
        } else {
            None
        };
        Ok((all, next))
    }

    /// A topic's counts, totals and the age of its oldest ready item, over every shard.
    pub async fn topic_stats(&self, ns: &str, topic: &str) -> Result<(TopicSnapshot, i64)> {
        let topic = self.topic_name(ns, topic)?;
        let shards = self.shards();
        let snaps = join_all(shards.values().map(|s| s.topic_snapshot(topic.clone()))).await;
        let mut all = TopicSnapshot::default();
        for s in snaps {
            let s = s?;
            all.ready += s.ready;
            all.deferred += s.deferred;
            all.leased += s.leased;
            all.dead += s.dead;
            all.oldest_ready_ms = [all.oldest_ready_ms, s.oldest_ready_ms]
                .into_iter()
                .flatten()
                .min();
            all.totals.add(&s.totals);
        }
        // Staged items are leased rows, but ready as far as clients can tell.
        let (staged, staged_oldest) = self.prefetch.staged_summary(&topic);
        let staged = staged.min(all.leased);
        all.leased -= staged;
        all.ready += staged;
        all.oldest_ready_ms = [all.oldest_ready_ms, staged_oldest]
            .into_iter()
            .flatten()
            .min();
        let age = all
            .oldest_ready_ms
            .map_or(0, |t| (self.clock.now_ms() - t).max(0));
        Ok((all, age))
    }

    /// Makes dead items ready again with their delivery count reset; an id that is not a
    /// dead item gets `NOT_FOUND`.
    /// Ids of shards owned by another host get `WRONG_HOST` (ask that host).
    pub async fn dlq_requeue(&self, ids: Vec<String>) -> Result<Vec<Result<()>>> {
        check_batch(ids.len(), "ids")?;
        let ids = ids.into_iter().map(|id| (id, Ok(()))).collect();
        Ok(self
            .settle(
                ids,
                |shard, keys| async move {
                    shard
                        .revive(keys.into_iter().map(|(k, _)| k).collect())
                        .await
                },
                None,
            )
            .await)
    }

    /// Makes up to `max` (default: all) of a topic's dead items ready again, in batches;
    /// returns how many.
    pub async fn dlq_requeue_all(&self, ns: &str, topic: &str, max: Option<i64>) -> Result<i64> {
        let topic = self.topic_name(ns, topic)?;
        let max = max.unwrap_or(i64::MAX);
        if max < 0 {
            return Err(Error::invalid(format!("max must be >= 0, got {max}")));
        }
        let mut done = 0i64;
        for shard in self.shards().values() {
            loop {
                let n = (max - done).min(limits::DLQ_BATCH as i64) as usize;
                if n == 0 {
                    return Ok(done);
                }
                let got = shard.revive_some(topic.clone(), n).await?;
                done += got as i64;
                if (got as usize) < n {
                    break;
                }
            }
        }
        Ok(done)
    }

    /// Deletes all of a topic's dead items, in batches; returns how many.
    pub async fn dlq_purge(&self, ns: &str, topic: &str) -> Result<i64> {
        let topic = self.topic_name(ns, topic)?;
        let mut done = 0i64;
        for shard in self.shards().values() {
            loop {
                let got = shard.purge_some(topic.clone(), limits::DLQ_BATCH).await?;
                done += got as i64;
                if got < limits::DLQ_BATCH as u64 {
                    break;
                }
            }
        }
        Ok(done)
    }

    /// The next `count` ready items of a topic in delivery order, without leasing them:
    /// staged items and the shards' index heads, merged.
    pub async fn peek(&self, ns: &str, topic: &str, count: i32) -> Result<Vec<Item>> {
        let topic = self.topic_name(ns, topic)?;
        let count = in_range("count", count, limits::DEQUEUE_COUNT_MAX)?;
        // Under the topic's claim lock no claim is in flight, so no item is between the
        // shards' indexes and the stage, invisible to both.
        let lock = self.prefetch.claim_lock(&topic);
        let _claiming = lock.lock().await;
        let mut items = self.prefetch.peek(&topic, count, self.clock.now_ms());
        let shards = self.shards();
        let healthy: Vec<&ShardHandle> = shards.values().filter(|s| s.is_healthy()).collect();
        let heads = join_all(
            healthy
                .iter()
                .map(|s| async { (s.id(), s.peek(topic.clone(), count).await) }),
        )
        .await;
        let heads: Vec<(ShardId, Vec<ReadyKey>)> = heads
            .into_iter()
            .filter_map(|(id, r)| r.ok().map(|k| (id, k)))
            .collect();
        let mut by_shard: HashMap<ShardId, Vec<u64>> = HashMap::new();
        for g in kway_merge(&heads, count) {
            by_shard.entry(g.shard).or_default().push(g.key);
        }
        let fetched = join_all(
            by_shard
                .into_iter()
                .map(|(id, keys)| shards[&id].fetch_ready(keys)),
        )
        .await;
        for r in fetched {
            items.extend(r?);
        }
        items.sort_by_key(Item::global_key);
        items.truncate(count);
        Ok(items)
    }

    /// Extends the leases of items still leased to now + `extend_ms`; an item that is not
    /// leased (acked, expired, never delivered) gets `NOT_FOUND`.
    pub async fn touch(
        &self,
        items: Vec<(String, i64)>,
        forwarded_by: Option<&str>,
    ) -> Result<Vec<Result<()>>> {
        check_batch(items.len(), "items")?;
        let remote = |addr: String, positions: Vec<usize>| -> BoxFuture<'_, _> {
            let sub = positions.iter().map(|&p| items[p].clone()).collect();
            Box::pin(async move { self.cluster.peers.touch(&addr, sub, self.host_id()).await })
        };
        let remote: Option<&Remote> = self.may_forward(forwarded_by).then_some(&remote);
        let checked = items
            .iter()
            .cloned()
            .map(|(id, extend_ms)| {
                let ok = check_duration("extend_ms", extend_ms).and_then(|()| match extend_ms {
                    0 => Err(Error::invalid("extend_ms must be > 0")),
                    _ => Ok(extend_ms),
                });
                (id, ok)
            })
            .collect();
        Ok(self
            .settle(
                checked,
                |shard, ops| async move { shard.touch(ops).await },
                remote,
            )
            .await)
    }

    /// The namespace's topics holding ready, deferred or leased items on this host's
    /// shards, sorted by name.
    pub(super) async fn local_active_topics(
        &self,
        ns: &str,
        limit: Option<i32>,
        after: Option<String>,
    ) -> Result<ActiveTopicsPage> {
        self.namespace(ns)?;
        let limit = in_range(
            "limit",
            limit.unwrap_or(limits::ACTIVE_TOPICS_LIMIT_DEFAULT),
            limits::ACTIVE_TOPICS_LIMIT_MAX,
        )?;
        // Each shard returns its first limit + 1 topics after the cursor; every topic among
        // the first limit + 1 overall is then in the list of every shard that holds it, so
        // its summed counts are complete.
        let shards = self.shards();
        let pages = join_all(
            shards
                .values()
                .map(|s| s.topic_counts(ns.to_string(), after.clone(), limit + 1)),
        )
        .await;
        let mut merged: BTreeMap<String, TopicCounts> = BTreeMap::new();
        for page in pages {
            for t in page? {
                let m = merged
                    .entry(t.topic.clone())
                    .or_insert_with(|| TopicCounts {
                        topic: t.topic.clone(),
                        ..Default::default()
                    });
                m.ready += t.ready;
                m.deferred += t.deferred;
                m.leased += t.leased;
            }
        }
        // Staged items are leased in MySQL but nobody holds them: they count as ready.
        for (topic, n) in self.prefetch.staged_counts(ns) {
            if let Some(m) = merged.get_mut(&topic) {
                let n = n.min(m.leased);
                m.leased -= n;
                m.ready += n;
            }
        }
        let more = merged.len() > limit;
        let topics: Vec<TopicCounts> = merged.into_values().take(limit).collect();
        let next_after = if more {
            topics.last().map(|t| t.topic.clone())
        } else {
            None
        };
        Ok(ActiveTopicsPage { topics, next_after })
    }

    pub fn shard_status(&self) -> Vec<ShardStatus> {
        self.shards().values().map(|s| s.status()).collect()
    }

    /// Flushes every shard's buffers, saves checkpoints and stops the workers. Call after
    /// the server has stopped taking requests.
    pub async fn shutdown(&self) {
        // Staged items go back before the workers stop, so none waits for its lease.
        let shards = self.shards();
        let shards = &shards;
        let mut by_shard: HashMap<ShardId, Vec<Item>> = HashMap::new();
        for i in self.prefetch.drain() {
            by_shard.entry(i.id.shard).or_default().push(i);
        }
        join_all(by_shard.into_iter().map(|(id, items)| async move {
            let Some(shard) = shards.get(&id) else { return };
            if let Err(e) = shard.release(items).await {
                tracing::warn!(shard = id, error = %e, "releasing staged items at shutdown failed");
            }
        }))
        .await;
        join_all(shards.values().map(|s| s.shutdown())).await;
        let workers = std::mem::take(&mut *self.workers.lock().expect("not poisoned"));
        for w in workers.into_values() {
            let _ = w.await;
        }
    }
}
