//! `foqsctl`: a command-line client of foqsd for shell scripts and operators.
//!
//! Output: readable lines by default, `--json` for one JSON object per line (payloads as
//! `payload` when they are UTF-8, always as `payload_base64`), `--raw` on dequeue/peek
//! for the payload bytes alone. Exit codes: 0 success, 1 server or connection error
//! (message on stderr), 2 usage error, 3 nothing to return (empty dequeue or peek).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use base64::Engine;
use clap::{Parser, Subcommand};
use foqs::client::{connect_tls_via, connect_via, new_item, ClientTransport, Protocol, SyncClient};
use foqs::thrift_gen::*;
use foqs::tls::{client_config, ClientTlsFiles};
use serde_json::{json, Value};

mod replication;
mod watch;
mod work;
mod work_metrics;

#[derive(Parser)]
#[command(
    version,
    about = "Command-line client of foqsd (the foqs priority queue)"
)]
struct Cli {
    /// foqsd address (HOST:PORT); default from FOQS_HOST, else 127.0.0.1:9090.
    #[arg(
        long,
        env = "FOQS_HOST",
        default_value = "127.0.0.1:9090",
        global = true
    )]
    host: String,
    #[arg(long, value_parser = ["binary", "compact"], default_value = "binary", global = true)]
    protocol: String,
    /// How messages are framed: `framed` (a length before each), `unframed` (most Thrift
    /// libraries' default) or `header` (THeader, as fbthrift clients send).
    #[arg(long, value_parser = ["framed", "unframed", "header"], default_value = "framed", global = true)]
    transport: String,
    /// One JSON object per line.
    #[arg(long, global = true)]
    json: bool,
    /// Speak TLS; the CA (PEM) that signed foqsd's certificate.
    #[arg(long, env = "FOQS_TLS_CA", global = true)]
    tls_ca: Option<PathBuf>,
    /// This client's certificate (PEM), for a foqsd that requires one (mTLS).
    #[arg(long, env = "FOQS_TLS_CERT", global = true, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "FOQS_TLS_KEY", global = true, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Connects, over TLS when a CA or a client certificate is given.
fn open(cli: &Cli, protocol: Protocol) -> Result<SyncClient, String> {
    let timeout = Duration::from_secs(60);
    let files = ClientTlsFiles {
        ca_file: cli.tls_ca.clone(),
        cert_file: cli.tls_cert.clone(),
        key_file: cli.tls_key.clone(),
    };
    let fail = |e: String| format!("cannot connect to {}: {e}", cli.host);
    let transport = ClientTransport::parse(&cli.transport).expect("clap checked the value");
    if !files.enabled() {
        return connect_via(&cli.host, protocol, transport, timeout)
            .map_err(|e| fail(describe(&e)));
    }
    let cfg = client_config(&files).map_err(|e| fail(e.to_string()))?;
    connect_tls_via(&cli.host, protocol, transport, timeout, cfg).map_err(|e| fail(describe(&e)))
}

#[derive(Subcommand)]
enum Cmd {
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
enum DlqCmd {
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

/// How a command ended, beyond printing.
enum Outcome {
    Done,
    Nothing,
}

fn main() -> ExitCode {
    // A reader that goes away (`foqsctl stats | head -1`) ends foqsctl quietly, as it
    // ends Unix tools: Rust's runtime ignores SIGPIPE, so the next write would fail and
    // `println!` panic with "Broken pipe" (exit 1).
    // SAFETY: called first thing, before any thread exists; it only restores the
    // default disposition of one signal.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse(); // usage errors exit 2
    let protocol = if cli.protocol == "compact" {
        Protocol::Compact
    } else {
        Protocol::Binary
    };
    if let Cmd::HashPassword = cli.cmd {
        return hash_password();
    }
    if let Cmd::Work {
        ns,
        topics,
        concurrency,
        lease_ms,
        max_attempts,
        backoff,
        timeout,
        dead_exit,
        grace,
        wait,
        metrics,
        cmd,
    } = &cli.cmd
    {
        let backoff = match work::parse_backoff(backoff) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("foqsctl: {e}");
                return ExitCode::from(2);
            }
        };
        let args = work::WorkArgs {
            ns: ns.clone(),
            topics: topics.clone(),
            concurrency: *concurrency as usize,
            lease_ms: *lease_ms,
            max_attempts: *max_attempts,
            backoff,
            timeout_ms: *timeout,
            dead_exit: *dead_exit,
            grace_ms: *grace,
            wait_ms: (*wait).max(0),
            metrics: metrics.clone(),
            cmd: cmd.clone(),
        };
        let connect = || open(&cli, protocol);
        return match work::work(&connect, &args, cli.json) {
            Ok(_) => ExitCode::SUCCESS,
            Err(msg) => {
                eprintln!("foqsctl: {msg}");
                ExitCode::from(1)
            }
        };
    }
    let result = open(&cli, protocol).and_then(|mut c| run(&mut c, &cli));
    match result {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::Nothing) => ExitCode::from(3),
        Err(msg) => {
            eprintln!("foqsctl: {msg}");
            ExitCode::from(1)
        }
    }
}

