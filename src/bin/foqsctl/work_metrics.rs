//! `foqsctl work --metrics ADDR`: the worker's Prometheus metrics over HTTP (any path):
//! jobs by outcome (`foqsctl_work_jobs_total{outcome}`: acked, retried, dead_lettered,
//! released, lease_lost, failed, not_run), jobs running now, and a histogram of how long
//! jobs took (`foqsctl_work_job_duration_seconds`).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use foqs::client::{Settled, Verdict};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

pub struct WorkMetrics {
    registry: Registry,
    jobs: Family<Outcome, Counter>,
    pub running: Gauge,
    duration: Histogram,
}

impl WorkMetrics {
    pub fn new() -> WorkMetrics {
        let mut registry = Registry::with_prefix("foqsctl_work");
        let jobs = Family::<Outcome, Counter>::default();
        registry.register("jobs", "Jobs ended, by outcome", jobs.clone());
        let running = Gauge::default();
        registry.register("running", "Jobs running now", running.clone());
        // 10 ms .. ~11 min
        let duration = Histogram::new(exponential_buckets(0.01, 2.0, 17));
        registry.register_with_unit(
            "job_duration",
            "How long jobs took, from the item's hand-over to its settling",
            Unit::Seconds,
            duration.clone(),
        );
        WorkMetrics {
            registry,
            jobs,
            running,
            duration,
        }
    }

    pub fn ended(&self, end: &Settled, took: Duration) {
        let outcome = match end {
            Settled::Applied(Verdict::Ack) => "acked",
            Settled::Applied(Verdict::RetryAfter(_)) => "retried",
            Settled::Applied(Verdict::DeadLetter) => "dead_lettered",
            Settled::Applied(Verdict::Release) => "released",
            Settled::Failed(..) => "failed",
            Settled::LeaseLost(_) => "lease_lost",
            Settled::NotRun(_) => "not_run",
        };
        self.jobs.get_or_create(&Outcome { outcome }).inc();
        self.duration.observe(took.as_secs_f64());
    }

    fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// Serves the metrics at `addr` on a thread of its own, for as long as the process runs.
pub fn serve(addr: &str, metrics: Arc<WorkMetrics>) -> Result<(), String> {
    let listener = TcpListener::bind(addr).map_err(|e| format!("--metrics {addr}: {e}"))?;
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            // The request's head: read what arrives first; any path gets the metrics.
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let body = metrics.encode();
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Ok(())
}
