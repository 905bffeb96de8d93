//! foqs: a Thrift-compatible implementation of FOQS, Meta's distributed priority queue,
//! storing items in sharded MySQL (MariaDB works) or, on one machine, in SQLite files.
//!
//! # Layout
//! One request flows top to bottom (see `DESIGN.md` in the team's shared notes):
//! - [`server`]: tokio accept loop, TLS, connection limits (deadlines, eviction at the
//!   cap), graceful shutdown; and the metrics/health HTTP listener.
//! - [`wire`]: the Thrift transports, sans I/O: which one a connection speaks (framed,
//!   unframed, THeader, HTTP), where each message starts and ends, how a reply is framed.
//! - [`rpc`]: the only module that sees generated Thrift types: decode → [`core`] → encode.
//! - [`core`]: [`core::Host`], the transport-free queue engine: validation, namespace
//!   policy and access rules, shard choice, the prefetch buffer and its k-way merge over
//!   shard heads, ack/nack routing, readiness. `Host`'s `impl` blocks, one concern a file
//!   (as NATS lists its server's files): `host.rs` (the struct, shards in and out),
//!   `enqueue.rs` (validation, quota, where items go), `enqueue_doubt.rs` (enqueues whose
//!   answer was lost), `dequeue.rs` (long polls, the stage, hand-outs), `useful_lease.rs`
//!   (no delivery leaves with half a lease), `routed_dequeue.rs` (the tier's order,
//!   merged), `routing.rs` (which host serves what), `settle.rs` (ack, nack, touch,
//!   requeue per item), `in_doubt.rs` (settles whose answer was lost), `inspect.rs`
//!   (peek, counts, dead-letter administration), `tenants.rs` (the fair gate's use),
//!   `cluster.rs` (views, peers, forwarding), `replication.rs` (the admin calls),
//!   `health.rs` (readiness, gauges), `overview.rs` (what the console shows).
//! - [`shard`]: one [`shard::ShardWorker`] per shard, the only writer of that shard: batched
//!   writes, the bounded in-memory ready index, background scans, circuit breaker.
//! - [`store`]: the narrow [`store::ShardStore`] trait, [`store::MySqlStore`] and
//!   [`store::SqliteStore`], the fence around them, and (feature `faults`, tests only)
//!   the fault-injecting `store::faulty::Faulty`.
//! - [`cluster`]: the pluggable [`cluster::ShardManager`] (single host, static, etcd) that
//!   says which host owns which shard, tiers, and the cluster-wide enqueue quota budget.
//! - [`failpoint`]: named failpoints for tests (nothing in a release build).
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
//! - [`demand`]: consumers that found a topic empty, so that an enqueue can hand them its
//!   items directly (written leased, no claim).
//! - [`fair`]: the fair gate: a host's slots shared among namespaces by weight (start-time
//!   fair queuing), with bounded waiting and shedding of namespaces without a guarantee.
//! - [`overload`]: sheds enqueues of namespaces without a guarantee while the machine's
//!   CPUs are saturated beside a guaranteed namespace (a rate kept by AIMD on `/proc/stat`).
//! - [`replication`]: replicated shards on MariaDB's replication: each set's primary in
//!   etcd, the driver that runs a set's switches under an etcd lock (`driver`), planned
//!   switchover and region drain (`switch`), failover (`failover`), the
//!   switch journal that lets the next driver finish (`journal`), server steps (`server`)
//!   and the admin account's grants (`grants`).
//! - [`console`]: the web console: server-rendered pages and the JSON API over
//!   [`core::Host`], with its own users, sessions and roles.
//! - [`hash`]: a hash stable across builds and hosts (dedup shards, owner locks).
//! - [`seeded`]: a small deterministic generator for seeded tests and fault plans.
//! - [`thrift_gen`]: code generated from `thrift/foqs.thrift` (do not edit; see
//!   `scripts/gen-thrift.sh`). Public so that Rust clients and tests can use its client.
//!
//! # Locks
//! Which locks may be held together, and in which order; no other nesting exists. A
//! std `Mutex`/`RwLock` is never held across an `.await`; the tokio locks named below are,
//! on purpose, as said.
//! - `Host.claiming` (tokio `RwLock`): held shared by every dequeue and restock across its
//!   claim, stage and hand-out; a shard's planned removal takes it alone (after the shard
//!   left the map), so that nothing claimed on the shard is in flight. (An abandoned
//!   shard's does not: its staged set holds its claims from before they run, and is
//!   closed; see `shard::Staged`.) Taken before the claim lock.
//! - Per-topic claim lock (`Prefetch` stage's `claim_lock`, tokio): held across the awaits
//!   of one claim (merge, claim, stage) and of a peek, so that no item is between the
//!   shards' indexes and the stage unseen. Under it: any of the std locks below, briefly.
//! - `Prefetch.topics`, then a shard's `Staged.keys` (through the stage's `live` and
//!   `hand_out` checks), then its `Staged.in_reply` (handing out, taking back). Never the
//!   other way: `Staged.in_reply` is taken alone or last, `Staged.keys` under no other
//!   staged lock.
//! - `ClusterState.loads`, then `ClusterState.ready`, then `ClusterState.shard_states`
//!   (the peer poll writes all three; a peer found unreachable clears them in that order).
//! - `Waiters.announce`, then `Waiters.announced` (announcing a ready topic).
//! - `Quotas` per-namespace slot (tokio): held across one budget call (an etcd
//!   transaction, or the local budget's buckets, briefly), so that concurrent requests of
//!   a namespace share its chunk.
//! - Taken alone (a snapshot is cloned, or a value read, and the lock dropped):
//!   `Host.shards`, `Host.workers`, `Host.unseen`, `ClusterState.view`,
//!   `Quotas.held`; a shard's ready index (written by its worker only), its `NsCounts`
//!   and its worker's `Doubts`; a store's `TopicIds`; the SQLite store's writer and reader
//!   slots; the peer client's pools; `Waiters.topics`, `Demand.topics`, `ConnTable.conns`, the metrics'
//!   namespace labels and the local budget's buckets (outside a slot); the console's
//!   verified credentials, its series ring and its topic rates.
//! - The MySQL store's owner-lock slot (tokio): only in `open` and `close`.
//! - The SQLite shard's thread and reader run one job at a time each and take none of
//!   these.

/// The Rust client: the blocking Thrift client and the consumer loop over it (both speak
/// Thrift, so they live in [`rpc`]; this facade keeps `foqs::client::*` in one place).
pub mod client {
    pub use crate::rpc::client::*;
    pub use crate::rpc::worker::{Job, Settled, Stopper, Verdict, Worker, WorkerOptions};
}
pub mod clock;
pub mod cluster;
pub mod config;
pub mod console;
pub mod core;
pub mod daemon;
pub mod demand;
pub mod error;
pub mod failpoint;
pub mod fair;
pub mod fence;
pub mod hash;
pub mod metrics;
pub mod model;
pub mod overload;
pub mod quota;
pub mod replication;
pub mod rpc;
pub mod seeded;
pub mod server;
pub mod shard;
pub mod store;
pub mod tls;
pub mod waiters;
pub mod wire;

#[path = "../gen/rs/foqs.rs"]
#[allow(clippy::all, dead_code, unused_imports, unused_mut)]
#[rustfmt::skip]
pub mod thrift_gen;

/// The version reported by `getHostInfo`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
