//! The `[cluster]` and `[[tiers]]` sections: which shard manager assigns shards, how this
//! host is reached, which tier it serves, and how it talks to its peers.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use crate::model::ShardId;

pub use crate::model::TIER_DEFAULT;
/// etcd grants leases in whole seconds; below 2 s a host would spend its life renewing.
pub const LEASE_TTL_MS_MIN: u64 = 2000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ManagerKind {
    /// One host owns every shard listed in `[[shards]]` and serves every tier.
    #[default]
    Single,
    /// Hosts and their shards listed in `[[cluster.hosts]]`; nothing moves by itself.
    Static,
    /// Hosts register in etcd under a lease; shards follow the live hosts.
    Etcd,
}

impl ManagerKind {
    pub fn name(self) -> &'static str {
        match self {
            ManagerKind::Single => "single",
            ManagerKind::Static => "static",
            ManagerKind::Etcd => "etcd",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    pub manager: ManagerKind,
    /// "host:port" peers and redirected clients use to reach this host; defaults to
    /// `server.listen`.
    pub advertise: Option<String>,
    /// The tier this host serves.
    pub tier: String,
    /// The region this host runs in: a replicated shard is owned by a host of its
    /// primary's region when the tier has one there.
    pub region: String,
    /// Forward what this host cannot serve (enqueues for another tier or when it has no
    /// capacity, acks/nacks/touches for shards owned elsewhere) to the host that can.
    /// Off: such calls fail with `WRONG_HOST` and `redirect_host`.
    pub forwarding: bool,
    /// Pooled connections per peer.
    pub peer_connections_max: u32,
    /// A call to a peer with no answer after this long fails.
    pub peer_timeout_ms: u64,
    /// How often this host asks its peers for their spare capacity.
    pub peer_poll_ms: u64,
    /// How far this host's wall clock may be from the cluster's middle clock (measured on the
    /// peer polls) before it stops holding shards (see `cluster::clock`).
    pub clock_skew_max_ms: u64,
    /// How many hosts of each tier this host polls (and announces its ready topics to):
    /// all of a tier with no more than this many, else this many on a ring (see
    /// `cluster::fanout`), so a host's background calls do not grow with the tier.
    pub peer_fanout: u32,
    /// `manager = "static"`: every host of the cluster and the shards it owns.
    pub hosts: Vec<StaticHost>,
    pub etcd: EtcdConfig,
    /// TLS towards peers whose ports speak TLS: this host's client certificate and key
    /// (PEM), presented to peers that require one, and the CA that signed the peers'
    /// certificates. With `tls_ca_file`, peer connections use TLS.
    pub tls_cert_file: Option<std::path::PathBuf>,
    pub tls_key_file: Option<std::path::PathBuf>,
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// The secret this cluster's hosts log in to each other with (`peerLogin`), so that
    /// they, and no client, may use the calls and fields only hosts may. The same on
    /// every host; at least `PEER_SECRET_BYTES_MIN` bytes. Or `peer_secret_file`, a file
    /// holding it (a trailing newline is not part of it). A cluster needs one of them
    /// unless its hosts prove themselves with TLS certificates allowed `peer`.
    pub peer_secret: Option<String>,
    pub peer_secret_file: Option<std::path::PathBuf>,
    /// The CA of the hosts' certificates, apart from the clients' (`server.tls
    /// .client_ca_file`): a connection whose certificate it issued is a peer, and no
    /// client's certificate is, whatever its name.
    pub peer_ca_file: Option<std::path::PathBuf>,
}

/// The shortest `cluster.peer_secret` accepted: 128 bits of a random hex or base64 string.
pub const PEER_SECRET_BYTES_MIN: usize = 16;

impl ClusterConfig {
    /// The peer secret, from `peer_secret` or read from `peer_secret_file`.
    pub fn peer_secret(&self) -> Result<Option<Vec<u8>>, String> {
        let secret = match (&self.peer_secret, &self.peer_secret_file) {
            (Some(_), Some(_)) => {
                return Err("cluster.peer_secret and cluster.peer_secret_file: give one".into())
            }
            (Some(s), None) => s.clone().into_bytes(),
            (None, Some(path)) => {
                let mut s = std::fs::read(path).map_err(|e| {
                    format!(
                        "cluster.peer_secret_file: cannot read {}: {e}",
                        path.display()
                    )
                })?;
                while s.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    s.pop();
                }
                s
            }
            (None, None) => return Ok(None),
        };
        if secret.len() < PEER_SECRET_BYTES_MIN {
            return Err(format!(
                "cluster.peer_secret must be at least {PEER_SECRET_BYTES_MIN} bytes (it has {})",
                secret.len()
            ));
        }
        Ok(Some(secret))
    }
}

