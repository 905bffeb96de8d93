//! Opening a shard given to this host: its store (MySQL with its TLS, owner lock and
//! statement bound, or a SQLite file), the host's payload cache and fence around it, and
//! a supervised worker, reopened with a backoff when it dies.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{follow, StartError};
use crate::clock::SharedClock;
use crate::config::ShardConfig;
use crate::fence::Fence;
use crate::metrics::Metrics;
use crate::model::{PrimaryRecord, ShardId};
use crate::shard::{ShardHandle, ShardWorker, WorkerConfig};
use crate::store::{
    Cached, Fenced, MySqlStore, PayloadCache, Retarget, ShardStore, SqliteStore, StoreError,
};
use crate::waiters::Waiters;

/// Opens shards given to this host: a store (with the manager's fence) and a started
/// worker, which rebuilds its index and checkpoints from MySQL.
#[derive(Clone)]
pub(super) struct ShardOpener {
    pub(super) shards: BTreeMap<ShardId, ShardConfig>,
    pub(super) workers: WorkerConfig,
    pub(super) clock: SharedClock,
    pub(super) waiters: Arc<Waiters>,
    pub(super) fence: Fence,
    /// Under a fixed assignment (single, static), each shard is opened under its owner
    /// lock, and a lost lock is reported here. Under etcd the lease and its fence are the
    /// authority (see docs/design.md, "One writer per shard").
    pub(super) lost: Option<mpsc::UnboundedSender<ShardId>>,
    /// A shard whose worker died is reported here, under every manager: the follow loop
    /// stops serving it and opens it anew.
    pub(super) died: mpsc::UnboundedSender<ShardId>,
    pub(super) store_timeout_ms: u64,
    /// Recently inserted rows of every shard here (see `store::cache`).
    pub(super) payload_cache: Arc<PayloadCache>,
    pub(super) metrics: Arc<Metrics>,
    #[cfg_attr(not(feature = "faults"), allow(dead_code))]
    pub(super) faults: FaultPlan,
    /// Each shard's recent worker deaths, for the backoff before a reopen.
    pub(super) deaths: Arc<std::sync::Mutex<HashMap<ShardId, Deaths>>>,
    /// Replicated shards: the generation each served shard was opened with, and the
    /// shards this host owns but does not serve (paused for a switch, or failing to open).
    pub(super) replicated: Arc<std::sync::Mutex<follow::Replicated>>,
}

/// A shard's worker deaths in a row (each within [`DEATHS_FORGOTTEN`] of the last): the
/// first reopens at once, each further one waits twice as long as the one before (1 s,
/// 2 s, 4 s ... up to [`REOPEN_BACKOFF_MAX`]), so that a worker that dies at every turn
/// (a bug that storage state triggers) costs little and does not flood the log.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deaths {
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
pub(super) type FaultPlan = ();

impl ShardOpener {
    /// The shard has replicas: it is served only on the primary etcd names.
    pub(super) fn replicas_of(&self, id: ShardId) -> bool {
        self.shards.get(&id).is_some_and(|s| !s.replicas.is_empty())
    }

    /// Shard `id`'s worker is no longer held here (resumed, or stopped).
    pub(super) fn forget_held(&self, id: ShardId) {
        self.replicated
            .lock()
            .expect("not poisoned")
            .forget_held(id);
    }

    /// Whether shard `id`'s worker can be held through a switch and moved (see
    /// [`Self::retarget`]): a replicated shard, not under an owner lock.
    pub(super) fn movable(&self, id: ShardId) -> bool {
        self.lost.is_none() && self.replicas_of(id)
    }

    /// Where a held worker of replicated shard `id` moves to serve it on `primary` (see
    /// `Host::hold_shard`). None when its store does not move: a file, or a shard under an
    /// owner lock (a fixed assignment), which is reopened instead.
    pub(super) fn retarget(&self, id: ShardId, primary: &PrimaryRecord) -> Option<Retarget> {
        if !self.movable(id) {
            return None;
        }
        let s = self.shards.get(&id)?;
        // As `open` makes them.
        let url = crate::replication::url_on(&s.url, &primary.addr);
        let tls = crate::replication::server_addr(&url).and_then(|a| s.tls_on(&a).cloned());
        Some(Retarget { url, tls })
    }

