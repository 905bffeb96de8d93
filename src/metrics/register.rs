//! [`Metrics::new`]: every metric declared (name, help, unit) and registered in the host's
//! own registry. docs/operations.md lists them.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::*;

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
            "What a host's buffers of each kind hold now: per = host, the sum over its shards or topics; per = shard or topic, the fullest one (compare with buffer_limit of the same labels)",
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
        let overload_cpu_busy = FloatGauge::default();
        r.register(
            "overload_cpu_busy",
            "The machine's busy CPU fraction, sampled every 100 ms (see engine.overload_cpu_busy)",
            overload_cpu_busy.clone(),
        );
        let overload_rate = Gauge::default();
        r.register(
            "overload_rate",
            "Items per second that enqueues of namespaces without a guaranteed rate are held to while the CPUs are saturated beside a guaranteed namespace (0: not shedding)",
            overload_rate.clone(),
        );
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
        let peer_clock_offset_ms = Family::<PeerLabel, Gauge>::default();
        r.register(
            "peer_clock_offset_ms",
            "Each peer's wall clock minus this host's, as the last poll of it measured",
            peer_clock_offset_ms.clone(),
        );
        let clock_out_of_bound = Gauge::default();
        r.register(
            "clock_out_of_bound",
            "1 while this host's clock is beyond cluster.clock_skew_max_ms from the cluster's middle clock (it holds no shards under etcd)",
            clock_out_of_bound.clone(),
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
        let view_reads = Family::<ReasonLabel, Counter>::default();
        r.register(
            "cluster_view_reads",
            "Whole reads of the cluster by this host's etcd follower, by reason: start (also after etcd could not be reached), watch_ended (failed, cancelled or compacted), watch_behind (this host's own write not seen within half the lease TTL), watch_silent (a progress request unanswered for half the lease TTL), count_differs (the range's key count at the cache's revision differs: a lost change), verify_differs (the cache compared whole with etcd at its revision, every 5 to 6 minutes, differs)",
            view_reads.clone(),
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
            overload_cpu_busy,
            overload_rate,
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
            peer_clock_offset_ms,
            clock_out_of_bound,
            shards_owned,
            lease_renewals,
            view_reads,
            handout_renewals,
            semi_sync_on,
            semi_sync_no_tx,
            replica_lag_ms,
            switches,
            labelled_ns: Default::default(),
            event_totals: Default::default(),
        }
    }
}
