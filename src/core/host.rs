//! [`Host`]: one `foqsd`'s engine over the shards it owns.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, RwLock};

use futures::future::join_all;
use tokio::task::JoinHandle;

use super::access::{Access, Caller, Kind};
use super::peers::{ClusterSettings, ClusterState, Peers};
use super::prefetch::{Prefetch, PrefetchConfig};
use super::validate::{check_name, limits};
use super::{kway_merge, TopicRequest};
use crate::clock::SharedClock;
use crate::config::{NamespacePolicy, Namespaces};
use crate::error::{Error, ErrorCode, Result};
use crate::metrics::{ItemEvent, Metrics};
use crate::model::{Item, ReadyKey, ShardId, ShardStatus, TopicName};
use crate::quota::QuotaBudget;
use crate::shard::ShardHandle;
use crate::waiters::Waiters;

/// `value` as a count, when it is in 1..=max.
pub(super) fn in_range(what: &str, value: i32, max: i32) -> Result<usize> {
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

/// Merge-and-claim rounds per topic in one dequeue. A round comes up short only when a
/// concurrent dequeue claimed some of the same keys, so a few rounds are plenty.
const DEQUEUE_ROUNDS_MAX: usize = 4;
/// Most items one merge-and-claim asks for: the largest dequeue count.
const CLAIM_ITEMS_MAX: usize = 1000;

/// The shards a host serves now, as one snapshot: a request works on the snapshot it
/// took, while shards come and go underneath (see [`Host::add_shard`]).
pub(super) type ShardMap = Arc<BTreeMap<ShardId, ShardHandle>>;

/// What a [`Host`] is made of.
pub struct HostParts {
    pub namespaces: Namespaces,
    pub prefetch: PrefetchConfig,
    pub waiters: Arc<Waiters>,
    pub clock: SharedClock,
    pub cluster: ClusterSettings,
    pub peers: Arc<dyn Peers>,
    pub quota_budget: Arc<dyn QuotaBudget>,
    pub access: Access,
    pub metrics: Arc<Metrics>,
    /// How long one `dlqRequeueAll` or `dlqPurge` works before it answers `more`.
    pub dlq_call_bound: std::time::Duration,
    /// The same for one that a peer routed here: half the peers' call timeout.
    pub dlq_routed_bound: std::time::Duration,
    /// Drives the replicated shards' switches (absent: no shard has replicas).
    pub switchboard: Option<Arc<dyn crate::replication::Switchboard>>,
    /// How long an enqueue waits for this host's shards while a switch pauses them.
    pub enqueue_hold: std::time::Duration,
}

pub struct Host {
    shards: RwLock<ShardMap>,
    pub(super) namespaces: Namespaces,
    pub(super) clock: SharedClock,
    pub(super) prefetch: Arc<Prefetch>,
    pub(super) waiters: Arc<Waiters>,
    pub(super) next_shard: AtomicUsize,
    workers: Mutex<HashMap<ShardId, JoinHandle<()>>>,
    /// Leases that a dead worker's claims left with nobody (see `remove_shard`), for the
    /// shard's next worker here.
    unseen: Mutex<HashMap<ShardId, Vec<(u64, i64)>>>,
    /// Held (shared) by every dequeue and restock while it claims, stages and hands out;
    /// a shard's removal takes it alone once the shard is out of the map, so that no item
    /// claimed on the shard is left in flight, leased by nobody (see `remove_shard`).
    claiming: tokio::sync::RwLock<()>,
    pub(super) cluster: ClusterState,
    pub(super) access: Access,
    metrics: Arc<Metrics>,
    pub(super) dlq_call_bound: std::time::Duration,
    pub(super) dlq_routed_bound: std::time::Duration,
    pub(super) switchboard: Option<Arc<dyn crate::replication::Switchboard>>,
    pub(super) enqueue_hold: std::time::Duration,
}

impl Host {
    /// A host with no shards yet: they come with [`Host::add_shard`] as the shard manager
    /// gives them.
    pub fn new(p: HostParts) -> Host {
        let prefetch = Arc::new(Prefetch::new(p.prefetch));
        {
            // What enqueues hand to waiting consumers is staged for their dequeues.
            let (prefetch, clock) = (prefetch.clone(), p.clock.clone());
            p.waiters
                .demand()
                .set_sink(Arc::new(move |topic: &TopicName, items: Vec<Item>| {
                    prefetch.stage_handed(topic, items, clock.now_ms())
                }));
        }
        Host {
            shards: RwLock::new(Arc::new(BTreeMap::new())),
            namespaces: p.namespaces,
            clock: p.clock,
            prefetch,
            waiters: p.waiters,
            next_shard: AtomicUsize::new(0),
            workers: Mutex::new(HashMap::new()),
            unseen: Mutex::new(HashMap::new()),
            claiming: tokio::sync::RwLock::new(()),
            cluster: ClusterState::new(p.cluster, p.peers, p.quota_budget),
            access: p.access,
            metrics: p.metrics,
            dlq_call_bound: p.dlq_call_bound,
            dlq_routed_bound: p.dlq_routed_bound,
            switchboard: p.switchboard,
            enqueue_hold: p.enqueue_hold,
        }
    }

    /// A host with no shards and no peers, that accepts any namespace: every call is
    /// validated and then finds no storage. For tests and fuzzing of the layers above the
    /// core (decoding, dispatch, validation); long polls return at once.
    pub fn detached(clock: SharedClock) -> Host {
        let cfg = crate::config::Config::default();
        let host = Host::new(HostParts {
            namespaces: Namespaces::from_config(&cfg),
            prefetch: PrefetchConfig {
                window_ms: 100,
                items_max: 1000,
                stage_max_ms: 1000,
            },
            waiters: Waiters::new(),
            clock: clock.clone(),
            cluster: ClusterSettings {
                host_id: "detached".into(),
                addr: "127.0.0.1:0".into(),
                tier: crate::model::TIER_DEFAULT.into(),
                manager: "single",
                serves_all_tiers: true,
                forwarding: false,
                tier_shards: Default::default(),
            },
            peers: Arc::new(super::peers::NoPeers),
            quota_budget: Arc::new(crate::quota::LocalBudget::new(1, clock)),
            access: Access::default(),
            metrics: Arc::new(Metrics::new()),
            dlq_call_bound: std::time::Duration::from_secs(5),
            dlq_routed_bound: std::time::Duration::from_secs(1),
            switchboard: None,
            enqueue_hold: std::time::Duration::ZERO,
        });
        host.stop_waiting();
        host
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Fails with `PERMISSION_DENIED` unless `caller` may make a call of `kind` in `ns`.
    pub(super) fn allow(&self, caller: &Caller, ns: &str, kind: Kind) -> Result<()> {
        self.access.check(caller, ns, kind)
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
        self.prefetch.open_shard(id);
        // Its worker was given the dead predecessor's unseen leases when it started
        // (`unseen_leases`); the record is done with.
        let unseen = self
            .unseen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        if let Some(leases) = unseen {
            tracing::info!(
                shard = id,
                leases = leases.len(),
                "the new worker took over leases nobody was handed"
            );
        }
        {
            let mut shards = self.shards.write().expect("not poisoned");
            let mut next = (**shards).clone();
            next.insert(id, handle);
            *shards = Arc::new(next);
        }
        self.workers
            .lock()
            .expect("not poisoned")
            .insert(id, worker);
        tracing::info!(shard = id, "serving shard");
    }

    /// Leases a dead worker of shard `id` left with nobody (kept until the shard's next
    /// worker here is added), for that worker to know before it runs.
    /// `None`: the shard's previous worker here (if any) stopped cleanly.
    pub fn unseen_leases(&self, id: ShardId) -> Option<Vec<(u64, i64)>> {
        self.unseen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    /// Stops serving a shard: no new work reaches it, its staged items go back, its
    /// worker flushes what it buffered (or fails it, retryably, when it may not write any
    /// more) and stops. Returns when the worker is gone.
    pub async fn remove_shard(&self, id: ShardId) {
        self.stop_shard(id, None).await
    }

    /// [`Host::remove_shard`] for a shard whose storage is gone for good (its primary was
    /// fenced for a failover): nothing is written to it on the way out (staged items are
    /// left as leases nobody was handed, for a successor here), and the stop waits for the
    /// worker's last writes at most `bound` (they fail on their own later).
    pub async fn abandon_shard(&self, id: ShardId, bound: std::time::Duration) {
        self.stop_shard(id, Some(bound)).await
    }

    async fn stop_shard(&self, id: ShardId, abandon: Option<std::time::Duration>) {
        let handle = {
            let mut shards = self.shards.write().expect("not poisoned");
            let mut next = (**shards).clone();
            let handle = next.remove(&id);
            *shards = Arc::new(next);
            handle
        };
        let Some(handle) = handle else { return };
        // Dequeues already claiming may still get items of this shard: wait for them to
        // hand those out (through the map they started with) or stage them, so that the
        // drain below finds every one nobody was handed.
        drop(self.claiming.write().await);
        let staged = self.prefetch.drain_shard(id);
        let mut released = staged.is_empty();
        if !staged.is_empty() && abandon.is_none() {
            match handle.release(staged).await {
                Ok(()) => released = true,
                Err(e) => {
                    tracing::warn!(shard = id, error = %e, "releasing staged items of a lost shard failed")
                }
            }
        }
        // A worker that died (or could not release) leaves leases that nobody was handed:
        // the staged items and the claims whose outcome it never learned. Its successor
        // here gives them back uncounted when they end, as this one would have; without
        // that, each would count as a delivery (an at-most-once item deleted unseen, an
        // attempt used up).
        // (Recorded even when there are none: the successor also doubts what the dead
        // worker's last writes did, see `ShardWorker::start_inheriting`.)
        if !released || !handle.is_alive() {
            let leases = handle.unseen_leases();
            self.unseen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, leases);
        }
        let worker = self.workers.lock().expect("not poisoned").remove(&id);
        let stop = async {
            handle.shutdown().await;
            if let Some(w) = worker {
                let _ = w.await;
            }
        };
        match abandon {
            None => stop.await,
            Some(bound) => {
                if tokio::time::timeout(bound, stop).await.is_err() {
                    tracing::warn!(shard = id, "abandoned shard: its worker's last writes to the fenced storage are left to fail");
                }
            }
        }
        // What the worker's last turns left leased by nobody (a release that failed on
        // the way out, a claim or hand-off whose outcome it never learned): a successor
        // here gives those back uncounted too.
        let left = handle.unseen_leases();
        if !left.is_empty() {
            let mut unseen = self.unseen.lock().unwrap_or_else(|p| p.into_inner());
            let known = unseen.entry(id).or_default();
            for l in left {
                if !known.contains(&l) {
                    known.push(l);
                }
            }
        }
        tracing::info!(shard = id, "stopped serving shard");
    }

    /// Ids of the shards served now.
    pub fn shard_ids(&self) -> Vec<ShardId> {
        self.shards().keys().copied().collect()
    }

    pub(super) fn namespace(&self, ns: &str) -> Result<NamespacePolicy> {
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
    /// in any of the topics (a long poll; waiting costs no storage query).
    /// Dequeues across the namespace's tier (see `routing.rs`), or from this host's
    /// shards only with `local_only`.
    pub async fn dequeue(
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
        for t in topics {
            self.allow(caller, &t.ns, Kind::Consume)?;
            let count = in_range("count", t.count, limits::DEQUEUE_COUNT_MAX)?;
            wanted.push((self.topic_name(&t.ns, &t.topic)?, count));
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
                wanted.iter().map(|(t, _)| self.waiters.watch(t)).collect()
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
                    .map(|(t, _)| self.waiters.demand().epoch(t))
                    .collect()
            } else {
                Vec::new()
            };
            let out = self.dequeue_once(&wanted, local_only).await?;
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
                .map(|((t, count), since)| self.waiters.demand().park(t, *count, *since))
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
        wanted: &[(TopicName, usize)],
        local_only: bool,
    ) -> Result<Vec<Item>> {
        // A topic whose shards fail is skipped (its items are delayed, not lost) rather
        // than failing the request and stranding what other topics already leased.
        let mut out = Vec::new();
        let mut failure = None;
        for (name, count) in wanted {
            match self.dequeue_across(name, *count, local_only).await {
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
    /// stage lacks, plus enough to restock it when the topic is busy. Items are handed out
    /// through their shards, which drop any that an ack, nack or expiry settled since they
    /// were claimed; when that leaves the reply short, it gathers again.
    pub(super) async fn dequeue_topic(&self, topic: &TopicName, count: usize) -> Result<Vec<Item>> {
        let mut out: Vec<Item> = Vec::new();
        // The shards as this dequeue found them: an item claimed on a shard that is being
        // removed meanwhile is still handed out through it (its lease is real).
        let _claiming = self.claiming.read().await;
        let shards = self.shards();
        for round in 0..DEQUEUE_ROUNDS_MAX {
            let gathered = match self.gather(topic, count - out.len(), round == 0).await {
                Ok(g) => g,
                Err(e) if out.is_empty() => return Err(e),
                Err(_) => break,
            };
            let n = gathered.len();
            let delivered = self.hand_out(&shards, gathered);
            let short = delivered.len() < n;
            out.extend(delivered);
            if !short || out.len() >= count {
                break;
            }
        }
        out.sort_by_key(Item::global_key);
        Ok(out)
    }

    /// Hands claimed items to a consumer: each shard keeps those still waiting under
    /// their claim (see [`crate::shard::Staged`]) and drops the rest.
    ///
    /// An item whose lease has already ended (its claim was slow to come back, under a
    /// stalled store) is not handed out: it stays staged, and the shard's scan gives it
    /// back uncounted, instead of reaching a consumer on a lease that another consumer may
    /// already hold.
    fn hand_out(&self, shards: &ShardMap, items: Vec<Item>) -> Vec<Item> {
        let now = self.clock.now_ms();
        let mut by_shard: BTreeMap<ShardId, Vec<Item>> = BTreeMap::new();
        for i in items.into_iter().filter(|i| i.lease_expires_ms > now) {
            by_shard.entry(i.id.shard).or_default().push(i);
        }
        let delivered: Vec<Item> = by_shard
            .into_iter()
            .filter_map(|(id, items)| Some(shards.get(&id)?.hand_out(items)))
            .flatten()
            .collect();
        if let Some(first) = delivered.first() {
            // A dequeue's items are of one topic.
            self.metrics
                .item_event(&first.ns, ItemEvent::Delivered, delivered.len() as u64);
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
                    tracing::warn!(shard = id, error = %e, "release of at-most-once items failed");
                }
            }
        }))
        .await;
    }

    /// Up to `count` claimed items for one dequeue: staged ones first, then claimed on
    /// demand; `first` counts the dequeue's demand (only once per dequeue).
    async fn gather(&self, topic: &TopicName, count: usize, first: bool) -> Result<Vec<Item>> {
        let taken = if first {
            self.prefetch.take(topic, count, self.clock.now_ms())
        } else {
            self.prefetch.take_more(topic, count, self.clock.now_ms())
        };
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
                return Err(e.into());
            }
        }
        got.sort_by_key(Item::global_key);
        Ok(got)
    }

    pub(super) fn topic_name(&self, ns: &str, topic: &str) -> Result<TopicName> {
        self.namespace(ns)?;
        check_name("topic", topic)?;
        Ok(TopicName {
            ns: ns.to_string(),
            topic: topic.to_string(),
        })
    }

    pub fn shard_status(&self) -> Vec<ShardStatus> {
        self.shards().values().map(|s| s.status()).collect()
    }

    /// Flushes every shard's buffers, saves checkpoints and stops the workers, each shard
    /// on its own within `within`: a shard whose storage hangs is left behind (logged)
    /// rather than holding the stop for ever, or the other shards' time. What that costs:
    /// a confirmed write is committed; its staged items were not given back, so they come
    /// back as after a crash, when their leases end (an at-least-once item counted as an
    /// attempt, an at-most-once one deleted as delivered). Call after the server has
    /// stopped taking requests.
    pub async fn shutdown(&self, within: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + within;
        let shards = self.shards();
        let mut staged: HashMap<ShardId, Vec<Item>> = HashMap::new();
        for i in self.prefetch.drain() {
            staged.entry(i.id.shard).or_default().push(i);
        }
        // Each shard gives its staged items back (so none waits for its lease), then
        // stops; one that hangs uses up only its own time.
        join_all(shards.iter().map(|(&id, shard)| {
            let items = staged.remove(&id).unwrap_or_default();
            async move {
                let stop = async {
                    if !items.is_empty() {
                        if let Err(e) = shard.release(items).await {
                            tracing::warn!(shard = id, error = %e, "releasing staged items at shutdown failed");
                        }
                    }
                    shard.shutdown().await;
                };
                if tokio::time::timeout_at(deadline, stop).await.is_err() {
                    tracing::warn!(shard = id, "the shard's worker did not stop in time; left behind");
                }
            }
        }))
        .await;
        let workers = std::mem::take(&mut *self.workers.lock().expect("not poisoned"));
        for (id, w) in workers {
            if tokio::time::timeout_at(deadline, w).await.is_err() {
                tracing::warn!(
                    shard = id,
                    "the shard's worker did not end in time; left behind"
                );
            }
        }
    }
}
