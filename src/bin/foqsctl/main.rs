//! `foqsctl`: a command-line client of foqsd for shell scripts and operators.
//!
//! Output: readable lines by default, `--json` for one JSON object per line (payloads as
//! `payload` when they are UTF-8, always as `payload_base64`), `--raw` on dequeue/peek
//! for the payload bytes alone. Exit codes: 0 success, 1 server or connection error
//! (message on stderr), 2 usage error, 3 nothing to return (empty dequeue or peek).

use std::io::Read;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use foqs::client::{connect_tls_via, connect_via, new_item, ClientTransport, Protocol, SyncClient};
use foqs::thrift_gen::*;
use foqs::tls::{client_config, ClientTlsFiles};
use serde_json::{json, Value};

mod cli;
mod dlq;
mod output;
mod replication;
mod watch;
mod work;
mod work_metrics;

use cli::{Cli, Cmd};
use output::{describe, out, print_items, print_results};

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

/// How a command ended, beyond printing.
pub enum Outcome {
    Done,
    Nothing,
}

fn main() -> ExitCode {
    // A reader that goes away (`foqsctl stats | head -1`) ends foqsctl quietly, as it
    // ends Unix tools: Rust's runtime ignores SIGPIPE, so the next write would fail and
    // `println!` panic with "Broken pipe" (exit 1). Not for `work`: it writes each job's
    // payload into the job's standard input, and a command that exits without reading
    // it ended the whole worker with SIGPIPE (now the write fails with EPIPE, ignored, as
    // are its log lines' failures).
    let cli = Cli::parse(); // usage errors exit 2
    #[cfg(unix)]
    // SAFETY: before any thread exists; it only sets the disposition of one signal.
    unsafe {
        let pipe = if matches!(cli.cmd, Cmd::Work { .. }) {
            libc::SIG_IGN
        } else {
            libc::SIG_DFL
        };
        libc::signal(libc::SIGPIPE, pipe);
    }
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
                    forwarded_for: None,
                    items: Some(vec![it]),
                    forwarded_by: None,
                    forward_token: None,
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
                forwarded_for: None,
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
                    nack_token: None,
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
                forwarded_for: None,
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
                    forwarded_for: None,
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
                    forwarded_for: None,
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
        Cmd::Dlq { cmd } => dlq::run(c, cmd, cli.json),
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
