//! The SQLite shard's connection, on a thread of its own: SQLite is blocking, so nothing
//! of it runs on the async runtime's threads. Every operation is a job sent to that
//! thread; the async side awaits its answer (and the shard worker bounds that wait by
//! `store_timeout_ms`, as for MySQL: a job whose wait ended still runs, its outcome
//! unknown to the worker, like a MySQL statement cut off by a timeout).
//!
//! **Group commit.** The thread takes every job already queued, runs each under a
//! savepoint of one transaction (a job that fails is rolled back alone) and commits once;
//! only then are the answers sent. With `synchronous = FULL` a commit is an fsync, so a
//! turn's insert, claim, ack and nack share one instead of paying four.
//!
//! **One writer.** Opening takes an exclusive `flock` on `<file>.lock` (released by the
//! kernel when the process dies, even by SIGKILL), so a second foqsd on the same file
//! refuses at start; the database itself stays readable by other connections (the
//! `sqlite3` shell, the tests) in WAL mode.

use std::path::{Path, PathBuf};
use std::sync::mpsc;

use rusqlite::{Connection, ErrorCode};
use tokio::sync::oneshot;

use super::priority::ThreadNice;
use crate::model::ShardId;
use crate::store::{StoreError, StoreResult};

/// Jobs committed together at most.
const GROUP_JOBS_MAX: usize = 256;
/// Jobs waiting for the thread at most (the worker's own writes are a few per turn; a
/// stalled disk must not let ones given up on pile up without end): more fail at once.
pub(super) const JOBS_QUEUED_MAX: usize = 1024;

/// What runs after the group's commit, with its outcome.
type Done = Box<dyn FnOnce(&Result<(), String>) + Send>;
/// Run on the connection, or (`None`) refused unrun, the reason then given to its `Done`.
type Job = Box<dyn FnOnce(Option<&Connection>) -> Done + Send>;

/// SQLite's errors in the store's terms.
pub(super) fn store_error(e: rusqlite::Error) -> StoreError {
    match &e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase | ErrorCode::TypeMismatch => {
                StoreError::Corrupt(format!("sqlite: {e}"))
            }
            ErrorCode::ConstraintViolation | ErrorCode::TooBig => {
                StoreError::Corrupt(format!("sqlite: {e}"))
            }
            ErrorCode::CannotOpen | ErrorCode::PermissionDenied | ErrorCode::ReadOnly => {
                StoreError::Schema(format!("sqlite: {e}"))
            }
            _ => StoreError::Transient(format!("sqlite: {e}")),
        },
        rusqlite::Error::SqlInputError { .. } => StoreError::Corrupt(format!("sqlite: {e}")),
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => {
            StoreError::Corrupt(format!("sqlite: {e}"))
        }
        _ => StoreError::Transient(format!("sqlite: {e}")),
    }
}

/// `path` with every symlink and `..` resolved; the file itself need not exist yet (its
/// folder does).
fn canonical(path: &Path) -> StoreResult<PathBuf> {
    let fail =
        |e: std::io::Error| StoreError::Schema(format!("cannot resolve {}: {e}", path.display()));
    match std::fs::canonicalize(path) {
        Ok(p) => Ok(p),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // A symlink to a file not there yet would lock under the link's name while
            // SQLite writes the target: refused (create the file, or name the real path).
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(StoreError::Schema(format!(
                    "{} is a symlink to a file that does not exist: name the real path",
                    path.display()
                )));
            }
            let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
                return Err(fail(e));
            };
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            Ok(std::fs::canonicalize(dir).map_err(fail)?.join(name))
        }
        Err(e) => Err(fail(e)),
    }
}

/// The shard's thread and the lock that makes this process its only writer.
pub(super) struct ShardThread {
    shard: ShardId,
    /// The database's real path (symlinks resolved), which the reader opens too.
    path: PathBuf,
    jobs: mpsc::SyncSender<Job>,
    thread: std::thread::JoinHandle<()>,
}

