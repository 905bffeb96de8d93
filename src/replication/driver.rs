//! [`Driver`]: switches replica sets through etcd (planned switchover, region drain,
//! failover), one at a time per set under an etcd lock, from whichever host was asked.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, WatchOptions, WatchStream};
use futures::future::BoxFuture;
use futures::stream::SelectAll;
use futures::StreamExt;
use tokio::sync::watch;

use super::server::{self as srv, ServerAdmin};
use super::{
    Layout, Refused, ReplicaState, ReplicationConfig, SetLayout, ShardReplication, SwitchReport,
    Switchboard, Switched,
};
use crate::cluster::primaries::{self, Ack, Demoted};
use crate::model::{ClusterView, PrimaryRecord, PrimaryState, ShardId};

/// How long a switch waits for the shards to be served on the new primary.
pub(super) const SERVED_WAIT: Duration = Duration::from_secs(10);
/// How often a switch reads the owners' acks when etcd refuses it a watch.
const ACK_POLL: Duration = Duration::from_millis(5);
/// Waiting for acks on a watch, the acks are read again at least this often anyway.
const ACK_WATCH_FALLBACK: Duration = Duration::from_millis(100);
/// A paused shard without an owner counts as paused once it has had none this long: its
/// owner may be moving to the switch target's region (see `PrimaryRecord::owner_region`),
/// and the new owner's ack, sent once it has opened and held the shard, is what says the
/// read-only window may begin without a reopen in it.
const OWNERLESS_GRACE: Duration = Duration::from_millis(300);

/// The set's switch lock, as held by this driver.
pub(super) struct Lock {
    pub key: String,
    pub lease: i64,
}

pub struct Driver {
    pub(super) client: Client,
    pub(super) prefix: String,
    pub(super) host_id: String,
    pub(super) layout: Layout,
    pub(super) cfg: ReplicationConfig,
    pub(super) views: watch::Receiver<Arc<ClusterView>>,
    /// The shards' account (its connections are ended at a fence).
    pub(super) data_user: String,
    pub(super) metrics: Arc<crate::metrics::Metrics>,
    /// Whether each primary was last seen waiting for acknowledgements (by `observe`).
    pub(super) semi_seen: std::sync::Mutex<std::collections::HashMap<String, bool>>,
    /// The switch lock's lease, in seconds (see [`super::journal`]).
    pub(super) lock_ttl_s: i64,
}

/// The records of one set's shards as read, all at one generation and primary.
pub(super) struct SetRecords {
    pub(super) records: Vec<(ShardId, PrimaryRecord, i64)>,
    pub(super) current: PrimaryRecord,
}

/// What a [`Driver`] is made of, besides its etcd client, the view and the metrics.
pub struct Setup {
    /// The cluster's etcd prefix.
    pub prefix: String,
    pub host_id: String,
    pub layout: Layout,
    pub cfg: ReplicationConfig,
    /// The shards' account (its connections are ended at a fence).
    pub data_user: String,
    /// The cluster's host lease TTL, in seconds: a switch's driver that dies frees the
    /// set's switch lock this long after, and the next driver settles the switch.
    pub lock_ttl_s: i64,
}

