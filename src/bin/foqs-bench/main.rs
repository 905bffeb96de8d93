//! `foqs-bench`: drives a running foqsd over Thrift with P producers and C consumers and
//! prints one JSON line: enqueue, drain (dequeue + ack) and mixed throughput in items/s,
//! and latency percentiles of enqueue calls and of dequeue+ack cycles.
//!
//! Phases (`--phases`, default all three, in this order):
//! - `enqueue`: producers enqueue `--items` items, nobody consumes;
//! - `drain`: consumers dequeue and ack until that many items are consumed;
//! - `mixed`: producers enqueue `--items` more while consumers drain them; the figure is
//!   items consumed per second;
//! - `victim`, `flood` (see `tenant.rs`) and `probe` (see `probe.rs`), not in the default;
//! - `longpoll` (not in the default): one consumer long-polls a topic of its own and one
//!   producer enqueues an item once the consumer waits, `--items` times; the figure is how
//!   long after the enqueue's reply the consumer has the item (0 when it had it first).
//!
//! Latencies are per call: enqueue calls, dequeue+ack cycles, and the ack alone.
//! Every run is bounded: by `--items` and by `--max-seconds` per phase.
//!
//! With `--rabbitmq URL` the same phases run against RabbitMQ instead (see `rabbit.rs`).

mod probe;
mod rabbit;
mod tenant;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use foqs::client::{connect_via, new_item, ClientTransport, Protocol, SyncClient};
use foqs::thrift_gen::{AckRequest, DequeueRequest, EnqueueRequest, TFoqsSyncClient, TopicRequest};

#[derive(Parser, Clone)]
#[command(about = "Load generator for foqsd; prints one JSON line")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:9090")]
    host: String,
    #[arg(long, default_value_t = 4)]
    producers: usize,
    #[arg(long, default_value_t = 4)]
    consumers: usize,
    /// Items per phase.
    #[arg(long, default_value_t = 200_000)]
    items: u64,
    #[arg(long, default_value_t = 100)]
    payload_bytes: usize,
    /// Items per enqueue call and per dequeue call.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Priorities are drawn from 0..priorities.
    #[arg(long, default_value_t = 10)]
    priorities: i32,
    #[arg(long, default_value = "bench")]
    ns: String,
    /// Default: a fresh topic per run.
    #[arg(long)]
    topic: Option<String>,
    /// Comma-separated phases: enqueue, drain, mixed, longpoll.
    #[arg(long, default_value = "enqueue,drain,mixed")]
    phases: String,
    /// Total enqueue rate limit in items/s for the mixed phase, the victim, and the flood (0: as fast as possible).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Upper bound on each phase's duration.
    #[arg(long, default_value_t = 300)]
    max_seconds: u64,
    #[arg(long, value_parser = ["binary", "compact"], default_value = "binary")]
    protocol: String,
    /// How foqs-bench frames its messages: framed (what peers speak), unframed, or header
    /// (THeader); foqsd detects each per connection.
    #[arg(long, value_parser = ["framed", "unframed", "header"], default_value = "framed")]
    transport: String,
    /// Run the workload against this RabbitMQ (e.g. amqp://guest:guest@127.0.0.1:5672/%2f)
    /// instead of foqsd.
    #[arg(long)]
    rabbitmq: Option<String>,
    /// The MySQL server the `probe` phase commits to (e.g. mysql://root@127.0.0.1:3306).
    #[arg(long)]
    mysql: Option<String>,
}

/// Latencies in microseconds.
#[derive(Default)]
struct Latencies(Vec<u32>);

impl Latencies {
    /// `{"count", "p50_ms", "p99_ms", "max_ms"}` in milliseconds, `null` when empty.
    fn summary(self) -> String {
        self.quantiles(&[("p50_ms", 0.5), ("p99_ms", 0.99)])
    }

    /// As [`Self::summary`], with the 99.9th percentile.
    fn summary_with_p999(self) -> String {
        self.quantiles(&[("p50_ms", 0.5), ("p99_ms", 0.99), ("p999_ms", 0.999)])
    }