impl ShardThread {
    /// Opens (creating when missing, with its folder) the database at `path`, under its
    /// owner lock, and runs `setup` on it before any job.
    pub(super) fn open(
        shard: ShardId,
        path: &Path,
        nice: crate::store::NiceKnob,
        setup: impl FnOnce(&Connection) -> StoreResult<()>,
    ) -> StoreResult<ShardThread> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Schema(format!("cannot create folder {}: {e}", dir.display()))
            })?;
        }
        // One file, one lock, however the path is spelled (a symlink to the file or its
        // folder, `..`): the lock and the database go by the file's real path.
        let path = &canonical(path)?;
        let lock_path = PathBuf::from(format!("{}.lock", path.display()));
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| StoreError::Schema(format!("cannot open {}: {e}", lock_path.display())))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Owned(format!(
                    "shard {shard} (file {}) is served by another foqsd process (it holds {})",
                    path.display(),
                    lock_path.display()
                )))
            }
            // Not another owner: the file system refused the lock (say, one without locks).
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(StoreError::Schema(format!(
                    "cannot lock {}: {e}",
                    lock_path.display()
                )))
            }
        }
        let conn = connect(path)?;
        setup(&conn)?;
        let (jobs, rx) = mpsc::sync_channel::<Job>(JOBS_QUEUED_MAX);
        let real = path.clone();
        let thread = std::thread::Builder::new()
            .name(format!("foqs-sqlite-{shard}"))
            .spawn(move || {
                run(conn, &real, rx, ThreadNice::new(nice), shard);
                // Only once the connection is closed may another process take the shard.
                drop(lock);
            })
            .map_err(|e| StoreError::Transient(format!("cannot start the shard's thread: {e}")))?;
        Ok(ShardThread {
            shard,
            path: path.clone(),
            jobs,
            thread,
        })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the shard's thread, inside a group transaction; answers once it is
    /// committed.
    pub(super) async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn: Option<&Connection>| {
            let r = conn.map(|conn| in_savepoint(conn, f));
            Box::new(move |commit: &Result<(), String>| {
                let r = match (r, commit) {
                    (Some(Ok(v)), Ok(())) => Ok(v),
                    (Some(Err(e)), _) => Err(e),
                    (Some(Ok(_)), Err(e)) => {
                        Err(StoreError::Transient(format!("sqlite commit: {e}")))
                    }
                    (None, Err(e)) => Err(StoreError::Transient(format!("sqlite, not run: {e}"))),
                    (None, Ok(())) => Err(StoreError::Transient("sqlite: not run".into())),
                };
                let _ = tx.send(r);
            })
        });
        self.jobs.try_send(job).map_err(|e| match e {
            mpsc::TrySendError::Full(_) => StoreError::Transient(format!(
                "busy: shard {}'s SQLite thread has {JOBS_QUEUED_MAX} operations waiting",
                self.shard
            )),
            mpsc::TrySendError::Disconnected(_) => {
                StoreError::Transient("the shard's SQLite thread stopped".into())
            }
        })?;
        rx.await
            .map_err(|_| StoreError::Transient("the shard's SQLite thread stopped".into()))?
    }

    /// Lets the thread finish what it was given, closes the database and lets go of the
    /// owner lock.
    pub(super) fn close(self) {
        drop(self.jobs);
        let _ = self.thread.join();
    }
}

thread_local! {
    /// Set on the shard's thread by a job that had to abort its group (see `in_savepoint`).
    static GROUP_ABORTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A connection to the shard's file as the writer uses it: WAL, a synced commit.
fn connect(path: &Path) -> StoreResult<Connection> {
    let conn = Connection::open(path).map_err(store_error)?;
    // Set first: a reader that has the file open while it is created must not turn
    // the journal-mode switch below into a refusal.
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(store_error)?;
    // WAL is what lets readers beside the writer and one fsync per commit; SQLite
    // answers with the mode it took, which is not WAL where WAL cannot work (some
    // network file systems): refuse that rather than run in another mode unawares.
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(store_error)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Schema(format!(
            "{} cannot use write-ahead logging (SQLite chose journal mode {mode})",
            path.display()
        )));
    }
    conn.execute_batch(
        "PRAGMA synchronous = FULL;
         PRAGMA cache_size = -65536;
         PRAGMA temp_store = MEMORY;",
    )
    .map_err(store_error)?;
    Ok(conn)
}

