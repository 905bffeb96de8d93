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

use std::collections::{BTreeMap, BTreeSet};

use etcd_client::{EventType, GetOptions, KeyValue, WatchOptions, WatchResponse};

use super::watches::Feed;
use super::{Follower, HostRecord};
use crate::model::{HostAddr, PrimaryRecord, ShardId};

/// The hosts, owner keys and primaries at `revision`.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Cache {
    pub hosts: BTreeMap<String, HostAddr>,
    /// shard -> (owner, lease)
    pub keys: BTreeMap<ShardId, (String, i64)>,
    pub primaries: BTreeMap<ShardId, PrimaryRecord>,
    /// The range's other keys (acks, records that do not parse), by name under the
    /// prefix: not planned from, but counted (see [`Cache::keys_in_range`]).
    rest: BTreeSet<String>,
    /// etcd's revision this is the state of.
    pub revision: i64,
}

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
    pub fn apply(&mut self, prefix: &str, r: &WatchResponse) {
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

    /// Applies one change of `key` (`dir/name` under the prefix): put (value, lease) or
    /// deleted (None). Keys the follower does not plan from go to `rest`.
    fn apply_one(&mut self, key: &str, change: Option<(&[u8], i64)>) {
        let (dir, name) = key.split_once('/').unwrap_or(("", key));
        let shard = name.parse::<ShardId>().ok();
        // Whatever the key held before goes; what it holds now, if anything, comes back.
        self.rest.remove(key);
        match (dir, shard) {
            ("hosts", _) => {
                self.hosts.remove(name);
            }
            ("shards", Some(s)) => {
                self.keys.remove(&s);
            }
            ("primaries", Some(s)) => {
                self.primaries.remove(&s);
            }
            _ => {}
        }
        let Some((value, lease)) = change else {
            return;
        };
        let kept = match (dir, shard) {
            ("hosts", _) => host_record(value)
                .map(|h| self.hosts.insert(name.to_string(), h))
                .is_some(),
            ("shards", Some(s)) => std::str::from_utf8(value)
                .map(|owner| self.keys.insert(s, (owner.to_string(), lease)))
                .is_ok(),
            ("primaries", Some(s)) => serde_json::from_slice::<PrimaryRecord>(value)
                .map(|p| self.primaries.insert(s, p))
                .is_ok(),
            _ => false,
        };
        if !kept {
            self.rest.insert(key.to_string());
        }
    }

    /// How many keys of the range etcd had at `revision`, by this cache.
    pub fn keys_in_range(&self) -> i64 {
        (self.hosts.len() + self.keys.len() + self.primaries.len() + self.rest.len()) as i64
    }
}

fn host_record(value: &[u8]) -> Option<HostAddr> {
    let r = serde_json::from_slice::<HostRecord>(value).ok()?;
    Some(HostAddr {
        addr: r.addr,
        tier: r.tier,
        region: r.region,
    })
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

    fn owner(c: &Cache, shard: ShardId) -> Option<&str> {
        c.keys.get(&shard).map(|(o, _)| o.as_str())
    }

    #[test]
    fn puts_and_deletes_of_each_directory_are_applied_and_others_ignored() {
        let mut c = Cache::default();
        c.apply_one("shards/1", Some((b"a", 7)));
        assert_eq!(c.keys[&1], ("a".to_string(), 7));
        c.apply_one("shards/1", None);
        assert_eq!(owner(&c, 1), None);
        c.apply_one("hosts/h1", Some((br#"{"addr":"x:1","tier":"t"}"#, 7)));
        assert_eq!(c.hosts["h1"].addr, "x:1");
        assert_eq!(c.hosts["h1"].region, "", "a record without a region");
        c.apply_one("hosts/h1", None);
        assert!(c.hosts.is_empty());
        // Acks, an older build's quota bucket, keys that do not parse: not planned
        // from, but counted.
        c.apply_one("paused/3", Some((br#"{"generation":1,"host":"h"}"#, 7)));
        c.apply_one("quota/ns", Some((b"{}", 0)));
        c.apply_one("shards/nope", Some((b"a", 7)));
        c.apply_one("hosts/h2", Some((b"not json", 7)));
        assert!(c.hosts.is_empty() && c.keys.is_empty() && c.primaries.is_empty());
        assert_eq!(c.keys_in_range(), 4);
        // A record that stops parsing leaves the plan; one that starts, joins it.
        c.apply_one("hosts/h2", Some((br#"{"addr":"x:2","tier":"t"}"#, 7)));
        c.apply_one("primaries/5", Some((b"{}", 0)));
        assert_eq!(c.hosts["h2"].addr, "x:2");
        assert_eq!(c.keys_in_range(), 5);
        c.apply_one("hosts/h2", Some((b"broken", 7)));
        assert!(c.hosts.is_empty());
        assert_eq!(c.keys_in_range(), 5);
        for k in [
            "paused/3",
            "quota/ns",
            "shards/nope",
            "hosts/h2",
            "primaries/5",
        ] {
            c.apply_one(k, None);
        }
        assert_eq!(c, Cache::default());
    }

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
