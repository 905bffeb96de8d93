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
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

mod labels;
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
    pub shards_owned: Gauge,
    pub lease_renewals: Family<OutcomeLabel, Counter>,
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
    pub fn new() -> Metrics {
        let mut r = Registry::with_prefix("foqs");
        let buffer_limits = Family::<BufferLabel, Gauge>::default();
        r.register(
            "buffer_limit",
            "The bound of each buffer a request or an item waits in, in its unit (requests, bytes, commands, items, keys, topics, connections), for each host, shard or topic (per)",
            buffer_limits.clone(),
        );
        let buffer_used = Family::<BufferLabel, Gauge>::default();
        r.register(
            "buffer_used",
            "What a host's buffers of each kind hold now, together (per = host: the sum over its shards or topics)",
            buffer_used.clone(),
        );
        let requests = Family::<MethodCode, Counter>::default();
        r.register(
            "requests",
            "Thrift requests by method and outcome code (ok, or the FoqsError code)",
            requests.clone(),
        );
        let request_duration =
            Family::<MethodLabel, Histogram, fn() -> Histogram>::new_with_constructor(latency);
        r.register_with_unit(
            "request_duration",
            "Time to serve a Thrift request, by method (a long poll's wait included)",
            Unit::Seconds,
            request_duration.clone(),
        );
        let item_events: [Family<NsLabel, Counter>; 6] = Default::default();
        for (family, (name, help)) in item_events.iter().zip([
            (
                "items_enqueued",
                "Items written by enqueues (deduplicated ones not counted)",
            ),
            ("items_delivered", "Items handed to consumers"),
            ("items_acked", "Items deleted by ack"),
            ("items_nacked", "Items nacked by consumers"),
            ("items_expired", "Leases that ran out without ack or nack"),
            (
                "items_dead_lettered",
                "Items that became dead (attempts used up, or nacked to the dead letters)",
            ),
        ]) {
            r.register(name, help, family.clone());
        }
        let items = Family::<NsState, Gauge>::default();
        r.register(
            "items",
            "Items on this host's shards by namespace and state (ready, deferred, leased, dead); leased includes items the prefetch buffer claimed",
            items.clone(),
        );
        let oldest_ready_age = Family::<NsLabel, FloatGauge>::default();
        r.register_with_unit(
            "oldest_ready_age",
            "How long the oldest ready item of the namespace has been ready",
            Unit::Seconds,
            oldest_ready_age.clone(),
        );
        let worker_deaths = Family::<ShardLabel, Counter>::default();
        r.register(
            "shard_worker_deaths",
            "Shard workers that died (a panic); each shard is reopened by itself",
            worker_deaths.clone(),
        );
        let breaker_open = Family::<ShardLabel, Gauge>::default();
        r.register(
            "shard_breaker_open",
            "1 while the shard's circuit breaker is open (no new enqueues go there)",
            breaker_open.clone(),
        );
        let shard_queue_depth = Family::<ShardLabel, Gauge>::default();
        r.register(
            "shard_queue_depth",
            "Commands waiting in the shard worker's queue",
            shard_queue_depth.clone(),
        );
        let shard_turn_duration =
            Family::<ShardLabel, Histogram, fn() -> Histogram>::new_with_constructor(latency);
        r.register_with_unit(
            "shard_turn_duration",
            "Time a shard worker takes for one turn (its batched writes)",
            Unit::Seconds,
            shard_turn_duration.clone(),
        );
        let store_duration =
            Family::<ShardLabel, Histogram, fn() -> Histogram>::new_with_constructor(latency);
        r.register_with_unit(
            "store_operation_duration",
            "Time of one storage operation (MySQL round trips) of a shard",
            Unit::Seconds,
            store_duration.clone(),
        );
        let store_errors = Family::<ShardLabel, Counter>::default();
        r.register(
            "store_errors",
            "Failed storage operations of a shard (timeouts included)",
            store_errors.clone(),
        );
        let connections_open = Gauge::default();
        r.register(
            "connections_open",
            "Open client connections",
            connections_open.clone(),
        );
        let ns_refusals = Family::<NsReason, Counter>::default();
        r.register(
            "ns_refusals",
            "Requests refused by namespace and reason: quota (over its enqueues_per_minute), requests or bytes (the host's waiting room for shard work was full and the namespace has no guaranteed rate)",
            ns_refusals.clone(),
        );
        let dlq_dropped = Family::<NsLabel, Counter>::default();
        r.register(
            "dlq_dropped",
            "Dead items purged because their topic was over its bound (engine.dlq_max_items_per_topic, or its namespace's), by namespace",
            dlq_dropped.clone(),
        );
        let ns_enqueue_to_delivery =
            Family::<NsLabel, Histogram, fn() -> Histogram>::new_with_constructor(latency);
        r.register_with_unit(
            "ns_enqueue_to_delivery",
            "Time from an item's enqueue (or its deliver_after, when later) to its delivery, by namespace (first deliveries and redeliveries alike; millisecond clock)",
            Unit::Seconds,
            ns_enqueue_to_delivery.clone(),
        );
        let fair_gauges: [Gauge; 5] = Default::default();
        for (g, (name, help)) in fair_gauges.iter().zip([
            (
                "fair_waiting",
                "Enqueues and dequeues waiting for a slot at the shards (see engine.fair_slots)",
            ),
            (
                "fair_waiting_bytes",
                "Payload bytes of the enqueues waiting for a slot",
            ),
            (
                "fair_waiting_max",
                "The bound on fair_waiting (engine.fair_waiting_max)",
            ),
            (
                "fair_waiting_bytes_max",
                "The bound on fair_waiting_bytes (engine.fair_waiting_bytes_max)",
            ),
            (
                "fair_slots",
                "Enqueues and dequeues at work on the shards at once, at most (engine.fair_slots)",
            ),
        ]) {
            r.register(name, help, g.clone());
        }
        let [fair_waiting, fair_waiting_bytes, fair_waiting_max, fair_waiting_bytes_max, fair_slots] =
            fair_gauges;
        let handoffs = Counter::default();
        r.register(
            "handoffs",
            "Items written already leased to consumers waiting on their topic (direct hand-off: no claim)",
            handoffs.clone(),
        );
        let payload_cache_hits = Counter::default();
        r.register(
            "payload_cache_hits",
            "Claimed rows whose contents were in the payload cache (no read back)",
            payload_cache_hits.clone(),
        );
        let payload_cache_misses = Counter::default();
        r.register(
            "payload_cache_misses",
            "Claimed rows not in the payload cache (read back from storage; MySQL only)",
            payload_cache_misses.clone(),
        );
        let payload_cache_bytes = Gauge::default();
        r.register(
            "payload_cache_bytes",
            "Bytes the payload cache holds (at most engine.payload_cache_bytes_max)",
            payload_cache_bytes.clone(),
        );
        let connections_evicted = Counter::default();
        r.register(
            "connections_evicted",
            "Connections closed at the connection cap to make room (the longest idle)",
            connections_evicted.clone(),
        );
        let connections_closed = Family::<ReasonLabel, Counter>::default();
        r.register(
            "connections_closed",
            "Connections ended, by reason (closed by the client, idle_timeout, frame_timeout, handshake_timeout, evicted, refused, shutdown; and for input foqs does not serve: unknown_transport, bad_frame, bad_header, bad_http, bad_message, too_large)",
            connections_closed.clone(),
        );
        let transport_connections = Family::<TransportLabel, Counter>::default();
        r.register(
            "transport_connections",
            "Client connections by the transport their first request spoke (framed, unframed, header, http)",
            transport_connections.clone(),
        );
        let transport_requests = Family::<TransportProtocol, Counter>::default();
        r.register(
            "transport_requests",
            "Thrift requests by transport (framed, unframed, header, http) and protocol (binary, compact)",
            transport_requests.clone(),
        );
        let forwarded = Family::<PeerOutcome, Counter>::default();
        r.register(
            "forwarded_requests",
            "Requests forwarded to a peer host, by peer, method and outcome",
            forwarded.clone(),
        );
        let peer_polls = Family::<PeerLabel, Counter>::default();
        r.register(
            "peer_polls",
            "Summaries this host finished reading from each peer (getHostInfo polls)",
            peer_polls.clone(),
        );
        let shards_owned = Gauge::default();
        r.register(
            "shards_owned",
            "Shards this host serves now",
            shards_owned.clone(),
        );
        let lease_renewals = Family::<OutcomeLabel, Counter>::default();
        r.register(
            "cluster_lease_renewals",
            "Renewals of this host's cluster lease (etcd), by outcome",
            lease_renewals.clone(),
        );
        let handout_renewals = Family::<OutcomeLabel, Counter>::default();
        r.register(
            "dequeue_leases_renewed",
            "Deliveries whose reply waited until less than half their lease was left: re-leased and sent (renewed); their renewal failed, so left out and given back uncounted (released); left out because their lease was over (dropped)",
            handout_renewals.clone(),
        );
        let semi_sync_on = Family::<ServerLabel, Gauge>::default();
        r.register(
            "replication_semi_sync_on",
            "1 while a replicated shards' primary waits for a replica's acknowledgement of every commit (0: it fell back to asynchronous: an alert)",
            semi_sync_on.clone(),
        );
        let semi_sync_no_tx = Family::<ServerLabel, Gauge>::default();
        r.register(
            "replication_semi_sync_no_tx",
            "Commits a primary made without a replica's acknowledgement (Rpl_semi_sync_master_no_tx since it started; should stay 0)",
            semi_sync_no_tx.clone(),
        );
        let replica_lag_ms = Family::<ServerLabel, Gauge>::default();
        r.register(
            "replication_replica_lag_ms",
            "How far a replica's heartbeat row is behind its primary's (-1: it does not answer or replicate)",
            replica_lag_ms.clone(),
        );
        let switches = Family::<SwitchLabel, Counter>::default();
        r.register(
            "replication_switches",
            "Switches of a replica set this host drove, by kind (switchover, failover) and outcome",
            switches.clone(),
        );
        Metrics {
            registry: r,
            requests,
            request_duration,
            item_events,
            items,
            oldest_ready_age,
            breaker_open,
            worker_deaths,
            shard_queue_depth,
            shard_turn_duration,
            store_duration,
            store_errors,
            connections_open,
            connections_evicted,
            handoffs,
            ns_refusals,
            dlq_dropped,
            ns_enqueue_to_delivery,
            fair_waiting,
            fair_waiting_bytes,
            fair_waiting_max,
            fair_waiting_bytes_max,
            fair_slots,
            buffer_limits,
            buffer_used,
            payload_cache_hits,
            payload_cache_misses,
            payload_cache_bytes,
            connections_closed,
            transport_connections,
            transport_requests,
            forwarded,
            peer_polls,
            shards_owned,
            lease_renewals,
            handout_renewals,
            semi_sync_on,
            semi_sync_no_tx,
            replica_lag_ms,
            switches,
            labelled_ns: Default::default(),
            event_totals: Default::default(),
        }
    }

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

    /// Says what a host's buffers of one kind hold now (see [`Self::buffer_used`]).
    pub fn buffer_used(&self, buffer: &'static str, unit: &'static str, v: u64) {
        self.buffer_used
            .get_or_create(&BufferLabel {
                buffer,
                unit,
                per: "host",
            })
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