/// Makes sure no transaction is left open before a group begins (one is after a
/// `ROLLBACK` that failed: every later `BEGIN` would fail, for good). It is rolled back,
/// or, when that fails too, the connection is replaced by a new one (closing a
/// connection discards its open transaction); the owner lock is held throughout.
fn ready_for_group(conn: &mut Connection, path: &Path) -> Result<(), String> {
    if conn.is_autocommit() {
        return Ok(());
    }
    match conn.execute_batch("ROLLBACK") {
        Ok(()) if conn.is_autocommit() => return Ok(()),
        Ok(()) => {}
        Err(e) => tracing::warn!(error = %e, "sqlite: cannot roll back a transaction left open"),
    }
    tracing::warn!("sqlite: reopening the shard's connection to end a transaction left open");
    *conn = connect(path).map_err(|e| format!("cannot reopen the connection: {e}"))?;
    Ok(())
}

fn in_savepoint<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> StoreResult<T>,
) -> StoreResult<T> {
    conn.execute_batch("SAVEPOINT job").map_err(store_error)?;
    // A panicking job fails alone (logged), not the shard's thread.
    let r =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(conn))).unwrap_or_else(|p| {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(panic = %what, "sqlite: a store operation panicked");
            Err(StoreError::Corrupt(format!(
                "a store operation panicked: {what}"
            )))
        });
    // When the savepoint can be neither released nor rolled back, whether this job's
    // writes are undone is unknown: undo the whole group (the thread sees the transaction
    // gone and fails every job of it), so nothing of a failed job is committed.
    let abort_group = || {
        // The group must not commit now, whatever the ROLLBACK does: a failed one leaves
        // the transaction open with this job's partial writes in it.
        GROUP_ABORTED.with(|a| a.set(true));
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
    };
    match r {
        Ok(v) => match conn.execute_batch("RELEASE job") {
            Ok(()) => Ok(v),
            Err(e) => {
                abort_group();
                Err(store_error(e))
            }
        },
        Err(e) => {
            if conn.execute_batch("ROLLBACK TO job; RELEASE job").is_err() {
                abort_group();
            }
            Err(e)
        }
    }
}

