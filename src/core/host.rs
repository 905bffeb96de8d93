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
use crate::clock::SharedClock;
use crate::config::{NamespacePolicy, Namespaces};
use crate::error::{Error, ErrorCode, Result};
use crate::metrics::Metrics;
use crate::model::{Item, ShardId, ShardStatus, TopicName};
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
    /// The bounds of the work shared among namespaces (see `crate::fair`).
    pub fair: crate::fair::Limits,
    /// `engine.overload_cpu_busy` (see `crate::overload`).
    pub overload_cpu_busy: f64,
    /// `engine.best_effort_nice` (see `tenants`).
    pub best_effort_nice: i32,
    /// How much one dequeue reply may carry (`server.reply_items_max`, `reply_bytes_max`).
    pub reply_bounds: ReplyBounds,
    /// `server.listing_calls_per_caller_max` (see `listing.rs`).
    pub listing_calls_per_caller_max: usize,
}

/// How much one dequeue reply may carry: claiming stops before it would pass either.
#[derive(Debug, Clone, Copy)]
pub struct ReplyBounds {
    pub items_max: usize,
    pub bytes_max: usize,
}

/// A shard's worker held for a switch (see [`Host::hold_shard`]).
struct Held {
    handle: ShardHandle,
    worker: JoinHandle<()>,
    resume: tokio::sync::oneshot::Sender<crate::shard::Resume>,
}

pub struct Host {
    shards: RwLock<ShardMap>,
    pub(super) namespaces: Namespaces,
    pub(super) clock: SharedClock,
    pub(super) prefetch: Arc<Prefetch>,
    pub(super) waiters: Arc<Waiters>,
    pub(super) next_shard: AtomicUsize,
    workers: Mutex<HashMap<ShardId, JoinHandle<()>>>,
    /// Shards out of the map whose workers are held for a switch (see `hold_shard`).
    held: Mutex<HashMap<ShardId, Held>>,
    /// Leases that a dead worker's claims left with nobody (see `remove_shard`), for the
    /// shard's next worker here.
    unseen: Mutex<HashMap<ShardId, Vec<(u64, i64)>>>,
    /// Held (shared) by every dequeue and restock while it claims, stages and hands out;
    /// a shard's removal takes it alone once the shard is out of the map, so that no item
    /// claimed on the shard is left in flight, leased by nobody (see `remove_shard`).
    pub(super) claiming: tokio::sync::RwLock<()>,
    pub(super) cluster: ClusterState,
    pub(super) access: Access,
    pub(super) metrics: Arc<Metrics>,
    pub(super) dlq_call_bound: std::time::Duration,
    pub(super) dlq_routed_bound: std::time::Duration,
    pub(super) switchboard: Option<Arc<dyn crate::replication::Switchboard>>,
    /// Enqueues and dequeues share the shards among namespaces through it.
    pub(super) fair: Arc<crate::fair::FairGate>,
    /// When a namespace with a guaranteed rate last enqueued here (see `tenants`).
    pub(super) guaranteed_at: std::sync::atomic::AtomicI64,
    /// Sheds enqueues of namespaces without a guarantee while the CPUs are saturated.
    pub(super) shedder: crate::overload::Shedder,
    pub(super) best_effort_nice: i32,
    pub(super) reply_bounds: ReplyBounds,
    pub(super) listing: super::listing::ListingGate,
    /// Some shard's threads were last asked to run lowered (see `tenants`).
    pub(super) lowered: std::sync::atomic::AtomicBool,
    pub(super) enqueue_hold: std::time::Duration,
}

