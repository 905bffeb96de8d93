//! [`EtcdManager`]: shard ownership through etcd leases (the tier's quota buckets in etcd
//! are [`super::budget::EtcdBudget`]).
//!
//! Keys, under the configured prefix P:
//! - `P/hosts/<host_id>` = `{"addr":..,"tier":..}`, attached to the host's lease;
//! - `P/shards/<shard>` = the owner's host id, attached to the owner's lease;
//! - `P/tokens/<ns>` = `{"tokens":..,"last_ms":..}` (no lease; see `budget.rs`);
//! - the replicated shards' primaries and acks (see `primaries.rs`).
//!
//! Every `poll_ms` a host renews its lease (on a task of its own, `lease.rs`), and on every
//! change its watch reports it reconciles: from the hosts and owners (a watch cache:
//! `cache.rs`) it computes the
//! owner each shard of its tier should have ([`super::assign_regional_from`]: from the
//! owners now, the fewest moves that leave the hosts' shard counts within one, rendezvous
//! hashing for the shards that must move; every host computes the same answer from the
//! same view). It creates the keys of free shards it should own (a transaction that succeeds
//! only if the key is absent, so a shard has one owner key at a time), and gives back
//! shards that should be elsewhere: first the host stops serving them (buffers flushed),
//! then the key is deleted and the new owner creates it. A dead host's keys vanish with
//! its lease, and the survivors take its shards. A replicated shard goes to a host of
//! its primary's region when the tier has one there. Besides the poll, a watch on the
//! hosts, owners and primaries reconciles at once when one changes (a switch's pause and
//! a shard's move take milliseconds, not a poll interval). A poll that finds the cache,
//! the lease, the fence and the host's own shards as the last plan left them plans
//! nothing ([`PlanInputs`]). While a planned switch is under way in the tier, no shard
//! moves for balance alone (see `follow.rs`: a drain would otherwise even out the region
//! it empties on the way).
//!
//! Fencing: after each successful renewal (sent at t) the lease cannot expire before
//! t + TTL; the host may write until t + TTL - `fence_margin_ms` (store timeout + 500 ms,
//! so a write started before the fence ends before the lease can expire). A host that
//! cannot renew stops writing at its fence and drops its shards from its view; another
//! host can take them only after etcd expired the lease, which is later.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, PutOptions, Txn, TxnOp};
use futures::future::BoxFuture;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

mod cache;
mod reports;
mod watches;

use cache::Checks;
use watches::{drain_ready, next_answer, Feed};

use super::config::{fence_margin_ms, EtcdConfig};
use super::follow::{Cache, HostRecord, Ownership};
use super::lease::{trouble, Lease, Renewals};
use super::primaries::{self, seen_after};
use super::{ClusterView, Report, ShardManager};
use crate::fence::Fence;
use crate::model::{PrimaryRecord, ShardId};

/// This host's identity in the cluster.
#[derive(Debug, Clone)]
pub struct Member {
    pub host_id: String,
    pub addr: String,
    pub tier: String,
    pub region: String,
    /// The shards of this host's tier: the ones it may be given.
    pub tier_shards: Vec<ShardId>,
    /// The replicated shards' first primaries (the config's layout), written to etcd
    /// when it has none yet.
    pub primaries: BTreeMap<ShardId, PrimaryRecord>,
}

pub struct EtcdManager {
    view: watch::Sender<Arc<ClusterView>>,
    fence: Fence,
    released: mpsc::UnboundedSender<ShardId>,
    reports: mpsc::UnboundedSender<(ShardId, u64, Report)>,
    leave: Mutex<Option<(tokio::sync::oneshot::Sender<()>, JoinHandle<()>)>>,
}

