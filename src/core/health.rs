//! What operators see of a host: readiness (`/readyz`) and the gauges refreshed at each
//! scrape from state the host and its shard workers keep in memory (no query per scrape).

use std::collections::BTreeMap;

use super::host::Host;
use crate::metrics::{NsLabel, NsState, ShardLabel};
use crate::shard::NsSnapshot;

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

    /// Sets the gauges from what the host and its shard workers hold now.
    pub fn refresh_metrics(&self) {
        let m = self.metrics();
        let shards = self.shards();
        m.shards_owned.set(shards.len() as i64);
        m.breaker_open.clear();
        m.shard_queue_depth.clear();
        let (mut queued, mut topics, mut keys) = (0, 0, 0);
        for (id, s) in shards.iter() {
            let label = ShardLabel {
                shard: id.to_string(),
            };
            m.breaker_open
                .get_or_create(&label)
                .set(i64::from(!s.is_healthy()));
            let depth = s.queue_depth();
            m.shard_queue_depth.get_or_create(&label).set(depth as i64);
            queued += depth;
            let (t, k) = s.index_size();
            topics += t;
            keys += k;
        }
        m.buffer_used("shard_queue", "commands", queued as u64);
        m.buffer_used("ready_index", "topics", topics as u64);
        m.buffer_used("ready_index", "keys", keys as u64);
        m.buffer_used(
            "prefetch_stage",
            "items",
            self.prefetch.staged_total() as u64,
        );
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