    /// `unseen`: leases a previous worker of the shard here left with nobody (see
    /// `Host::remove_shard`), known to the new worker before it runs.
    pub(super) async fn open(
        &self,
        id: ShardId,
        unseen: Option<Vec<(u64, i64)>>,
        primary: Option<&PrimaryRecord>,
    ) -> Result<(ShardHandle, JoinHandle<()>), StartError> {
        let (handle, join, _) = self.open_maybe_held(id, unseen, primary, false).await?;
        Ok((handle, join))
    }

    /// [`Self::open`], the worker held before its first turn (see
    /// `ShardWorker::start_held`): a shard whose switch is under way, opened on the frozen
    /// old primary `paused` names, resumed with the sender on the new one.
    pub(super) async fn open_held(
        &self,
        id: ShardId,
        unseen: Option<Vec<(u64, i64)>>,
        paused: &PrimaryRecord,
    ) -> Result<(ShardHandle, JoinHandle<()>, Resumer), StartError> {
        let (handle, join, resume) = self.open_maybe_held(id, unseen, Some(paused), true).await?;
        Ok((
            handle,
            join,
            resume.expect("a held start returns its resumer"),
        ))
    }

    async fn open_maybe_held(
        &self,
        id: ShardId,
        unseen: Option<Vec<(u64, i64)>>,
        primary: Option<&PrimaryRecord>,
        held: bool,
    ) -> Result<Started, StartError> {
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
            return self
                .start(id, SqliteStore::new(s.id, path), unseen, held)
                .await;
        }
        // A replicated shard is opened on the primary etcd names, never on another.
        let url = match primary {
            Some(p) => crate::replication::url_on(&s.url, &p.addr),
            None => s.url.clone(),
        };
        let tls = crate::replication::server_addr(&url).and_then(|a| s.tls_on(&a));
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
        tracing::info!(shard = s.id, database = store.database(), server = %crate::replication::server_addr(&url).unwrap_or_default(), generation = primary.map(|p| p.generation), held, "opening shard");
        self.start(id, store, unseen, held).await
    }

    /// Starts a shard's worker over `store` with the host's payload cache in front of its
    /// claims, and the faults a test planned for it around both.
    async fn start<S: ShardStore>(
        &self,
        id: ShardId,
        store: S,
        unseen: Option<Vec<(u64, i64)>>,
        held: bool,
    ) -> Result<Started, StartError> {
        let store = Cached::new(store, id, self.payload_cache.clone());
        #[cfg(feature = "faults")]
        if let Some(f) = self.faults.get(&id) {
            let store = crate::store::faulty::Faulty::new(store, f.clone());
            return self.start_worker(id, store, unseen, held).await;
        }
        self.start_worker(id, store, unseen, held).await
    }

    /// Starts a shard's worker over `store`. Fencing wraps whatever store the shard has
    /// (see `store::Fenced`).
    async fn start_worker<S: ShardStore>(
        &self,
        id: ShardId,
        store: S,
        unseen: Option<Vec<(u64, i64)>>,
        held: bool,
    ) -> Result<Started, StartError> {
        let (store, clock, cfg) = (
            Fenced::new(store, self.fence.clone()),
            self.clock.clone(),
            self.workers.clone(),
        );
        let (waiters, metrics, unseen) = (
            self.waiters.clone(),
            self.metrics.clone(),
            unseen.as_deref(),
        );
        let started = if held {
            ShardWorker::start_held(id, store, clock, cfg, waiters, metrics, unseen)
                .await
                .map(|(h, w, r)| (h, w, Some(r)))
        } else {
            ShardWorker::start_inheriting(id, store, clock, cfg, waiters, metrics, unseen)
                .await
                .map(|(h, w)| (h, w, None))
        };
        let (handle, worker, resume) =
            started.map_err(|source| StartError::Shard { shard: id, source })?;
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
        Ok((handle, supervised, resume))
    }
}

/// What resumes a worker started held (see [`ShardOpener::open_held`]).
pub(super) type Resumer = tokio::sync::oneshot::Sender<crate::shard::Resume>;

/// A started worker: its handle, its supervised task, and its resumer when held.
type Started = (ShardHandle, JoinHandle<()>, Option<Resumer>);

/// What a panic said, for the log.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
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