impl EtcdManager {
    /// Connects to etcd and starts following the cluster. The first view (with no shards
    /// of this host yet) is published at once; shards come as they are acquired.
    pub async fn start(
        cfg: &EtcdConfig,
        member: Member,
        store_timeout_ms: u64,
        metrics: Arc<crate::metrics::Metrics>,
        clock: Arc<super::ClockCheck>,
    ) -> Result<(Arc<EtcdManager>, Client), etcd_client::Error> {
        let client = connect(cfg).await?;
        // The watches on a connection of their own: a watch replaying many events fills
        // its connection's flow-control window until they are read, which would hold up
        // the reads, writes and renewals answered on the same connection.
        let watcher = connect_watcher(cfg).await?;
        let fence = Fence::closed();
        let view = watch::Sender::new(Arc::new(ClusterView::default()));
        let (released_tx, released_rx) = mpsc::unbounded_channel();
        let (reports_tx, reports_rx) = mpsc::unbounded_channel();
        let (leave_tx, leave_rx) = tokio::sync::oneshot::channel();
        let follower = Follower {
            client: client.clone(),
            watcher,
            prefix: cfg.prefix.trim_end_matches('/').to_string(),
            ttl: Duration::from_millis(cfg.lease_ttl_ms),
            renew_every: Duration::from_millis(cfg.poll_ms),
            margin: Duration::from_millis(fence_margin_ms(store_timeout_ms)),
            fence: fence.clone(),
            view: view.clone(),
            lease: None,
            own: Ownership {
                me: member.host_id.clone(),
                tier: member.tier.clone(),
                tier_shards: member.tier_shards.clone(),
                ..Ownership::default()
            },
            member,
            in_trouble: false,
            metrics,
            clock,
            cache: None,
            written: 0,
            written_at: Instant::now(),
            planned: None,
        };
        let task = tokio::spawn(follower.run(
            Duration::from_millis(cfg.poll_ms),
            released_rx,
            reports_rx,
            leave_rx,
        ));
        Ok((
            Arc::new(EtcdManager {
                view,
                fence,
                released: released_tx,
                reports: reports_tx,
                leave: Mutex::new(Some((leave_tx, task))),
            }),
            client,
        ))
    }
}

impl EtcdManager {
    /// Test support: this host dies as `kill -9` would leave it. Its follower stops at
    /// once; its lease is not revoked (etcd expires it after the TTL, and its keys with
    /// it), and it releases nothing.
    #[cfg(any(test, feature = "faults"))]
    pub fn crash(&self) {
        if let Some((tx, task)) = self.leave.lock().expect("not poisoned").take() {
            task.abort();
            // Dropping the sender would wake the follower to leave (revoking the lease)
            // should it be polled once more before the abort takes.
            std::mem::forget(tx);
        }
    }
}

async fn connect(cfg: &EtcdConfig) -> Result<Client, etcd_client::Error> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(cfg.lease_ttl_ms / 4))
        .with_timeout(Duration::from_millis(cfg.lease_ttl_ms / 4));
    Client::connect(&cfg.endpoints, Some(opts)).await
}

/// The watches' connection: a member cut off from its cluster's leader ends the watch
/// (require-leader) instead of keeping it open and silent (as Kubernetes' etcd watcher
/// does); a dead connection is caught by the follower's progress requests.
async fn connect_watcher(cfg: &EtcdConfig) -> Result<Client, etcd_client::Error> {
    let every = Duration::from_millis((cfg.lease_ttl_ms / 4).max(1));
    let opts = ConnectOptions::new()
        .with_connect_timeout(every)
        .with_timeout(every)
        .with_require_leader(true);
    Client::connect(&cfg.endpoints, Some(opts)).await
}

impl ShardManager for EtcdManager {
    fn kind(&self) -> &'static str {
        "etcd"
    }
    fn watch(&self) -> watch::Receiver<Arc<ClusterView>> {
        self.view.subscribe()
    }
    fn fence(&self) -> Fence {
        self.fence.clone()
    }
    fn released(&self, shard: ShardId) {
        let _ = self.released.send(shard);
    }
    fn report(&self, shard: ShardId, generation: u64, what: Report) {
        let _ = self.reports.send((shard, generation, what));
    }
    fn leave(&self) -> BoxFuture<'_, ()> {
        let taken = self.leave.lock().expect("not poisoned").take();
        Box::pin(async move {
            if let Some((tx, task)) = taken {
                let _ = tx.send(());
                let _ = task.await;
            }
        })
    }
}

/// How long a follower waits after a watch event for the rest of its batch before it
/// reconciles (a lease lapsing, or a tier's hosts taking shards, brings many at once).
const COALESCE: Duration = Duration::from_millis(20);

