//! Assembles a running `foqsd` from its configuration: binds the listener, starts the
//! shard manager, opens the shards it gives this host (creating their databases and
//! schemas when missing) and keeps following it (opening gained shards, stopping lost
//! ones), and serves until told to stop. Used by the binary and by the tests.

mod follow;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::clock::SharedClock;
use crate::cluster::config::tier_shards;
use crate::cluster::{EtcdBudget, EtcdManager, ManagerKind, Member, ShardManager, StaticManager};
use crate::config::{Config, Namespaces, ShardConfig};
use crate::core::{Access, ClusterSettings, Host, HostParts, PrefetchConfig};
use crate::fence::Fence;
use crate::metrics::Metrics;
use crate::model::{PrimaryRecord, PrimaryState, ShardId};
use crate::quota::{LocalBudget, QuotaBudget};
use crate::rpc::PeerClient;
use crate::server::{serve, serve_http, ServerLimits};
use crate::shard::{ShardHandle, ShardWorker, WorkerConfig};
use crate::store::{Cached, Fenced, MySqlStore, PayloadCache, ShardStore, SqliteStore, StoreError};
use crate::waiters::Waiters;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("shard {shard}: {source}")]
    Shard { shard: u32, source: StoreError },
    #[error("cluster: {0}")]
    Cluster(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
}

/// A started `foqsd`.
pub struct Running {
    pub addr: SocketAddr,
    /// Where `/metrics`, `/healthz` and `/readyz` are served, when configured.
    pub metrics_addr: Option<SocketAddr>,
    /// Where the web console is served, when configured.
    pub console_addr: Option<SocketAddr>,
    pub host: Arc<Host>,
    manager: Arc<dyn ShardManager>,
    stop: watch::Sender<bool>,
    server: JoinHandle<()>,
    background: Vec<JoinHandle<()>>,
    /// The metrics and console listeners: stopped within [`LISTENERS_STOP_MAX`].
    listeners: Vec<JoinHandle<()>>,
    /// How long the shards get to stop (`server.shutdown_grace_ms`).
    grace: Duration,
}

/// How long the HTTP listeners get to finish their requests at shutdown.
const LISTENERS_STOP_MAX: Duration = Duration::from_secs(2);

impl Running {
    /// Graceful stop: no new connections, in-flight requests finish, shard buffers are
    /// flushed and checkpoints saved, then the host leaves the cluster (its shards go to
    /// the others at once).
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        // Long polls in flight return (empty) now, so connections can finish.
        self.host.stop_waiting();
        let _ = self.server.await;
        // The HTTP listeners (metrics, console) finish the requests they are serving; one
        // that a client never finishes is cut off, so it cannot hold up the shards' flush.
        // They hold no state, unlike the background tasks, which stop at their own checks.
        let aborts: Vec<_> = self.listeners.iter().map(|t| t.abort_handle()).collect();
        let listeners = futures::future::join_all(self.listeners);
        if tokio::time::timeout(LISTENERS_STOP_MAX, listeners)
            .await
            .is_err()
        {
            tracing::warn!("HTTP requests still open at shutdown: cut off");
            for a in &aborts {
                a.abort();
            }
        }
        for task in self.background {
            let _ = task.await;
        }
        self.host.shutdown(self.grace).await;
        // Leaving gives up every shard at once (etcd: the lease is revoked).
        self.manager.leave().await;
    }
}

