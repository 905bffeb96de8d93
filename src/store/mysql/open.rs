//! Opening a MySQL shard: its owner lock first, then its database (created only when the
//! server says it is missing), its schema (see `schema`), its topics, and what its worker
//! recovers: the key high-water mark and the background scans' checkpoint.

use std::sync::atomic::Ordering;

use mysql_async::prelude::*;
use mysql_async::Conn;

use super::owner::OwnerLock;
use super::schema::{self, meta_get};
use super::{connecting, errors, MySqlStore};
use crate::store::topics::TopicIds;
use crate::store::{Recovered, StoreResult};

impl MySqlStore {
    pub(super) async fn open_shard(&self) -> StoreResult<Recovered> {
        if let Some(on_lost) = &self.owner_lock {
            let lock = OwnerLock::acquire(
                self.shard,
                &self.database,
                self.target().server_opts.clone(),
                self.owned.clone(),
                on_lost.clone(),
                self.check_timeout,
            )
            .await?;
            *self.lock.lock().await = Some(lock);
        }
        // The database is there at almost every open (a replicated shard's always is, on
        // the new primary of a switch): connect to it first, and only when the server says
        // it is missing create it over a connection to the server itself. Checking first on
        // a server connection cost every open a connection (a TLS handshake) and a round
        // trip, inside a switch's read-only window. Created only when missing: the DDL is
        // binlogged even when the database exists, and a semi-synchronous primary holds it
        // for a replica's acknowledgement (see `schema::prepare`).
        let mut conn = match self.unbounded_conn().await {
            Err(e) if errors::is_unknown_database(&e) => {
                let opts = self.target().server_opts.clone();
                let mut server =
                    connecting(self.connect_timeout, &opts, Conn::new(opts.clone())).await?;
                let create = format!(
                    "CREATE DATABASE IF NOT EXISTS `{}`",
                    self.database.replace('`', "``")
                );
                server.query_drop(create).await?;
                let _ = server.disconnect().await;
                self.unbounded_conn().await?
            }
            other => other?,
        };
        let version: String = conn
            .query_first("SELECT VERSION()")
            .await?
            .unwrap_or_default();
        self.returning
            .store(version.contains("MariaDB"), Ordering::Relaxed);
        schema::prepare(&mut conn, self.shard, &self.database).await?;
        let topics: Vec<(u32, Vec<u8>, Vec<u8>)> =
            conn.query("SELECT tid, ns, topic FROM topics").await?;
        *self.topics.lock().expect("topics") =
            TopicIds::load(topics.into_iter().map(|(tid, ns, topic)| {
                (
                    tid,
                    String::from_utf8_lossy(&ns).into_owned(),
                    String::from_utf8_lossy(&topic).into_owned(),
                )
            }));
        let hwm = meta_get(&mut conn, "key_high_water")
            .await?
            .unwrap_or(0)
            .max(0) as u64;
        let max_key: Option<u64> = conn
            .query_first("SELECT MAX(id) FROM items")
            .await?
            .flatten();
        Ok(Recovered {
            key_high_water: hwm.max(max_key.map_or(1, |k| k + 1)),
            checkpoint_ms: meta_get(&mut conn, "checkpoint_ms").await?.unwrap_or(0),
        })
    }
}