/// The task behind [`EtcdManager`]: the only code that changes this host's keys.
struct Follower {
    client: Client,
    /// For the watches alone (see `EtcdManager::start`).
    watcher: Client,
    prefix: String,
    ttl: Duration,
    /// How often the lease is renewed (`poll_ms`).
    renew_every: Duration,
    margin: Duration,
    member: Member,
    fence: Fence,
    view: watch::Sender<Arc<ClusterView>>,
    lease: Option<Lease>,
    /// The shards this host holds and gives back (see `cluster::follow`).
    own: Ownership,
    /// An etcd problem was logged and has not cleared yet.
    in_trouble: bool,
    metrics: Arc<crate::metrics::Metrics>,
    /// Whether this host's clock is in bound: out of it, it neither renews nor registers.
    clock: Arc<super::ClockCheck>,
    /// The cluster as etcd had it at the cache's revision, kept by the watch (None: to be
    /// read whole; see `cache.rs`).
    cache: Option<Cache>,
    /// The revision of this host's last write the cache must show before the follower
    /// plans again (see [`Follower::wrote`]), and when it was written.
    written: i64,
    written_at: Instant,
    /// What the last plan that ran to its end was made from (see [`PlanInputs`]).
    planned: Option<PlanInputs>,
}

/// Everything a plan depends on: a plan from the same inputs as the last one finds
/// nothing to do (what it withdrew is withdrawn, what it could take it tried, and a
/// create that found its key taken waits for a later revision), so it is skipped. Most
/// polls change none of these; a host of a large tier would otherwise compute the
/// tier's assignment once a second for nothing.
#[derive(Debug, PartialEq)]
struct PlanInputs {
    revision: i64,
    lease: Option<i64>,
    fence_open: bool,
    held: BTreeSet<ShardId>,
    releasing: BTreeSet<ShardId>,
    undeleted: BTreeSet<ShardId>,
}

impl Follower {
    fn plan_inputs(&self, revision: i64, fence_open: bool) -> PlanInputs {
        PlanInputs {
            revision,
            lease: self.lease.as_ref().map(|l| l.id),
            fence_open,
            held: self.own.held.clone(),
            releasing: self.own.releasing.clone(),
            undeleted: self.own.undeleted.clone(),
        }
    }

    fn host_key(&self, id: &str) -> String {
        format!("{}/hosts/{id}", self.prefix)
    }

    fn shard_key(&self, s: ShardId) -> String {
        format!("{}/shards/{s}", self.prefix)
    }

    async fn run(
        mut self,
        poll: Duration,
        mut released: mpsc::UnboundedReceiver<ShardId>,
        mut reports: mpsc::UnboundedReceiver<(ShardId, u64, Report)>,
        mut leave: tokio::sync::oneshot::Receiver<()>,
    ) {
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut watch: Option<Feed> = None;
        // Why the next whole read happens (see `cache.rs`).
        let mut reason = "start";
        let mut checks = Checks::new(&self.member.host_id);
        loop {
            let mut ticked = false;
            tokio::select! {
                _ = tick.tick() => ticked = true,
                Some(s) = released.recv() => self.give_back(s).await,
                Some(r) = reports.recv() => self.report(r).await,
                // Every answer arrived within COALESCE of one with events leads to the one
                // reconcile below: in a storm (leases lapsing, a tier's hosts taking
                // shards) a follower plans once per batch, not once per event.
                answer = next_answer(&mut watch) => {
                    checks.answered();
                    let healthy = match (answer, &mut self.cache, watch.as_mut()) {
                        (Some(r), Some(cache), Some(w)) => {
                            cache.apply(&self.prefix, &r);
                            if !r.events().is_empty() {
                                tokio::time::sleep(COALESCE).await;
                            }
                            drain_ready(w, |r| cache.apply(&self.prefix, r))
                        }
                        _ => false,
                    };
                    if !healthy {
                        watch = None;
                        reason = "watch_ended";
                    }
                }
                _ = &mut leave => break,
            }
            while let Ok(s) = released.try_recv() {
                self.give_back(s).await;
            }
            while let Ok(r) = reports.try_recv() {
                self.report(r).await;
            }
            if ticked {
                self.renew().await;
                for s in self.own.undeleted.clone() {
                    if !self.own.held.contains(&s) {
                        self.delete_key(s).await;
                    } else {
                        self.own.undeleted.remove(&s);
                    }
                }
                if let Some(why) = self.check_watch(&mut watch, &mut checks).await {
                    watch = None;
                    reason = why;
                }
            }
            if watch.is_none() {
                // A whole read; the watch from its next revision. A read without a watch
                // is planned from all the same, and read again next time.
                match self.load().await {
                    Ok(cache) => {
                        self.metrics.view_read(reason);
                        let from = cache.revision + 1;
                        self.cache = Some(cache);
                        // A whole read may correct a cache that drifted (a lost event)
                        // and still be at the same revision: plan from it.
                        self.planned = None;
                        match self.open_feed(from).await {
                            Ok(w) => {
                                reason = "start";
                                checks = Checks::new(&self.member.host_id);
                                watch = Some(w);
                            }
                            Err(e) => self.trouble(&format!("cannot watch the cluster ({e})")),
                        }
                    }
                    Err(e) => {
                        // No plans from a cache no watch keeps: the view stays as it was.
                        self.cache = None;
                        self.trouble(&format!(
                            "cannot read the cluster ({e}); keeping the last view"
                        ));
                    }
                }
            }
            match self.reconcile().await {
                Ok(()) if self.lease.is_some() && watch.is_some() => self.recovered(),
                Ok(()) => {}
                Err(e) => self.trouble(&format!("cannot write to etcd ({e})")),
            }
            // Fenced: whatever etcd says, this host serves nothing until it renews again.
            if !self.fence.is_open() && !self.own.held.is_empty() {
                tracing::warn!("etcd: lease not renewed in time; giving up every shard");
                self.lose_everything();
            }
        }
        // Renewals stopped first: one answered after the fence closed would open it again.
        let lease = self.lease.take();
        let id = match lease {
            Some(l) => Some(l.stop().await),
            None => None,
        };
        self.fence.close();
        if let Some(id) = id {
            // Revoking deletes every key of the lease: survivors take the shards now.
            let _ = self.client.lease_revoke(id).await;
        }
        tracing::info!(host_id = %self.member.host_id, "left the cluster");
    }

