//! The follower's view of the cluster in etcd, kept as a watch cache the way Kubernetes'
//! reflectors keep theirs: one range read at one revision R, then one watch of the same
//! range from R + 1, whose events are applied in order. A change then costs etcd one
//! event per follower instead of a read of the whole cluster by every follower.
//!
//! Why this is exact (two earlier caches were not, and were taken out): the range
//! `[P/hosts/, P/shards0)` holds the hosts, the replicated shards' records and acks and the
//! owner keys, so one watch covers all the follower plans from, and etcd delivers one
//! watch's events in revision order, a revision's events never split over two answers.
//! After applying an answer the cache is etcd's state at that answer's revision, a state
//! etcd really had. Nothing is applied ahead of the watch: this host's own writes reach
//! the cache through it like anyone's, and the follower does not plan again until the
//! cache has reached its last write (`Follower::written`). (The earlier caches watched
//! three prefixes on separate streams, with no order between them, and applied their own
//! writes at once: their views were, for moments, states etcd never had.) The quota
//! buckets, written on every take, live outside the range (`P/tokens/`), so they cost the
//! followers nothing.
//!
//! The watch is read by a task of its own, so that the follower's own work (its writes,
//! the 20 ms it waits for a batch) never leaves etcd with answers it cannot send: etcd
//! 3.4 before 3.4.31 and 3.5 before 3.5.13 could drop events for such a slow watcher
//! (etcd-io/etcd#17529). In case one is missed all the same, every [`CHECK_POLLS`] polls
//! the follower counts the range's keys at the cache's revision (one request answered
//! with a number) and reads whole again if the count differs from the cache's.
//!
//! Read whole again when the watch fails, ends, is cancelled or compacted, when the cache
//! has not reached this host's last write within half the lease TTL (a watch that went
//! silent), or when the count differs; there is no periodic re-read.

use etcd_client::{EventType, GetOptions, KeyValue, WatchOptions, WatchResponse};

use super::watches::Feed;
use super::Follower;
use crate::cluster::follow::Cache;

/// Polls between two counts of the range's keys (see the module's text).
pub(super) const CHECK_POLLS: u32 = 10;

/// The first and (excluded) last key of the range watched under prefix `p`.
pub(super) fn range(p: &str) -> (String, String) {
    (format!("{p}/hosts/"), format!("{p}/shards0"))
}

impl Cache {
    /// Applies one watch answer (its events are after `revision`, in order). The cache's
    /// revision follows the events alone, not the answer's header: a watcher catching up
    /// may be sent a header ahead of events still to come.
    pub(super) fn apply(&mut self, prefix: &str, r: &WatchResponse) {
        for e in r.events() {
            let Some(kv) = e.kv() else { continue };
            self.apply_kv(prefix, kv, e.event_type() == EventType::Put);
        }
    }

    fn apply_kv(&mut self, prefix: &str, kv: &KeyValue, put: bool) {
        let Some(key) = kv
            .key_str()
            .ok()
            .and_then(|k| k.strip_prefix(prefix))
            .and_then(|k| k.strip_prefix('/'))
        else {
            return;
        };
        // A delete's key carries the delete's revision.
        self.revision = self.revision.max(kv.mod_revision());
        self.apply_one(key, put.then(|| (kv.value(), kv.lease())));
    }
}

impl Follower {
    /// Reads the range whole (one request, one revision) and opens its watch from the
    /// next revision, on the watches' own connection.
    pub(super) async fn load(&mut self) -> Result<(Cache, Feed), etcd_client::Error> {
        let (from, to) = range(&self.prefix);
        let resp = self
            .client
            .get(from.clone(), Some(GetOptions::new().with_range(to.clone())))
            .await?;
        let mut cache = Cache {
            revision: resp.header().map_or(0, |h| h.revision()),
            ..Cache::default()
        };
        for kv in resp.kvs() {
            cache.apply_kv(&self.prefix, kv, true);
        }
        // Every event after the read, none in it (a key's mod revision is at most the
        // read's revision).
        let options = WatchOptions::new()
            .with_range(to)
            .with_start_revision(cache.revision + 1);
        let stream = self.watcher.watch(from, Some(options)).await?;
        Ok((cache, Feed::start(stream)))
    }

    /// Whether etcd had as many keys in the range at the cache's revision as the cache
    /// holds (one request, answered with a count). An error (a revision compacted, etcd
    /// not answering) says nothing: true.
    pub(super) async fn count_agrees(&mut self, (revision, count): (i64, i64)) -> bool {
        let (from, to) = range(&self.prefix);
        let options = GetOptions::new()
            .with_range(to)
            .with_count_only()
            .with_revision(revision);
        match self.client.get(from, Some(options)).await {
            Ok(r) => r.count() == count,
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_holds_every_directory_the_follower_plans_from_and_not_the_buckets() {
        let (from, to) = range("/p");
        let inside = |k: &str| k >= from.as_str() && k < to.as_str();
        for k in [
            "/p/hosts/h1",
            "/p/primaries/3",
            "/p/paused/3",
            "/p/served/3",
            "/p/shards/0",
            "/p/shards/9999",
        ] {
            assert!(inside(k), "{k} is watched");
        }
        for k in [
            "/p/tokens/ns",
            "/p/switch/a",
            "/p/demoted/a",
            "/p2/hosts/h1",
        ] {
            assert!(!inside(k), "{k} is not watched");
        }
    }
}