/// Opens shards given to this host: a store (with the manager's fence) and a started
/// worker, which rebuilds its index and checkpoints from MySQL.
#[derive(Clone)]
struct ShardOpener {
    shards: BTreeMap<ShardId, ShardConfig>,
    workers: WorkerConfig,
    clock: SharedClock,
    waiters: Arc<Waiters>,
    fence: Fence,
    /// Under a fixed assignment (single, static), each shard is opened under its owner
    /// lock, and a lost lock is reported here. Under etcd the lease and its fence are the
    /// authority (see README, "One writer per shard").
    lost: Option<mpsc::UnboundedSender<ShardId>>,
    /// A shard whose worker died is reported here, under every manager: the follow loop
    /// stops serving it and opens it anew.
    died: mpsc::UnboundedSender<ShardId>,
    store_timeout_ms: u64,
    /// Recently inserted rows of every shard here (see `store::cache`).
    payload_cache: Arc<PayloadCache>,
    metrics: Arc<Metrics>,
    #[cfg_attr(not(feature = "faults"), allow(dead_code))]
    faults: FaultPlan,
    /// Each shard's recent worker deaths, for the backoff before a reopen.
    deaths: Arc<std::sync::Mutex<HashMap<ShardId, Deaths>>>,
    /// Replicated shards: the generation each served shard was opened with, and the
    /// shards this host owns but does not serve (paused for a switch, or failing to open).
    replicated: Arc<std::sync::Mutex<follow::Replicated>>,
}

/// A shard's worker deaths in a row (each within [`DEATHS_FORGOTTEN`] of the last): the
/// first reopens at once, each further one waits twice as long as the one before (1 s,
/// 2 s, 4 s ... up to [`REOPEN_BACKOFF_MAX`]), so that a worker that dies at every turn
/// (a bug that storage state triggers) costs little and does not flood the log.
#[derive(Debug, Clone, Copy)]
struct Deaths {
    in_a_row: u32,
    last: std::time::Instant,
}

const DEATHS_FORGOTTEN: Duration = Duration::from_secs(60);
const REOPEN_BACKOFF_MAX: Duration = Duration::from_secs(30);

impl Deaths {
    /// Records a death now; returns how long to wait before the reopen.
    fn record(deaths: &mut HashMap<ShardId, Deaths>, id: ShardId) -> Duration {
        let now = std::time::Instant::now();
        let in_a_row = match deaths.get(&id) {
            Some(d) if now.duration_since(d.last) < DEATHS_FORGOTTEN => d.in_a_row + 1,
            _ => 1,
        };
        deaths.insert(
            id,
            Deaths {
                in_a_row,
                last: now,
            },
        );
        match in_a_row {
            1 => Duration::ZERO,
            n => Duration::from_secs(1u64 << (n - 2).min(5)).min(REOPEN_BACKOFF_MAX),
        }
    }
}

/// Faults to inject around shards' stores, by shard (tests only: feature `faults`).
#[cfg(feature = "faults")]
pub type FaultPlan = BTreeMap<ShardId, crate::store::faulty::Faults>;
#[cfg(not(feature = "faults"))]
type FaultPlan = ();

impl ShardOpener {
    /// The shard has replicas: it is served only on the primary etcd names.
    fn replicas_of(&self, id: ShardId) -> bool {
        self.shards.get(&id).is_some_and(|s| !s.replicas.is_empty())
    }

    /// `unseen`: leases a previous worker of the shard here left with nobody (see
    /// `Host::remove_shard`), known to the new worker before it runs.
    async fn open(
        &self,
        id: ShardId,
        unseen: Option<Vec<(u64, i64)>>,
        primary: Option<&PrimaryRecord>,
    ) -> Result<(ShardHandle, JoinHandle<()>), StartError> {
        let err = |source| StartError::Shard { shard: id, source };
        let s = self.shards.get(&id).ok_or_else(|| {
            err(StoreError::Schema(format!(
                "shard {id} is not in [[shards]]"
            )))
        })?;
        if let Some(path) = crate::store::sqlite_path(&s.url, std::path::Path::new(".")) {
            // A file of this host: its owner lock is a lock on the file (see
            // `store::sqlite`), and it is opened only under the `single` manager.
            tracing::info!(shard = s.id, file = %path.display(), "opening shard");
            return self.start(id, SqliteStore::new(s.id, path), unseen).await;
        }
        // A replicated shard is opened on the primary etcd names, never on another.
        let url = match primary {
            Some(p) => crate::replication::url_on(&s.url, &p.addr),
            None => s.url.clone(),
        };
        // TLS: the settings of the server connected to (a replica's own, or the shard's).
        let server = crate::replication::server_addr(&url);
        let tls = s
            .replicas
            .iter()
            .find(|r| server.is_some() && crate::replication::server_addr(&r.url) == server)
            .and_then(|r| r.tls.as_ref())
            .or(s.tls.as_ref());
        let mut store = MySqlStore::new(s.id, &url, s.pool_connections_max)
            .map_err(err)?
            .with_tls(tls)
            .with_statement_timeout(self.store_timeout_ms);
        if let Some(lost) = &self.lost {
            let lost = lost.clone();
            store = store.with_owner_lock(
                Arc::new(move || {
                    let _ = lost.send(id);
                }),
                self.store_timeout_ms,
            );
        }
        tracing::info!(shard = s.id, database = store.database(), server = %crate::replication::server_addr(&url).unwrap_or_default(), generation = primary.map(|p| p.generation), "opening shard");
        let no_tls = tls.is_none();
        self.start(id, store, unseen).await.map_err(|e| match e {
            // A server that requires secure transport refuses a plain connection as an
            // access denied, and says no more.
            StartError::Shard { shard, source } if no_tls && source.to_string().contains("Access denied") => {
                StartError::Shard {
                    shard,
                    source: StoreError::Schema(format!(
                        "{source} (connected without TLS: if the server requires secure transport, give the shard tls = {{ ca_file = \"...\" }})"
                    )),
                }
            }
            e => e,
        })
    }

