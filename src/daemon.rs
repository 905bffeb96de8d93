//! Assembles a running `foqsd` from its configuration: opens every shard (creating its
//! database and schema when missing), starts the shard workers and the host, binds the
//! listener and serves until told to stop. Used by the binary and by the tests.

use std::net::SocketAddr;
use std::sync::Arc;

use futures::future::try_join_all;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::clock::SharedClock;
use crate::config::{Config, Namespaces};
use crate::core::{Host, PrefetchConfig};
use crate::server::{serve, ServerLimits};
use crate::shard::{ShardWorker, WorkerConfig};
use crate::store::{MySqlStore, StoreError};
use crate::waiters::Waiters;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("shard {shard}: {source}")]
    Shard { shard: u32, source: StoreError },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
}

/// A started `foqsd`.
pub struct Running {
    pub addr: SocketAddr,
    pub host: Arc<Host>,
    stop: watch::Sender<bool>,
    server: JoinHandle<()>,
    prefetcher: JoinHandle<()>,
}

impl Running {
    /// Graceful stop: no new connections, in-flight requests finish, shard buffers are
    /// flushed and checkpoints saved.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        // Long polls in flight return (empty) now, so connections can finish.
        self.host.stop_waiting();
        let _ = self.server.await;
        let _ = self.prefetcher.await;
        self.host.shutdown().await;
    }
}

pub async fn start(cfg: &Config, clock: SharedClock) -> Result<Running, StartError> {
    let workers = WorkerConfig::from(&cfg.engine);
    let waiters = Waiters::new();
    let shards = try_join_all(cfg.shards.iter().map(|s| {
        let (clock, workers, waiters) = (clock.clone(), workers.clone(), waiters.clone());
        async move {
            let store =
                MySqlStore::new(s.id, &s.url, s.pool_connections_max).map_err(|source| {
                    StartError::Shard {
                        shard: s.id,
                        source,
                    }
                })?;
            tracing::info!(shard = s.id, database = store.database(), "opening shard");
            ShardWorker::start(s.id, store, clock, workers, waiters)
                .await
                .map_err(|source| StartError::Shard {
                    shard: s.id,
                    source,
                })
        }
    }))
    .await?;
    let prefetch = PrefetchConfig {
        window_ms: cfg.engine.prefetch_window_ms,
        items_max: cfg.engine.prefetch_items_max,
        stage_max_ms: cfg.engine.prefetch_stage_max_ms as i64,
    };
    let host = Arc::new(Host::new(
        cfg.host_id(),
        shards,
        Namespaces::from_config(cfg),
        prefetch,
        waiters,
        clock,
    ));
    let listener = TcpListener::bind(&cfg.server.listen)
        .await
        .map_err(|source| StartError::Listen {
            addr: cfg.server.listen.clone(),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| StartError::Listen {
        addr: cfg.server.listen.clone(),
        source,
    })?;
    tracing::info!(%addr, host_id = host.host_id(), "foqsd listening");
    let (stop, stop_rx) = watch::channel(false);
    let limits = ServerLimits {
        max_frame_bytes: cfg.server.max_frame_bytes,
        max_connections: cfg.server.max_connections,
        shutdown_grace_ms: cfg.server.shutdown_grace_ms,
    };
    let prefetcher = tokio::spawn(
        host.clone()
            .run_prefetch(cfg.engine.prefetch_tick_ms, stop_rx.clone()),
    );
    let server = tokio::spawn(serve(listener, host.clone(), limits, stop_rx));
    Ok(Running {
        addr,
        host,
        prefetcher,
        stop,
        server,
    })
}
