//! The tenants workload (`--phases victim` and `--phases flood`, run as two processes
//! side by side by `scripts/bench.sh tenants`):
//! - `victim`: one producer offers `--rate` items/s (in calls of `--batch`) to its own
//!   topic for `--max-seconds`; `--consumers` long-poll consumers take and ack them. Each
//!   payload starts with its enqueue's send time, so each delivery's enqueue-to-delivery
//!   latency is measured at the consumer (client side: the send of the enqueue to the
//!   dequeue's reply). Refusals are counted by error code, never retried.
//! - `flood`: `--producers` producers offer as much as they can (calls of `--batch`) for
//!   `--max-seconds` while `--consumers` consumers drain; the figure is items consumed per
//!   second, and the refusals by code (a refused enqueue is retried after its hint).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use foqs::client::new_item;
use foqs::thrift_gen::{AckRequest, DequeueRequest, EnqueueRequest, TFoqsSyncClient, TopicRequest};

use super::{Latencies, Run};

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Refusals by error code.
#[derive(Default)]
struct Refusals(Mutex<BTreeMap<String, u64>>);

impl Refusals {
    fn add(&self, code: String, n: u64) {
        *self.0.lock().unwrap().entry(code).or_default() += n;
    }

    fn json(&self) -> String {
        let m = self.0.lock().unwrap();
        let parts: Vec<String> = m.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
        format!("{{{}}}", parts.join(","))
    }

    fn total(&self) -> u64 {
        self.0.lock().unwrap().values().sum()
    }
}

impl Run {
    fn topic_request(&self, count: usize) -> DequeueRequest {
        DequeueRequest {
            forwarded_for: None,
            topics: Some(vec![TopicRequest {
                ns: Some(self.args.ns.clone()),
                topic: Some(self.topic.clone()),
                count: Some(count as i32),
                before_priority: None,
                before_deliver_after_ms: None,
            }]),
            wait_ms: Some(1_000),
            local_only: None,
            forwarded_by: None,
        }
    }

    /// Consumers long-poll and ack until `stop`; returns items consumed and, when
    /// `measure`, each delivery's enqueue-to-delivery latency.
    fn tenant_consumers(
        &self,
        stop: &AtomicBool,
        measure: bool,
    ) -> anyhow::Result<(u64, Latencies)> {
        let consumed = AtomicU64::new(0);
        let (_, lat) = self.on_threads(self.args.consumers, |_, c, lat| {
            let req = self.topic_request(self.args.batch.max(10));
            while !stop.load(Ordering::SeqCst) {
                let got = c.dequeue(req.clone())?.items.unwrap_or_default();
                let at = now_us();
                if got.is_empty() {
                    continue;
                }
                let mut ids = Vec::with_capacity(got.len());
                for i in got {
                    if measure {
                        if let Some(sent) = i
                            .payload
                            .as_deref()
                            .and_then(|p| p.get(..8))
                            .map(|b| u64::from_be_bytes(b.try_into().unwrap()))
                        {
                            lat.push(at.saturating_sub(sent).min(u32::MAX as u64) as u32);
                        }
                    }
                    ids.extend(i.id);
                }
                consumed.fetch_add(ids.len() as u64, Ordering::Relaxed);
                c.ack(AckRequest {
                    ids: Some(ids),
                    forwarded_by: None,
                    forwarded_for: None,
                    lease_ids: None,
                })?;
            }
            Ok(())
        })?;
        Ok((consumed.load(Ordering::Relaxed), lat))
    }

    /// Sends one enqueue of `n` items stamped now; returns how many were refused, by code.
    fn stamped_enqueue(
        &self,
        c: &mut foqs::client::SyncClient,
        n: usize,
        refusals: &Refusals,
    ) -> anyhow::Result<(u64, Option<u64>)> {
        let mut payload = now_us().to_be_bytes().to_vec();
        payload.resize(self.args.payload_bytes.max(8), b'x');
        let items = (0..n)
            .map(|_| new_item(&self.args.ns, &self.topic, 0, payload.clone()))
            .collect();
        let r = c.enqueue(EnqueueRequest {
            forwarded_for: None,
            items: Some(items),
            forwarded_by: None,
            forward_token: None,
        })?;
        let mut ok = 0;
        let mut retry_after = None;
        for r in r.results.unwrap_or_default() {
            match r.error {
                None => ok += 1,
                Some(e) => {
                    let code = e.code.map_or("none".into(), |c| format!("{c:?}"));
                    refusals.add(code, 1);
                    if let Some(ms) = e.retry_after_ms {
                        retry_after = Some(ms.max(0) as u64);
                    }
                }
            }
        }
        Ok((ok, retry_after))
    }

