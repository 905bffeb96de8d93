//! `foqsctl work`: runs a command once per item, as a consumer loop does (Sidekiq's,
//! Oban's, an SQS worker's): long-polls the topics for as many items as it has free slots,
//! runs the command with the payload on standard input and the item in the environment,
//! renews the lease while it runs, and settles the item by the exit status:
//! - 0: ack (naming the lease);
//! - `--dead-exit` (65, EX_DATAERR): to the dead letters at once;
//! - anything else, a spawn failure, or `--timeout` (the command's process group killed):
//!   nack with exponential backoff from the item's delivery count (`--backoff BASE,MAX`,
//!   half of it jittered), or to the dead letters once `--max-attempts` deliveries failed;
//! - its lease lost (a renewal refused): the command is killed, the item left to whoever
//!   holds it now.
//!
//! The lease is renewed (`touch` with the lease id) every third of it, by its length
//! (`--lease-ms`, else the item's own), so a job longer than its lease is never delivered
//! twice. SIGTERM or SIGINT: no more dequeues; running jobs get `--grace` ms to finish,
//! then are killed and their items released (nacked with no delay); a second signal does
//! that at once. Nothing is left leased by a worker that stopped. Each command runs in a
//! process group of its own, so a terminal's Ctrl-C reaches the worker, not the jobs.
//! One line per job on standard output (id, outcome, duration, exit status; `--json`: one
//! JSON object).

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use foqs::client::SyncClient;
use foqs::thrift_gen::*;
use serde_json::json;

use super::Outcome;

/// Signals received (SIGTERM, SIGINT): 1 stops dequeuing, 2 stops at once.
static SIGNALS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(_: libc::c_int) {
    SIGNALS.fetch_add(1, Ordering::SeqCst);
}

/// How long one long poll waits at most, so that a signal is noticed within it.
const POLL_MS_MAX: i64 = 1_000;
/// How often a running job is looked at (exit, timeout, renewal, stop).
const TICK: Duration = Duration::from_millis(20);

pub struct WorkArgs {
    pub ns: String,
    pub topics: Vec<String>,
    pub concurrency: usize,
    pub lease_ms: Option<i64>,
    pub max_attempts: Option<i32>,
    pub backoff: (u64, u64),
    pub timeout_ms: Option<u64>,
    pub dead_exit: i32,
    pub grace_ms: u64,
    pub wait_ms: i64,
    pub cmd: Vec<String>,
}

/// Parses `--backoff BASE_MS,MAX_MS`.
pub fn parse_backoff(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("--backoff {s:?}: want BASE_MS,MAX_MS"))?;
    let base: u64 = a
        .trim()
        .parse()
        .map_err(|_| format!("--backoff: bad BASE_MS {a:?}"))?;
    let max: u64 = b
        .trim()
        .parse()
        .map_err(|_| format!("--backoff: bad MAX_MS {b:?}"))?;
    if base == 0 || max < base {
        return Err(format!("--backoff {s:?}: want 0 < BASE_MS <= MAX_MS"));
    }
    Ok((base, max))
}

/// The delay before delivery `deliveries + 1`: base x 2^(deliveries - 1), at most max,
/// its upper half drawn at random (so that items failing together do not retry together).
fn backoff_ms((base, max): (u64, u64), deliveries: i32, seed: u64) -> u64 {
    let exp = (deliveries.max(1) - 1).min(30) as u32;
    let d = base.saturating_mul(1u64 << exp).min(max);
    let half = d / 2;
    let mut x = seed | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    half + x % (d - half + 1)
}

enum Settle {
    Ack,
    Retry(u64),
    Dead,
    /// Given back at once, uncounted as a failure (the worker stops).
    Release,
}

struct Job<'a> {
    args: &'a WorkArgs,
    item: Item,
    stop_now: &'a AtomicBool,
}

