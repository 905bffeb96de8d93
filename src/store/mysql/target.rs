//! The server a [`MySqlStore`] talks to, and its move to another server of its replica set
//! (see [`crate::store::ShardStore::retarget`]); connects bounded in time.

use std::sync::Arc;

use mysql_async::{Opts, Pool};

use super::MySqlStore;
use crate::store::{Retarget, StoreError, StoreResult};

/// The server a [`MySqlStore`] talks to.
pub(super) struct Target {
    pub(super) pool: Pool,
    /// What the pool was made from (to remake it with a statement bound).
    pub(super) shard_opts: Opts,
    /// The same server without a database selected, to create the database.
    pub(super) server_opts: Opts,
}

impl MySqlStore {
    /// The server this store talks to now.
    pub(super) fn target(&self) -> Arc<Target> {
        self.target.read().expect("not poisoned").clone()
    }

    /// The target while the store is being built (nobody else holds it yet).
    pub(super) fn target_mut(&mut self) -> &mut Target {
        Arc::get_mut(self.target.get_mut().expect("not poisoned"))
            .expect("a store being built shares its target with nobody")
    }

    /// See [`ShardStore::retarget`]: a store for `to` made as this one was, connected
    /// once (a server that refuses is found here, and the first statement after the move
    /// does not pay the handshake), then put in place of this one's server; the old
    /// pool's connections are closed behind it.
    pub(super) async fn move_to(&self, to: &Retarget) -> StoreResult<()> {
        if self.owner_lock.is_some() {
            return Err(StoreError::Schema(
                "a shard under an owner lock is reopened, not moved".into(),
            ));
        }
        let mut next = MySqlStore::new(self.shard, &to.url, self.pool_connections_max)?
            .with_tls(to.tls.as_ref());
        if let Some(ms) = self.statement_timeout_ms {
            next = next.with_statement_timeout(ms);
        }
        if next.database != self.database {
            return Err(StoreError::Schema(format!(
                "{} names database {}, not this shard's {}",
                to.url, next.database, self.database
            )));
        }
        let t = next.target();
        let conn = connecting(self.connect_timeout, &t.shard_opts, t.pool.get_conn()).await?;
        drop(conn);
        let old = std::mem::replace(&mut *self.target.write().expect("not poisoned"), t);
        tokio::spawn(async move {
            let _ = old.pool.clone().disconnect().await;
        });
        Ok(())
    }
}

/// Bounds a connect or a wait for a pooled connection (with `opts`, the connection's):
/// a frozen server (SIGSTOP, a hung machine) accepts TCP connections and never greets, and
/// mysql_async bounds neither. Unbounded, a shard's open on such a server hung, and with it
/// the host's following of its shard manager: it handed no shard over, and the set whose
/// lowest shard was in transit had no leader to fail it over. Nothing is sent before a
/// connection is had, so no failure here is in doubt.
pub(in crate::store::mysql) async fn connecting<T>(
    d: std::time::Duration,
    opts: &Opts,
    f: impl std::future::Future<Output = Result<T, mysql_async::Error>>,
) -> StoreResult<T> {
    match tokio::time::timeout(d, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(connect_error(e, opts.ssl_opts().is_none())),
        Err(_) => Err(StoreError::Transient(format!(
            "no connection within {} ms",
            d.as_millis()
        ))),
    }
}

/// A failed connect in the store's terms. A server that requires secure transport
/// refuses a plain connection as an access denied and says no more: `plain` says so.
fn connect_error(e: mysql_async::Error, plain: bool) -> StoreError {
    let denied = matches!(&e, mysql_async::Error::Server(s) if s.code == 1045);
    match StoreError::from(e) {
        StoreError::Lost(m) => StoreError::Transient(m),
        StoreError::Schema(m) if plain && denied => StoreError::Schema(format!(
            "{m} (connected without TLS: if the server requires secure transport, give the shard tls = {{ ca_file = \"...\" }})"
        )),
        other => other,
    }
}
