//! What operators see of a host: readiness (`/readyz`) and the gauges refreshed at each
//! scrape from state the host and its shard workers keep in memory (no query per scrape).

use std::collections::BTreeMap;

use super::host::Host;
use crate::metrics::{NsLabel, NsState, ShardLabel};
use crate::shard::NsSnapshot;

/// What one kind of buffer holds now (see [`Host::buffers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferUse {
    pub buffer: &'static str,
    pub unit: &'static str,
    /// `host`: the sum over the host's; `shard` or `topic`: the fullest one's.
    pub per: &'static str,
    pub used: u64,
}

impl Host {
    /// `Ok(why)` when this host can serve now: it has a healthy shard, or (in a cluster)
    /// a reachable peer to forward to; `Err(why not)` otherwise. Either way the text ends
    /// with one line per shard: `shard N: STATE` (see [`crate::model::ShardState::label`]).
    pub fn readiness(&self) -> Result<String, String> {
        let shards = self.shard_status();
        let healthy = shards.iter().filter(|s| s.healthy).count();
        let mut each = String::new();
        for s in &shards {
            each.push_str(&format!("\nshard {}: {}", s.shard, s.state.label()));
        }
        // Under etcd such a host gives its shards up (under `static` it keeps serving
        // them: nobody else may).
        if self.clock_out_of_bound() && self.cluster.settings.manager == "etcd" {
            return Err(format!(
                "this host's clock is beyond cluster.clock_skew_max_ms from the cluster's middle clock \
                 (see foqs_peer_clock_offset_ms): it holds no shards until it is back in bound{each}"
            ));
        }
        if healthy > 0 {
            return Ok(format!(
                "{healthy} of {} shards healthy{each}",
                shards.len()
            ));
        }
        if let Some(p) = self.peer_statuses().iter().find(|p| p.load.reachable) {
            return Ok(format!(
                "no healthy shard here; forwarding to peer {} ({}){each}",
                p.host_id, p.addr
            ));
        }
        if shards.is_empty() {
            Err("this host serves no shard, and no peer can be reached".into())
        } else {
            Err(format!(
                "none of its {} shards is healthy, and no peer can be reached{each}",
                shards.len()
            ))
        }
    }

    /// What the host's buffers hold now, each kind in the units and per what its bound
    /// (`foqs_buffer_limit`) is given: per host, the sum over the host's; per shard or
    /// topic, the fullest one's, so that each compares with its bound directly.
    pub fn buffers(&self) -> Vec<BufferUse> {
        let shards = self.shards();
        let (mut queued, mut queued_most, mut acks, mut acks_most) = (0, 0, 0, 0);
        let (mut topics, mut topics_most, mut keys, mut keys_most) = (0, 0, 0, 0);
        for s in shards.values() {
            let depth = s.queue_depth();
            queued += depth;
            queued_most = queued_most.max(depth);
            let remembered = s.acks_remembered();
            acks += remembered;
            acks_most = acks_most.max(remembered);
            let (t, k, k_most) = s.index_size();
            topics += t;
            topics_most = topics_most.max(t);
            keys += k;
            keys_most = keys_most.max(k_most);
        }
        let (staged, staged_most) = self.prefetch.staged();
        let (waiting, waiting_bytes) = self.fair.waiting();
        let m = self.metrics();
        let gauge = |g: &prometheus_client::metrics::gauge::Gauge| g.get().max(0) as usize;
        [
            ("shard_queue", "commands", "host", queued),
            ("shard_queue", "commands", "shard", queued_most),
            ("ready_index", "topics", "host", topics),
            ("ready_index", "topics", "shard", topics_most),
            ("ready_index", "keys", "host", keys),
            ("ready_index", "keys", "topic", keys_most),
            ("prefetch_stage", "items", "host", staged),
            ("prefetch_stage", "items", "topic", staged_most),
            ("fair_waiting", "requests", "host", waiting),
            ("fair_waiting", "bytes", "host", waiting_bytes),
            (
                "connections",
                "connections",
                "host",
                gauge(&m.connections_open),
            ),
            (
                "payload_cache",
                "bytes",
                "host",
                gauge(&m.payload_cache_bytes),
            ),
            ("ack_memory", "items", "host", acks),
            ("ack_memory", "items", "shard", acks_most),
        ]
        .into_iter()
        .map(|(buffer, unit, per, used)| BufferUse {
            buffer,
            unit,
            per,
            used: used as u64,
        })
        .collect()
    }

    /// Sets the gauges from what the host and its shard workers hold now.
    pub fn refresh_metrics(&self) {
        let m = self.metrics();
        let shards = self.shards();
        m.shards_owned.set(shards.len() as i64);
        m.breaker_open.clear();
        m.shard_queue_depth.clear();
        for (id, s) in shards.iter() {
            let label = ShardLabel {
                shard: id.to_string(),
            };
            m.breaker_open
                .get_or_create(&label)
                .set(i64::from(!s.is_healthy()));
            m.shard_queue_depth
                .get_or_create(&label)
                .set(s.queue_depth() as i64);
        }
        for b in self.buffers() {
            m.buffer_used(b.buffer, b.unit, b.per, b.used);
        }
        let now = self.clock.now_ms();
        let mut by_ns: BTreeMap<String, NsSnapshot> = BTreeMap::new();
        for s in shards.values() {
            for (ns, snap) in s.ns_counts(now) {
                by_ns.entry(m.ns_label(&ns)).or_default().add(&snap);
            }
        }
        // Namespaces that emptied disappear from the scrape rather than linger at 0.
        m.items.clear();
        m.oldest_ready_age.clear();
        for (ns, c) in by_ns {
            for (state, n) in [
                ("ready", c.ready),
                ("deferred", c.deferred),
                ("leased", c.leased),
                ("dead", c.dead),
            ] {
                m.items
                    .get_or_create(&NsState {
                        ns: ns.clone(),
                        state,
                    })
                    .set(n);
            }
            let age_s = c
                .oldest_ready_ms
                .map_or(0.0, |t| (now - t).max(0) as f64 / 1000.0);
            m.oldest_ready_age.get_or_create(&NsLabel { ns }).set(age_s);
        }
    }
}
