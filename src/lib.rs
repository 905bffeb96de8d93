//! foqs: a Thrift-compatible implementation of FOQS, Meta's distributed priority queue,
//! storing items in sharded MySQL (MariaDB works).
//!
//! # Layout
//! One request flows top to bottom (see `DESIGN.md` in the team's shared notes):
//! - [`server`]: tokio accept loop, TLS, connection limits (deadlines, eviction at the
//!   cap), Thrift framing, graceful shutdown; and the metrics/health HTTP listener.
//! - [`rpc`]: the only module that sees generated Thrift types: decode → [`core`] → encode.
//! - [`core`]: [`core::Host`], the transport-free queue engine: validation, namespace
//!   policy and access rules, shard choice, the prefetch buffer and its k-way merge over
//!   shard heads, ack/nack routing, readiness.
//! - [`shard`]: one [`shard::ShardWorker`] per shard, the only writer of that shard: batched
//!   writes, the bounded in-memory ready index, background scans, circuit breaker.
//! - [`store`]: the narrow [`store::ShardStore`] trait and [`store::MySqlStore`].
//! - [`cluster`]: the pluggable [`cluster::ShardManager`] (single host, static, etcd) that
//!   says which host owns which shard, tiers, and the cluster-wide enqueue quota budget.
//! - [`fence`]: until when this host may write its shards (lease-based fencing).
//! - [`tls`]: rustls configurations from PEM files, and a caller's identity.
//! - [`metrics`]: the Prometheus registry of one running host.
//! - [`model`]: domain types shared by the layers (item ids, keys, items, policies, the
//!   cluster view), so that the arrows between [`core`] and [`cluster`] run one way.
//! - [`error`]: the domain error with its stable [`error::ErrorCode`].
//! - [`config`]: the configuration file, environment overrides and validation.
//! - [`client`] (`rpc::client`): a blocking Rust client (the generated one over TCP or
//!   TLS), for tools and tests.
//! - [`quota`]: namespace enqueue quotas (token buckets) and where their budget lives;
//!   below both [`core`] and [`cluster`], which implements the etcd budget.
//! - [`daemon`]: assembles a running foqsd from a [`config::Config`] (binary and tests).
//! - [`clock`]: time as an injectable [`clock::Clock`], so leases and TTLs are testable.
//! - [`waiters`]: long-polling dequeues parked per topic, woken when an item gets ready.
//! - [`thrift_gen`]: code generated from `thrift/foqs.thrift` (do not edit; see
//!   `scripts/gen-thrift.sh`). Public so that Rust clients and tests can use its client.

/// The blocking Rust client (it speaks Thrift, so it lives in [`rpc`]).
pub use rpc::client;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod core;
pub mod daemon;
pub mod error;
pub mod fence;
pub mod metrics;
pub mod model;
pub mod quota;
pub mod rpc;
pub mod server;
pub mod shard;
pub mod store;
pub mod tls;
pub mod waiters;

#[path = "../gen/rs/foqs.rs"]
#[allow(clippy::all, dead_code, unused_imports, unused_mut)]
#[rustfmt::skip]
pub mod thrift_gen;

/// The version reported by `getHostInfo`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