impl Driver {
    pub fn new(
        client: Client,
        setup: Setup,
        views: watch::Receiver<Arc<ClusterView>>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Driver {
        Driver {
            client,
            prefix: setup.prefix.trim_end_matches('/').to_string(),
            host_id: setup.host_id,
            layout: setup.layout,
            cfg: setup.cfg,
            views,
            data_user: setup.data_user,
            metrics,
            semi_seen: Default::default(),
            lock_ttl_s: setup.lock_ttl_s,
        }
    }

    pub(super) fn count(&self, r: &SwitchReport) {
        let outcome = if r.ok { "ok" } else { "failed" };
        self.metrics
            .switches
            .get_or_create(&crate::metrics::SwitchLabel {
                kind: r.kind.clone(),
                outcome,
            })
            .inc();
    }

    /// Sets the gauges of `set`: its primary's semi-sync, its replicas' lag.
    pub(super) async fn observe(&self, set: &SetLayout, primary: &str) {
        use crate::metrics::ServerLabel;
        let label = |s: &str| ServerLabel {
            server: s.to_string(),
        };
        let semi = self
            .admin(primary)
            .with(Duration::from_secs(1), |c| Box::pin(srv::semi_sync(c)))
            .await;
        if let Ok(s) = &semi {
            self.semi_seen
                .lock()
                .expect("not poisoned")
                .insert(primary.to_string(), s.on);
            self.metrics
                .semi_sync_on
                .get_or_create(&label(primary))
                .set(i64::from(s.on));
            self.metrics
                .semi_sync_no_tx
                .get_or_create(&label(primary))
                .set(s.no_tx);
        }
        let mut can_ack = false;
        for s in set.servers.iter().filter(|s| s.addr != primary) {
            let st = self.lag(set, primary, &s.addr).await;
            let lag = if st.io_running && st.sql_running {
                st.lag_ms.unwrap_or(-1)
            } else {
                -1
            };
            self.metrics
                .replica_lag_ms
                .get_or_create(&label(&s.addr))
                .set(lag);
            can_ack |= st.io_running && st.semi_sync_replica;
        }
        // Semi-sync off on the primary (a promotion with no replica left to acknowledge)
        // while one that can is back: on again.
        if let Ok(s) = semi {
            if self.cfg.semi_sync && !s.enabled && can_ack {
                let r = self
                    .admin(primary)
                    .exec(
                        Duration::from_secs(1),
                        "SET GLOBAL rpl_semi_sync_master_enabled = ON",
                    )
                    .await;
                match r {
                    Ok(()) => tracing::info!(
                        primary,
                        "semi-sync back on: a replica that acknowledges is back"
                    ),
                    Err(e) => tracing::warn!(primary, error = %e, "cannot turn semi-sync back on"),
                }
            }
        }
    }

    pub(super) fn admin(&self, addr: &str) -> ServerAdmin {
        ServerAdmin::new(
            &self.cfg,
            addr,
            self.layout.tls_of(addr),
            Duration::from_millis(self.cfg.probe_interval_ms.max(250) * 2),
        )
    }

    pub(super) fn step_bound(&self) -> Duration {
        Duration::from_millis(self.cfg.catchup_timeout_ms + 2000)
    }

    pub(super) async fn records(&self, set: &SetLayout) -> Result<SetRecords, String> {
        let mut client = self.client.clone();
        let all = primaries::read::<PrimaryRecord>(&mut client, &self.prefix, "primaries")
            .await
            .map_err(|e| format!("etcd: {e}"))?;
        let mut records = Vec::new();
        for s in &set.shards {
            let (r, rev) = all
                .get(s)
                .cloned()
                .ok_or_else(|| format!("shard {s} has no primary record in etcd yet"))?;
            records.push((*s, r, rev));
        }
        // The shards of a set are written together; should they ever disagree (a switch
        // interrupted between etcd writes), the newest generation is the set's, and the
        // next publish writes it to all of them.
        let current = records
            .iter()
            .max_by_key(|(_, r, _)| r.generation)
            .map(|(_, r, _)| r.clone())
            .expect("a set has shards");
        if records.iter().any(|(_, r, _)| *r != current) {
            tracing::warn!(shards = ?set.shards, generation = current.generation, "the shards of a replica set disagree in etcd; taking the newest record");
        }
        Ok(SetRecords { records, current })
    }

    /// Names `to` as the set's primary record, if the records are as `recs` read them
    /// and this host still holds the set's switch `lock`.
    pub(super) async fn publish(
        &self,
        recs: &SetRecords,
        to: PrimaryRecord,
        lock: &Lock,
    ) -> Result<SetRecords, String> {
        self.publish_also(recs, to, Vec::new(), lock).await
    }

    /// [`Self::publish`], with `also` in the same etcd transaction.
    pub(super) async fn publish_also(
        &self,
        recs: &SetRecords,
        to: PrimaryRecord,
        also: Vec<etcd_client::TxnOp>,
        lock: &Lock,
    ) -> Result<SetRecords, String> {
        let mut client = self.client.clone();
        let next: Vec<_> = recs
            .records
            .iter()
            .map(|(s, _, rev)| (*s, to.clone(), *rev))
            .collect();
        let held = primaries::held(&lock.key, lock.lease);
        if !primaries::publish(&mut client, &self.prefix, &next, (held, also))
            .await
            .map_err(|e| format!("etcd: {e}"))?
        {
            return Err(
                "the primary records changed under the switch, or this host lost the set's switch lock".into(),
            );
        }
        let set = self
            .layout
            .set_of(recs.records[0].0)
            .expect("a set's shard");
        self.records(set).await
    }

    /// Waits until every shard of `recs` that has an owner acked `dir` at `generation`.
    pub(super) async fn acks(
        &self,
        shards: &[ShardId],
        dir: &str,
        generation: u64,
        within: Duration,
    ) -> bool {
        let mut client = self.client.clone();
        let end = Instant::now() + within;
        // Woken by etcd when an ack or an owner changes, rather than reading both every
        // few milliseconds: on a loaded machine that polling (two range reads every 5 ms,
        // per set switching at once) took CPU from the owners whose acks it waited for.
        // The watch is opened (within the bound) only when the first read found the acks
        // missing, and the acks are read again once it is open, so no change between the
        // two is missed; without a watch (refused, cancelled or broken) it polls as before.
        let mut changes = None;
        let mut watching = false;
        let mut ownerless: HashMap<ShardId, Instant> = HashMap::new();
        loop {
            let owners = primaries::read_owners(&mut client, &self.prefix).await;
            let acks = primaries::read::<Ack>(&mut client, &self.prefix, dir).await;
            if let (Ok(owners), Ok(acks)) = (owners, acks) {
                let now = Instant::now();
                // Every shard without an owner is timed from when it was first seen so,
                // all at once (not one after another as the check below reaches them).
                ownerless.retain(|s, _| !owners.contains_key(s));
                for s in shards.iter().filter(|s| !owners.contains_key(s)) {
                    ownerless.entry(*s).or_insert(now);
                }
                let done = shards.iter().all(|s| match owners.get(s) {
                    // No owner: nobody writes it; paused once that has lasted (a new
                    // owner may be coming, see OWNERLESS_GRACE).
                    None => {
                        dir == "paused"
                            && ownerless
                                .get(s)
                                .is_some_and(|t| now.duration_since(*t) >= OWNERLESS_GRACE)
                    }
                    Some(owner) => acks
                        .get(s)
                        .is_some_and(|(a, _)| a.generation == generation && &a.host == owner),
                });
                if done {
                    return true;
                }
            }
            let now = Instant::now();
            if now >= end {
                return false;
            }
            if !watching {
                watching = true;
                changes = tokio::time::timeout(end - now, self.watch_acks(dir))
                    .await
                    .ok()
                    .flatten();
                continue;
            }
            match &mut changes {
                Some(w) => {
                    // A change, or the fallback read (a watch that went quiet).
                    let wait = ACK_WATCH_FALLBACK.min(end - now);
                    if !next_change(w, wait).await {
                        changes = None;
                    }
                }
                None => tokio::time::sleep(ACK_POLL).await,
            }
        }
    }

    /// A stream of the changes to `dir`'s acks and to the shards' owners (None when etcd
    /// refuses the watch).
    async fn watch_acks(&self, dir: &str) -> Option<SelectAll<WatchStream>> {
        let mut client = self.client.clone();
        let mut streams = Vec::new();
        for d in [dir, "shards"] {
            let k = primaries::key(&self.prefix, d, "");
            let stream = client
                .watch(k, Some(WatchOptions::new().with_prefix()))
                .await
                .ok()?;
            streams.push(stream);
        }
        Some(futures::stream::select_all(streams))
    }

    /// The last publish of a switch, retried: the new primary is writable by now. The
    /// switch's journal ends with it.
    pub(super) async fn publish_final(
        &self,
        set: &SetLayout,
        recs: &SetRecords,
        to: PrimaryRecord,
        lock: &Lock,
    ) -> Result<SetRecords, String> {
        let mut last = String::new();
        for _ in 0..10 {
            if crate::failpoint::fires("switch-final-publish-fails") {
                last = "failpoint switch-final-publish-fails".into();
                break;
            }
            match self
                .publish_also(recs, to.clone(), vec![self.journal_end(set)], lock)
                .await
            {
                Ok(r) => return Ok(r),
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tracing::error!(shards = ?recs.records.iter().map(|r| r.0).collect::<Vec<_>>(), primary = %to.addr, error = %last, "the new primary is writable but etcd could not be told");
        Err(format!(
            "{} is the new primary (writable) but etcd could not be told ({last}); the shards stay {:?} until the next driver finishes the switch (the set's leader, within the switch lock's lease)",
            to.addr, recs.current.state
        ))
    }

    /// Lag of `addr` behind `primary`: transactions (domain 0) and heartbeat milliseconds.
    pub(super) async fn lag(&self, set: &SetLayout, primary: &str, addr: &str) -> ReplicaState {
        let mut st = ReplicaState {
            addr: addr.to_string(),
            region: set.region_of(addr).unwrap_or_default().to_string(),
            ..Default::default()
        };
        let bound = Duration::from_millis(1000);
        let db = heartbeat_db(&set.heartbeat_url);
        let p = self
            .admin(primary)
            .with(bound, |c| {
                let db = db.clone();
                Box::pin(async move { Ok((srv::binlog_pos(c).await?, heartbeat(c, &db).await)) })
            })
            .await;
        let r = self
            .admin(addr)
            .with(bound, |c| {
                let db = db.clone();
                Box::pin(async move {
                    Ok((
                        srv::replica_status(c).await?,
                        heartbeat(c, &db).await,
                        srv::read_only(c).await?,
                        srv::semi_sync(c).await?,
                    ))
                })
            })
            .await;
        match r {
            Err(e) => st.error = e,
            Ok((status, beat, ro, semi)) => {
                st.reachable = true;
                st.read_only = ro;
                st.semi_sync_replica = semi.replica_enabled;
                if let Some(s) = status {
                    st.io_running = s.io_running;
                    st.sql_running = s.sql_running;
                    st.error = s.error;
                    if let Ok((ppos, pbeat)) = &p {
                        if let (Some(a), Some(b)) =
                            (srv::seq_of(ppos, 0), srv::seq_of(&s.slave_pos, 0))
                        {
                            st.lag_transactions = Some(a as i64 - b as i64);
                        }
                        if let (Some(a), Some(b)) = (pbeat, beat) {
                            st.lag_ms = Some((a - b).max(0));
                        }
                    }
                } else if st.error.is_empty() {
                    st.error = "replicates from nobody".into();
                }
            }
        }
        st
    }

    pub(super) fn set_of(&self, shard: ShardId) -> Result<&SetLayout, Refused> {
        self.layout
            .set_of(shard)
            .ok_or_else(|| Refused::Invalid(format!("shard {shard} has no replicas")))
    }

    pub(super) async fn put_demoted(&self, server: &str, d: &Demoted) -> Result<(), String> {
        let mut client = self.client.clone();
        primaries::put_demoted(&mut client, &self.prefix, server, d)
            .await
            .map_err(|e| format!("etcd: {e}"))
    }

    pub(super) async fn status_of(&self, set: &SetLayout) -> Vec<ShardReplication> {
        let view = self.views.borrow().clone();
        let Some(rec) = view.primaries.get(&set.shards[0]).cloned() else {
            return Vec::new();
        };
        let mut replicas = Vec::new();
        for s in set.servers.iter().filter(|s| s.addr != rec.addr) {
            replicas.push(self.lag(set, &rec.addr, &s.addr).await);
        }
        let semi = self
            .admin(&rec.addr)
            .with(Duration::from_secs(1), |c| Box::pin(srv::semi_sync(c)))
            .await;
        set.shards
            .iter()
            .map(|s| ShardReplication {
                shard: *s,
                primary: rec.addr.clone(),
                primary_region: rec.region.clone(),
                generation: rec.generation,
                state: match rec.state {
                    PrimaryState::Serving => "serving".into(),
                    PrimaryState::Paused => "paused".into(),
                    PrimaryState::Fenced => "fenced".into(),
                },
                owner: view.owners.get(s).cloned(),
                primary_reachable: semi.is_ok(),
                semi_sync_on: semi.as_ref().is_ok_and(|x| x.on),
                semi_sync_no_tx: semi.as_ref().map(|x| x.no_tx).unwrap_or(0),
                replicas: replicas.clone(),
            })
            .collect()
    }

    pub(super) async fn served(&self, set: &SetLayout, generation: u64) -> bool {
        self.acks(&set.shards, "served", generation, SERVED_WAIT)
            .await
    }
}

pub(super) fn servers(set: &SetLayout) -> String {
    set.servers
        .iter()
        .map(|s| s.addr.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The database of a shard URL (where the heartbeat row lives).
pub(super) fn heartbeat_db(url: &str) -> String {
    mysql_async::Opts::from_url(url)
        .ok()
        .and_then(|o| o.db_name().map(str::to_string))
        .unwrap_or_default()
}

/// The heartbeat row's time on this server, if it has one.
pub(super) async fn heartbeat(c: &mut mysql_async::Conn, db: &str) -> Option<i64> {
    use mysql_async::prelude::*;
    let q = format!(
        "SELECT at_ms FROM `{}`.foqs_heartbeat WHERE id = 0",
        db.replace('`', "``")
    );
    c.query_first::<i64, _>(q).await.ok().flatten()
}

impl Switchboard for Driver {
    fn switchover(&self, shard: ShardId, to: Option<String>) -> BoxFuture<'_, Switched> {
        Box::pin(async move {
            let set = self.set_of(shard)?;
            Ok(vec![self.switch(set, to, None).await])
        })
    }

    fn drain(&self, from: String, to: Option<String>) -> BoxFuture<'_, Switched> {
        Box::pin(self.drain_all(from, to))
    }

    fn failover(&self, shard: ShardId, allow_loss: bool) -> BoxFuture<'_, Switched> {
        Box::pin(async move {
            let set = self.set_of(shard)?;
            Ok(vec![self.failover_set(set, allow_loss).await])
        })
    }

    fn status(&self) -> BoxFuture<'_, Vec<ShardReplication>> {
        Box::pin(async move {
            let mut out = Vec::new();
            for set in &self.layout.sets {
                out.extend(self.status_of(set).await);
            }
            out
        })
    }
}

/// Waits at most `wait` for a change on `w` (a response carrying events; the watches'
/// `created` answers carry none). False when the watch is over: cancelled by etcd (it
/// answers a refused or compacted watch so, not with an error), broken, or ended.
async fn next_change(w: &mut SelectAll<WatchStream>, wait: Duration) -> bool {
    let until = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(until, w.next()).await {
            Err(_) => return true,
            Ok(Some(Ok(r))) if r.canceled() => return false,
            Ok(Some(Ok(r))) if r.events().is_empty() => continue,
            Ok(Some(Ok(_))) => return true,
            Ok(None | Some(Err(_))) => return false,
        }
    }
}