    /// Starts a shard's worker over `store` with the host's payload cache in front of its
    /// claims, and the faults a test planned for it around both.
    async fn start<S: ShardStore>(
        &self,
        id: ShardId,
        store: S,
        unseen: Option<Vec<(u64, i64)>>,
    ) -> Result<(ShardHandle, JoinHandle<()>), StartError> {
        let store = Cached::new(store, id, self.payload_cache.clone());
        #[cfg(feature = "faults")]
        if let Some(f) = self.faults.get(&id) {
            let store = crate::store::faulty::Faulty::new(store, f.clone());
            return self.start_worker(id, store, unseen).await;
        }
        self.start_worker(id, store, unseen).await
    }

    /// Starts a shard's worker over `store`. Fencing wraps whatever store the shard has
    /// (see `store::Fenced`).
    async fn start_worker<S: ShardStore>(
        &self,
        id: ShardId,
        store: S,
        unseen: Option<Vec<(u64, i64)>>,
    ) -> Result<(ShardHandle, JoinHandle<()>), StartError> {
        let (handle, worker) = ShardWorker::start_inheriting(
            id,
            Fenced::new(store, self.fence.clone()),
            self.clock.clone(),
            self.workers.clone(),
            self.waiters.clone(),
            self.metrics.clone(),
            unseen.as_deref(),
        )
        .await
        .map_err(|source| StartError::Shard { shard: id, source })?;
        // The worker's end is watched: one that panicked leaves its shard unhealthy
        // (readiness, getHostInfo), counted and logged, and reported to be reopened. Its
        // requests fail meanwhile with a retryable UNAVAILABLE (its queue is closed).
        let (dead, died, metrics) = (handle.clone(), self.died.clone(), self.metrics.clone());
        let deaths = self.deaths.clone();
        let supervised = tokio::spawn(async move {
            match worker.await {
                Err(e) if e.is_panic() => {
                    let why = panic_message(&*e.into_panic());
                    dead.mark_dead();
                    metrics.worker_died(id);
                    let wait =
                        Deaths::record(&mut deaths.lock().unwrap_or_else(|p| p.into_inner()), id);
                    tracing::error!(shard = id, error = %why, reopen_in_ms = wait.as_millis() as u64, "shard worker died; reopening the shard");
                    tokio::time::sleep(wait).await;
                    let _ = died.send(id);
                }
                _ => {}
            }
        });
        Ok((handle, supervised))
    }
}

/// What a panic said, for the log.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

async fn bind(addr: &str, backlog: u32) -> Result<(TcpListener, SocketAddr), StartError> {
    let listen_error = |source| StartError::Listen {
        addr: addr.to_string(),
        source,
    };
    let listener = crate::server::listen(addr, backlog)
        .await
        .map_err(listen_error)?;
    let bound = listener.local_addr().map_err(listen_error)?;
    Ok((listener, bound))
}

