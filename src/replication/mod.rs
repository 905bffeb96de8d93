//! Replicated shards on MariaDB's own replication: each shard's primary and replicas,
//! planned switchovers and region drains, and unplanned failover.
//!
//! A **replica set** is one primary server and its replicas; the shards whose databases
//! live on it switch together, because `read_only` (the fence) is a server's, not a
//! database's. etcd holds each shard's current primary with a generation (see
//! `cluster::primaries`); every switch raises it, and a host writes only the server that
//! the generation it opened the shard with names.
//!
//! A switch ([`driver`]): pause (the record says `paused`; each owner flushes its buffers,
//! stops the shard and says so), `read_only = ON` on the old primary and its GTID position
//! read, the target waits for it (`MASTER_GTID_WAIT`; at the timeout everything is undone),
//! the target is promoted (replication reset, semi-sync primary on, writable), the record
//! names it with the next generation (owners reopen the shard on it, rebuilding their
//! memory from its rows; region affinity moves it to a host of the new region), then the
//! other servers replicate from it. An unplanned failover ([`failover`]) fences the dead
//! primary by the generation, promotes the semi-sync replica that received the most, and
//! marks the old primary demoted: when it answers again it is made read-only and, if its
//! history is a prefix of the new primary's, repointed.

/// The `[replication]` section and the shards' replicas live with the rest of the
/// configuration (`crate::config::replication`); named here too, where they are used.
pub use crate::config::replication as config;
pub use crate::config::replication::server_addr;
pub mod driver;
pub mod failover;
pub mod grants;
pub mod journal;
pub mod server;
mod switch;
mod topology;

use std::collections::BTreeMap;

use futures::future::BoxFuture;

pub use config::{ReplicaConfig, ReplicationConfig};

use crate::model::ShardId;

/// `url` with its server replaced by `addr` (account, database and options kept).
pub fn url_on(url: &str, addr: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let user = authority
        .rsplit_once('@')
        .map(|(u, _)| format!("{u}@"))
        .unwrap_or_default();
    format!("{scheme}://{user}{addr}{tail}")
}

/// A server of a replica set and its region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    pub addr: String,
    pub region: String,
    /// TLS for the shards' account on it (its replica entry's, or its shards').
    pub tls: Option<crate::store::MysqlTls>,
}

/// The configured replica sets: servers (the initial primary first) and their shards.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    pub sets: Vec<SetLayout>,
}

#[derive(Debug, Clone)]
pub struct SetLayout {
    pub shards: Vec<ShardId>,
    pub servers: Vec<Server>,
    /// The database of the lowest shard: where the heartbeat row lives.
    pub heartbeat_url: String,
}

impl Layout {
    pub fn from_config(cfg: &crate::config::Config) -> Layout {
        let mut sets: Vec<SetLayout> = Vec::new();
        let mut shards: Vec<_> = cfg
            .shards
            .iter()
            .filter(|s| !s.replicas.is_empty())
            .collect();
        shards.sort_by_key(|s| s.id);
        for s in shards {
            let Some(primary) = server_addr(&s.url) else {
                continue;
            };
            if let Some(set) = sets.iter_mut().find(|x| x.servers[0].addr == primary) {
                set.shards.push(s.id);
                continue;
            }
            let mut servers = vec![Server {
                addr: primary,
                region: s.region.clone().unwrap_or_default(),
                tls: s.tls.clone(),
            }];
            servers.extend(s.replicas.iter().filter_map(|r| {
                let addr = server_addr(&r.url)?;
                Some(Server {
                    tls: s.tls_on(&addr).cloned(),
                    addr,
                    region: r.region.clone(),
                })
            }));
            sets.push(SetLayout {
                shards: vec![s.id],
                servers,
                heartbeat_url: s.url.clone(),
            });
        }
        Layout { sets }
    }

    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    pub fn set_of(&self, shard: ShardId) -> Option<&SetLayout> {
        self.sets.iter().find(|s| s.shards.contains(&shard))
    }

    /// The TLS settings of the shards' account on `addr`, in whichever set it is.
    pub fn tls_of(&self, addr: &str) -> Option<&crate::store::MysqlTls> {
        self.sets.iter().find_map(|s| s.tls_of(addr))
    }

