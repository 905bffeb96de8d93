//! Assembles a running `foqsd` from its configuration: binds the listener, starts the
//! shard manager, opens the shards it gives this host (creating their databases and
//! schemas when missing) and keeps following it (opening gained shards, stopping lost
//! ones), and serves until told to stop. Used by the binary and by the tests.

mod follow;
mod opener;

#[cfg(feature = "faults")]
pub use opener::FaultPlan;
#[cfg(not(feature = "faults"))]
use opener::FaultPlan;
use opener::ShardOpener;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::clock::SharedClock;
use crate::cluster::config::tier_shards;
use crate::cluster::{EtcdBudget, EtcdManager, ManagerKind, Member, ShardManager, StaticManager};
use crate::config::{Config, Namespaces};
use crate::core::{Access, ClusterSettings, Host, HostParts, PrefetchConfig};
use crate::metrics::Metrics;
use crate::model::{PrimaryRecord, PrimaryState, ShardId};
use crate::quota::{LocalBudget, QuotaBudget};
use crate::rpc::PeerClient;
use crate::server::{serve, serve_http, ServerLimits};
use crate::shard::WorkerConfig;
use crate::store::{PayloadCache, StoreError};
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
        Some(t) => Some(crate::tls::ServerTls::new(
            t,
            cfg.cluster.peer_ca_file.as_deref(),
        )?),
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
    say_buffer_limits(&metrics, cfg);
    let c = &cfg.cluster;
    let host_id = cfg.host_id();
    let advertise = c.advertise.clone().unwrap_or_else(|| addr.to_string());
    let shard_ids: Vec<ShardId> = cfg.shards.iter().map(|s| s.id).collect();
    let tier_shards = tier_shards(&cfg.tiers, &shard_ids);
    let layout = crate::replication::Layout::from_config(cfg);
    let mut etcd_client = None;
    // Fed by the peer polls; an etcd host out of bound stops holding shards.
    let clock_check = Arc::new(crate::cluster::ClockCheck::new(c.clock_skew_max_ms));
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
                                next_region: None,
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
                clock_check.clone(),
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
        workers: WorkerConfig {
            dlq_bounds: crate::shard::DlqBounds::from_config(cfg),
            ..WorkerConfig::from(&cfg.engine)
        },
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
        peer_fanout: c.peer_fanout as usize,
        clock_check,
    };
    // Checked with the config; read again here for its bytes.
    let peer_secret = c.peer_secret().map_err(StartError::Cluster)?;
    let peers = Arc::new(PeerClient::new(
        c.peer_connections_max,
        Duration::from_millis(c.peer_timeout_ms),
        peer_tls,
        peer_secret
            .clone()
            .map(|secret| crate::rpc::PeerLogin::new(host_id.clone(), secret)),
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
                    lock_ttl_s: (c.etcd.lease_ttl_ms / 1000) as i64,
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
        access: match c.manager {
            ManagerKind::Single => Access::new(cfg.access.clone()),
            _ => Access::new(cfg.access.clone())
                .with_peers(peer_secret.clone(), cfg.cluster.peer_ca_file.is_some()),
        },
        metrics: metrics.clone(),
        dlq_call_bound: Duration::from_millis(cfg.engine.dlq_call_ms_max),
        dlq_routed_bound: Duration::from_millis(c.peer_timeout_ms / 2),
        switchboard: driver
            .clone()
            .map(|d| d as Arc<dyn crate::replication::Switchboard>),
        enqueue_hold: Duration::from_millis(cfg.replication.enqueue_hold_ms),
        fair: crate::fair::Limits::from_engine(&cfg.engine),
        overload_cpu_busy: cfg.engine.overload_cpu_busy,
        best_effort_nice: cfg.engine.best_effort_nice,
        reply_bounds: crate::core::ReplyBounds {
            items_max: cfg.server.reply_items_max,
            bytes_max: cfg.server.reply_bytes_max,
        },
        listing_calls_per_caller_max: cfg.server.listing_calls_per_caller_max,
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
        connections_per_address_max: cfg.server.connections_per_address_max,
        connections_per_identity_max: cfg.server.connections_per_identity_max,
    };
    let mut background = vec![
        tokio::spawn(
            host.clone()
                .run_prefetch(cfg.engine.prefetch_tick_ms, stop_rx.clone()),
        ),
        tokio::spawn(host.clone().run_overload(stop_rx.clone())),
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
                let Ok(f) = r else { continue };
                if !f.lacks.is_empty() {
                    tracing::error!(server, lacks = %f.lacks.join(", "), "the replication admin account lacks privileges a switch or failover needs");
                }
                if !f.settings.is_empty() {
                    tracing::error!(server, set = %f.settings.join("; "), "a server lacks settings the guarantees rest on");
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
    let http_limits = crate::server::HttpLimits {
        header_timeout: Duration::from_millis(cfg.server.http_header_timeout_ms),
        idle_timeout: Duration::from_millis(cfg.server.http_idle_timeout_ms),
        connections_max: cfg.server.http_connections_max,
    };
    let metrics_addr = metrics_listener.as_ref().map(|(_, a)| *a);
    if let Some((l, a)) = metrics_listener {
        tracing::info!(addr = %a, "metrics and health on http://{a}/metrics, /healthz, /readyz");
        listeners.push(tokio::spawn(serve_http(
            l,
            host.clone(),
            http_limits,
            stop_rx.clone(),
        )));
    }
    let console_addr = console_listener.as_ref().map(|(_, a)| *a);
    if let Some((l, a)) = console_listener {
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
            http_limits,
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

/// Every buffer a request or an item waits in, and its bounds, in `/metrics`
/// (`foqs_buffer_limit{buffer, unit, per}`); docs/tenants.md lists them.
fn say_buffer_limits(m: &Metrics, cfg: &Config) {
    let e = &cfg.engine;
    let limits: [(&'static str, &'static str, &'static str, u64); 10] = [
        (
            "connections",
            "connections",
            "host",
            cfg.server.max_connections as u64,
        ),
        (
            "request",
            "bytes",
            "connection",
            cfg.server.max_frame_bytes as u64,
        ),
        (
            "fair_waiting",
            "requests",
            "host",
            e.fair_waiting_max as u64,
        ),
        (
            "fair_waiting",
            "bytes",
            "host",
            e.fair_waiting_bytes_max as u64,
        ),
        (
            "shard_queue",
            "commands",
            "shard",
            e.worker_queue_max as u64,
        ),
        (
            "prefetch_stage",
            "items",
            "topic",
            e.prefetch_items_max as u64,
        ),
        (
            "ready_index",
            "keys",
            "topic",
            e.index_keys_per_topic_max as u64,
        ),
        ("ready_index", "topics", "shard", e.index_topics_max as u64),
        (
            "payload_cache",
            "bytes",
            "host",
            e.payload_cache_bytes_max as u64,
        ),
        (
            "ack_memory",
            "items",
            "shard",
            e.ack_memory_items_max as u64,
        ),
    ];
    for (buffer, unit, per, v) in limits {
        m.buffer_limit(buffer, unit, per, v);
    }
}
