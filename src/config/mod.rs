//! The configuration: a TOML file read through the `config` crate, every key overridable
//! from the environment as `FOQS__SECTION__KEY`, then validated as a whole so that an
//! operator sees every problem at once. Defaults and limits are named constants.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

mod access;
mod console;
mod edge;
mod namespaces;
pub mod replication;

pub use access::{AccessRule, Kind};
pub use console::{
    ConsoleConfig, ConsoleRole, ConsoleUser, CONSOLE_REFRESH_MS_DEFAULT, CONSOLE_REFRESH_MS_MIN,
};
pub use edge::{LogConfig, LogFormat, MetricsConfig};
pub use namespaces::{NamespaceConfig, NamespaceDefaults, NamespacePolicy, Namespaces, PolicyName};

use crate::cluster::config::{self as cluster_config, ClusterConfig, TierConfig};
use crate::model::ShardId;

pub const LISTEN_DEFAULT: &str = "127.0.0.1:9090";
pub const MAX_FRAME_BYTES_DEFAULT: usize = 16 * 1024 * 1024;
/// Below this, a maximal enqueue request (1000 items of 10 KiB) could not be framed at all.
pub const MAX_FRAME_BYTES_MIN: usize = 1024;
pub const MAX_CONNECTIONS_DEFAULT: usize = 1024;
/// As many as a fleet of clients reconnecting at once after a restart may send together.
pub const LISTEN_BACKLOG_DEFAULT: u32 = 4096;
pub const LEASE_MS_DEFAULT: i64 = 30_000;
pub const MAX_ATTEMPTS_DEFAULT: i32 = 5;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub shards: Vec<ShardConfig>,
    #[serde(default)]
    pub engine: EngineConfig,
    /// Settings for namespaces that `namespaces` does not list.
    #[serde(default)]
    pub defaults: NamespaceDefaults,
    /// When non-empty, only these namespaces are accepted (others: `UNKNOWN_NAMESPACE`).
    #[serde(default)]
    pub namespaces: Vec<NamespaceConfig>,
    #[serde(default)]
    pub cluster: ClusterConfig,
    /// Pools of shards; shards no tier lists form the tier `default`.
    #[serde(default)]
    pub tiers: Vec<TierConfig>,
    /// Who may do what in which namespace; none: everything is allowed.
    #[serde(default)]
    pub access: Vec<AccessRule>,
    #[serde(default)]
    pub metrics: MetricsConfig,
    #[serde(default)]
    pub console: ConsoleConfig,
    #[serde(default)]
    pub log: LogConfig,
    #[serde(default)]
    pub replication: replication::ReplicationConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub listen: String,
    /// Reported by `getHostInfo`; defaults to the listen address.
    pub host_id: Option<String>,
    pub max_frame_bytes: usize,
    pub max_connections: usize,
    /// Connections the kernel holds for foqsd before it accepts them (the `listen(2)`
    /// backlog; the kernel caps it at `net.core.somaxconn`).
    pub listen_backlog: u32,
    /// On SIGTERM, how long to wait for connections to finish the request they are serving.
    pub shutdown_grace_ms: u64,
    /// A frame that has started must be complete within this long (and a reply taken by
    /// the client within it), else the connection is closed.
    pub frame_read_timeout_ms: u64,
    /// A connection with no request for this long is closed.
    pub idle_timeout_ms: u64,
    /// A TLS handshake must finish within this long.
    pub handshake_timeout_ms: u64,
    /// With it, the Thrift port speaks TLS only.
    pub tls: Option<crate::tls::ServerTlsConfig>,
    /// Serve beyond loopback with no TLS and no `[[access]]` rules, where any client that
    /// reaches a port may do everything: refused at start unless this says it is meant.
    pub allow_open: bool,
    /// The metrics and console listeners: a request head must arrive whole within this
    /// long, a connection with nothing read for `http_idle_timeout_ms` is closed, and at
    /// most `http_connections_max` are open on each (past it new ones are closed at once).
    pub http_header_timeout_ms: u64,
    pub http_idle_timeout_ms: u64,
    pub http_connections_max: usize,
    /// Most items, and most bytes of items, one dequeue reply carries: claiming stops
    /// before either is passed (a dequeue of 100 topics of 1,000 items each would
    /// otherwise be 100,000 items).
    pub reply_items_max: usize,
    pub reply_bytes_max: usize,
    /// Connections one client address may hold: at it, one of that address's own
    /// connections gives way to its new one, as at `max_connections` for all.
    pub connections_per_address_max: usize,
    /// Connections one TLS client identity may hold, from any addresses: at it, one of
    /// that identity's own connections gives way to its new one.
    pub connections_per_identity_max: usize,
    /// Listing calls (topicStats, getActiveTopics, peek, dlqList) one caller (TLS
    /// identity, or address) may have in progress on this host; more are refused at once
    /// (`RATE_LIMITED`).
    pub listing_calls_per_caller_max: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: LISTEN_DEFAULT.to_string(),
            host_id: None,
            max_frame_bytes: MAX_FRAME_BYTES_DEFAULT,
            max_connections: MAX_CONNECTIONS_DEFAULT,
            listen_backlog: LISTEN_BACKLOG_DEFAULT,
            shutdown_grace_ms: 30_000,
            frame_read_timeout_ms: 10_000,
            idle_timeout_ms: 300_000,
            handshake_timeout_ms: 10_000,
            tls: None,
            allow_open: false,
            http_header_timeout_ms: 10_000,
            http_idle_timeout_ms: 75_000,
            http_connections_max: 128,
            reply_items_max: 10_000,
            reply_bytes_max: 16 << 20,
            connections_per_address_max: 512,
            connections_per_identity_max: 512,
            listing_calls_per_caller_max: 16,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardConfig {
    pub id: ShardId,
    /// `mysql://user:password@host:port/database` (the database is created when
    /// missing), or `sqlite://PATH.db`: a local file, relative to the config file's folder
    /// unless absolute (`sqlite:///var/lib/foqs/0.db`), created with its folder.
    pub url: String,
    #[serde(default = "pool_connections_max_default")]
    pub pool_connections_max: usize,
    /// The region of the primary `url` names (needed with replicas).
    #[serde(default)]
    pub region: Option<String>,
    /// The shard's replicas (MySQL only, `cluster.manager = "etcd"`): the initial layout;
    /// etcd holds the current primary from then on (see `crate::replication`).
    #[serde(default)]
    pub replicas: Vec<replication::ReplicaConfig>,
    /// TLS to this shard's MySQL servers (its data, owner-lock and heartbeat
    /// connections; a replica may set its own).
    #[serde(default)]
    pub tls: Option<crate::store::MysqlTls>,
}