    /// Every replicated shard's first primary, as the config gives it.
    pub fn initial(&self) -> BTreeMap<ShardId, Server> {
        self.sets
            .iter()
            .flat_map(|set| set.shards.iter().map(|s| (*s, set.servers[0].clone())))
            .collect()
    }
}

impl SetLayout {
    pub fn region_of(&self, addr: &str) -> Option<&str> {
        self.servers
            .iter()
            .find(|s| s.addr == addr)
            .map(|s| s.region.as_str())
    }

    /// The TLS settings of the shards' account on `addr`.
    pub fn tls_of(&self, addr: &str) -> Option<&crate::store::MysqlTls> {
        self.servers
            .iter()
            .find(|s| s.addr == addr)
            .and_then(|s| s.tls.as_ref())
    }
}

/// What one switch of one replica set did, as reported to the operator.
#[derive(Debug, Clone, Default)]
pub struct SwitchReport {
    /// "switchover" or "failover".
    pub kind: String,
    pub shards: Vec<ShardId>,
    pub from: String,
    pub to: String,
    pub to_region: String,
    /// The generation the shards have now.
    pub generation: u64,
    pub ok: bool,
    pub error: Option<String>,
    /// Pause requested → every owner paused.
    pub pause_ms: u64,
    /// Old primary read-only → new primary writable and the shards served on it.
    pub read_only_ms: u64,
    /// Time the target took to apply the old primary's last transaction.
    pub catchup_ms: u64,
    /// GTID transactions the new primary lacks (a failover with `allow_loss`).
    pub lost_transactions: u64,
}

/// One server of a replicated shard, as the status call shows it.
#[derive(Debug, Clone, Default)]
pub struct ReplicaState {
    pub addr: String,
    pub region: String,
    pub reachable: bool,
    pub read_only: bool,
    /// Transactions of domain 0 the primary has and this server has not applied.
    pub lag_transactions: Option<i64>,
    /// Age of its heartbeat row against the primary's.
    pub lag_ms: Option<i64>,
    pub io_running: bool,
    pub sql_running: bool,
    pub semi_sync_replica: bool,
    pub error: String,
}

/// A replicated shard's servers now.
#[derive(Debug, Clone, Default)]
pub struct ShardReplication {
    pub shard: ShardId,
    pub primary: String,
    pub primary_region: String,
    pub generation: u64,
    pub state: String,
    pub owner: Option<String>,
    pub primary_reachable: bool,
    /// The primary's semi-sync: on, and commits that fell back to asynchronous.
    pub semi_sync_on: bool,
    pub semi_sync_no_tx: i64,
    pub replicas: Vec<ReplicaState>,
}

/// Why a replication call did nothing: the caller's mistake, or a passing condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    Invalid(String),
    Unavailable(String),
}

pub type Switched = Result<Vec<SwitchReport>, Refused>;

/// The replication admin calls, as the API layer sees them (implemented by
/// [`driver::Driver`]; absent without replicas).
pub trait Switchboard: Send + Sync {
    fn switchover(&self, shard: ShardId, to: Option<String>) -> BoxFuture<'_, Switched>;
    fn drain(&self, from: String, to: Option<String>) -> BoxFuture<'_, Switched>;
    fn failover(&self, shard: ShardId, allow_loss: bool) -> BoxFuture<'_, Switched>;
    fn status(&self) -> BoxFuture<'_, Vec<ShardReplication>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_move_to_another_server_keeping_account_and_database() {
        assert_eq!(
            url_on(
                "mysql://foqs:pw@127.0.0.1:3410/foqs_shard_0?pool_max=4",
                "127.0.0.1:3411"
            ),
            "mysql://foqs:pw@127.0.0.1:3411/foqs_shard_0?pool_max=4"
        );
        assert_eq!(url_on("mysql://h:1/db", "x:2"), "mysql://x:2/db");
        assert_eq!(
            server_addr("mysql://foqs:pw@127.0.0.1:3410/d").as_deref(),
            Some("127.0.0.1:3410")
        );
        assert_eq!(server_addr("sqlite://a.db"), None);
    }
}