pub fn work(
    connect: &(dyn Fn() -> Result<SyncClient, String> + Sync),
    args: &WorkArgs,
    json: bool,
) -> Result<Outcome, String> {
    // SAFETY: the handler only increments an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    let running = AtomicUsize::new(0);
    let stop_now = AtomicBool::new(false);
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut c = connect()?;
    std::thread::scope(|s| -> Result<(), String> {
        let mut next_topic = 0usize;
        while SIGNALS.load(Ordering::SeqCst) == 0 {
            let free = args.concurrency - running.load(Ordering::SeqCst);
            if free == 0 {
                let _ = done_rx.recv_timeout(Duration::from_millis(200));
                continue;
            }
            let topic = &args.topics[next_topic % args.topics.len()];
            next_topic += 1;
            let req = DequeueRequest {
                topics: Some(vec![TopicRequest {
                    ns: Some(args.ns.clone()),
                    topic: Some(topic.clone()),
                    count: Some(free as i32),
                    before_priority: None,
                    before_deliver_after_ms: None,
                }]),
                wait_ms: Some(args.wait_ms.min(POLL_MS_MAX)),
                local_only: None,
                forwarded_by: None,
            };
            let items = match c.dequeue(req) {
                Ok(r) => r.items.unwrap_or_default(),
                Err(e) => {
                    eprintln!(
                        "foqsctl work: dequeue failed: {}; retrying",
                        super::describe(&e)
                    );
                    std::thread::sleep(Duration::from_secs(1));
                    if let Ok(fresh) = connect() {
                        c = fresh;
                    }
                    continue;
                }
            };
            for item in items {
                if SIGNALS.load(Ordering::SeqCst) > 0 {
                    // Dequeued as the stop came: given back untouched.
                    let line = settle(&mut c, &item, Settle::Release)
                        .map(|()| "released".to_string())
                        .unwrap_or_else(|e| format!("release failed: {e}"));
                    log(json, &item, &line, Duration::ZERO, None);
                    continue;
                }
                running.fetch_add(1, Ordering::SeqCst);
                let (running, done_tx, stop_now) = (&running, done_tx.clone(), &stop_now);
                s.spawn(move || {
                    let job = Job {
                        args,
                        item,
                        stop_now,
                    };
                    job.run(connect, json);
                    running.fetch_sub(1, Ordering::SeqCst);
                    let _ = done_tx.send(());
                });
            }
        }
        // Stopping: the running jobs get the grace period, or a second signal ends it.
        let deadline = Instant::now() + Duration::from_millis(args.grace_ms);
        while running.load(Ordering::SeqCst) > 0 {
            if SIGNALS.load(Ordering::SeqCst) >= 2 || Instant::now() >= deadline {
                stop_now.store(true, Ordering::SeqCst);
            }
            let _ = done_rx.recv_timeout(Duration::from_millis(100));
        }
        Ok(())
    })?;
    Ok(Outcome::Done)
}

impl Job<'_> {
    fn run(&self, connect: &(dyn Fn() -> Result<SyncClient, String> + Sync), json: bool) {
        let started = Instant::now();
        let item = &self.item;
        let mut c = match connect() {
            Ok(c) => c,
            Err(e) => {
                // Nothing can be settled: the lease ends and the item comes back.
                log(
                    json,
                    item,
                    &format!("not run: {e}"),
                    started.elapsed(),
                    None,
                );
                return;
            }
        };
        let (how, exit) = self.execute(&mut c, started);
        let what = match how {
            None => "lease lost: killed, left to its next delivery".to_string(),
            Some(s) => {
                let name = match &s {
                    Settle::Ack => "acked".to_string(),
                    Settle::Retry(ms) => format!("retry in {ms} ms"),
                    Settle::Dead => "dead-lettered".to_string(),
                    Settle::Release => "released".to_string(),
                };
                match settle(&mut c, item, s) {
                    Ok(()) => name,
                    Err(e) => format!("{name} failed: {e}"),
                }
            }
        };
        log(json, item, &what, started.elapsed(), exit);
    }

    /// Runs the command to its end; returns how to settle the item (`None`: its lease was
    /// lost) and the exit status.
    fn execute(&self, c: &mut SyncClient, started: Instant) -> (Option<Settle>, Option<i32>) {
        let (args, item) = (self.args, &self.item);
        let deliveries = item.delivery_count.unwrap_or(1);
        let failed = |exit| {
            let seed = started.elapsed().as_nanos() as u64
                ^ foqs::hash::fnv1a([item.id.as_deref().unwrap_or("").as_bytes()]);
            if args.max_attempts.is_some_and(|m| deliveries >= m) {
                (Some(Settle::Dead), exit)
            } else {
                (
                    Some(Settle::Retry(backoff_ms(args.backoff, deliveries, seed))),
                    exit,
                )
            }
        };
        let mut cmd = Command::new(&args.cmd[0]);
        cmd.args(&args.cmd[1..])
            .stdin(Stdio::piped())
            .env("FOQS_ID", item.id.clone().unwrap_or_default())
            .env("FOQS_NS", item.ns.clone().unwrap_or_default())
            .env("FOQS_TOPIC", item.topic.clone().unwrap_or_default())
            .env("FOQS_PRIORITY", item.priority.unwrap_or(0).to_string())
            .env("FOQS_DELIVERIES", deliveries.to_string())
            .env(
                "FOQS_METADATA",
                String::from_utf8_lossy(item.metadata.as_deref().unwrap_or_default()).as_ref(),
            )
            .env("FOQS_LEASE_ID", item.lease_id.unwrap_or(0).to_string());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = match cmd.spawn() {
            Ok(ch) => ch,
            Err(e) => {
                eprintln!("foqsctl work: cannot run {:?}: {e}", args.cmd[0]);
                return failed(None);
            }
        };
        // The payload, written beside the wait: a command that does not read all of it
        // must not block the worker.
        if let Some(mut stdin) = child.stdin.take() {
            let payload = item.payload.clone().unwrap_or_default();
            std::thread::spawn(move || {
                let _ = stdin.write_all(&payload);
            });
        }
        let kill = |child: &mut std::process::Child| {
            // SAFETY: a plain kill(2) of the job's own process group.
            unsafe {
                libc::kill(-(child.id() as i32), libc::SIGKILL);
            }
            let _ = child.wait();
        };
        let lease_ms = args
            .lease_ms
            .or(item.lease_ms)
            .filter(|ms| *ms > 0)
            .unwrap_or(30_000);
        let every = Duration::from_millis((lease_ms / 3).max(1) as u64);
        let mut renew_at = started + every;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    return match status.code() {
                        Some(0) => (Some(Settle::Ack), Some(0)),
                        Some(d) if d == args.dead_exit => (Some(Settle::Dead), Some(d)),
                        code => failed(code),
                    };
                }
                Ok(None) => {}
                Err(e) => {
                    eprintln!("foqsctl work: waiting for the command: {e}");
                    kill(&mut child);
                    return failed(None);
                }
            }
            if self.stop_now.load(Ordering::SeqCst) {
                kill(&mut child);
                return (Some(Settle::Release), None);
            }
            if args
                .timeout_ms
                .is_some_and(|t| started.elapsed() >= Duration::from_millis(t))
            {
                kill(&mut child);
                return failed(None);
            }
            if Instant::now() >= renew_at {
                renew_at += every;
                if let Err(e) = renew(c, item, lease_ms) {
                    eprintln!(
                        "foqsctl work: renewing the lease of {} failed: {e}; killing its job",
                        item.id.as_deref().unwrap_or("?")
                    );
                    kill(&mut child);
                    return (None, None);
                }
            }
            std::thread::sleep(TICK);
        }
    }
}