impl ShardConfig {
    /// The TLS settings for this shard's account on the server at `addr` ("host:port"):
    /// its `[[shards.replicas]]` entry's own, else the shard's.
    pub fn tls_on(&self, addr: &str) -> Option<&crate::store::MysqlTls> {
        self.replicas
            .iter()
            .find(|r| replication::server_addr(&r.url).as_deref() == Some(addr))
            .and_then(|r| r.tls.as_ref())
            .or(self.tls.as_ref())
    }
}

fn pool_connections_max_default() -> usize {
    4
}

/// Bounds and intervals of the engine; every one has a unit in its name.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Most rows one multi-row INSERT writes.
    pub enqueue_batch_rows_max: usize,
    /// Commands a shard worker's channel holds before callers get `UNAVAILABLE`.
    pub worker_queue_max: usize,
    /// Keys of ready items one shard keeps in memory per topic (must be >= 1000, the
    /// largest dequeue count, so a single shard can answer any one request).
    pub index_keys_per_topic_max: usize,
    /// Topics one shard keeps an index for; the least recently dequeued are forgotten
    /// (and reloaded from storage when used again).
    pub index_topics_max: usize,
    /// How often each shard promotes due items, expires leases and purges TTLs.
    pub scan_interval_ms: u64,
    /// Most rows one background scan step reads.
    pub scan_rows_max: usize,
    /// How often scan checkpoints are written to the shard's storage.
    pub checkpoint_interval_ms: u64,
    /// A topic that has held no item on a shard for this long is forgotten there (its
    /// row, its traffic totals, its id), so that topics made without end do not grow
    /// every shard's table and memory for ever.
    pub topic_forget_after_ms: u64,
    /// Consecutive storage failures that open a shard's circuit breaker.
    pub breaker_failures_max: u32,
    /// A shard whose recent median operation latency exceeds this is isolated too.
    pub breaker_slow_ms: u64,
    /// A storage operation with no answer after this long fails (and counts against the
    /// breaker), so a hung server cannot stall its shard's worker.
    pub store_timeout_ms: u64,
    /// Opening a shard (its schema, and the one full count of its items) fails after this
    /// long, to be retried, so that a stalled store cannot hold the host's other shards'
    /// hand-overs (they open one after another).
    pub shard_open_timeout_ms: u64,
    /// One `dlqRequeueAll` or `dlqPurge` works this long at most, then answers with
    /// `more = true` (call again), so that no admin call outlasts a client's timeout.
    pub dlq_call_ms_max: u64,
    /// How long an open breaker waits before probing the shard again.
    pub breaker_open_ms: u64,
    /// A busy topic stages about this much of its dequeue rate in the prefetch buffer.
    pub prefetch_window_ms: u64,
    /// Most items staged per topic.
    pub prefetch_items_max: usize,
    /// Staged items not handed out within this long are released back to their shards.
    pub prefetch_stage_max_ms: u64,
    /// How often busy topics are restocked and aged staged items released.
    pub prefetch_tick_ms: u64,
    /// Memory for the rows this host's shards inserted recently, so that their first
    /// claim need not read them back (MySQL; 0, the default, keeps none). The oldest go
    /// first.
    pub payload_cache_bytes_max: usize,
    /// How long a shard remembers the items it deleted for an ack (and under which
    /// lease), so that a retried ack of the same delivery answers OK, not `NOT_FOUND`.
    pub ack_memory_ms: u64,
    /// Acked items one shard remembers at most (about 40 bytes each); past it the oldest
    /// are forgotten before `ack_memory_ms`.
    pub ack_memory_items_max: usize,
    /// Enqueues and dequeues at work on the shards at once, across namespaces; the rest
    /// wait in their namespace's queue, served by weight (see `fair`).
    pub fair_slots: usize,
    /// Requests waiting for a slot, at most; past it (or `fair_waiting_bytes_max`), a
    /// namespace without a guaranteed rate is refused with `RATE_LIMITED`.
    pub fair_waiting_max: usize,
    /// Payload bytes of the requests waiting for a slot, at most.
    pub fair_waiting_bytes_max: usize,
    /// The machine's busy CPU fraction above which, while a namespace with a guaranteed
    /// rate is at work, enqueues of namespaces without one are shed (see `overload`).
    /// 0: never.
    pub overload_cpu_busy: f64,
    /// While a namespace with a guaranteed rate is at work, the nice value (0-19) of the
    /// SQLite threads of every shard but the one kept for such namespaces (see
    /// `core::tenants`). 0: never lowered.
    pub best_effort_nice: i32,
    /// Dead items one topic keeps on each shard, at most; past it the oldest are purged
    /// (counted in `foqs_dlq_dropped_total`). 0: unbounded. A namespace may set its own.
    pub dlq_max_items_per_topic: u64,
    /// Every insert writes a mark in its transaction, so that an enqueue whose commit's
    /// outcome was lost is answered with what happened (see `store::batches`); off, such
    /// an enqueue answers `outcome_unknown`, and single-item enqueues gain about 30 % in
    /// rate on MySQL (5.1k/s to 6.8k/s here).
    pub enqueue_marks: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            enqueue_batch_rows_max: 500,
            worker_queue_max: 4096,
            index_keys_per_topic_max: 2048,
            index_topics_max: 10_000,
            scan_interval_ms: 100,
            scan_rows_max: 1000,
            checkpoint_interval_ms: 1000,
            topic_forget_after_ms: 3_600_000,
            breaker_failures_max: 3,
            breaker_slow_ms: 1000,
            store_timeout_ms: 5000,
            shard_open_timeout_ms: 60_000,
            dlq_call_ms_max: 5_000,
            breaker_open_ms: 2000,
            prefetch_window_ms: 100,
            prefetch_items_max: 1000,
            prefetch_stage_max_ms: 1000,
            prefetch_tick_ms: 10,
            payload_cache_bytes_max: 0,
            ack_memory_ms: 600_000,
            ack_memory_items_max: 100_000,
            fair_slots: 16,
            fair_waiting_max: 4096,
            fair_waiting_bytes_max: 64 << 20,
            overload_cpu_busy: 0.75,
            best_effort_nice: 10,
            dlq_max_items_per_topic: 0,
            enqueue_marks: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the configuration: {0}")]
    Read(#[from] config::ConfigError),
    #[error("invalid configuration:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
}

