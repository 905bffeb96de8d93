//! `[replication]` and the replicas of `[[shards]]`, and their checks.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use super::Config;
use crate::cluster::config::ManagerKind;

/// "host:port" of the server a `mysql://` URL names.
pub fn server_addr(url: &str) -> Option<String> {
    if !url.starts_with("mysql://") {
        return None;
    }
    let o = mysql_async::Opts::from_url(url).ok()?;
    Some(format!("{}:{}", o.ip_or_hostname(), o.tcp_port()))
}

/// `[[shards.replicas]]`: a server holding a copy of the shard's database.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaConfig {
    /// `mysql://user:password@host:port/database`: the same account and database as the
    /// shard's `url`, on another server.
    pub url: String,
    pub region: String,
    /// TLS to this server, when not the shard's `tls`.
    #[serde(default)]
    pub tls: Option<crate::store::MysqlTls>,
}

/// How foqsd drives MariaDB's replication.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplicationConfig {
    /// The account that switches `read_only`, promotes and repoints servers (it needs
    /// SUPER, or READ_ONLY ADMIN, REPLICATION SLAVE ADMIN, REPLICATION MASTER ADMIN,
    /// BINLOG MONITOR and CONNECTION ADMIN). Not the account of the shards' URLs: that one
    /// must have none of these, so that `read_only` stops it.
    pub admin_user: String,
    pub admin_password: String,
    /// The account replicas replicate with (`REPLICATION SLAVE`).
    pub repl_user: String,
    pub repl_password: String,
    /// Replication channels over TLS: the CA file as the database servers see it (a path
    /// on their machines). Set, every `CHANGE MASTER` foqsd runs says `MASTER_SSL = 1`,
    /// this `MASTER_SSL_CA` and `MASTER_SSL_VERIFY_SERVER_CERT = 1`.
    pub repl_ssl_ca: Option<String>,
    /// A primary that has not answered for this long is replaced by a replica.
    pub failover_after_ms: u64,
    /// How often the primaries are probed (and the heartbeat row written).
    pub probe_interval_ms: u64,
    /// A switchover refuses a target further behind than this (heartbeat lag).
    pub lag_max_ms: u64,
    /// How long a switch waits for the target to apply the old primary's last
    /// transaction (`MASTER_GTID_WAIT`) before it undoes itself; half of it bounds the
    /// wait, before the switch starts, for the target to come within a few transactions.
    pub catchup_timeout_ms: u64,
    /// How long a switch waits for the owners to pause the shards before it undoes itself.
    pub pause_timeout_ms: u64,
    /// Replica sets one region drain switches at once.
    pub drain_parallel_max: usize,
    /// Every commit waits for a replica's acknowledgement (MariaDB semi-sync): a promotion
    /// turns it on, and it is turned back on when a replica that can acknowledge is back.
    /// Off: asynchronous (a failover needs `--allow-loss`).
    pub semi_sync: bool,
    /// How long an enqueue waits for its host's shards while a switch pauses them, before
    /// it goes to another host (or fails with `UNAVAILABLE`, retryable).
    pub enqueue_hold_ms: u64,
    /// TLS for the admin account's connections; absent: each server's own (the `tls` of
    /// its shards, or of its `[[shards.replicas]]` entry).
    pub tls: Option<crate::store::MysqlTls>,
}

/// How a replica reaches its primary (what `CHANGE MASTER` says besides the primary).
#[derive(Debug, Clone)]
pub struct Channel {
    pub user: String,
    pub password: String,
    pub ssl_ca: Option<String>,
}

impl ReplicationConfig {
    pub fn channel(&self) -> Channel {
        Channel {
            user: self.repl_user.clone(),
            password: self.repl_password.clone(),
            ssl_ca: self.repl_ssl_ca.clone(),
        }
    }
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        ReplicationConfig {
            admin_user: "root".into(),
            admin_password: String::new(),
            repl_user: "foqs_repl".into(),
            repl_password: "foqs_repl".into(),
            repl_ssl_ca: None,
            failover_after_ms: 3000,
            probe_interval_ms: 250,
            lag_max_ms: 2000,
            catchup_timeout_ms: 2000,
            pause_timeout_ms: 2000,
            drain_parallel_max: 4,
            semi_sync: true,
            enqueue_hold_ms: 1000,
            tls: None,
        }
    }
}

