//! foqsctl's command line: the global options and every command with its arguments.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::replication;

#[derive(Parser)]
#[command(
    version,
    about = "Command-line client of foqsd (the foqs priority queue)"
)]
pub struct Cli {
    /// foqsd address (HOST:PORT); default from FOQS_HOST, else 127.0.0.1:9090.
    #[arg(
        long,
        env = "FOQS_HOST",
        default_value = "127.0.0.1:9090",
        global = true
    )]
    pub host: String,
    #[arg(long, value_parser = ["binary", "compact"], default_value = "binary", global = true)]
    pub protocol: String,
    /// How messages are framed: `framed` (a length before each), `unframed` (most Thrift
    /// libraries' default) or `header` (THeader, as fbthrift clients send).
    #[arg(long, value_parser = ["framed", "unframed", "header"], default_value = "framed", global = true)]
    pub transport: String,
    /// One JSON object per line.
    #[arg(long, global = true)]
    pub json: bool,
    /// Speak TLS; the CA (PEM) that signed foqsd's certificate.
    #[arg(long, env = "FOQS_TLS_CA", global = true)]
    pub tls_ca: Option<PathBuf>,
    /// This client's certificate (PEM), for a foqsd that requires one (mTLS).
    #[arg(long, env = "FOQS_TLS_CERT", global = true, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "FOQS_TLS_KEY", global = true, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Enqueue one item; prints its id. The payload comes from --payload, --payload-file
    /// or standard input.
    Enqueue {
        #[arg(long)]
        ns: String,
        #[arg(long)]
        topic: String,
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        #[arg(long, conflicts_with = "payload_file")]
        payload: Option<String>,
        #[arg(long)]
        payload_file: Option<std::path::PathBuf>,
        #[arg(long)]
        metadata: Option<String>,
        /// Deliver no earlier than this many ms from now.
        #[arg(long)]
        delay_ms: Option<i64>,
        #[arg(long)]
        lease_ms: Option<i64>,
        #[arg(long)]
        ttl_ms: Option<i64>,
        #[arg(long, value_parser = ["at-least-once", "at-most-once"])]
        policy: Option<String>,
        #[arg(long)]
        max_attempts: Option<i32>,
    },
    /// Dequeue (lease) up to --count items; exit 3 when there is none.
    Dequeue {
        #[arg(long)]
        ns: String,
        #[arg(long)]
        topic: String,
        #[arg(long, default_value_t = 1)]
        count: i32,
        /// Long poll: wait up to this many ms for an item.
        #[arg(long)]
        wait: Option<i64>,
        /// Write only the payload bytes (of every item, back to back).
        #[arg(long)]
        raw: bool,
    },
    /// Ack (delete) items by id.
    Ack {
        ids: Vec<String>,
        /// Only if the item is still on this delivery's lease (see nack --lease-id); one
        /// per id, in order, when given (0: none for that id).
        #[arg(long = "lease-id")]
        lease_ids: Vec<i64>,
    },
    /// Nack an item: ready again after --delay-ms, or dead with --to-dlq.
    Nack {
        id: String,
        #[arg(long)]
        delay_ms: Option<i64>,
        #[arg(long)]
        metadata: Option<String>,
        #[arg(long)]
        to_dlq: bool,
        /// Only if the item is still on this delivery's lease (`lease_id` from dequeue
        /// --json); otherwise NOT_FOUND ("lease ended").
        #[arg(long)]
        lease_id: Option<i64>,
    },
    /// Extend an item's lease to now + --extend-ms.
    Touch {
        id: String,
        #[arg(long)]
        extend_ms: i64,
        /// Only if the item is still on this delivery's lease (see nack --lease-id).
        #[arg(long)]
        lease_id: Option<i64>,
    },
    /// Show the next ready items without leasing them; exit 3 when there is none.
    Peek {
        #[arg(long)]
        ns: String,
        #[arg(long)]
        topic: String,
        #[arg(long, default_value_t = 10)]
        count: i32,
        #[arg(long)]
        raw: bool,
    },
    /// Active topics of a namespace with their counts.
    Topics {
        #[arg(long)]
        ns: String,
        #[arg(long)]
        limit: Option<i32>,
        #[arg(long)]
        after: Option<String>,
    },
    /// A topic's counts, totals and the age of its oldest ready item.
    Stats {
        #[arg(long)]
        ns: String,
        #[arg(long)]
        topic: String,
    },
    /// Dead letters.
    Dlq {
        #[command(subcommand)]
        cmd: DlqCmd,
    },
    /// The host's id, version and shards.
    HostInfo,
    /// Replicated shards: every shard's primary, its replicas and their lag, semi-sync
    /// status, owner and generation.
    Shards,
    /// Replicated shards: planned switchover or failover of a shard's replica set.
    Shard {
        #[command(subcommand)]
        cmd: replication::ShardCmd,
    },
    /// Replicated shards: drain a region of its primaries.
    Region {
        #[command(subcommand)]
        cmd: replication::RegionCmd,
    },
    /// Run CMD once per item of the topics, as a worker: the payload on its standard
    /// input, the item in its environment (FOQS_ID, FOQS_NS, FOQS_TOPIC, FOQS_PRIORITY,
    /// FOQS_DELIVERIES, FOQS_METADATA, FOQS_LEASE_ID); exit 0 acks, --dead-exit sends to
    /// the dead letters, anything else retries with backoff. The lease is renewed while
    /// CMD runs. SIGTERM/SIGINT: stop taking items, let running ones finish (--grace),
    /// then kill them and give their items back.
    Work {
        #[arg(long)]
        ns: String,
        /// A topic to take items from (repeat for several).
        #[arg(long = "topic", required = true)]
        topics: Vec<String>,
        /// Items run at once, at most (each dequeued only when a slot is free).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
        concurrency: u16,
        /// The lease to keep while a command runs (renewed every third of it); default:
        /// the item's own lease.
        #[arg(long)]
        lease_ms: Option<i64>,
        /// After this many deliveries have failed, the item goes to the dead letters.
        #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
        max_attempts: Option<i32>,
        /// Retry delay: BASE_MS x 2^(deliveries - 1), at most MAX_MS, half jittered.
        #[arg(long, default_value = "1000,60000")]
        backoff: String,
        /// Kill a command (its process group) running longer than this, and retry.
        #[arg(long)]
        timeout: Option<u64>,
        /// The exit status that sends the item to the dead letters at once (EX_DATAERR).
        #[arg(long, default_value_t = 65)]
        dead_exit: i32,
        /// On SIGTERM/SIGINT, how long running commands may go on before they are killed.
        #[arg(long, default_value_t = 30_000)]
        grace: u64,
        /// How long one long poll waits for items (at most 1000 ms a poll).
        #[arg(long, default_value_t = 1_000)]
        wait: i64,
        /// Serve Prometheus metrics (jobs by outcome, running, durations) at HOST:PORT.
        #[arg(long)]
        metrics: Option<String>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// A live view of a namespace's topics (ready, deferred, leased, dead, oldest ready
    /// age, enqueue and delivery rates), across the tier: redrawn in place on a terminal,
    /// one JSON object per refresh with --json.
    Watch {
        #[arg(long)]
        ns: String,
        /// Only this topic.
        #[arg(long)]
        topic: Option<String>,
        /// Milliseconds between refreshes.
        #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..))]
        interval: u64,
        /// Topics shown at most, the busiest first.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
        limit: u64,
        /// Stop after this many refreshes (default: until interrupted).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
    },
    /// Print an Argon2id hash of the password read from standard input (its first line),
    /// for `password_hash` in `[[console.users]]`. Talks to no foqsd.
    HashPassword,
}

#[derive(Subcommand)]
pub enum DlqCmd {
    List {
        #[arg(long)]
        ns: String,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        limit: Option<i32>,
        #[arg(long)]
        after: Option<String>,
    },
    /// Requeue dead items by id.
    Requeue { ids: Vec<String> },
    /// Requeue a topic's dead items (at most --max).
    RequeueAll {
        #[arg(long)]
        ns: String,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        max: Option<i64>,
    },
    Purge {
        #[arg(long)]
        ns: String,
        #[arg(long)]
        topic: String,
    },
}