impl Config {
    /// Reads `path` (TOML), then `FOQS__SECTION__KEY` environment overrides, then validates.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let raw = config::Config::builder()
            .add_source(config::File::from(path).format(config::FileFormat::Toml))
            .add_source(
                config::Environment::with_prefix("FOQS")
                    .prefix_separator("__")
                    .separator("__")
                    .try_parsing(true),
            )
            .build()?;
        let mut cfg: Config = raw.try_deserialize()?;
        // SQLite paths are relative to the config file, not to wherever foqsd starts.
        let base = path.parent().unwrap_or(Path::new("."));
        for s in &mut cfg.shards {
            if let Some(p) = crate::store::sqlite_path(&s.url, base) {
                s.url = format!("sqlite://{}", p.display());
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses TOML text without environment overrides (tests build configs this way).
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let raw = config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()?;
        let cfg: Config = raw.try_deserialize()?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reports every problem at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        if self.server.listen.parse::<std::net::SocketAddr>().is_err() {
            problems.push(format!(
                "server.listen {:?} is not HOST:PORT",
                self.server.listen
            ));
        }
        // The largest frame length a transport can be told from (THeader's spec: a length's
        // first byte is at most 0x3F).
        if self.server.max_frame_bytes < MAX_FRAME_BYTES_MIN
            || self.server.max_frame_bytes > crate::wire::FRAME_BYTES_MAX
        {
            problems.push(format!(
                "server.max_frame_bytes must be in {MAX_FRAME_BYTES_MIN}..={}",
                crate::wire::FRAME_BYTES_MAX
            ));
        }
        if self.server.max_connections == 0 {
            problems.push("server.max_connections must be > 0".into());
        }
        if self.server.listen_backlog == 0 {
            problems.push("server.listen_backlog must be > 0".into());
        }
        edge::check(self, &mut problems);
        console::check(self, &mut problems);
        if self.shards.is_empty() {
            problems.push("no [[shards]]: at least one shard is needed".into());
        }
        let mut seen = HashMap::new();
        for s in &self.shards {
            if let Some(prev) = seen.insert(s.id, &s.url) {
                problems.push(format!(
                    "shard id {} is listed twice ({prev} and {})",
                    s.id, s.url
                ));
            }
            if s.url.starts_with("sqlite:") {
                if crate::store::sqlite_path(&s.url, Path::new(".")).is_none() {
                    problems.push(format!(
                        "shard {}: url {:?}: want sqlite://PATH (a file)",
                        s.id, s.url
                    ));
                }
                if self.cluster.manager != crate::cluster::config::ManagerKind::Single {
                    problems.push(format!(
                        "shard {}: a SQLite shard ({}) is local to one host: it needs cluster.manager = \"single\"",
                        s.id, s.url
                    ));
                }
                if s.tls.is_some() {
                    problems.push(format!(
                        "shard {}: tls is for MySQL servers; a SQLite shard is a local file",
                        s.id
                    ));
                }
            } else if let Err(e) = mysql_async::Opts::from_url(&s.url) {
                // The password never goes into error text (nor does the parser's own echo
                // of the URL, which some of its messages carry).
                let why = e.to_string().replace(&s.url, &redact_url(&s.url));
                problems.push(format!(
                    "shard {}: url {:?}: {why}",
                    s.id,
                    redact_url(&s.url)
                ));
            }
            let what = format!("shards[id = {}]", s.id);
            for tls in s
                .tls
                .iter()
                .chain(s.replicas.iter().filter_map(|r| r.tls.as_ref()))
            {
                problems.extend(tls.problems(&what));
            }
            if s.pool_connections_max == 0 {
                problems.push(format!("shard {}: pool_connections_max must be > 0", s.id));
            }
        }
        let e = &self.engine;
        let positive = [
            (
                "engine.enqueue_batch_rows_max",
                e.enqueue_batch_rows_max as u64,
            ),
            ("engine.worker_queue_max", e.worker_queue_max as u64),
            ("engine.index_topics_max", e.index_topics_max as u64),
            ("engine.scan_interval_ms", e.scan_interval_ms),
            ("engine.scan_rows_max", e.scan_rows_max as u64),
            ("engine.checkpoint_interval_ms", e.checkpoint_interval_ms),
            ("engine.topic_forget_after_ms", e.topic_forget_after_ms),
            ("engine.breaker_failures_max", e.breaker_failures_max as u64),
            ("engine.breaker_open_ms", e.breaker_open_ms),
            ("engine.breaker_slow_ms", e.breaker_slow_ms),
            ("engine.store_timeout_ms", e.store_timeout_ms),
            ("engine.shard_open_timeout_ms", e.shard_open_timeout_ms),
            ("engine.dlq_call_ms_max", e.dlq_call_ms_max),
            ("engine.prefetch_stage_max_ms", e.prefetch_stage_max_ms),
            ("engine.prefetch_tick_ms", e.prefetch_tick_ms),
            ("engine.fair_slots", e.fair_slots as u64),
            ("engine.fair_waiting_max", e.fair_waiting_max as u64),
            (
                "engine.fair_waiting_bytes_max",
                e.fair_waiting_bytes_max as u64,
            ),
        ];
        for (name, v) in positive {
            if v == 0 {
                problems.push(format!("{name} must be > 0"));
            }
        }
        if !(0..=19).contains(&e.best_effort_nice) {
            problems
                .push("engine.best_effort_nice must be between 0 and 19 (0: never lowered)".into());
        }
        if !(0.0..=1.0).contains(&e.overload_cpu_busy) {
            problems
                .push("engine.overload_cpu_busy must be between 0 and 1 (0: never shed)".into());
        }
        if e.enqueue_batch_rows_max > 2000 {
            // 15 placeholders a row; MySQL allows 65535 in one statement.
            problems.push("engine.enqueue_batch_rows_max must be <= 2000".into());
        }
        if e.index_keys_per_topic_max < 1000 {
            problems.push(
                "engine.index_keys_per_topic_max must be >= 1000 (the largest dequeue count)"
                    .into(),
            );
        }
        namespaces::check(self, &mut problems);
        let shard_ids: Vec<ShardId> = self.shards.iter().map(|s| s.id).collect();
        cluster_config::check(
            &self.cluster,
            &self.tiers,
            &shard_ids,
            &self.host_id(),
            self.engine.store_timeout_ms,
            &mut problems,
        );
        replication::check(self, &mut problems);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    pub fn host_id(&self) -> String {
        self.server
            .host_id
            .clone()
            .unwrap_or_else(|| self.server.listen.clone())
    }
}

/// `url` with its password (if any) shown as `***`, for error text and logs:
/// `mysql://foqs:s3cret@db:3306/s0` → `mysql://foqs:***@db:3306/s0`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let (userinfo, host) = authority.split_at(at);
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***{host}{path}"),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_in_urls_are_redacted() {
        use super::redact_url;
        assert_eq!(
            redact_url("mysql://foqs:s3cret@db:3306/s0"),
            "mysql://foqs:***@db:3306/s0"
        );
        assert_eq!(
            redact_url("mysql://a:p@ss@db/s?x=1"),
            "mysql://a:***@db/s?x=1"
        );
        assert_eq!(
            redact_url("mysql://root@db:3306/s0"),
            "mysql://root@db:3306/s0"
        );
        assert_eq!(
            redact_url("sqlite:///var/lib/x.db"),
            "sqlite:///var/lib/x.db"
        );
        let bad = "[server]\nlisten = \"127.0.0.1:0\"\n[[shards]]\nid = 0\n\
                   url = \"mysql://u:hunter2-secret@db:notaport/s0\"\n";
        let e = super::Config::from_toml(bad).unwrap_err().to_string();
        assert!(!e.contains("hunter2") && e.contains("u:***@db"), "{e}");
    }

    use super::*;

    #[test]
    fn every_problem_is_reported_at_once() {
        let err = Config::from_toml(
            r#"
            [server]
            listen = "nowhere"
            listen_backlog = 0
            [engine]
            scan_interval_ms = 0
            index_keys_per_topic_max = 10
            [[namespaces]]
            name = ""
            lease_ms = -1
            quota_burst_ms = 0
            "#,
        )
        .unwrap_err();
        let text = err.to_string();
        for want in [
            "server.listen",
            "server.listen_backlog must be > 0",
            "no [[shards]]",
            "scan_interval_ms",
            "index_keys_per_topic_max",
            "lease_ms must be > 0",
            "quota_burst_ms must be between 1 and 3600000",
            "1..=255",
        ] {
            assert!(text.contains(want), "{want} missing from {text}");
        }
    }
}
