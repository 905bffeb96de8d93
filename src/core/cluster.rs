//! The host's side of the cluster: the view the shard manager published last, its peers
//! (reached through [`Peers`], which the RPC layer implements with pooled Thrift
//! clients) and how loaded they are, tiers, and the namespace quotas.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use futures::future::{join_all, BoxFuture};

use super::access::{Caller, Kind};
use super::enqueue::EnqueueOutcome;
use super::host::Host;
use super::quota::{QuotaBudget, Quotas};
use super::validate::EnqueueRequestItem;
use super::{ActiveTopicsPage, NackRequestItem, TouchRequestItem};
use crate::cluster::ClusterView;
use crate::error::{Error, Result};
use crate::model::{ShardId, ShardStatus};

/// Who a forwarded per-item call comes from: this host (`forwarded_by`) and, when access
/// rules apply, the identity of the client it acts for (`forwarded_for`), which the
/// owner of the items checks against their namespaces.
#[derive(Debug, Clone, Copy)]
pub struct Forwarded<'a> {
    pub by: &'a str,
    pub for_identity: Option<&'a str>,
}

/// Calls to another host. Every call carries this host's id as `forwarded_by` (where the
/// API has it), so the peer serves it or fails it, and never forwards it again.
pub trait Peers: Send + Sync {
    fn enqueue<'a>(
        &'a self,
        addr: &'a str,
        items: Vec<EnqueueRequestItem>,
        from: &'a str,
    ) -> BoxFuture<'a, Result<Vec<EnqueueOutcome>>>;
    fn ack<'a>(
        &'a self,
        addr: &'a str,
        ids: Vec<String>,
        from: Forwarded<'a>,
    ) -> BoxFuture<'a, Result<Vec<Result<()>>>>;
    fn nack<'a>(
        &'a self,
        addr: &'a str,
        items: Vec<NackRequestItem>,
        from: Forwarded<'a>,
    ) -> BoxFuture<'a, Result<Vec<Result<()>>>>;
    fn touch<'a>(
        &'a self,
        addr: &'a str,
        items: Vec<TouchRequestItem>,
        from: Forwarded<'a>,
    ) -> BoxFuture<'a, Result<Vec<Result<()>>>>;
    /// The peer's own topics only (`local_only`).
    fn active_topics<'a>(
        &'a self,
        addr: &'a str,
        ns: &'a str,
        limit: i32,
        after: Option<String>,
    ) -> BoxFuture<'a, Result<ActiveTopicsPage>>;
    /// The peer's `spare_capacity` (see [`Host::spare_capacity`]).
    fn spare_capacity<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<i64>>;
}

/// What a host knows of itself in the cluster.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    pub host_id: String,
    /// "host:port" peers and redirected clients use.
    pub addr: String,
    pub tier: String,
    /// "single", "static" or "etcd".
    pub manager: &'static str,
    /// A single host serves every tier: there is nobody to forward to.
    pub serves_all_tiers: bool,
    pub forwarding: bool,
    /// Every tier's shards, wherever they are served.
    pub tier_shards: BTreeMap<String, Vec<ShardId>>,
}

/// A peer's load as this host last saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerLoad {
    pub reachable: bool,
    pub spare: i64,
}

/// Another host, for `getHostInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerStatus {
    pub host_id: String,
    pub addr: String,
    pub tier: String,
    pub shards: Vec<ShardId>,
    pub load: PeerLoad,
}

/// This host, for `getHostInfo`.
#[derive(Debug, Clone)]
pub struct HostStatus {
    pub host_id: String,
    pub addr: String,
    pub tier: String,
    pub manager: &'static str,
    pub shards: Vec<ShardStatus>,
    pub spare: i64,
    pub peers: Vec<PeerStatus>,
}

pub struct ClusterState {
    pub(super) settings: ClusterSettings,
    view: RwLock<Arc<ClusterView>>,
    pub(super) peers: Arc<dyn Peers>,
    loads: Mutex<HashMap<String, PeerLoad>>,
    pub(super) quotas: Quotas,
}

impl ClusterState {
    pub(super) fn new(
        settings: ClusterSettings,
        peers: Arc<dyn Peers>,
        budget: Arc<dyn QuotaBudget>,
    ) -> ClusterState {
        ClusterState {
            settings,
            view: RwLock::new(Arc::new(ClusterView::default())),
            peers,
            loads: Mutex::new(HashMap::new()),
            quotas: Quotas::new(budget),
        }
    }

    pub(super) fn view(&self) -> Arc<ClusterView> {
        self.view.read().expect("not poisoned").clone()
    }

    pub(super) fn serves_tier(&self, tier: &str) -> bool {
        self.settings.serves_all_tiers || tier == self.settings.tier
    }