/// `foqsctl hash-password`: argon2's recommended cost (19 MiB, 2 passes).
fn hash_password() -> ExitCode {
    let mut line = String::new();
    if let Err(e) = std::io::stdin().read_line(&mut line) {
        eprintln!("foqsctl: reading the password: {e}");
        return ExitCode::from(1);
    }
    let password = line.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        eprintln!("foqsctl: no password on standard input");
        return ExitCode::from(1);
    }
    match foqs::console::hash_password(password, 19 * 1024, 2) {
        Ok(h) => {
            println!("{h}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("foqsctl: {e}");
            ExitCode::from(1)
        }
    }
}

fn describe(e: &thrift::Error) -> String {
    match e {
        thrift::Error::User(u) => match u.downcast_ref::<FoqsError>() {
            Some(f) => format!(
                "{} (code {}{})",
                f.message.clone().unwrap_or_default(),
                f.code.map(|c| c.0).unwrap_or(0),
                if f.retryable == Some(true) {
                    ", retryable"
                } else {
                    ""
                }
            ),
            None => u.to_string(),
        },
        thrift::Error::Transport(t) => format!("transport: {}", t.message),
        thrift::Error::Protocol(p) => format!("protocol: {}", p.message),
        thrift::Error::Application(a) => format!("application: {}", a.message),
    }
}

fn out(line: &str) -> Result<(), String> {
    let mut o = std::io::stdout().lock();
    writeln!(o, "{line}").map_err(|e| e.to_string())
}

fn item_json(i: &Item) -> Value {
    let payload = i.payload.clone().unwrap_or_default();
    let metadata = i.metadata.clone().unwrap_or_default();
    let b64 = base64::engine::general_purpose::STANDARD;
    json!({
        "id": i.id, "ns": i.ns, "topic": i.topic, "priority": i.priority,
        "payload": String::from_utf8(payload.clone()).ok(),
        "payload_base64": b64.encode(&payload),
        "metadata": String::from_utf8(metadata.clone()).ok(),
        "metadata_base64": b64.encode(&metadata),
        "deliver_after_ms": i.deliver_after_ms, "enqueued_at_ms": i.enqueued_at_ms,
        "delivery_count": i.delivery_count, "lease_expires_ms": i.lease_expires_ms,
        "lease_id": i.lease_id,
        "policy": match i.policy { Some(DeliveryPolicy::AT_MOST_ONCE) => "at-most-once", _ => "at-least-once" },
    })
}

fn print_items(items: &[Item], json: bool, raw: bool) -> Result<Outcome, String> {
    if items.is_empty() {
        return Ok(Outcome::Nothing);
    }
    for i in items {
        if raw {
            std::io::stdout()
                .lock()
                .write_all(i.payload.as_deref().unwrap_or_default())
                .map_err(|e| e.to_string())?;
        } else if json {
            out(&item_json(i).to_string())?;
        } else {
            let payload = i.payload.as_deref().unwrap_or_default();
            out(&format!(
                "{}\tpriority={}\tdeliveries={}\t{}",
                i.id.as_deref().unwrap_or_default(),
                i.priority.unwrap_or(0),
                i.delivery_count.unwrap_or(0),
                String::from_utf8_lossy(payload)
            ))?;
        }
    }
    Ok(Outcome::Done)
}

