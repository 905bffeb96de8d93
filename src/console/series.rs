//! The console's memory of the recent past: once a second the host's item events (all
//! namespaces together) and its items by state are sampled into a ring of
//! [`SAMPLES_MAX`] samples, so a chart shows the last minutes at once, and a reload keeps
//! them. Per namespace, the last [`NS_WINDOW`] samples of its event counters give its
//! rates. Memory is fixed: the ring, and a short window per namespace.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::core::Host;
use crate::metrics::ItemEvent;

/// Ten minutes at one sample a second.
pub const SAMPLES_MAX: usize = 600;
/// Samples a namespace's rates are computed over (ten seconds).
const NS_WINDOW: usize = 11;
const EVENTS: [ItemEvent; 3] = [ItemEvent::Enqueued, ItemEvent::Delivered, ItemEvent::Acked];

#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    t_ms: i64,
    /// Enqueued, delivered, acked since the host started.
    events: [u64; 3],
    /// Ready, deferred, leased, dead.
    items: [i64; 4],
}

#[derive(Default)]
struct Inner {
    ring: VecDeque<Sample>,
    by_ns: HashMap<String, VecDeque<(i64, [u64; 3])>>,
}

#[derive(Default)]
pub struct Series {
    inner: Mutex<Inner>,
}

/// The chart's data: one entry per second (rates per second between samples).
#[derive(Debug, Clone, Default, serde::Serialize, PartialEq)]
pub struct SeriesView {
    /// Unix seconds.
    pub t: Vec<f64>,
    pub enqueued: Vec<f64>,
    pub delivered: Vec<f64>,
    pub acked: Vec<f64>,
    pub ready: Vec<i64>,
    pub leased: Vec<i64>,
}

/// Items per second, over the window held.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, PartialEq)]
pub struct Rates {
    pub enqueued: f64,
    pub delivered: f64,
    pub acked: f64,
}

fn rates(a: (i64, [u64; 3]), b: (i64, [u64; 3])) -> Rates {
    let dt = (b.0 - a.0) as f64 / 1000.0;
    if dt <= 0.0 {
        return Rates::default();
    }
    let r = |i: usize| b.1[i].saturating_sub(a.1[i]) as f64 / dt;
    Rates {
        enqueued: r(0),
        delivered: r(1),
        acked: r(2),
    }
}

impl Series {
    /// Takes one sample of `host` now.
    pub fn sample(&self, host: &Host, now_ms: i64) {
        let m = host.metrics();
        let by_ns = host.namespace_totals();
        let mut items = [0i64; 4];
        for c in by_ns.values() {
            items[0] += c.ready;
            items[1] += c.deferred;
            items[2] += c.leased;
            items[3] += c.dead;
        }
        let s = Sample {
            t_ms: now_ms,
            events: EVENTS.map(|e| m.event_total(e)),
            items,
        };
        let mut inner = self.inner.lock().expect("not poisoned");
        if inner.ring.len() == SAMPLES_MAX {
            inner.ring.pop_front();
        }
        inner.ring.push_back(s);
        for ns in by_ns.keys() {
            // Namespaces without a counter of their own (past the metrics' label cap)
            // get no rates: the shared count is not theirs.
            let Some(events) = EVENTS
                .iter()
                .map(|e| m.ns_event_total(ns, *e))
                .collect::<Option<Vec<u64>>>()
            else {
                continue;
            };
            let w = inner.by_ns.entry(ns.clone()).or_default();
            if w.len() == NS_WINDOW {
                w.pop_front();
            }
            w.push_back((now_ms, [events[0], events[1], events[2]]));
        }
        // A namespace with no items left is forgotten once its window shows no traffic.
        inner.by_ns.retain(|ns, w| {
            by_ns.contains_key(ns) || w.front().zip(w.back()).is_some_and(|(a, b)| a.1 != b.1)
        });
    }

    pub fn view(&self) -> SeriesView {
        let inner = self.inner.lock().expect("not poisoned");
        let mut v = SeriesView::default();
        for (a, b) in inner.ring.iter().zip(inner.ring.iter().skip(1)) {
            let r = rates((a.t_ms, a.events), (b.t_ms, b.events));
            v.t.push(b.t_ms as f64 / 1000.0);
            v.enqueued.push(r.enqueued);
            v.delivered.push(r.delivered);
            v.acked.push(r.acked);
            v.ready.push(b.items[0]);
            v.leased.push(b.items[2]);
        }
        v
    }

    /// The host's rates over the last ten seconds.
    pub fn host_rates(&self) -> Rates {
        let inner = self.inner.lock().expect("not poisoned");
        let n = inner.ring.len();
        if n < 2 {
            return Rates::default();
        }
        let a = inner.ring[n.saturating_sub(NS_WINDOW)];
        let b = inner.ring[n - 1];
        rates((a.t_ms, a.events), (b.t_ms, b.events))
    }

    /// A namespace's rates over the last ten seconds.
    pub fn ns_rates(&self, ns: &str) -> Rates {
        let inner = self.inner.lock().expect("not poisoned");
        match inner.by_ns.get(ns) {
            Some(w) if w.len() >= 2 => rates(w[0], w[w.len() - 1]),
            _ => Rates::default(),
        }
    }
}

/// Samples `host` every second until `shutdown` turns true.
pub async fn run_sampler(
    series: Arc<Series>,
    host: Arc<Host>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                series.sample(&host, now);
            }
            _ = shutdown.changed() => return,
        }
    }
}