    pub(super) fn tier_shards(&self, tier: &str) -> &[ShardId] {
        self.settings
            .tier_shards
            .get(tier)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// May a request (forwarded already or not) be forwarded from here?
    pub(super) fn may_forward(&self, forwarded: bool) -> bool {
        !forwarded && self.settings.forwarding
    }

    /// The reachable peers of `tier` with their loads and addresses, the most spare
    /// capacity first.
    fn ranked(&self, tier: &str) -> Vec<(PeerLoad, String)> {
        let view = self.view();
        let loads = self.loads.lock().expect("not poisoned");
        let mut peers: Vec<(PeerLoad, String, String)> = view
            .hosts
            .iter()
            .filter(|(id, h)| **id != self.settings.host_id && h.tier == tier)
            // A peer not asked yet counts as reachable with no spare capacity.
            .map(|(id, h)| {
                let load = loads.get(id).copied().unwrap_or(PeerLoad {
                    reachable: true,
                    spare: 0,
                });
                (load, id.clone(), h.addr.clone())
            })
            .collect();
        peers.sort_by(|a, b| {
            (b.0.reachable, b.0.spare)
                .cmp(&(a.0.reachable, a.0.spare))
                .then(a.1.cmp(&b.1))
        });
        peers
            .into_iter()
            .filter(|(l, _, _)| l.reachable)
            .map(|(load, _, addr)| (load, addr))
            .collect()
    }

    /// The address of a host of `tier` to forward `ns`'s enqueues to; when forwarding is
    /// not allowed, `WRONG_HOST` naming one.
    pub(super) fn peer_for_tier(&self, tier: &str, forwarded: bool, ns: &str) -> Result<String> {
        let Some((_, addr)) = self.ranked(tier).into_iter().next() else {
            return Err(Error::unavailable(format!(
                "namespace {ns:?} belongs to tier {tier:?}, which has no reachable host"
            )));
        };
        if !self.may_forward(forwarded) {
            return Err(Error::wrong_host(
                format!("namespace {ns:?} is served by tier {tier:?}, not by this host"),
                &addr,
            ));
        }
        Ok(addr)
    }

    /// A peer of this host's tier with spare capacity, for an enqueue this host cannot
    /// take; `None` when forwarding is not allowed or no peer has room.
    pub(super) fn spare_peer(&self, forwarded: bool) -> Option<String> {
        if !self.may_forward(forwarded) {
            return None;
        }
        self.ranked(&self.settings.tier)
            .into_iter()
            .find(|(load, _)| load.spare > 0)
            .map(|(_, addr)| addr)
    }

    /// The address of the host that owns `shard`, to send `what` there; `WRONG_HOST`
    /// (with that address) when forwarding is not allowed, `UNAVAILABLE` while the shard
    /// has no owner (it is moving), `NOT_FOUND` for a shard no tier has.
    pub(super) fn owner_for(
        &self,
        shard: ShardId,
        may_forward: bool,
        what: &str,
    ) -> Result<String> {
        let view = self.view();
        match view.owner(shard) {
            Some((owner, _)) if owner == self.settings.host_id => Err(Error::unavailable(format!(
                "{what}: shard {shard} is being opened on this host; retry"
            ))),
            Some((_, addr)) if may_forward => Ok(addr.to_string()),
            Some((owner, addr)) => Err(Error::wrong_host(
                format!("{what}: shard {shard} is served by {owner} at {addr}"),
                addr,
            )),
            None if self
                .settings
                .tier_shards
                .values()
                .any(|s| s.contains(&shard)) =>
            {
                Err(Error::unavailable(format!(
                    "{what}: shard {shard} has no owner right now (it is moving); retry"
                )))
            }
            None => Err(Error::not_found(format!(
                "{what}: there is no shard {shard}"
            ))),
        }
    }
}

impl Host {
    /// Adopts the shard manager's latest view (owners and peers).
    pub fn set_view(&self, view: Arc<ClusterView>) {
        let live: Vec<String> = view.hosts.keys().cloned().collect();
        *self.cluster.view.write().expect("not poisoned") = view;
        self.cluster
            .loads
            .lock()
            .expect("not poisoned")
            .retain(|id, _| live.contains(id));
    }

    /// How much more this host can buffer: free slots in its healthy shards' queues.
    pub fn spare_capacity(&self) -> i64 {
        self.shards()
            .values()
            .filter(|s| s.is_healthy())
            .map(|s| s.spare() as i64)
            .sum()
    }