/// Prints per-item results; any failed item makes the command fail.
fn print_results(results: Vec<ItemResult>, json: bool) -> Result<Outcome, String> {
    let mut failed = 0;
    for r in results {
        let id = r.id.unwrap_or_default();
        match r.error {
            None if json => out(&json!({"id": id, "ok": true}).to_string())?,
            None => out(&format!("{id}\tok"))?,
            Some(e) => {
                failed += 1;
                let (code, msg) = (
                    e.code.map(|c| c.0).unwrap_or(0),
                    e.message.unwrap_or_default(),
                );
                if json {
                    out(&json!({"id": id, "ok": false, "code": code, "message": msg}).to_string())?;
                }
                eprintln!("foqsctl: {id}: {msg} (code {code})");
            }
        }
    }
    if failed > 0 {
        return Err(format!("{failed} item(s) failed"));
    }
    Ok(Outcome::Done)
}

fn run(c: &mut SyncClient, cli: &Cli) -> Result<Outcome, String> {
    let e = |e: thrift::Error| describe(&e);
    match &cli.cmd {
        Cmd::Enqueue {
            ns,
            topic,
            priority,
            payload,
            payload_file,
            metadata,
            delay_ms,
            lease_ms,
            ttl_ms,
            policy,
            max_attempts,
        } => {
            let payload = match (payload, payload_file) {
                (Some(p), _) => p.clone().into_bytes(),
                (None, Some(f)) => {
                    std::fs::read(f).map_err(|err| format!("{}: {err}", f.display()))?
                }
                (None, None) => {
                    let mut buf = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut buf)
                        .map_err(|err| err.to_string())?;
                    buf
                }
            };
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            let mut it = new_item(ns, topic, *priority, payload);
            it.metadata = metadata.clone().map(String::into_bytes);
            it.deliver_after_ms = delay_ms.map(|d| now + d);
            it.lease_ms = *lease_ms;
            it.ttl_ms = *ttl_ms;
            it.policy = policy.as_deref().map(|p| {
                if p == "at-most-once" {
                    DeliveryPolicy::AT_MOST_ONCE
                } else {
                    DeliveryPolicy::AT_LEAST_ONCE
                }
            });
            it.max_attempts = *max_attempts;
            let r = c
                .enqueue(EnqueueRequest {
                    items: Some(vec![it]),
                    forwarded_by: None,
                })
                .map_err(e)?;
            let r = r
                .results
                .unwrap_or_default()
                .into_iter()
                .next()
                .ok_or("no result")?;
            match (r.id, r.error) {
                (Some(id), None) if cli.json => out(&json!({"id": id}).to_string())?,
                (Some(id), None) => out(&id)?,
                (_, err) => {
                    let err = err.unwrap_or_default();
                    return Err(format!(
                        "{} (code {})",
                        err.message.unwrap_or_default(),
                        err.code.map(|c| c.0).unwrap_or(0)
                    ));
                }
            }
            Ok(Outcome::Done)
        }
        Cmd::Dequeue {
            ns,
            topic,
            count,
            wait,
            raw,
        } => {
            let req = DequeueRequest {
                topics: Some(vec![TopicRequest {
                    ns: Some(ns.clone()),
                    topic: Some(topic.clone()),
                    count: Some(*count),
                    before_priority: None,
                    before_deliver_after_ms: None,
                }]),
                wait_ms: *wait,
                local_only: None,
                forwarded_by: None,
            };
            let items = c.dequeue(req).map_err(e)?.items.unwrap_or_default();
            print_items(&items, cli.json, *raw)
        }
        Cmd::Ack { ids, lease_ids } => print_results(
            c.ack(AckRequest {
                ids: Some(ids.clone()),
                forwarded_by: None,
                forwarded_for: None,
                lease_ids: (!lease_ids.is_empty()).then(|| lease_ids.clone()),
            })
            .map_err(e)?
            .results
            .unwrap_or_default(),
            cli.json,
        ),
        Cmd::Nack {
            id,
            delay_ms,
            metadata,
            to_dlq,
            lease_id,
        } => {
            let item = NackItem {
                id: Some(id.clone()),
                delay_ms: *delay_ms,
                metadata: metadata.clone().map(String::into_bytes),
                to_dlq: Some(*to_dlq),
                lease_id: *lease_id,
            };
            print_results(
                c.nack(NackRequest {
                    items: Some(vec![item]),
                    forwarded_by: None,
                    forwarded_for: None,
                })
                .map_err(e)?
                .results
                .unwrap_or_default(),
                cli.json,
            )
        }
        Cmd::Touch {
            id,
            extend_ms,
            lease_id,
        } => {
            let item = TouchItem {
                id: Some(id.clone()),
                extend_ms: Some(*extend_ms),
                lease_id: *lease_id,
            };
            print_results(
                c.touch(TouchRequest {
                    items: Some(vec![item]),
                    forwarded_by: None,
                    forwarded_for: None,
                })
                .map_err(e)?
                .results
                .unwrap_or_default(),
                cli.json,
            )
        }
        Cmd::Peek {
            ns,
            topic,
            count,
            raw,
        } => {
            let req = PeekRequest {
                ns: Some(ns.clone()),
                topic: Some(topic.clone()),
                count: Some(*count),
                local_only: None,
            };
            print_items(
                &c.peek(req).map_err(e)?.items.unwrap_or_default(),
                cli.json,
                *raw,
            )
        }
        Cmd::Topics { ns, limit, after } => {
            let r = c
                .get_active_topics(GetActiveTopicsRequest {
                    ns: Some(ns.clone()),
                    limit: *limit,
                    after: after.clone(),
                    local_only: None,
                })
                .map_err(e)?;
            for t in r.topics.unwrap_or_default() {
                let (name, ready, deferred, leased, hosts) = (
                    t.topic.unwrap_or_default(),
                    t.ready.unwrap_or(0),
                    t.deferred.unwrap_or(0),
                    t.leased.unwrap_or(0),
                    t.hosts.unwrap_or_default(),
                );
                if cli.json {
                    out(&json!({"topic": name, "ready": ready, "deferred": deferred, "leased": leased, "hosts": hosts}).to_string())?;
                } else {
                    out(&format!(
                        "{name}\tready={ready}\tdeferred={deferred}\tleased={leased}\thosts={}",
                        hosts.join(",")
                    ))?;
                }
            }
            if let Some(next) = r.next_after {
                eprintln!("more: --after {next}");
            }
            Ok(Outcome::Done)
        }
        Cmd::Stats { ns, topic } => {
            let s = c
                .topic_stats(TopicStatsRequest {
                    ns: Some(ns.clone()),
                    topic: Some(topic.clone()),
                    local_only: None,
                })
                .map_err(e)?;
            let fields = [
                ("ready", s.ready),
                ("deferred", s.deferred),
                ("leased", s.leased),
                ("dead", s.dead),
                ("enqueued", s.enqueued),
                ("delivered", s.delivered),
                ("acked", s.acked),
                ("nacked", s.nacked),
                ("expired", s.expired),
                ("oldest_ready_age_ms", s.oldest_ready_age_ms),
            ];
            if cli.json {
                let obj: serde_json::Map<String, Value> = fields
                    .iter()
                    .map(|(k, v)| (k.to_string(), json!(v.unwrap_or(0))))
                    .collect();
                out(&Value::Object(obj).to_string())?;
            } else {
                for (k, v) in fields {
                    out(&format!("{k}\t{}", v.unwrap_or(0)))?;
                }
            }
            Ok(Outcome::Done)
        }
        Cmd::Dlq { cmd } => match cmd {
            DlqCmd::List {
                ns,
                topic,
                limit,
                after,
            } => {
                let r = c
                    .dlq_list(DlqListRequest {
                        ns: Some(ns.clone()),
                        topic: Some(topic.clone()),
                        limit: *limit,
                        after: after.clone(),
                        local_only: None,
                    })
                    .map_err(e)?;
                for d in r.items.unwrap_or_default() {
                    let item = d.item.unwrap_or_default();
                    if cli.json {
                        let mut v = item_json(&item);
                        v["died_at_ms"] = json!(d.died_at_ms);
                        out(&v.to_string())?;
                    } else {
                        out(&format!(
                            "{}\tdeliveries={}\tdied_at_ms={}\t{}",
                            item.id.as_deref().unwrap_or_default(),
                            item.delivery_count.unwrap_or(0),
                            d.died_at_ms.unwrap_or(0),
                            String::from_utf8_lossy(item.payload.as_deref().unwrap_or_default())
                        ))?;
                    }
                }
                if let Some(next) = r.next_after {
                    eprintln!("more: --after {next}");
                }
                Ok(Outcome::Done)
            }
            DlqCmd::Requeue { ids } => print_results(
                c.dlq_requeue(DlqRequeueRequest {
                    ids: Some(ids.clone()),
                    ..Default::default()
                })
                .map_err(e)?
                .results
                .unwrap_or_default(),
                cli.json,
            ),
            DlqCmd::RequeueAll { ns, topic, max } => {
                let n = until_done(*max, |left| {
                    c.dlq_requeue_all(DlqRequeueAllRequest {
                        ns: Some(ns.clone()),
                        topic: Some(topic.clone()),
                        max: left,
                        local_only: None,
                    })
                })
                .map_err(e)?;
                out(&if cli.json {
                    json!({"requeued": n}).to_string()
                } else {
                    format!("requeued {n}")
                })?;
                Ok(Outcome::Done)
            }
            DlqCmd::Purge { ns, topic } => {
                let n = until_done(None, |_| {
                    c.dlq_purge(DlqPurgeRequest {
                        ns: Some(ns.clone()),
                        topic: Some(topic.clone()),
                        local_only: None,
                    })
                })
                .map_err(e)?;
                out(&if cli.json {
                    json!({"purged": n}).to_string()
                } else {
                    format!("purged {n}")
                })?;
                Ok(Outcome::Done)
            }
        },
        Cmd::Shards => {
            replication::shards(c, cli.json, &mut |l| out(l), e)?;
            Ok(Outcome::Done)
        }
        Cmd::Shard { cmd } => {
            replication::shard(c, cmd, cli.json, &mut |l| out(l), e)?;
            Ok(Outcome::Done)
        }
        Cmd::Region { cmd } => {
            replication::region(c, cmd, cli.json, &mut |l| out(l), e)?;
            Ok(Outcome::Done)
        }
        Cmd::Watch {
            ns,
            topic,
            interval,
            limit,
            count,
        } => watch::watch(
            c,
            &watch::WatchArgs {
                ns: ns.clone(),
                topic: topic.clone(),
                interval_ms: *interval,
                limit: *limit as usize,
                count: *count,
            },
            cli.json,
        ),
        Cmd::HashPassword | Cmd::Work { .. } => unreachable!("answered before connecting"),
        Cmd::HostInfo => {
            let h = c.get_host_info().map_err(e)?;
            let shards: Vec<Value> = h
                .shards
                .unwrap_or_default()
                .into_iter()
                .map(|s| json!({"shard_id": s.shard_id, "healthy": s.healthy, "state": s.state, "items": s.items}))
                .collect();
            let peers: Vec<Value> = h
                .peers
                .unwrap_or_default()
                .into_iter()
                .map(|p| {
                    json!({"host_id": p.host_id, "addr": p.addr, "tier": p.tier,
                           "shards": p.shards, "reachable": p.reachable,
                           "spare_capacity": p.spare_capacity})
                })
                .collect();
            if cli.json {
                out(
                    &json!({"host_id": h.host_id, "version": h.version, "addr": h.addr,
                            "tier": h.tier, "manager": h.manager,
                            "spare_capacity": h.spare_capacity, "shards": shards,
                            "peers": peers})
                    .to_string(),
                )?;
            } else {
                out(&format!(
                    "host {} at {} (foqs {}, tier {}, manager {}, spare capacity {})",
                    h.host_id.unwrap_or_default(),
                    h.addr.unwrap_or_default(),
                    h.version.unwrap_or_default(),
                    h.tier.unwrap_or_default(),
                    h.manager.unwrap_or_default(),
                    h.spare_capacity.unwrap_or(0)
                ))?;
                for s in shards {
                    out(&format!(
                        "shard {}\thealthy={}\titems={}\tstate={}",
                        s["shard_id"],
                        s["healthy"],
                        s["items"],
                        s["state"].as_str().unwrap_or("unknown")
                    ))?;
                }
                for p in peers {
                    out(&format!(
                        "peer {}\taddr={}\ttier={}\tshards={}\treachable={}\tspare={}",
                        p["host_id"].as_str().unwrap_or(""),
                        p["addr"].as_str().unwrap_or(""),
                        p["tier"].as_str().unwrap_or(""),
                        p["shards"],
                        p["reachable"],
                        p["spare_capacity"]
                    ))?;
                }
            }
            Ok(Outcome::Done)
        }
    }
}

/// Calls a bulk dead-letter call until it says it is done (each call works within the
/// server's bound and answers `more` when some are left), or until `max` are counted;
/// `call` gets how many are still wanted. Returns the total.
fn until_done<E>(
    max: Option<i64>,
    mut call: impl FnMut(Option<i64>) -> Result<DlqCountResponse, E>,
) -> Result<i64, E> {
    let mut n = 0i64;
    loop {
        let r = call(max.map(|m| m - n))?;
        n += r.count.unwrap_or(0);
        if !r.more.unwrap_or(false) || max.is_some_and(|m| n >= m) {
            return Ok(n);
        }
    }
}
