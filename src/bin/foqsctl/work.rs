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
//! JSON object); with `--metrics ADDR`, Prometheus counters and a duration histogram. The loop itself (dequeue, slots, renewal, stop, settling) is
//! `foqs::client::Worker`'s; this is its handler.

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use foqs::client::{Job, Settled, SyncClient, Verdict, Worker, WorkerOptions};
use foqs::thrift_gen::Item;
use serde_json::json;

use super::Outcome;

/// Signals received (SIGTERM, SIGINT): 1 stops dequeuing, 2 stops at once.
static SIGNALS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(_: libc::c_int) {
    SIGNALS.fetch_add(1, Ordering::SeqCst);
}

/// How often a running command is looked at (exit, timeout, cancellation).
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
    /// Serve Prometheus metrics at this address (see `work_metrics`).
    pub metrics: Option<String>,
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

/// Runs the worker loop (`foqs::client::Worker`) with a handler that runs the command.
pub fn work(
    connect: &(dyn Fn() -> Result<SyncClient, String> + Sync),
    args: &WorkArgs,
    json: bool,
) -> Result<Outcome, String> {
    let worker = Worker::new(WorkerOptions {
        ns: args.ns.clone(),
        topics: args.topics.clone(),
        concurrency: args.concurrency,
        lease_ms: args.lease_ms,
        wait_ms: args.wait_ms,
        grace: Duration::from_millis(args.grace_ms),
    });
    // SAFETY: the handler only increments an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    // Signals become stops: the first graceful, the second at once.
    let stopper = worker.stopper();
    let watching = std::sync::Arc::new(AtomicBool::new(true));
    let w = watching.clone();
    let signals = std::thread::spawn(move || {
        let mut seen = 0;
        while w.load(Ordering::SeqCst) {
            let now = SIGNALS.load(Ordering::SeqCst);
            while seen < now {
                stopper.stop();
                seen += 1;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let metrics = std::sync::Arc::new(super::work_metrics::WorkMetrics::new());
    if let Some(addr) = &args.metrics {
        super::work_metrics::serve(addr, metrics.clone())?;
    }
    // Each job's exit status, from its handler to its log line.
    let exits: std::sync::Mutex<HashMap<String, Option<i32>>> = Default::default();
    let id = |item: &Item| item.id.clone().unwrap_or_default();
    let handler = |job: &Job| {
        metrics.running.inc();
        let (verdict, exit) = run_command(args, job);
        metrics.running.dec();
        let mut exits = exits.lock().expect("not poisoned");
        exits.insert(id(job.item), exit);
        verdict
    };
    let done = |item: &Item, end: &Settled, took: Duration| {
        let exit = exits
            .lock()
            .expect("not poisoned")
            .remove(&id(item))
            .flatten();
        metrics.ended(end, took);
        log(json, item, end, took, exit)
    };
    let r = worker.run(connect, &handler, &done);
    watching.store(false, Ordering::SeqCst);
    let _ = signals.join();
    r.map(|()| Outcome::Done)
}

/// Runs the command for one job; see the module's notes.
/// Returns the verdict and the command's exit status.
fn run_command(args: &WorkArgs, job: &Job) -> (Verdict, Option<i32>) {
    let item = job.item;
    let started = Instant::now();
    let deliveries = item.delivery_count.unwrap_or(1);
    let failed = |exit: Option<i32>| {
        let seed = started.elapsed().as_nanos() as u64
            ^ foqs::hash::fnv1a([item.id.as_deref().unwrap_or("").as_bytes()]);
        let v = if args.max_attempts.is_some_and(|m| deliveries >= m) {
            Verdict::DeadLetter
        } else {
            Verdict::RetryAfter(Duration::from_millis(backoff_ms(
                args.backoff,
                deliveries,
                seed,
            )))
        };
        (v, exit)
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
    // The payload, written beside the wait: a command that does not read all of it must
    // not block the worker.
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
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let code = status.code();
                return match code {
                    Some(0) => (Verdict::Ack, code),
                    Some(d) if d == args.dead_exit => (Verdict::DeadLetter, code),
                    _ => failed(code),
                };
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("foqsctl work: waiting for the command: {e}");
                kill(&mut child);
                return failed(None);
            }
        }
        if job.cancelled() {
            // The worker stops at once, or the lease was lost (then nothing is settled,
            // whatever is returned).
            kill(&mut child);
            return (Verdict::Release, None);
        }
        if args
            .timeout_ms
            .is_some_and(|t| started.elapsed() >= Duration::from_millis(t))
        {
            eprintln!(
                "foqsctl work: {} ran past --timeout: killed",
                item.id.as_deref().unwrap_or("?")
            );
            kill(&mut child);
            return failed(None);
        }
        std::thread::sleep(TICK);
    }
}

fn log(json: bool, item: &Item, end: &Settled, took: Duration, exit: Option<i32>) {
    let name = |v: &Verdict| match v {
        Verdict::Ack => "acked".to_string(),
        Verdict::RetryAfter(d) => format!("retry in {} ms", d.as_millis()),
        Verdict::DeadLetter => "dead-lettered".to_string(),
        Verdict::Release => "released".to_string(),
    };
    let outcome = match end {
        Settled::Applied(v) => name(v),
        Settled::Failed(v, e) => format!("{} failed: {e}", name(v)),
        Settled::LeaseLost(e) => format!("lease lost ({e}): killed, left to its next delivery"),
        Settled::NotRun(e) => format!("not run: {e}"),
    };
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
    let _ = crate::output::out(&line);
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