/// Extends the item's lease to now + `lease_ms`, naming this delivery's lease.
fn renew(c: &mut SyncClient, item: &Item, lease_ms: i64) -> Result<(), String> {
    let r = c
        .touch(TouchRequest {
            items: Some(vec![TouchItem {
                id: item.id.clone(),
                extend_ms: Some(lease_ms),
                lease_id: item.lease_id,
            }]),
            forwarded_by: None,
            forwarded_for: None,
        })
        .map_err(|e| super::describe(&e))?;
    first_error(r.results)
}

fn first_error(results: Option<Vec<ItemResult>>) -> Result<(), String> {
    match results
        .unwrap_or_default()
        .into_iter()
        .find_map(|r| r.error)
    {
        None => Ok(()),
        Some(e) => Err(e.message.unwrap_or_default()),
    }
}

fn settle(c: &mut SyncClient, item: &Item, how: Settle) -> Result<(), String> {
    let e = |e: thrift::Error| super::describe(&e);
    let nack = |c: &mut SyncClient, delay_ms: i64, to_dlq: bool| {
        c.nack(NackRequest {
            items: Some(vec![NackItem {
                id: item.id.clone(),
                delay_ms: Some(delay_ms),
                metadata: None,
                to_dlq: Some(to_dlq),
                lease_id: item.lease_id,
            }]),
            forwarded_by: None,
            forwarded_for: None,
        })
        .map_err(e)
        .and_then(|r| first_error(r.results))
    };
    match how {
        Settle::Ack => c
            .ack(AckRequest {
                ids: Some(vec![item.id.clone().unwrap_or_default()]),
                forwarded_by: None,
                forwarded_for: None,
                lease_ids: item.lease_id.map(|l| vec![l]),
            })
            .map_err(e)
            .and_then(|r| first_error(r.results)),
        Settle::Retry(ms) => nack(c, ms as i64, false),
        Settle::Dead => nack(c, 0, true),
        Settle::Release => nack(c, 0, false),
    }
}

fn log(json: bool, item: &Item, outcome: &str, took: Duration, exit: Option<i32>) {
    let id = item.id.as_deref().unwrap_or("?");
    let line = if json {
        json!({
            "id": id, "topic": item.topic, "deliveries": item.delivery_count,
            "outcome": outcome, "duration_ms": took.as_millis() as u64, "exit": exit,
        })
        .to_string()
    } else {
        let exit = exit.map_or("-".to_string(), |c| c.to_string());
        format!("{id}\t{outcome}\t{} ms\texit={exit}", took.as_millis())
    };
    let _ = super::out(&line);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_its_upper_half_jittered() {
        for seed in 0..200 {
            let d1 = backoff_ms((100, 1_000), 1, seed);
            assert!((50..=100).contains(&d1), "{d1}");
            let d3 = backoff_ms((100, 1_000), 3, seed);
            assert!((200..=400).contains(&d3), "{d3}");
            let d9 = backoff_ms((100, 1_000), 9, seed);
            assert!((500..=1_000).contains(&d9), "{d9}");
        }
        assert_eq!(parse_backoff("100,2000"), Ok((100, 2_000)));
        assert!(parse_backoff("0,10").is_err());
        assert!(parse_backoff("10").is_err());
        assert!(parse_backoff("10,5").is_err());
    }
}
