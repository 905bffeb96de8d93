//! The shard's owner lock on MySQL: a named lock (`GET_LOCK`) held on a connection of its
//! own for as long as this process serves the shard, so that two foqsd processes never
//! both write one shard, whatever shard manager they run. MySQL releases a named lock when
//! its connection ends, so a process killed with SIGKILL frees its shards at once.
//!
//! A keeper task checks the lock every `CHECK_MS`. When the lock connection fails, or
//! the server says the lock is not this connection's, the lock is lost: the store writes
//! no more (its gate closes for good) and `on_lost` runs, so that the daemon can stop the
//! shard and open it afresh (rebuilding everything it kept in memory), which takes the
//! lock again once nobody else holds it. A check that times out closes the gate until the
//! same connection answers again: then the lock was never let go (a frozen server), and
//! if it never answers, its failure ends the lock as above. Left open: for up to one
//! check interval after the lock connection dies, pool connections may still write.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};
use tokio::sync::oneshot;

use crate::model::ShardId;
use crate::store::{StoreError, StoreResult};

/// How often the keeper checks that the lock is still held.
const CHECK_MS: u64 = 1000;
/// How long opening a shard waits for its lock: long enough for the lock of a process
/// that just stopped (or was killed) to be let go, short enough to refuse at once.
const ACQUIRE_WAIT_S: u32 = 2;
/// Lock names are at most 64 characters on MySQL.
const NAME_MAX: usize = 64;

/// `foqs_shard_<database>`, or a hash of the database name when that is too long.
pub(super) fn lock_name(database: &str) -> String {
    let name = format!("foqs_shard_{database}");
    if name.len() <= NAME_MAX {
        return name;
    }
    let h = crate::hash::fnv1a([database.as_bytes()]);
    format!("foqs_shard_{h:016x}")
}

/// Called once when the lock is lost.
pub type OnLost = Arc<dyn Fn() + Send + Sync>;

/// A held owner lock; dropping it (or [`OwnerLock::release`]) lets it go.
pub(super) struct OwnerLock {
    stop: Option<oneshot::Sender<oneshot::Sender<()>>>,
}

impl OwnerLock {
    /// Takes the lock of `database` on a connection of its own, or fails with a message
    /// naming the shard and who holds it. `gate` stays open while the lock is held.
    pub(super) async fn acquire(
        shard: ShardId,
        database: &str,
        opts: Opts,
        gate: Arc<AtomicBool>,
        on_lost: OnLost,
        check_timeout: Duration,
    ) -> StoreResult<OwnerLock> {
        let name = lock_name(database);
        let mut conn = super::connecting(check_timeout, &opts, Conn::new(opts.clone())).await?;
        let wait = check_timeout + Duration::from_secs(ACQUIRE_WAIT_S as u64);
        let got: Option<Option<i64>> = tokio::time::timeout(
            wait,
            conn.exec_first("SELECT GET_LOCK(?, ?)", (&name, ACQUIRE_WAIT_S)),
        )
        .await
        .map_err(|_| StoreError::Timeout(wait.as_millis() as u64))??;
        if got.flatten() != Some(1) {
            let holder = holder(&mut conn, &name).await;
            let _ = conn.disconnect().await;
            return Err(StoreError::Owned(format!(
                "shard {shard} (database {database}) is served by another foqsd process ({holder}): \
                 a shard has one writer; stop the other process, or give this one other shards"
            )));
        }
        gate.store(true, Ordering::SeqCst);
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(keep(
            shard,
            name,
            conn,
            gate,
            on_lost,
            check_timeout,
            stopped,
        ));
        Ok(OwnerLock { stop: Some(stop) })
    }

    /// Lets the lock go and waits until the server has released it.
    pub(super) async fn release(mut self) {
        if let Some(stop) = self.stop.take() {
            let (done, released) = oneshot::channel();
            if stop.send(done).is_ok() {
                let _ = released.await;
            }
        }
    }
}

impl Drop for OwnerLock {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let (done, _) = oneshot::channel();
            let _ = stop.send(done);
        }
    }
}

/// Who holds the lock, as the server sees it: its connection id and client address.
async fn holder(conn: &mut Conn, name: &str) -> String {
    let id: Option<Option<u64>> = conn
        .exec_first("SELECT IS_USED_LOCK(?)", (name,))
        .await
        .ok()
        .flatten();
    let Some(id) = id.flatten() else {
        return "lock held, holder unknown".to_string();
    };
    let host: Option<String> = conn
        .exec_first(
            "SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = ?",
            (id,),
        )
        .await
        .ok()
        .flatten();
    match host {
        Some(h) => format!("lock {name} held by MySQL connection {id} from {h}"),
        None => format!("lock {name} held by MySQL connection {id}"),
    }
}

async fn keep(
    shard: ShardId,
    name: String,
    mut conn: Conn,
    gate: Arc<AtomicBool>,
    on_lost: OnLost,
    check_timeout: Duration,
    mut stop: oneshot::Receiver<oneshot::Sender<()>>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(CHECK_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            done = &mut stop => {
                let _ = conn.exec_drop("DO RELEASE_LOCK(?)", (&name,)).await;
                let _ = conn.disconnect().await;
                if let Ok(done) = done {
                    let _ = done.send(());
                }
                return;
            }
            _ = tick.tick() => {}
        }
        let check = conn
            .exec_first::<Option<i64>, _, _>("SELECT IS_USED_LOCK(?) = CONNECTION_ID()", (&name,));
        let lost = match tokio::time::timeout(check_timeout, check).await {
            // No answer: no writes until the lock connection answers again (it may be the
            // only connection cut off). The same connection answering "ours" proves the
            // lock was never let go: a named lock goes only with its connection.
            Err(_) => {
                gate.store(false, Ordering::SeqCst);
                continue;
            }
            Ok(Ok(Some(Some(1)))) => {
                gate.store(true, Ordering::SeqCst);
                continue;
            }
            Ok(Ok(other)) => format!("the server says lock {name} is not ours ({other:?})"),
            Ok(Err(e)) => format!("the connection holding lock {name} failed: {e}"),
        };
        gate.store(false, Ordering::SeqCst);
        tracing::error!(
            shard,
            why = %lost,
            "lost this shard's owner lock: it writes no more, and is opened again once the lock can be taken"
        );
        on_lost();
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_fit_mysqls_limit() {
        assert_eq!(lock_name("foqs_shard_0"), "foqs_shard_foqs_shard_0");
        let long = "d".repeat(64);
        let n = lock_name(&long);
        assert!(n.len() <= NAME_MAX && n.starts_with("foqs_shard_"), "{n}");
        assert_ne!(n, lock_name(&"e".repeat(64)));
    }
}