    /// The victim: offers `--rate` items/s; see the module's notes.
    pub(super) fn victim(&self, fields: &mut Vec<String>) -> anyhow::Result<()> {
        let seconds = self.args.max_seconds as f64;
        let rate = self.args.rate.max(1) as f64;
        let batch = self.args.batch.max(1);
        let stop = AtomicBool::new(false);
        let refusals = Refusals::default();
        let (produced, consumed) = std::thread::scope(|s| {
            let consumers = s.spawn(|| self.tenant_consumers(&stop, true));
            let produced = (|| -> anyhow::Result<(u64, u64, Latencies)> {
                let mut c = self.client()?;
                let mut calls = Latencies::default();
                let started = Instant::now();
                let end = started + Duration::from_secs_f64(seconds);
                let (mut offered, mut enqueued) = (0u64, 0u64);
                while Instant::now() < end {
                    let due = started + Duration::from_secs_f64(offered as f64 / rate);
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let t = Instant::now();
                    let (ok, _) = self.stamped_enqueue(&mut c, batch, &refusals)?;
                    calls.0.push(t.elapsed().as_micros() as u32);
                    offered += batch as u64;
                    enqueued += ok;
                }
                Ok((offered, enqueued, calls))
            })();
            // Time for the last items to arrive, then the consumers stop.
            std::thread::sleep(Duration::from_millis(1_500));
            stop.store(true, Ordering::SeqCst);
            let consumed = consumers.join().expect("consumers panicked");
            (produced, consumed)
        });
        let (offered, enqueued, calls) = produced?;
        let (n, lat) = consumed?;
        fields.push(format!("\"victim_offered\":{offered}"));
        fields.push(format!(
            "\"victim_offered_per_s\":{:.1}",
            offered as f64 / seconds
        ));
        fields.push(format!(
            "\"victim_delivered_ratio\":{:.4}",
            n as f64 / offered.max(1) as f64
        ));
        fields.push(format!("\"victim_enqueued\":{enqueued}"));
        fields.push(format!("\"victim_refusals\":{}", refusals.json()));
        fields.push(format!("\"victim_refused\":{}", refusals.total()));
        fields.push(format!(
            "\"victim_enqueue_to_delivery\":{}",
            lat.summary_with_p999()
        ));
        fields.push(format!(
            "\"victim_enqueue_call\":{}",
            calls.summary_with_p999()
        ));
        Ok(())
    }

    /// The flooder: as much as it can; see the module's notes.
    pub(super) fn flood(&self, fields: &mut Vec<String>) -> anyhow::Result<()> {
        let seconds = self.args.max_seconds as f64;
        let stop = AtomicBool::new(false);
        let refusals = Refusals::default();
        let enqueued = AtomicU64::new(0);
        let started = Instant::now();
        let consumed = std::thread::scope(|s| {
            let consumers = s.spawn(|| self.tenant_consumers(&stop, false));
            let end = started + Duration::from_secs_f64(seconds);
            let produced = self.on_threads(self.args.producers, |_, c, _| {
                // With --rate, each producer paces its batches to its part of the rate.
                let per = self.args.rate as f64 / self.args.producers.max(1) as f64;
                let mut next = Instant::now();
                while Instant::now() < end {
                    if per > 0.0 {
                        next += Duration::from_secs_f64(self.args.batch.max(1) as f64 / per);
                        if let Some(d) = next.checked_duration_since(Instant::now()) {
                            std::thread::sleep(d);
                        }
                    }
                    let (ok, retry_after) =
                        self.stamped_enqueue(c, self.args.batch.max(1), &refusals)?;
                    enqueued.fetch_add(ok, Ordering::Relaxed);
                    if let Some(ms) = retry_after {
                        std::thread::sleep(Duration::from_millis(ms.clamp(1, 1_000)));
                    }
                }
                Ok(())
            });
            stop.store(true, Ordering::SeqCst);
            let consumed = consumers.join().expect("consumers panicked");
            produced.map(|_| ()).and(consumed)
        });
        let (n, _) = consumed?;
        let elapsed = started.elapsed().as_secs_f64();
        fields.push(format!(
            "\"flood_enqueued_per_s\":{:.0}",
            enqueued.load(Ordering::Relaxed) as f64 / elapsed
        ));
        fields.push(format!(
            "\"flood_consumed_per_s\":{:.0}",
            n as f64 / elapsed
        ));
        fields.push(format!("\"flood_refusals\":{}", refusals.json()));
        Ok(())
    }
}
