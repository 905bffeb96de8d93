//! What operators see of a host: readiness (`/readyz`) and the gauges refreshed at each
//! scrape from state the host and its shard workers keep in memory (no query per scrape).

use super::host::Host;
use crate::metrics::ShardLabel;

impl Host {
    /// `Ok(why)` when this host can serve now: it has a healthy shard, or (in a cluster)
    /// a reachable peer to forward to; `Err(why not)` otherwise.
    pub fn readiness(&self) -> Result<String, String> {
        let status = self.host_status();
        let healthy = status.shards.iter().filter(|s| s.healthy).count();
        if healthy > 0 {
            return Ok(format!(
                "{healthy} of {} shards healthy",
                status.shards.len()
            ));
        }
        if let Some(p) = status.peers.iter().find(|p| p.load.reachable) {
            return Ok(format!(
                "no healthy shard here; forwarding to peer {} ({})",
                p.host_id, p.addr
            ));
        }
        if status.shards.is_empty() {
            Err("this host serves no shard, and no peer can be reached".into())
        } else {
            Err(format!(
                "every one of its {} shards has its circuit breaker open, and no peer can be reached",
                status.shards.len()
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
    }
}