/// `cluster.peer_fanout`'s default: tiers of up to 9 hosts are polled whole.
pub const PEER_FANOUT_DEFAULT: usize = 8;

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            manager: ManagerKind::Single,
            advertise: None,
            tier: TIER_DEFAULT.to_string(),
            region: String::new(),
            forwarding: true,
            peer_connections_max: 8,
            peer_timeout_ms: 2000,
            peer_poll_ms: 500,
            clock_skew_max_ms: 500,
            peer_fanout: PEER_FANOUT_DEFAULT as u32,
            hosts: Vec::new(),
            etcd: EtcdConfig::default(),
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_file: None,
            peer_secret: None,
            peer_secret_file: None,
            peer_ca_file: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticHost {
    pub id: String,
    pub addr: String,
    #[serde(default = "tier_default")]
    pub tier: String,
    pub shards: Vec<ShardId>,
}

fn tier_default() -> String {
    TIER_DEFAULT.to_string()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdConfig {
    /// "host:port" of etcd's client endpoints.
    pub endpoints: Vec<String>,
    /// Every key this cluster writes starts with it; clusters sharing an etcd differ here.
    pub prefix: String,
    /// A host that stops renewing its lease loses its shards this long after its last
    /// renewal. It stops writing them `engine.store_timeout_ms` + 500 ms earlier.
    pub lease_ttl_ms: u64,
    /// How often the host renews its lease and reconciles (it also reconciles on every
    /// batch of watch events; see `etcd/cache.rs`).
    pub poll_ms: u64,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["127.0.0.1:2379".to_string()],
            prefix: "/foqs".to_string(),
            lease_ttl_ms: 10_000,
            poll_ms: 200,
        }
    }
}

/// A tier: a pool of hosts and shards serving some namespaces.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierConfig {
    pub name: String,
    pub shards: Vec<ShardId>,
}

/// Every tier's shards: the listed tiers, and `default` with every shard no tier lists.
pub fn tier_shards(tiers: &[TierConfig], all: &[ShardId]) -> BTreeMap<String, Vec<ShardId>> {
    let mut out: BTreeMap<String, Vec<ShardId>> = BTreeMap::new();
    let mut listed = BTreeSet::new();
    for t in tiers {
        let mut s = t.shards.clone();
        s.sort_unstable();
        listed.extend(s.iter().copied());
        out.insert(t.name.clone(), s);
    }
    let rest: Vec<ShardId> = all
        .iter()
        .copied()
        .filter(|s| !listed.contains(s))
        .collect();
    out.entry(TIER_DEFAULT.to_string())
        .or_default()
        .extend(rest);
    out
}