    fn lose_everything(&mut self) {
        self.fence.close();
        self.own.held.clear();
        self.own.releasing.clear();
        self.own.undeleted.clear();
        self.lease = None;
        self.view.send_if_modified(|v| {
            let me = &self.member.host_id;
            let before = v.owners.len();
            let mut nv = (**v).clone();
            nv.owners.retain(|_, h| h != me);
            let changed = nv.owners.len() != before;
            *v = Arc::new(nv);
            changed
        });
    }

    /// Registers when this host has no lease; drops one etcd said expired (its renewals
    /// run on their own task: see `lease.rs`).
    async fn renew(&mut self) {
        if let Some(lease) = &self.lease {
            if lease.expired() {
                self.lose_everything();
            }
            return;
        }
        if self.clock.out_of_bound() {
            self.trouble(
                "this host's clock is out of bound (cluster.clock_skew_max_ms): not registering",
            );
            return;
        }
        let sent = Instant::now();
        if let Err(e) = self.register(sent).await {
            self.trouble(&format!("cannot register this host yet: {e}"));
        }
    }

    fn trouble(&mut self, what: &str) {
        trouble(&mut self.in_trouble, what);
    }

    /// This host wrote in the watched range: the follower plans again only once the cache
    /// shows revision `rev` (0: nothing to wait for), so that it never plans on a state
    /// older than its own act.
    fn wrote(&mut self, rev: i64) {
        if rev > self.written {
            self.written = rev;
            self.written_at = Instant::now();
        }
    }

    fn recovered(&mut self) {
        if self.in_trouble {
            tracing::info!("etcd: working again");
            self.in_trouble = false;
        }
    }