pub async fn start(cfg: &Config, clock: SharedClock) -> Result<Running, StartError> {
    // Without the `faults` feature the plan is `()`: nothing to inject.
    #[allow(clippy::unit_arg)]
    start_planned(cfg, clock, FaultPlan::default()).await
}

/// [`start`], with faults injected around the stores of the shards `plan` names.
#[cfg(feature = "faults")]
pub async fn start_with_faults(
    cfg: &Config,
    clock: SharedClock,
    plan: FaultPlan,
) -> Result<Running, StartError> {
    start_planned(cfg, clock, plan).await
}

async fn start_planned(
    cfg: &Config,
    clock: SharedClock,
    faults: FaultPlan,
) -> Result<Running, StartError> {
    // TLS files are read before anything listens: a bad one fails the start.
    let tls = match &cfg.server.tls {
        Some(t) => Some(tokio_rustls::TlsAcceptor::from(crate::tls::server_config(
            t,
        )?)),
        None => None,
    };
    let peer_tls = match &cfg.cluster.tls_ca_file {
        Some(ca) => Some(crate::tls::client_config(&crate::tls::ClientTlsFiles {
            ca_file: Some(ca.clone()),
            cert_file: cfg.cluster.tls_cert_file.clone(),
            key_file: cfg.cluster.tls_key_file.clone(),
        })?),
        None => None,
    };
    let backlog = cfg.server.listen_backlog;
    let (listener, addr) = bind(&cfg.server.listen, backlog).await?;
    let metrics_listener = match &cfg.metrics.listen {
        Some(l) => Some(bind(l, backlog).await?),
        None => None,
    };
    let console_listener = match &cfg.console.listen {
        Some(l) => Some(bind(l, backlog).await?),
        None => None,
    };
    let metrics = Arc::new(Metrics::new());
    let c = &cfg.cluster;
    let host_id = cfg.host_id();
    let advertise = c.advertise.clone().unwrap_or_else(|| addr.to_string());
    let shard_ids: Vec<ShardId> = cfg.shards.iter().map(|s| s.id).collect();
    let tier_shards = tier_shards(&cfg.tiers, &shard_ids);
    let layout = crate::replication::Layout::from_config(cfg);
    let mut etcd_client = None;
    let (manager, budget): (Arc<dyn ShardManager>, Arc<dyn QuotaBudget>) = match c.manager {
        ManagerKind::Single => (
            Arc::new(StaticManager::single(
                &host_id, &advertise, &c.tier, &shard_ids,
            )),
            Arc::new(LocalBudget::new(1, clock.clone())),
        ),
        ManagerKind::Static => {
            let tier_hosts = c.hosts.iter().filter(|h| h.tier == c.tier).count();
            (
                Arc::new(StaticManager::from_config(c)),
                Arc::new(LocalBudget::new(tier_hosts as u64, clock.clone())),
            )
        }
        ManagerKind::Etcd => {
            let member = Member {
                host_id: host_id.clone(),
                addr: advertise.clone(),
                tier: c.tier.clone(),
                region: c.region.clone(),
                tier_shards: tier_shards.get(&c.tier).cloned().unwrap_or_default(),
                primaries: layout
                    .initial()
                    .into_iter()
                    .map(|(s, srv)| {
                        (
                            s,
                            PrimaryRecord {
                                addr: srv.addr,
                                region: srv.region,
                                generation: 1,
                                state: PrimaryState::Serving,
                            },
                        )
                    })
                    .collect(),
            };
            let (m, client) = EtcdManager::start(
                &c.etcd,
                member,
                cfg.engine.store_timeout_ms,
                metrics.clone(),
            )
            .await
            .map_err(|e| StartError::Cluster(e.to_string()))?;
            etcd_client = Some(client.clone());
            (
                m,
                Arc::new(EtcdBudget::new(client, &c.etcd.prefix, clock.clone())),
            )
        }
    };
    let waiters = Waiters::new();
    let (lost_tx, lost_rx) = mpsc::unbounded_channel();
    let opener = ShardOpener {
        shards: cfg.shards.iter().map(|s| (s.id, s.clone())).collect(),
        workers: WorkerConfig::from(&cfg.engine),
        clock: clock.clone(),
        waiters: waiters.clone(),
        fence: manager.fence(),
        lost: (c.manager != ManagerKind::Etcd).then_some(lost_tx.clone()),
        died: lost_tx,
        store_timeout_ms: cfg.engine.store_timeout_ms,
        payload_cache: PayloadCache::counted(
            cfg.engine.payload_cache_bytes_max,
            metrics.payload_cache_hits.clone(),
            metrics.payload_cache_misses.clone(),
            metrics.payload_cache_bytes.clone(),
        ),
        metrics: metrics.clone(),
        faults,
        deaths: Default::default(),
        replicated: Default::default(),
    };
    let prefetch = PrefetchConfig {
        window_ms: cfg.engine.prefetch_window_ms,
        items_max: cfg.engine.prefetch_items_max,
        stage_max_ms: cfg.engine.prefetch_stage_max_ms as i64,
    };
    let settings = ClusterSettings {
        host_id: host_id.clone(),
        addr: advertise,
        tier: c.tier.clone(),
        manager: manager.kind(),
        serves_all_tiers: c.manager == ManagerKind::Single,
        forwarding: c.forwarding,
        in_doubt_max: Duration::from_millis(match c.manager {
            ManagerKind::Etcd => c.etcd.lease_ttl_ms + 5000,
            _ => 2000,
        }),
        tier_shards,
    };
    let peers = Arc::new(PeerClient::new(
        c.peer_connections_max,
        Duration::from_millis(c.peer_timeout_ms),
        peer_tls,
        metrics.clone(),
    ));
    // Replicated shards: switches driven from this host when asked, and the monitor of
    // the replica sets it leads (heartbeats, failover, demoted servers' rejoin).
    let driver = match (&etcd_client, layout.is_empty()) {
        (Some(client), false) => {
            let data_user = cfg
                .shards
                .iter()
                .find(|s| !s.replicas.is_empty())
                .and_then(|s| mysql_async::Opts::from_url(&s.url).ok())
                .and_then(|o| o.user().map(str::to_string))
                .unwrap_or_default();
            Some(Arc::new(crate::replication::driver::Driver::new(
                client.clone(),
                crate::replication::driver::Setup {
                    prefix: c.etcd.prefix.clone(),
                    host_id: host_id.clone(),
                    layout: layout.clone(),
                    cfg: cfg.replication.clone(),
                    data_user,
                },
                manager.watch(),
                metrics.clone(),
            )))
        }
        _ => None,
    };
    let host = Arc::new(Host::new(HostParts {
        namespaces: Namespaces::from_config(cfg),
        prefetch,
        waiters: waiters.clone(),
        clock,
        cluster: settings,
        peers,
        quota_budget: budget,
        access: Access::new(cfg.access.clone()),
        metrics: metrics.clone(),
        dlq_call_bound: Duration::from_millis(cfg.engine.dlq_call_ms_max),
        dlq_routed_bound: Duration::from_millis(c.peer_timeout_ms / 2),
        switchboard: driver
            .clone()
            .map(|d| d as Arc<dyn crate::replication::Switchboard>),
        enqueue_hold: Duration::from_millis(cfg.replication.enqueue_hold_ms),
    }));
    let mut views = manager.watch();
    // A fixed assignment is opened before serving, and a shard that cannot be opened
    // fails the start; under etcd, shards arrive (and are retried) while serving.
    let first = views.borrow_and_update().clone();
    let failed = follow::follow_view(&host, &*manager, &opener, first).await;
    if c.manager != ManagerKind::Etcd {
        if let Some((_, e)) = failed.into_iter().next() {
            host.shutdown(Duration::from_millis(cfg.server.shutdown_grace_ms))
                .await;
            return Err(e);
        }
    }
    tracing::info!(%addr, host_id = host.host_id(), manager = manager.kind(), "foqsd listening");
    let (stop, stop_rx) = watch::channel(false);
    let limits = ServerLimits {
        max_frame_bytes: cfg.server.max_frame_bytes,
        max_connections: cfg.server.max_connections,
        shutdown_grace_ms: cfg.server.shutdown_grace_ms,
        frame_read_timeout_ms: cfg.server.frame_read_timeout_ms,
        idle_timeout_ms: cfg.server.idle_timeout_ms,
        handshake_timeout_ms: cfg.server.handshake_timeout_ms,
    };
    let mut background = vec![
        tokio::spawn(
            host.clone()
                .run_prefetch(cfg.engine.prefetch_tick_ms, stop_rx.clone()),
        ),
        tokio::spawn(follow::follow(
            host.clone(),
            manager.clone(),
            opener,
            views,
            lost_rx,
            stop_rx.clone(),
        )),
    ];
    if let Some(d) = driver {
        background.push(tokio::spawn(crate::replication::failover::run_monitor(
            d,
            stop_rx.clone(),
        )));
        // Said once at start, before a switch needs it (`foqsd --check-config` says it too).
        let grants_cfg = cfg.clone();
        tokio::spawn(async move {
            for (server, r) in crate::replication::grants::check_servers(&grants_cfg).await {
                if let Some(m) = r.ok().filter(|m| !m.is_empty()) {
                    tracing::error!(server, lacks = %m.join(", "), "the replication admin account lacks privileges a switch or failover needs");
                }
            }
        });
    }
    if c.manager != ManagerKind::Single {
        background.push(tokio::spawn(
            host.clone().run_peer_poll(c.peer_poll_ms, stop_rx.clone()),
        ));
        // Topics that get ready items here are announced to the peers, so that long polls
        // routed through them wake at once.
        let (announce, announced) = mpsc::unbounded_channel();
        waiters.announce_to(announce);
        background.push(tokio::spawn(
            host.clone().run_announcer(announced, stop_rx.clone()),
        ));
    }
    let mut listeners = Vec::new();
    let metrics_addr = metrics_listener.as_ref().map(|(_, a)| *a);
    if let Some((l, a)) = metrics_listener {
        tracing::info!(addr = %a, "metrics and health on http://{a}/metrics, /healthz, /readyz");
        listeners.push(tokio::spawn(serve_http(l, host.clone(), stop_rx.clone())));
    }
    let console_addr = console_listener.as_ref().map(|(_, a)| *a);
    if let Some((l, a)) = console_listener {
        if !a.ip().is_loopback() && cfg.console.users.is_empty() {
            tracing::warn!(addr = %a, "the console listens beyond this machine with no [[console.users]]: anyone who reaches it may requeue and purge");
        }
        tracing::info!(addr = %a, "web console on http://{a}/");
        let series = Arc::new(crate::console::Series::default());
        background.push(tokio::spawn(crate::console::run_sampler(
            series.clone(),
            host.clone(),
            stop_rx.clone(),
        )));
        let console = Arc::new(crate::console::Console::new(
            host.clone(),
            &cfg.console,
            series,
        ));
        listeners.push(tokio::spawn(crate::console::serve_console(
            l,
            console,
            stop_rx.clone(),
        )));
    }
    let server = tokio::spawn(serve(listener, host.clone(), limits, tls, metrics, stop_rx));
    Ok(Running {
        addr,
        metrics_addr,
        console_addr,
        host,
        manager,
        stop,
        server,
        background,
        listeners,
        grace: Duration::from_millis(cfg.server.shutdown_grace_ms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reopens_after_deaths_in_a_row_back_off_and_a_quiet_minute_forgives() {
        let mut d = HashMap::new();
        let waits: Vec<u64> = (0..9)
            .map(|_| Deaths::record(&mut d, 3).as_secs())
            .collect();
        assert_eq!(waits, vec![0, 1, 2, 4, 8, 16, 30, 30, 30]);
        // Another shard's deaths are its own.
        assert_eq!(Deaths::record(&mut d, 4), Duration::ZERO);
        // A minute without a death: the next is a first again.
        d.get_mut(&3).unwrap().last -= DEATHS_FORGOTTEN;
        assert_eq!(Deaths::record(&mut d, 3), Duration::ZERO);
    }
}
