//! [`Metrics`]: what foqsd tells Prometheus, one registry per running host (so that tests
//! running several hosts in one process see each host's own numbers). Names follow
//! Prometheus conventions: `foqs_` prefix, base units (seconds), `_total` on counters, and
//! labels of low cardinality only (namespace, method, code, shard, peer; never a topic or
//! an item id). docs/operations.md lists every metric.
//!
//! Counters are bumped where things happen; gauges of depth and age are set at scrape
//! time from state the shard workers keep in memory ([`crate::shard::NsCounts`]), so a
//! scrape runs no query.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

mod labels;
mod register;
pub use labels::*;

type FloatGauge = Gauge<f64, AtomicU64>;

/// Distinct namespaces labelled; later ones share the label `_other`, so a client that
/// invents namespaces (when none are listed, any name is accepted) cannot grow the
/// scrape without bound.
pub const NS_LABELS_MAX: usize = 1000;
/// The label of namespaces past [`NS_LABELS_MAX`].
pub const NS_OTHER: &str = "_other";

fn latency() -> Histogram {
    // 100 µs .. ~6.5 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 17))
}

/// Items that happen to a namespace's items, counted by the shard workers and the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemEvent {
    Enqueued,
    Delivered,
    Acked,
    Nacked,
    Expired,
    DeadLettered,
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<MethodCode, Counter>,
    pub request_duration: Family<MethodLabel, Histogram, fn() -> Histogram>,
    item_events: [Family<NsLabel, Counter>; 6],
    pub items: Family<NsState, Gauge>,
    pub oldest_ready_age: Family<NsLabel, FloatGauge>,
    pub breaker_open: Family<ShardLabel, Gauge>,
    pub worker_deaths: Family<ShardLabel, Counter>,
    pub shard_queue_depth: Family<ShardLabel, Gauge>,
    pub shard_turn_duration: Family<ShardLabel, Histogram, fn() -> Histogram>,
    pub store_duration: Family<ShardLabel, Histogram, fn() -> Histogram>,
    pub store_errors: Family<ShardLabel, Counter>,
    pub connections_open: Gauge,
    pub connections_evicted: Counter,
    pub handoffs: Counter,
    /// The payload cache (see `store::cache`): claimed rows found there and not, and the
    /// bytes it holds.
    pub payload_cache_hits: Counter,
    pub payload_cache_misses: Counter,
    pub payload_cache_bytes: Gauge,
    pub connections_closed: Family<ReasonLabel, Counter>,
    pub transport_connections: Family<TransportLabel, Counter>,
    pub transport_requests: Family<TransportProtocol, Counter>,
    pub forwarded: Family<PeerOutcome, Counter>,
    pub peer_polls: Family<PeerLabel, Counter>,
    /// Each peer's clock minus this host's, as its last poll measured (see
    /// `cluster::clock`), and whether this host's clock is out of bound.
    pub peer_clock_offset_ms: Family<PeerLabel, Gauge>,
    pub clock_out_of_bound: Gauge,
    pub shards_owned: Gauge,
    pub lease_renewals: Family<OutcomeLabel, Counter>,
    /// The etcd follower's whole reads of the cluster, by reason (see
    /// `cluster::etcd::cache`).
    pub view_reads: Family<ReasonLabel, Counter>,
    /// Deliveries re-leased before leaving the host (see `core::useful_lease`), by
    /// outcome: `renewed`; `released` (the renewal failed: left out of the reply, given
    /// back uncounted); `dropped` (left out: the lease was over).
    pub handout_renewals: Family<OutcomeLabel, Counter>,
    pub semi_sync_on: Family<ServerLabel, Gauge>,
    pub semi_sync_no_tx: Family<ServerLabel, Gauge>,
    pub replica_lag_ms: Family<ServerLabel, Gauge>,
    pub switches: Family<SwitchLabel, Counter>,
    /// What a tenant feels (see `core::tenants`): its refusals by reason, and how long
    /// its items took from enqueue (or from coming due) to delivery.
    ns_refusals: Family<NsReason, Counter>,
    dlq_dropped: Family<NsLabel, Counter>,
    ns_enqueue_to_delivery: Family<NsLabel, Histogram, fn() -> Histogram>,
    /// The fair gate's waiting room (see `crate::fair`): what waits now, and its bounds.
    pub fair_waiting: Gauge,
    pub fair_waiting_bytes: Gauge,
    pub fair_waiting_max: Gauge,
    pub fair_waiting_bytes_max: Gauge,
    pub fair_slots: Gauge,
    /// The shedder's view (see `crate::overload`): the machine's busy CPU fraction last
    /// sampled, and the rate (items/s) enqueues without a guarantee are held to (0: none).
    pub overload_cpu_busy: FloatGauge,
    pub overload_rate: Gauge,
    /// Every bounded buffer's bounds (see [`Metrics::buffer_limit`]), and what the
    /// host's buffers of each kind hold together now (set at each scrape).
    buffer_limits: Family<BufferLabel, Gauge>,
    buffer_used: Family<BufferLabel, Gauge>,
    labelled_ns: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Every namespace's item events together, by [`ItemEvent`] (the console's rates).
    event_totals: [AtomicU64; 6],
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The label for namespace `ns` (see [`NS_LABELS_MAX`]).
    pub fn ns_label(&self, ns: &str) -> String {
        let mut seen = self.labelled_ns.lock().expect("not poisoned");
        if seen.contains(ns) {
            return ns.to_string();
        }
        if seen.len() < NS_LABELS_MAX {
            seen.insert(ns.to_string());
            return ns.to_string();
        }
        NS_OTHER.to_string()
    }

    /// The registry in Prometheus' text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    pub fn item_event(&self, ns: &str, event: ItemEvent, n: u64) {
        if n == 0 {
            return;
        }
        self.event_totals[event as usize].fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        let family = &self.item_events[event as usize];
        family
            .get_or_create(&NsLabel {
                ns: self.ns_label(ns),
            })
            .inc_by(n);
    }

    /// A request of namespace `ns` refused for `reason`.
    pub fn ns_refused(&self, ns: &str, reason: &'static str) {
        self.ns_refusals
            .get_or_create(&NsReason {
                ns: self.ns_label(ns),
                reason,
            })
            .inc();
    }

    /// `n` dead items of namespace `ns` purged for their topic's bound.
    /// Says a buffer's bound (set once, at start).
    pub fn buffer_limit(
        &self,
        buffer: &'static str,
        unit: &'static str,
        per: &'static str,
        v: u64,
    ) {
        self.buffer_limits
            .get_or_create(&BufferLabel { buffer, unit, per })
            .set(v.min(i64::MAX as u64) as i64);
    }

    /// Says what a host's buffers of one kind hold now: per host, together; per shard or
    /// topic, the fullest one.
    pub fn buffer_used(&self, buffer: &'static str, unit: &'static str, per: &'static str, v: u64) {
        self.buffer_used
            .get_or_create(&BufferLabel { buffer, unit, per })
            .set(v.min(i64::MAX as u64) as i64);
    }

    pub fn dlq_dropped(&self, ns: &str, n: u64) {
        if n > 0 {
            self.dlq_dropped
                .get_or_create(&NsLabel {
                    ns: self.ns_label(ns),
                })
                .inc_by(n);
        }
    }

    /// Items of namespace `ns` delivered, each this many ms after it was ready.
    pub fn ns_delivered_after(&self, ns: &str, waited_ms: impl Iterator<Item = i64>) {
        let h = self.ns_enqueue_to_delivery.get_or_create(&NsLabel {
            ns: self.ns_label(ns),
        });
        for ms in waited_ms {
            h.observe(ms.max(0) as f64 / 1000.0);
        }
    }

    /// How many `event`s happened to any namespace's items since the host started.
    pub fn event_total(&self, event: ItemEvent) -> u64 {
        self.event_totals[event as usize].load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many `event`s happened to `ns`'s items since the host started: 0 before the
    /// first, `None` when `ns` has no counter of its own (past [`NS_LABELS_MAX`]). Reads
    /// only: no label is created.
    pub fn ns_event_total(&self, ns: &str, event: ItemEvent) -> Option<u64> {
        let label = NsLabel { ns: ns.to_string() };
        if let Some(c) = self.item_events[event as usize].get(&label) {
            return Some(c.get());
        }
        let seen = self.labelled_ns.lock().expect("not poisoned");
        // Labelled (an event of another kind came first), or it would be on its first.
        (seen.contains(ns) || seen.len() < NS_LABELS_MAX).then_some(0)
    }

    pub fn connection_evicted(&self) {
        self.connections_evicted.inc();
    }

    pub fn connection_ended(&self, reason: &'static str) {
        self.connections_closed
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub fn worker_died(&self, shard: crate::model::ShardId) {
        self.worker_deaths
            .get_or_create(&ShardLabel {
                shard: shard.to_string(),
            })
            .inc();
    }

    pub fn connection_transport(&self, transport: &'static str) {
        self.transport_connections
            .get_or_create(&TransportLabel { transport })
            .inc();
    }

    pub fn transport_request(&self, transport: &'static str, protocol: &'static str) {
        self.transport_requests
            .get_or_create(&TransportProtocol {
                transport,
                protocol,
            })
            .inc();
    }

    pub fn request(&self, method: &'static str, code: &'static str, seconds: f64) {
        self.requests
            .get_or_create(&MethodCode { method, code })
            .inc();
        self.request_duration
            .get_or_create(&MethodLabel { method })
            .observe(seconds);
    }

    /// A poll of `peer`'s summary finished (see `Host::run_peer_poll`).
    pub fn peer_polled(&self, peer: &str) {
        self.peer_polls
            .get_or_create(&PeerLabel {
                peer: peer.to_string(),
            })
            .inc();
    }

    /// A poll measured `peer`'s clock `offset_ms` ahead of this host's (< 0: behind).
    pub fn peer_clock_offset(&self, peer: &str, offset_ms: i64) {
        self.peer_clock_offset_ms
            .get_or_create(&PeerLabel {
                peer: peer.to_string(),
            })
            .set(offset_ms);
    }

    pub fn clock_out_of_bound(&self, out: bool) {
        self.clock_out_of_bound.set(i64::from(out));
    }

    pub fn forwarded(&self, peer: &str, method: &'static str, outcome: &'static str) {
        self.forwarded
            .get_or_create(&PeerOutcome {
                peer: peer.to_string(),
                method,
                outcome,
            })
            .inc();
    }

    pub fn leases_renewed_at_handout(&self, renewed: u64, released: u64, dropped: u64) {
        for (outcome, n) in [
            ("renewed", renewed),
            ("released", released),
            ("dropped", dropped),
        ] {
            if n > 0 {
                self.handout_renewals
                    .get_or_create(&OutcomeLabel { outcome })
                    .inc_by(n);
            }
        }
    }

    pub fn view_read(&self, reason: &'static str) {
        self.view_reads.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// The etcd follower's whole reads of the cluster for `reason` so far.
    pub fn view_reads_for(&self, reason: &'static str) -> u64 {
        self.view_reads.get_or_create(&ReasonLabel { reason }).get()
    }

    pub fn lease_renewal(&self, ok: bool) {
        let outcome = if ok { "ok" } else { "failed" };
        self.lease_renewals
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        let m = Metrics::new();
        m.request("enqueue", "ok", 0.002);
        m.item_event("shop", ItemEvent::Acked, 3);
        m.connection_ended("idle_timeout");
        let text = m.encode();
        assert!(
            text.contains("foqs_requests_total{method=\"enqueue\",code=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("foqs_request_duration_seconds_bucket{"),
            "{text}"
        );
        assert!(
            text.contains("foqs_items_acked_total{ns=\"shop\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("foqs_connections_closed_total{reason=\"idle_timeout\"} 1"),
            "{text}"
        );
        assert!(text.trim_end().ends_with("# EOF"));
    }

    #[test]
    fn invented_namespaces_cannot_grow_the_scrape_without_bound() {
        let m = Metrics::new();
        for i in 0..NS_LABELS_MAX + 50 {
            m.item_event(&format!("ns{i}"), ItemEvent::Enqueued, 1);
        }
        let text = m.encode();
        let series = text.matches("foqs_items_enqueued_total{").count();
        assert_eq!(series, NS_LABELS_MAX + 1);
        assert!(text.contains("foqs_items_enqueued_total{ns=\"_other\"} 50"));
        // A namespace labelled before keeps its label.
        assert_eq!(m.ns_label("ns0"), "ns0");
    }
}