    fn quantiles(mut self, qs: &[(&str, f64)]) -> String {
        if self.0.is_empty() {
            return "null".into();
        }
        self.0.sort_unstable();
        let at = |q: f64| self.0[((self.0.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0;
        let mut out = format!("{{\"count\":{}", self.0.len());
        for (name, q) in qs.iter().chain(&[("max_ms", 1.0)]) {
            out.push_str(&format!(",\"{name}\":{:.3}", at(*q)));
        }
        out.push('}');
        out
    }
}

struct Run {
    args: Args,
    topic: String,
    protocol: Protocol,
}

impl Run {
    fn client(&self) -> anyhow::Result<foqs::client::SyncClient> {
        let transport = ClientTransport::parse(&self.args.transport).expect("clap checked it");
        connect_via(
            &self.args.host,
            self.protocol,
            transport,
            Duration::from_secs(30),
        )
        .with_context(|| format!("connecting to {}", self.args.host))
    }

    /// Runs `body` on `n` threads, each with its own connection and latency list; returns
    /// how long they took together and all their latencies.
    fn on_threads(
        &self,
        n: usize,
        body: impl Fn(usize, &mut SyncClient, &mut Vec<u32>) -> anyhow::Result<()> + Sync,
    ) -> anyhow::Result<(Duration, Latencies)> {
        let start = Instant::now();
        let all = std::thread::scope(|s| {
            let body = &body;
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    s.spawn(move || -> anyhow::Result<Vec<u32>> {
                        let mut c = self.client()?;
                        let mut mine = Vec::new();
                        body(i, &mut c, &mut mine)?;
                        Ok(mine)
                    })
                })
                .collect();
            let mut all = Vec::new();
            for h in handles {
                all.extend(h.join().expect("load thread panicked")?);
            }
            anyhow::Ok(all)
        })?;
        Ok((start.elapsed(), Latencies(all)))
    }

    /// Producers enqueue `items` in total; returns (elapsed, latencies).
    /// Producers enqueue until `items` are enqueued or the deadline; returns (elapsed,
    /// latencies, items enqueued).
    fn produce(&self, items: u64, deadline: Instant) -> anyhow::Result<(Duration, Latencies, u64)> {
        let next = AtomicU64::new(0);
        let enqueued = AtomicU64::new(0);
        let started = Instant::now();
        let per_producer_rate = (self.args.rate as f64) / self.args.producers as f64;
        self.on_threads(self.args.producers, |p, c, lat| {
            let payload = vec![b'x'; self.args.payload_bytes];
            let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (p as u64 + 1);
            let mut sent = 0u64;
            loop {
                let first = next.fetch_add(self.args.batch as u64, Ordering::SeqCst);
                if first >= items || Instant::now() > deadline {
                    return Ok(());
                }
                let n = (items - first).min(self.args.batch as u64) as usize;
                let batch = (0..n)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        let priority = (seed % self.args.priorities.max(1) as u64) as i32;
                        new_item(&self.args.ns, &self.topic, priority, payload.clone())
                    })
                    .collect();
                if per_producer_rate > 0.0 {
                    let due = started + Duration::from_secs_f64(sent as f64 / per_producer_rate);
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                }
                let t = Instant::now();
                let r = c.enqueue(EnqueueRequest {
                    forwarded_for: None,
                    items: Some(batch),
                    forwarded_by: None,
                    forward_token: None,
                })?;
                lat.push(t.elapsed().as_micros() as u32);
                if let Some(e) = r
                    .results
                    .unwrap_or_default()
                    .into_iter()
                    .find_map(|r| r.error)
                {
                    bail!("enqueue failed: {e:?}");
                }
                sent += n as u64;
                enqueued.fetch_add(n as u64, Ordering::Relaxed);
            }
        })
        .map(|(d, lat)| (d, lat, enqueued.load(Ordering::Relaxed)))
    }

    /// One long-poll consumer, one producer, an item at a time (see the `longpoll` phase):
    /// for each item, how long after the enqueue's reply the consumer had it.
    fn longpoll(&self, items: u64, deadline: Instant) -> anyhow::Result<Latencies> {
        let topic = format!("{}-longpoll", self.topic);
        let mut producer = self.client()?;
        let (waiting_tx, waiting_rx) = std::sync::mpsc::channel::<()>();
        let (got_tx, got_rx) = std::sync::mpsc::channel::<Instant>();
        std::thread::scope(|s| {
            let consumer = s.spawn(|| -> anyhow::Result<()> {
                let mut c = self.client()?;
                let req = DequeueRequest {
                    forwarded_for: None,
                    topics: Some(vec![TopicRequest {
                        ns: Some(self.args.ns.clone()),
                        topic: Some(topic.clone()),
                        count: Some(1),
                        before_priority: None,
                        before_deliver_after_ms: None,
                    }]),
                    wait_ms: Some(5_000),
                    local_only: None,
                    forwarded_by: None,
                };
                let mut received = 0;
                while received < items && Instant::now() < deadline {
                    if waiting_tx.send(()).is_err() {
                        break;
                    }
                    let got = c.dequeue(req.clone())?.items.unwrap_or_default();
                    let at = Instant::now();
                    if got.is_empty() {
                        continue;
                    }
                    received += got.len() as u64;
                    let _ = got_tx.send(at);
                    let ids: Vec<String> = got.into_iter().filter_map(|i| i.id).collect();
                    c.ack(AckRequest {
                        ids: Some(ids),
                        forwarded_by: None,
                        forwarded_for: None,
                        lease_ids: None,
                    })?;
                }
                Ok(())
            });
            let mut lat = Latencies::default();
            let payload = vec![b'x'; self.args.payload_bytes];
            for _ in 0..items {
                if Instant::now() >= deadline || waiting_rx.recv().is_err() {
                    break;
                }
                // The consumer sent its poll; give it time to reach foqsd and park.
                std::thread::sleep(Duration::from_millis(2));
                producer.enqueue(EnqueueRequest {
                    forwarded_for: None,
                    items: Some(vec![new_item(&self.args.ns, &topic, 0, payload.clone())]),
                    forwarded_by: None,
                    forward_token: None,
                })?;
                let replied = Instant::now();
                let got = got_rx
                    .recv_timeout(Duration::from_secs(10))
                    .context("the long poll did not receive the item within 10 s")?;
                lat.0
                    .push(got.saturating_duration_since(replied).as_micros() as u32);
            }
            drop(waiting_rx);
            consumer.join().expect("consumer panicked")?;
            Ok(lat)
        })
    }

    /// Consumers dequeue and ack until `items` are consumed; returns (elapsed, latencies,
    /// items consumed).
    fn consume(
        &self,
        items: u64,
        deadline: Instant,
        producing: &AtomicBool,
    ) -> anyhow::Result<(Duration, Latencies, Latencies, u64)> {
        let done = AtomicU64::new(0);
        let acks = std::sync::Mutex::new(Vec::new());
        let req = DequeueRequest {
            forwarded_for: None,
            topics: Some(vec![TopicRequest {
                ns: Some(self.args.ns.clone()),
                topic: Some(self.topic.clone()),
                count: Some(self.args.batch as i32),
                before_priority: None,
                before_deliver_after_ms: None,
            }]),
            wait_ms: None,
            local_only: None,
            forwarded_by: None,
        };
        let (elapsed, lat) = self.on_threads(self.args.consumers, |_, c, lat| {
            while done.load(Ordering::SeqCst) < items && Instant::now() < deadline {
                let t = Instant::now();
                let got = c.dequeue(req.clone())?.items.unwrap_or_default();
                if got.is_empty() {
                    if !producing.load(Ordering::SeqCst) && done.load(Ordering::SeqCst) >= items {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                let ids: Vec<String> = got.into_iter().filter_map(|i| i.id).collect();
                let n = ids.len() as u64;
                let a = Instant::now();
                let r = c.ack(AckRequest {
                    ids: Some(ids),
                    forwarded_by: None,
                    forwarded_for: None,
                    lease_ids: None,
                })?;
                lat.push(t.elapsed().as_micros() as u32);
                acks.lock()
                    .expect("not poisoned")
                    .push(a.elapsed().as_micros() as u32);
                if let Some(e) = r
                    .results
                    .unwrap_or_default()
                    .into_iter()
                    .find_map(|r| r.error)
                {
                    bail!("ack failed: {e:?}");
                }
                done.fetch_add(n, Ordering::SeqCst);
            }
            Ok(())
        })?;
        let acks = Latencies(acks.into_inner().expect("not poisoned"));
        Ok((elapsed, lat, acks, done.load(Ordering::SeqCst)))
    }
}

fn rate(items: u64, d: Duration) -> f64 {
    items as f64 / d.as_secs_f64().max(1e-9)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.batch == 0 || args.batch > 1000 || args.producers == 0 || args.consumers == 0 {
        bail!("--batch must be 1..=1000, --producers and --consumers > 0");
    }
    let protocol = if args.protocol == "compact" {
        Protocol::Compact
    } else {
        Protocol::Binary
    };
    let topic = args.topic.clone().unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        format!("bench-{}-{t}", std::process::id())
    });
    let run = Run {
        args: args.clone(),
        topic,
        protocol,
    };
    let phases: Vec<&str> = args.phases.split(',').map(str::trim).collect();
    let limit = Duration::from_secs(args.max_seconds);
    let mut fields = vec![
        format!("\"items\":{}", args.items),
        format!("\"producers\":{}", args.producers),
        format!("\"consumers\":{}", args.consumers),
        format!("\"batch\":{}", args.batch),
        format!("\"payload_bytes\":{}", args.payload_bytes),
        format!("\"protocol\":\"{}\"", args.protocol),
    ];
    if let Some(url) = &args.rabbitmq {
        fields.insert(0, "\"system\":\"rabbitmq\"".to_string());
        rabbit::run(&args, url, &phases, &mut fields)?;
        println!("{{{}}}", fields.join(","));
        return Ok(());
    }
    fields.insert(0, "\"system\":\"foqs\"".to_string());
    fields.push(format!("\"transport\":\"{}\"", args.transport));
    let idle = AtomicBool::new(false);
    for phase in phases {
        match phase {
            "enqueue" => {
                // What was enqueued, not what was asked: --max-seconds may stop it early.
                let (d, lat, n) = run.produce(args.items, Instant::now() + limit)?;
                fields.push(format!("\"enqueue_items_per_s\":{:.0}", rate(n, d)));
                fields.push(format!("\"enqueue_items\":{n}"));
                fields.push(format!("\"enqueue_latency\":{}", lat.summary()));
            }
            "drain" => {
                let (d, lat, acks, n) = run.consume(args.items, Instant::now() + limit, &idle)?;
                fields.push(format!("\"drain_items_per_s\":{:.0}", rate(n, d)));
                fields.push(format!("\"drain_items\":{n}"));
                fields.push(format!("\"dequeue_ack_latency\":{}", lat.summary()));
                fields.push(format!("\"ack_latency\":{}", acks.summary()));
            }
            "mixed" => {
                let producing = AtomicBool::new(true);
                let deadline = Instant::now() + limit;
                let (consumed, produced) = std::thread::scope(|s| {
                    let c = s.spawn(|| run.consume(args.items, deadline, &producing));
                    let p = run.produce(args.items, deadline);
                    producing.store(false, Ordering::SeqCst);
                    (c.join().expect("consumers panicked"), p)
                });
                let (d, lat, acks, n) = consumed?;
                let (_, plat, _) = produced?;
                fields.push(format!("\"mixed_items_per_s\":{:.0}", rate(n, d)));
                fields.push(format!("\"mixed_items\":{n}"));
                fields.push(format!("\"mixed_enqueue_latency\":{}", plat.summary()));
                fields.push(format!("\"mixed_dequeue_ack_latency\":{}", lat.summary()));
                fields.push(format!("\"mixed_ack_latency\":{}", acks.summary()));
            }
            "longpoll" => {
                let lat = run.longpoll(args.items, Instant::now() + limit)?;
                fields.push(format!(
                    "\"longpoll_receive_after_reply\":{}",
                    lat.summary()
                ));
            }
            "victim" => run.victim(&mut fields)?,
            "flood" => run.flood(&mut fields)?,
            "probe" => {
                let url = args.mysql.as_deref().context("--phases probe needs --mysql URL")?;
                run.probe(url, &mut fields)?
            }
            other => bail!(
                "unknown phase {other:?}: want enqueue, drain, mixed, longpoll, victim, flood or probe"
            ),
        }
    }
    println!("{{{}}}", fields.join(","));
    Ok(())
}