impl Host {
    /// A host with no shards yet: they come with [`Host::add_shard`] as the shard manager
    /// gives them.
    pub fn new(p: HostParts) -> Host {
        let prefetch = Arc::new(Prefetch::new(p.prefetch));
        // The fair gate's bounds, fixed for the host's life (what waits: `fair_turn`).
        let fair = crate::fair::FairGate::new(p.fair);
        let l = fair.limits();
        p.metrics.fair_waiting_max.set(l.waiting_max as i64);
        p.metrics
            .fair_waiting_bytes_max
            .set(l.waiting_bytes_max as i64);
        p.metrics.fair_slots.set(l.slots as i64);
        {
            // What enqueues hand to waiting consumers is staged for their dequeues, as
            // far as the topic's stage has room.
            let (prefetch, clock) = (prefetch.clone(), p.clock.clone());
            let room = prefetch.clone();
            p.waiters.demand().set_sink(
                Arc::new(move |topic: &TopicName, items: Vec<Item>| {
                    prefetch.stage_handed(topic, items, clock.now_ms())
                }),
                Arc::new(move |topic: &TopicName| room.room(topic)),
            );
        }
        Host {
            shards: RwLock::new(Arc::new(BTreeMap::new())),
            namespaces: p.namespaces,
            clock: p.clock,
            prefetch,
            waiters: p.waiters,
            next_shard: AtomicUsize::new(0),
            workers: Mutex::new(HashMap::new()),
            held: Mutex::new(HashMap::new()),
            unseen: Mutex::new(HashMap::new()),
            claiming: tokio::sync::RwLock::new(()),
            cluster: ClusterState::new(p.cluster, p.peers, p.quota_budget),
            access: p.access,
            metrics: p.metrics,
            dlq_call_bound: p.dlq_call_bound,
            dlq_routed_bound: p.dlq_routed_bound,
            switchboard: p.switchboard,
            enqueue_hold: p.enqueue_hold,
            fair,
            guaranteed_at: std::sync::atomic::AtomicI64::new(i64::MIN / 2),
            shedder: crate::overload::Shedder::new(p.overload_cpu_busy),
            best_effort_nice: if p.best_effort_nice > 0 && !crate::store::can_lower_and_restore() {
                tracing::warn!(
                    "engine.best_effort_nice is set but this process may not raise a thread's \
                     priority back once lowered (it needs CAP_SYS_NICE or RLIMIT_NICE): the \
                     shards' threads keep their priority"
                );
                0
            } else {
                p.best_effort_nice
            },
            lowered: std::sync::atomic::AtomicBool::new(false),
            reply_bounds: p.reply_bounds,
            listing: super::listing::ListingGate::new(p.listing_calls_per_caller_max),
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
                in_doubt_max: std::time::Duration::from_secs(2),
                tier_shards: Default::default(),
                peer_fanout: crate::cluster::config::PEER_FANOUT_DEFAULT,
                clock_check: Arc::new(crate::cluster::ClockCheck::new(
                    cfg.cluster.clock_skew_max_ms,
                )),
            },
            peers: Arc::new(super::peers::NoPeers),
            quota_budget: Arc::new(crate::quota::LocalBudget::new(1, clock)),
            access: Access::default(),
            metrics: Arc::new(Metrics::new()),
            dlq_call_bound: std::time::Duration::from_secs(5),
            dlq_routed_bound: std::time::Duration::from_secs(1),
            switchboard: None,
            enqueue_hold: std::time::Duration::ZERO,
            fair: crate::fair::Limits::from_engine(&cfg.engine),
            overload_cpu_busy: 0.0,
            best_effort_nice: 0,
            reply_bounds: ReplyBounds {
                items_max: cfg.server.reply_items_max,
                bytes_max: cfg.server.reply_bytes_max,
            },
            listing_calls_per_caller_max: cfg.server.listing_calls_per_caller_max,
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
        self.stop_or_hold(id, abandon, false).await;
    }

    /// Stops serving a shard for a planned switch of its replica set, keeping its worker
    /// and all it knows: as [`Host::remove_shard`] (no new work reaches it, its staged
    /// items go back, what it put off is written, its checkpoints saved), but the worker
    /// then waits, held, for [`Host::resume_shard`] on the new primary, or
    /// [`Host::drop_held`]. A switch then costs the shard no reopen (its schema checks,
    /// its counts' scan) inside the set's read-only window. False when it could not be
    /// held cleanly (a staged item not given back, the worker gone): it is stopped then,
    /// as by `remove_shard`.
    pub async fn hold_shard(&self, id: ShardId) -> bool {
        self.stop_or_hold(id, None, true).await
    }

    /// Serves a held shard again, its store moved to `to`. False when none was held, or
    /// its store could not move: its worker has then stopped without another write, and
    /// the shard is to be opened afresh.
    pub async fn resume_shard(&self, id: ShardId, to: crate::store::Retarget) -> bool {
        let Some(h) = self.held.lock().expect("not poisoned").remove(&id) else {
            return false;
        };
        let (moved, answer) = tokio::sync::oneshot::channel();
        let sent = h.resume.send(crate::shard::Resume { to, moved }).is_ok();
        if sent && matches!(answer.await, Ok(Ok(()))) {
            self.add_shard(h.handle, h.worker);
            return true;
        }
        let _ = h.worker.await;
        self.keep_unseen(&h.handle);
        false
    }