fn run(
    mut conn: Connection,
    path: &Path,
    rx: mpsc::Receiver<Job>,
    mut nice: ThreadNice,
    shard: ShardId,
) {
    while let Ok(first) = rx.recv() {
        nice.follow(shard);
        let mut group = vec![first];
        while group.len() < GROUP_JOBS_MAX {
            match rx.try_recv() {
                Ok(j) => group.push(j),
                Err(_) => break,
            }
        }
        let begun = ready_for_group(&mut conn, path).and_then(|()| {
            conn.execute_batch("BEGIN IMMEDIATE")
                .map_err(|e| format!("cannot begin a transaction: {e}"))
        });
        if let Err(e) = begun {
            // Not run: each caller learns why, and may retry.
            tracing::warn!(error = %e, jobs = group.len(), "sqlite: a group of operations was not run");
            let why = Err(e);
            for job in group {
                job(None)(&why);
            }
            continue;
        }
        let mut dones: Vec<Done> = Vec::with_capacity(group.len());
        let mut lost = false;
        let mut skipped = 0;
        for job in group {
            if lost {
                // Not run (see below): its caller sees a transient failure and may retry.
                dones.push(job(None));
                skipped += 1;
                continue;
            }
            GROUP_ABORTED.with(|a| a.set(false));
            dones.push(job(Some(&conn)));
            // SQLite rolls the whole transaction back by itself on some errors (a full
            // disk, an I/O error): then the jobs before this one are undone, and the ones
            // after it would each commit on their own. Run none of them; fail them all.
            // (So too when a job had to abort the group itself.)
            lost = conn.is_autocommit() || GROUP_ABORTED.with(|a| a.get());
        }
        GROUP_ABORTED.with(|a| a.set(false));
        let commit = if lost {
            Err("the transaction was rolled back by SQLite (I/O error or full disk)".to_string())
        } else {
            conn.execute_batch("COMMIT").map_err(|e| e.to_string())
        };
        // A failed COMMIT leaves the transaction open; a ROLLBACK that fails too is dealt
        // with before the next group (`ready_for_group`).
        if commit.is_err() && !conn.is_autocommit() {
            if let Err(e) = conn.execute_batch("ROLLBACK") {
                tracing::warn!(error = %e, "sqlite: cannot roll back a group that failed to commit");
            }
        }
        if let Err(e) = &commit {
            tracing::warn!(error = %e, skipped, "sqlite: a group of operations failed to commit");
        }
        for d in dones {
            d(&commit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder of its own under the system's temporary one, removed at the end.
    struct Dir(PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("foqs-conn-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    fn open(path: &Path) -> StoreResult<ShardThread> {
        ShardThread::open(0, path, Default::default(), |_| Ok(()))
    }

    /// One file is one shard, however its path is spelled: through a symlink to the file
    /// or to its folder, or with `..` in it, a second open finds the first's lock.
    #[test]
    fn a_file_reached_by_another_path_is_still_locked() {
        let d = dir("alias");
        let real = d.0.join("real");
        std::fs::create_dir_all(&real).unwrap();
        let file = real.join("shard.db");
        let first = open(&file).expect("the first open takes the lock");
        std::os::unix::fs::symlink(&file, d.0.join("link.db")).unwrap();
        std::os::unix::fs::symlink(&real, d.0.join("linked")).unwrap();
        for other in [
            d.0.join("link.db"),
            d.0.join("linked").join("shard.db"),
            real.join("..").join("real").join("shard.db"),
        ] {
            match open(&other) {
                Err(StoreError::Owned(why)) => assert!(why.contains("another"), "{why}"),
                Err(e) => panic!("{}: {e}", other.display()),
                Ok(_) => panic!("{} opened beside its other path", other.display()),
            }
        }
        // A symlink to a file that does not exist yet is refused, not locked by its name.
        std::os::unix::fs::symlink(real.join("later.db"), d.0.join("dangling.db")).unwrap();
        assert!(matches!(
            open(&d.0.join("dangling.db")),
            Err(StoreError::Schema(_))
        ));
        first.close();
        // Released with the first: the aliased path now opens.
        open(&d.0.join("link.db"))
            .expect("opens once the first is closed")
            .close();
    }

    /// A transaction left open (a ROLLBACK after a failed COMMIT that failed too) would
    /// fail every later group's BEGIN for good: the next group ends it first, and runs.
    #[test]
    fn a_transaction_left_open_is_ended_before_the_next_group() {
        let d = dir("left-open");
        let path = d.0.join("shard.db");
        let mut conn = connect(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE t (v INTEGER); BEGIN IMMEDIATE; INSERT INTO t VALUES (1);",
        )
        .unwrap();
        assert!(!conn.is_autocommit());
        ready_for_group(&mut conn, &path).unwrap();
        assert!(conn.is_autocommit());
        conn.execute_batch("BEGIN IMMEDIATE; INSERT INTO t VALUES (2); COMMIT;")
            .unwrap();
        let n: i64 = conn
            .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(
            n, 1,
            "the row of the transaction left open is not committed"
        );
    }

    /// A job that holds the shard's thread until the sender sends (or is dropped), and
    /// its answer; returns once the thread is running it.
    async fn hold(
        t: &std::sync::Arc<ShardThread>,
    ) -> (
        std::sync::mpsc::Sender<()>,
        tokio::task::JoinHandle<StoreResult<()>>,
    ) {
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        let (running_tx, running_rx) = oneshot::channel();
        let t = t.clone();
        let held = tokio::spawn(async move {
            t.call(move |_| {
                let _ = running_tx.send(());
                let _ = hold_rx.recv();
                Ok(())
            })
            .await
        });
        running_rx.await.expect("the held job runs");
        (hold_tx, held)
    }

    /// A job that fails is undone alone (its savepoint is rolled back), alone in its
    /// group or beside others, whose writes are committed; a job that panics is a failed
    /// job.
    #[tokio::test]
    async fn a_failed_job_is_undone_alone_with_or_without_company() {
        let d = dir("undone");
        let t = std::sync::Arc::new(open(&d.0.join("shard.db")).unwrap());
        t.call(|c| {
            c.execute_batch("CREATE TABLE t (v INTEGER)")
                .map_err(store_error)
        })
        .await
        .unwrap();
        let insert = |v: i64, fail: bool| {
            move |c: &Connection| {
                c.execute("INSERT INTO t VALUES (?1)", [v])
                    .map_err(store_error)?;
                if fail {
                    return Err(StoreError::Transient(format!("job {v} failed")));
                }
                Ok(())
            }
        };
        let rows = |t: std::sync::Arc<ShardThread>| async move {
            t.call(|c| {
                let mut st = c
                    .prepare("SELECT v FROM t ORDER BY v")
                    .map_err(store_error)?;
                let v = st
                    .query_map([], |r| r.get::<_, i64>(0))
                    .map_err(store_error)?
                    .collect::<rusqlite::Result<Vec<i64>>>()
                    .map_err(store_error)?;
                Ok(v)
            })
            .await
            .unwrap()
        };
        // Alone.
        assert!(t.call(insert(1, true)).await.is_err());
        t.call(insert(2, false)).await.unwrap();
        assert!(t
            .call(|_| -> StoreResult<()> { panic!("a job that panics") })
            .await
            .is_err());
        assert_eq!(rows(t.clone()).await, vec![2]);
        // In company: the thread is held while four jobs queue, so they run as one group.
        let (hold_tx, held) = hold(&t).await;
        let jobs: Vec<_> = [(3, false), (4, true), (5, false)]
            .into_iter()
            .map(|(v, fail)| {
                let t = t.clone();
                tokio::spawn(async move { t.call(insert(v, fail)).await })
            })
            .collect();
        let panics = {
            let t = t.clone();
            tokio::spawn(async move {
                t.call(|_| -> StoreResult<()> { panic!("a job that panics") })
                    .await
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        hold_tx.send(()).unwrap();
        held.await.unwrap().unwrap();
        let outcomes: Vec<bool> = futures::future::join_all(jobs)
            .await
            .into_iter()
            .map(|r| r.unwrap().is_ok())
            .collect();
        assert_eq!(outcomes, vec![true, false, true]);
        assert!(panics.await.unwrap().is_err());
        assert_eq!(rows(t.clone()).await, vec![2, 3, 5]);
        std::sync::Arc::try_unwrap(t).ok().unwrap().close();
    }

    /// A job the thread refuses unrun (its queue full) is answered at once, as busy.
    #[tokio::test]
    async fn a_full_queue_refuses_at_once() {
        let d = dir("full-queue");
        let t = std::sync::Arc::new(open(&d.0.join("shard.db")).unwrap());
        // The first job holds the thread; the queue behind it fills.
        let (hold_tx, first) = hold(&t).await;
        let queued: Vec<_> = (0..JOBS_QUEUED_MAX + 10)
            .map(|_| {
                let t = t.clone();
                tokio::spawn(async move { t.call(|_| Ok(())).await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        hold_tx.send(()).unwrap();
        first.await.unwrap().unwrap();
        let mut busy = 0;
        for q in queued {
            match q.await.unwrap() {
                Ok(()) => {}
                Err(StoreError::Transient(m)) if m.starts_with("busy") => busy += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(busy >= 10, "{busy} refused");
        std::sync::Arc::try_unwrap(t).ok().unwrap().close();
    }
}
