//! The SQLite shard's reads beside its writer: a read-only connection on a thread of its
//! own. WAL lets it read the last commit while the writer's group transaction is open, so
//! a burst of `getActiveTopics` or `topicStats` (GROUP BYs over a topic's rows) no longer
//! runs inside the writer's `BEGIN IMMEDIATE` and delays its commits. Only reads that need no order with the worker's writes come here (see
//! `SqliteStore`); a read the worker sequences after its own writes stays on the writer's
//! thread, behind them.
//!
//! Its queue is bounded: a read that finds it full fails at once, a retryable "busy".

use std::path::Path;
use std::sync::mpsc;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

use super::conn::store_error;
use crate::model::ShardId;
use crate::store::{StoreError, StoreResult};

/// Reads waiting for the reader at most; more fail at once as busy.
pub(super) const READS_QUEUED_MAX: usize = 256;

type Job = Box<dyn FnOnce(&Connection) + Send>;

pub(super) struct ReadThread {
    shard: ShardId,
    jobs: mpsc::SyncSender<Job>,
    thread: std::thread::JoinHandle<()>,
}

impl ReadThread {
    /// Opens `path` (the writer's real path: it exists, in WAL mode) read-only.
    pub(super) fn open(
        shard: ShardId,
        path: &Path,
        nice: crate::store::NiceKnob,
    ) -> StoreResult<ReadThread> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI,
        )
        .map_err(store_error)?;
        // A reader waits on the writer only around a WAL checkpoint's brief lock.
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(store_error)?;
        conn.execute_batch("PRAGMA cache_size = -16384; PRAGMA temp_store = MEMORY;")
            .map_err(store_error)?;
        let (jobs, rx) = mpsc::sync_channel::<Job>(READS_QUEUED_MAX);
        let thread = std::thread::Builder::new()
            .name(format!("foqs-sqlr-{shard}")) // within the 15 bytes of a thread name
            .spawn(move || {
                let mut nice = super::priority::ThreadNice::new(nice);
                while let Ok(job) = rx.recv() {
                    nice.follow(shard);
                    job(&conn);
                }
            })
            .map_err(|e| StoreError::Transient(format!("cannot start the shard's reader: {e}")))?;
        Ok(ReadThread {
            shard,
            jobs,
            thread,
        })
    }

    /// Runs `f` in one read transaction (one snapshot for all its statements).
    pub(super) async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn: &Connection| {
            let _ = tx.send(in_snapshot(conn, f));
        });
        self.jobs.try_send(job).map_err(|e| match e {
            mpsc::TrySendError::Full(_) => StoreError::Transient(format!(
                "busy: shard {}'s reader has {READS_QUEUED_MAX} reads waiting",
                self.shard
            )),
            mpsc::TrySendError::Disconnected(_) => stopped(),
        })?;
        rx.await.map_err(|_| stopped())?
    }

    /// Lets the reader finish what it was given and closes its connection.
    pub(super) fn close(self) {
        drop(self.jobs);
        let _ = self.thread.join();
    }
}

fn stopped() -> StoreError {
    StoreError::Transient("the shard's SQLite reader stopped".into())
}

fn in_snapshot<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> StoreResult<T>,
) -> StoreResult<T> {
    conn.execute_batch("BEGIN DEFERRED").map_err(store_error)?;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(conn)))
        .unwrap_or_else(|_| Err(StoreError::Corrupt("a store read panicked".into())));
    // Nothing to keep: ending the read transaction only lets the snapshot go; one left
    // open would fail every later read's BEGIN.
    if !conn.is_autocommit() && conn.execute_batch("COMMIT").is_err() {
        if let Err(e) = conn.execute_batch("ROLLBACK") {
            tracing::warn!(error = %e, "sqlite: cannot end a read transaction");
        }
    }
    r
}