/// Problems of the cluster and tier sections, given the shards and the listen address.
pub fn check(
    c: &ClusterConfig,
    tiers: &[TierConfig],
    shards: &[ShardId],
    host_id: &str,
    store_timeout_ms: u64,
    problems: &mut Vec<String>,
) {
    let known: BTreeSet<ShardId> = shards.iter().copied().collect();
    let mut tier_names = BTreeSet::from([TIER_DEFAULT.to_string()]);
    let mut tiered = BTreeMap::new();
    for t in tiers {
        if !tier_names.insert(t.name.clone()) && t.name != TIER_DEFAULT {
            problems.push(format!("tier {:?} is listed twice", t.name));
        }
        for s in &t.shards {
            if !known.contains(s) {
                problems.push(format!("tier {:?}: shard {s} is not in [[shards]]", t.name));
            }
            if let Some(other) = tiered.insert(*s, t.name.clone()) {
                problems.push(format!("shard {s} is in tiers {other:?} and {:?}", t.name));
            }
        }
    }
    if !tier_names.contains(&c.tier) {
        problems.push(format!("cluster.tier {:?} is not a tier", c.tier));
    }
    if let Some(a) = &c.advertise {
        if a.parse::<std::net::SocketAddr>().is_err() {
            problems.push(format!("cluster.advertise {a:?} is not HOST:PORT"));
        }
    }
    for (name, v) in [
        (
            "cluster.peer_connections_max",
            c.peer_connections_max as u64,
        ),
        ("cluster.peer_timeout_ms", c.peer_timeout_ms),
        ("cluster.peer_poll_ms", c.peer_poll_ms),
        ("cluster.clock_skew_max_ms", c.clock_skew_max_ms),
        ("cluster.peer_fanout", c.peer_fanout as u64),
    ] {
        if v == 0 {
            problems.push(format!("{name} must be > 0"));
        }
    }
    let by_tier = tier_shards(tiers, shards);
    match c.manager {
        ManagerKind::Single => {}
        ManagerKind::Static => {
            if !c.hosts.iter().any(|h| h.id == host_id) {
                problems.push(format!(
                    "cluster.manager = \"static\": this host ({host_id:?}, server.host_id) is not in [[cluster.hosts]]"
                ));
            }
            let mut owner = BTreeMap::new();
            let mut ids = BTreeSet::new();
            for h in &c.hosts {
                if !ids.insert(h.id.clone()) {
                    problems.push(format!("cluster host {:?} is listed twice", h.id));
                }
                if h.addr.parse::<std::net::SocketAddr>().is_err() {
                    problems.push(format!(
                        "cluster host {:?}: addr {:?} is not HOST:PORT",
                        h.id, h.addr
                    ));
                }
                let Some(tier_shards) = by_tier.get(&h.tier) else {
                    problems.push(format!(
                        "cluster host {:?}: tier {:?} is not a tier",
                        h.id, h.tier
                    ));
                    continue;
                };
                for s in &h.shards {
                    if !tier_shards.contains(s) {
                        problems.push(format!(
                            "cluster host {:?}: shard {s} is not a shard of its tier {:?}",
                            h.id, h.tier
                        ));
                    }
                    if let Some(other) = owner.insert(*s, h.id.clone()) {
                        problems.push(format!(
                            "shard {s} is owned by both {other:?} and {:?}",
                            h.id
                        ));
                    }
                }
            }
        }
        ManagerKind::Etcd => {
            let e = &c.etcd;
            if e.endpoints.is_empty() {
                problems.push("cluster.etcd.endpoints is empty".into());
            }
            if e.prefix.is_empty() || !e.prefix.starts_with('/') {
                problems.push(format!(
                    "cluster.etcd.prefix {:?} must start with /",
                    e.prefix
                ));
            }
            if e.lease_ttl_ms < LEASE_TTL_MS_MIN || !e.lease_ttl_ms.is_multiple_of(1000) {
                problems.push(format!(
                    "cluster.etcd.lease_ttl_ms must be whole seconds, >= {LEASE_TTL_MS_MIN}"
                ));
            }
            // Fencing: a host stops writing fence_margin_ms before its lease can expire,
            // and renews every poll; it must still have time to write in between.
            if e.lease_ttl_ms < fence_margin_ms(store_timeout_ms) + 2 * e.poll_ms.max(1) {
                problems.push(format!(
                    "cluster.etcd.lease_ttl_ms ({}) must exceed engine.store_timeout_ms + 500 + 2 x cluster.etcd.poll_ms ({})",
                    e.lease_ttl_ms,
                    fence_margin_ms(store_timeout_ms) + 2 * e.poll_ms
                ));
            }
            if e.poll_ms == 0 {
                problems.push("cluster.etcd.poll_ms must be > 0".into());
            }
        }
    }
}

/// How long before its lease can expire a host stops writing: a write started just before
/// the fence may take up to the store timeout, and 500 ms cover clock-rate differences.
pub fn fence_margin_ms(store_timeout_ms: u64) -> u64 {
    store_timeout_ms + 500
}