    /// Asks every peer for its spare capacity every `every_ms` until `stop` turns true.
    pub async fn run_peer_poll(
        self: Arc<Self>,
        every_ms: u64,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(every_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => break,
            }
            let view = self.cluster.view();
            let me = &self.cluster.settings.host_id;
            let asks = view
                .hosts
                .iter()
                .filter(|(id, _)| *id != me)
                .map(|(id, h)| {
                    let peers = self.cluster.peers.clone();
                    async move {
                        let load = match peers.spare_capacity(&h.addr).await {
                            Ok(spare) => PeerLoad {
                                reachable: true,
                                spare,
                            },
                            Err(e) => {
                                tracing::debug!(peer = %id, error = %e, "peer unreachable");
                                PeerLoad::default()
                            }
                        };
                        (id.clone(), load)
                    }
                });
            let loads = join_all(asks).await;
            let mut current = self.cluster.loads.lock().expect("not poisoned");
            for (id, load) in loads {
                current.insert(id, load);
            }
        }
    }

    /// This host, its shards and its peers as it sees them, for `getHostInfo`.
    pub fn host_status(&self) -> HostStatus {
        let s = &self.cluster.settings;
        let view = self.cluster.view();
        let loads = self.cluster.loads.lock().expect("not poisoned").clone();
        let peers = view
            .hosts
            .iter()
            .filter(|(id, _)| **id != s.host_id)
            .map(|(id, h)| PeerStatus {
                host_id: id.clone(),
                addr: h.addr.clone(),
                tier: h.tier.clone(),
                shards: view.shards_of(id),
                load: loads.get(id).copied().unwrap_or_default(),
            })
            .collect();
        HostStatus {
            host_id: s.host_id.clone(),
            addr: s.addr.clone(),
            tier: s.tier.clone(),
            manager: s.manager,
            shards: self.shard_status(),
            spare: self.spare_capacity(),
            peers,
        }
    }

    /// `getActiveTopics` for the namespace's whole tier: this host's topics merged with
    /// its peers' (each asked for its own only), each topic naming the hosts that hold it.
    /// With `local_only`, this host's topics only. A peer that cannot answer fails the
    /// call (retryably): a partial list would look complete.
    pub async fn active_topics(
        &self,
        caller: &Caller,
        ns: &str,
        limit: Option<i32>,
        after: Option<String>,
        local_only: bool,
    ) -> Result<ActiveTopicsPage> {
        self.allow(caller, ns, Kind::Consume)?;
        let mut page = self.local_active_topics(ns, limit, after.clone()).await?;
        let me = self.host_id().to_string();
        for t in &mut page.topics {
            t.hosts = vec![me.clone()];
        }
        if local_only {
            return Ok(page);
        }
        let tier = self.namespaces.tier(ns);
        let view = self.cluster.view();
        let peers: Vec<(&String, &str)> = view
            .hosts
            .iter()
            .filter(|(id, h)| **id != me && h.tier == tier)
            .map(|(id, h)| (id, h.addr.as_str()))
            .collect();
        if peers.is_empty() {
            return Ok(page);
        }
        let limit = limit.unwrap_or(super::limits::ACTIVE_TOPICS_LIMIT_DEFAULT);
        let pages = join_all(peers.iter().map(|(id, addr)| {
            let after = after.clone();
            async move {
                let r = self
                    .cluster
                    .peers
                    .active_topics(addr, ns, limit, after)
                    .await;
                (id.to_string(), r)
            }
        }))
        .await;
        // Each source returned its first `limit` topics after the cursor, so each topic of
        // the first `limit` overall is in every list that has it: its sums are complete.
        let mut more = page.next_after.is_some();
        let mut merged: BTreeMap<String, crate::model::TopicCounts> = page
            .topics
            .into_iter()
            .map(|t| (t.topic.clone(), t))
            .collect();
        for (id, r) in pages {
            let p = r.map_err(|e| {
                Error::unavailable(format!(
                    "peer {id} could not list its topics: {}",
                    e.message
                ))
            })?;
            more |= p.next_after.is_some();
            for t in p.topics {
                let m =
                    merged
                        .entry(t.topic.clone())
                        .or_insert_with(|| crate::model::TopicCounts {
                            topic: t.topic.clone(),
                            ..Default::default()
                        });
                m.ready += t.ready;
                m.deferred += t.deferred;
                m.leased += t.leased;
                m.hosts.push(id.clone());
            }
        }
        let limit = limit.max(1) as usize;
        let more = more || merged.len() > limit;
        let topics: Vec<_> = merged
            .into_values()
            .take(limit)
            .map(|mut t| {
                t.hosts.sort();
                t
            })
            .collect();
        let next_after = if more {
            topics.last().map(|t| t.topic.clone())
        } else {
            None
        };
        Ok(ActiveTopicsPage { topics, next_after })
    }
}