    async fn register(&mut self, sent: Instant) -> Result<(), String> {
        let ttl_s = self.ttl.as_secs() as i64;
        let grant = self
            .client
            .lease_grant(ttl_s, None)
            .await
            .map_err(|e| e.to_string())?;
        let id = grant.id();
        let key = self.host_key(&self.member.host_id);
        let record = serde_json::to_string(&HostRecord {
            addr: self.member.addr.clone(),
            tier: self.member.tier.clone(),
            region: self.member.region.clone(),
        })
        .expect("serializable");
        // A key left by this host's previous life (same id, older lease) blocks the
        // registration until that lease expires: the old process may still be writing.
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                record,
                Some(PutOptions::new().with_lease(id)),
            )]);
        let r = self.client.txn(txn).await.map_err(|e| e.to_string())?;
        self.wrote(seen_after(&r));
        if !r.succeeded() {
            let _ = self.client.lease_revoke(id).await;
            return Err(format!(
                "host id {:?} is still registered (a previous run's lease); waiting for it to expire",
                self.member.host_id
            ));
        }
        let (keeper, stream) = self
            .client
            .lease_keep_alive(id)
            .await
            .map_err(|e| e.to_string())?;
        self.fence
            .extend_to(sent + Duration::from_secs(grant.ttl() as u64).saturating_sub(self.margin));
        let renewals = Renewals {
            client: self.client.clone(),
            every: self.renew_every,
            ttl: self.ttl,
            margin: self.margin,
            fence: self.fence.clone(),
            metrics: self.metrics.clone(),
            clock: self.clock.clone(),
        };
        self.lease = Some(Lease::start(id, keeper, stream, renewals));
        tracing::info!(host_id = %self.member.host_id, lease = id, "registered in etcd");
        Ok(())
    }

    /// Reads hosts and owners, takes free shards this host should own, withdraws those
    /// that should move, and publishes the view.
    async fn reconcile(&mut self) -> Result<(), etcd_client::Error> {
        let Some(cache) = &self.cache else {
            return Ok(());
        };
        if cache.revision < self.written {
            // The watch has yet to bring this host's last write: plan after it does.
            return Ok(());
        }
        // The config's layout, for the replicated shards etcd has no record of yet (the
        // first host to get here writes them; a record once written is etcd's to change).
        // A shard added to a replica set that has switched since takes the set's
        // current record (a set's shards share their config's first primary).
        let missing: BTreeMap<ShardId, PrimaryRecord> = self
            .member
            .primaries
            .iter()
            // A record etcd has but this build cannot read (a newer build's, during an
            // upgrade) is not this host's to write: it plans without it.
            .filter(|(s, _)| {
                !cache.primaries().contains_key(s)
                    && !cache.rest.contains(&format!("primaries/{s}"))
            })
            .map(|(s, r)| {
                let sibling = self.member.primaries.iter().find_map(|(t, tr)| {
                    (tr.addr == r.addr)
                        .then(|| cache.primaries().get(t))
                        .flatten()
                });
                (*s, sibling.cloned().unwrap_or_else(|| r.clone()))
            })
            .collect();
        if !missing.is_empty() {
            // Planned once the watch brings them.
            let rev = primaries::init(&mut self.client, &self.prefix, &missing).await?;
            self.wrote(rev);
            return Ok(());
        }
        let revision = cache.revision;
        // Read once: the fence moves with the clock and the renewals.
        let fence_open = self.fence.is_open();
        if self.planned.as_ref() == Some(&self.plan_inputs(revision, fence_open)) {
            return Ok(());
        }
        let my_lease = self.lease.as_ref().map(|l| l.id);
        let plan = self.own.plan(cache, my_lease, fence_open);
        for s in &plan.lost {
            tracing::warn!(shard = s, "etcd: shard key no longer ours");
        }
        for s in &plan.taken_up {
            tracing::warn!(
                shard = s,
                "etcd: a key of ours this host did not hold: taking it up"
            );
        }
        for (s, to) in &plan.withdrawn {
            tracing::info!(
                shard = s,
                to = to.as_deref(),
                "shard moving to another host"
            );
        }
        // A plan whose creates were all tried is recorded as done; one cut short by the
        // fence is not (it is tried again next time).
        let mut complete = true;
        for s in plan.acquire {
            if !self.fence.is_open() {
                complete = false;
                break;
            }
            let lease = my_lease.expect("a plan acquires only with a lease");
            let key = self.shard_key(s);
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.clone(),
                    self.member.host_id.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                )])
                .or_else([TxnOp::get(key, None)]);
            let r = self.client.txn(txn).await?;
            // Taken: planned again once the cache shows by whom.
            self.wrote(seen_after(&r));
            if r.succeeded() {
                tracing::info!(shard = s, "acquired shard");
                self.own.held.insert(s);
            }
        }
        self.planned = complete.then(|| self.plan_inputs(revision, fence_open));
        let Some(cache) = &self.cache else {
            return Ok(());
        };
        let view = self.own.view(cache);
        self.view.send_if_modified(|v| {
            if **v == view {
                return false;
            }
            *v = Arc::new(view);
            true
        });
        Ok(())
    }
}