    /// Leases a stopped held worker left with nobody (a give-back that failed at its
    /// hold), for the shard's next worker here, as a stop records them.
    fn keep_unseen(&self, handle: &ShardHandle) {
        let left = handle.unseen_leases();
        if !left.is_empty() {
            let mut unseen = self.unseen.lock().unwrap_or_else(|p| p.into_inner());
            let known = unseen.entry(handle.id()).or_default();
            for l in left {
                if !known.contains(&l) {
                    known.push(l);
                }
            }
        }
    }

    /// Stops a held shard without another write (it is no longer this host's, or its
    /// primary failed over: what the worker knows may not hold there). True when one was.
    pub async fn drop_held(&self, id: ShardId) -> bool {
        let Some(h) = self.held.lock().expect("not poisoned").remove(&id) else {
            return false;
        };
        drop(h.resume);
        let _ = h.worker.await;
        self.keep_unseen(&h.handle);
        tracing::info!(shard = id, "stopped a held shard");
        true
    }

    /// Keeps a worker started held (see `ShardWorker::start_held`) for a shard whose
    /// switch is under way (its owner moved here at the pause, see
    /// `PrimaryRecord::owner_region`): it writes nothing until [`Host::resume_shard`]
    /// serves it on the new primary, or [`Host::drop_held`] stops it.
    pub fn keep_held(
        &self,
        handle: ShardHandle,
        worker: JoinHandle<()>,
        resume: tokio::sync::oneshot::Sender<crate::shard::Resume>,
    ) {
        tracing::info!(
            shard = handle.id(),
            "opened a shard held for a switch of its replica set"
        );
        self.put_held(handle, worker, resume);
    }

    fn put_held(
        &self,
        handle: ShardHandle,
        worker: JoinHandle<()>,
        resume: tokio::sync::oneshot::Sender<crate::shard::Resume>,
    ) {
        let id = handle.id();
        let held = Held {
            handle,
            worker,
            resume,
        };
        self.held.lock().expect("not poisoned").insert(id, held);
    }

    /// Stops serving shard `id`; with `hold`, keeps its worker held when it can (see
    /// [`Host::hold_shard`]) and says so.
    async fn stop_or_hold(
        &self,
        id: ShardId,
        abandon: Option<std::time::Duration>,
        hold: bool,
    ) -> bool {
        let handle = {
            let mut shards = self.shards.write().expect("not poisoned");
            let mut next = (**shards).clone();
            let handle = next.remove(&id);
            *shards = Arc::new(next);
            handle
        };
        let Some(handle) = handle else { return false };
        if abandon.is_some() {
            // Its staged set is closed: nothing of it is handed out any more, and it
            // already holds the keys of claims still out on the frozen server (staged
            // before their statements ran), so those need no waiting for: they can only
            // time out, and a lease one made is known to the successor as unseen (see
            // `Staged`). A late answer is dropped by the closed set, or refused by the
            // drained stage below and given back through the successor.
            handle.abandon();
        } else {
            // Dequeues already claiming may still get items of this shard: wait for them
            // to hand those out (through the map they started with) or stage them, so that
            // the drain below finds every one nobody was handed.
            drop(self.claiming.write().await);
        }
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
        if hold && released && handle.is_alive() {
            let worker = self.workers.lock().expect("not poisoned").remove(&id);
            if let Some(worker) = worker {
                match handle.hold().await {
                    Some(resume) => {
                        tracing::info!(shard = id, "holding shard for a switch of its replica set");
                        self.put_held(handle, worker, resume);
                        return true;
                    }
                    // Gone meanwhile: stopped below as any other.
                    None => {
                        self.workers
                            .lock()
                            .expect("not poisoned")
                            .insert(id, worker);
                    }
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
            let mut leases = handle.unseen_leases();
            if !handle.is_alive() {
                // Its replies in flight take their items back from the successor (see
                // `useful_lease.rs`); those whose reply never does come back uncounted.
                leases.extend(handle.in_reply_leases());
            }
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
        self.keep_unseen(&handle);
        tracing::info!(shard = id, "stopped serving shard");
        false
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
        // Workers held for a switch stop without another write (they hold nothing).
        let held: Vec<Held> = self
            .held
            .lock()
            .expect("not poisoned")
            .drain()
            .map(|(_, h)| h)
            .collect();
        for h in held {
            drop(h.resume);
            let _ = tokio::time::timeout_at(deadline, h.worker).await;
        }
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