/// Problems of the replication settings.
pub fn check(cfg: &Config, problems: &mut Vec<String>) {
    let replicated: Vec<_> = cfg
        .shards
        .iter()
        .filter(|s| !s.replicas.is_empty())
        .collect();
    if replicated.is_empty() {
        return;
    }
    if cfg.cluster.manager != ManagerKind::Etcd {
        problems.push(format!(
            "shard {} has replicas: replication needs cluster.manager = \"etcd\" (etcd holds each shard's current primary and its generation, so that no two servers of a shard are written)",
            replicated[0].id
        ));
    }
    let r = &cfg.replication;
    for (name, v) in [
        ("replication.failover_after_ms", r.failover_after_ms),
        ("replication.probe_interval_ms", r.probe_interval_ms),
        ("replication.catchup_timeout_ms", r.catchup_timeout_ms),
        ("replication.pause_timeout_ms", r.pause_timeout_ms),
        (
            "replication.drain_parallel_max",
            r.drain_parallel_max as u64,
        ),
    ] {
        if v == 0 {
            problems.push(format!("{name} must be > 0"));
        }
    }
    if r.failover_after_ms < 2 * r.probe_interval_ms {
        problems.push(
            "replication.failover_after_ms must be at least 2 x replication.probe_interval_ms"
                .into(),
        );
    }
    if let Some(tls) = &r.tls {
        problems.extend(tls.problems("replication"));
    }
    if r.admin_user.is_empty() || r.repl_user.is_empty() {
        problems.push("replication.admin_user and replication.repl_user must be set".into());
    }
    // Servers of a shard by primary: shards on one primary form a replica set (read_only
    // is a server's, so they switch together) and must list the same replicas.
    let mut sets: BTreeMap<String, (u32, BTreeSet<String>)> = BTreeMap::new();
    for s in &replicated {
        let Some(primary) = server_addr(&s.url) else {
            problems.push(format!(
                "shard {}: url {:?} names no MySQL server",
                s.id,
                super::redact_url(&s.url)
            ));
            continue;
        };
        if s.region.as_deref().unwrap_or("").is_empty() {
            problems.push(format!(
                "shard {}: has replicas, so it needs region (of its primary)",
                s.id
            ));
        }
        let db = mysql_async::Opts::from_url(&s.url)
            .ok()
            .and_then(|o| o.db_name().map(str::to_string));
        let mut servers = BTreeSet::from([primary.clone()]);
        for rep in &s.replicas {
            let Some(a) = server_addr(&rep.url) else {
                problems.push(format!(
                    "shard {}: replica url {:?} names no MySQL server",
                    s.id,
                    super::redact_url(&rep.url)
                ));
                continue;
            };
            let rdb = mysql_async::Opts::from_url(&rep.url)
                .ok()
                .and_then(|o| o.db_name().map(str::to_string));
            if rdb != db {
                problems.push(format!("shard {}: replica {a} must hold the same database as the primary ({db:?}, not {rdb:?})", s.id));
            }
            if rep.region.is_empty() {
                problems.push(format!("shard {}: replica {a} needs a region", s.id));
            }
            if !servers.insert(a.clone()) {
                problems.push(format!("shard {}: server {a} is listed twice", s.id));
            }
        }
        match sets.get(&primary) {
            Some((first, prev)) if *prev != servers => problems.push(format!(
                "shards {first} and {} share the primary {primary} but not their replicas: shards on one server switch together, so they must list the same servers",
                s.id
            )),
            Some(_) => {}
            None => {
                sets.insert(primary, (s.id, servers));
            }
        }
    }
    // A server belongs to one replica set: a promotion or repointing of one set would
    // reconfigure another's primary.
    let sets_v: Vec<_> = sets.iter().collect();
    for (i, (pa, (fa, sa))) in sets_v.iter().enumerate() {
        for (pb, (fb, sb)) in &sets_v[i + 1..] {
            if let Some(shared) = sa.intersection(sb).next() {
                problems.push(format!(
                    "server {shared} is in two replica sets (shards {fa} on {pa} and {fb} on {pb}): a server replicates one set"
                ));
            }
        }
    }
    for s in cfg.shards.iter().filter(|s| s.replicas.is_empty()) {
        if let Some(a) = server_addr(&s.url) {
            if sets.values().any(|(_, servers)| servers.contains(&a)) {
                problems.push(format!(
                    "shard {}: its server {a} is replicated for other shards, so it must list the same replicas",
                    s.id
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Config;

    fn shards(manager: &str, second_replica: &str) -> String {
        format!(
            "[cluster]\nmanager = \"{manager}\"\npeer_secret = \"foqs-test-peer-secret\"\n\
             [[shards]]\nid = 0\nurl = \"mysql://foqs:foqs@10.0.0.1:3306/s0\"\nregion = \"r1\"\n\
             replicas = [{{ url = \"mysql://foqs:foqs@10.0.0.2:3306/s0\", region = \"r2\" }}]\n\
             [[shards]]\nid = 1\nurl = \"mysql://foqs:foqs@10.0.0.1:3306/s1\"\nregion = \"r1\"\n\
             replicas = [{{ url = \"mysql://foqs:foqs@{second_replica}/s1\", region = \"r2\" }}]\n"
        )
    }

    fn problems(toml: &str) -> String {
        match Config::from_toml(toml) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_shipped_replicated_example_is_valid() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/replicated.toml");
        let cfg = Config::load(&path).expect("conf/replicated.toml");
        let layout = crate::replication::Layout::from_config(&cfg);
        assert_eq!(layout.sets.len(), 1);
        assert_eq!(layout.sets[0].shards, vec![0, 1, 2, 3]);
        assert_eq!(layout.sets[0].servers.len(), 3);
    }

    #[test]
    fn replicas_need_etcd_and_a_server_has_one_replica_set() {
        assert_eq!(problems(&shards("etcd", "10.0.0.2:3306")), "");
        let single = problems(&shards("single", "10.0.0.2:3306"));
        assert!(
            single.contains("replication needs cluster.manager = \"etcd\""),
            "{single}"
        );
        let split = problems(&shards("etcd", "10.0.0.3:3306"));
        assert!(
            split.contains("share the primary 10.0.0.1:3306 but not their replicas"),
            "{split}"
        );
        let other_db = problems(
            &shards("etcd", "10.0.0.2:3306").replace("10.0.0.2:3306/s1", "10.0.0.2:3306/elsewhere"),
        );
        assert!(
            other_db.contains("must hold the same database"),
            "{other_db}"
        );
        let no_region = problems(&shards("etcd", "10.0.0.2:3306").replace("region = \"r1\"\n", ""));
        assert!(no_region.contains("needs region"), "{no_region}");
    }
}
