//! The follower's view of the cluster in etcd, as a watch cache (as Kubernetes' informers
//! keep one): the watches open, then the [`Snapshot`] of hosts, owner keys and primaries
//! is read whole at one revision, and every event the watches report after that revision
//! is applied to it. A change then costs etcd one event per follower, not a read of the
//! whole cluster by every follower.
//!
//! Read whole again: when the watch fails, ends or is cancelled (compacted), when this
//! host's own write says the snapshot was wrong (a create whose key was taken, a delete
//! of a key that was not ours), when this host (re)registers, and every
//! [`RESYNC_POLLS`] polls as a safety net (etcd's watch delivers every change after its
//! start revision, in order, per key, or cancels the watch).

use std::collections::BTreeMap;
use std::time::Instant;

use etcd_client::{EventType, GetOptions, WatchResponse};

use super::{Follower, HostRecord};
use crate::model::{HostAddr, PrimaryRecord, ShardId};

/// The hosts, owner keys and primaries: read whole at `revision`, then kept current by
/// the watch (see the module's text).
#[derive(Clone)]
pub(super) struct Snapshot {
    pub hosts: BTreeMap<String, HostAddr>,
    /// shard -> (owner, lease)
    pub keys: BTreeMap<ShardId, (String, i64)>,
    pub primaries: BTreeMap<ShardId, PrimaryRecord>,
    /// The revision of the whole read: the watch's events up to it are in it already.
    pub revision: i64,
    /// This host's own writes of owner keys, applied before their watch events come:
    /// shard -> the write's revision. An older event of that key (still on its way) is
    /// skipped, so that it cannot undo the write; the entry goes once the watch reaches
    /// the write.
    own: BTreeMap<ShardId, i64>,
}

/// Polls after which the snapshot is read whole again with the watch healthy.
const RESYNC_POLLS: u32 = 60;

impl Snapshot {
    /// Applies one watch answer's events under `prefix` (`P/hosts/..`, `P/shards/..`,
    /// `P/primaries/..`; others are ignored).
    pub fn apply(&mut self, prefix: &str, r: &WatchResponse) {
        for e in r.events() {
            let Some(kv) = e.kv() else { continue };
            let Some(rest) = kv
                .key_str()
                .ok()
                .and_then(|k| k.strip_prefix(prefix))
                .and_then(|k| k.strip_prefix('/'))
            else {
                continue;
            };
            let change = (e.event_type() == EventType::Put).then(|| (kv.value(), kv.lease()));
            // A delete event's key carries the delete's revision.
            self.apply_one(rest, change, kv.mod_revision());
        }
    }

    /// Applies one change of `dir/name` (under the prefix) at `rev`: put (value, lease)
    /// or deleted (None).
    fn apply_one(&mut self, key: &str, change: Option<(&[u8], i64)>, rev: i64) {
        let Some((dir, name)) = key.split_once('/') else {
            return;
        };
        if rev <= self.revision {
            // In the whole read already (the watch opened before it).
            return;
        }
        match dir {
            "hosts" => match change.and_then(|(v, _)| host_record(v)) {
                Some(h) => {
                    self.hosts.insert(name.to_string(), h);
                }
                None => {
                    self.hosts.remove(name);
                }
            },
            "shards" => {
                let Ok(s) = name.parse::<ShardId>() else {
                    return;
                };
                match self.own.get(&s) {
                    Some(w) if rev < *w => return,
                    Some(_) => {
                        self.own.remove(&s);
                    }
                    None => {}
                }
                let owner = change.and_then(|(v, l)| Some((std::str::from_utf8(v).ok()?, l)));
                match owner {
                    Some((o, lease)) => {
                        self.keys.insert(s, (o.to_string(), lease));
                    }
                    None => {
                        self.keys.remove(&s);
                    }
                }
            }
            "primaries" => {
                let Ok(s) = name.parse::<ShardId>() else {
                    return;
                };
                match change.and_then(|(v, _)| serde_json::from_slice::<PrimaryRecord>(v).ok()) {
                    Some(p) => {
                        self.primaries.insert(s, p);
                    }
                    None => {
                        self.primaries.remove(&s);
                    }
                }
            }
            _ => {}
        }
    }

    /// This host wrote `s`'s owner key (`Some((owner, lease))`) or deleted it (`None`) at
    /// `revision`: applied now, its watch event later.
    pub fn own_write(&mut self, s: ShardId, key: Option<(String, i64)>, revision: i64) {
        match key {
            Some(k) => self.keys.insert(s, k),
            None => self.keys.remove(&s),
        };
        self.own.insert(s, revision);
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
    /// Every key under `P/<dir>/` at `revision` (0: the latest): its last path segment,
    /// its value and its lease; and the revision read.
    async fn read_prefix(
        &mut self,
        dir: &str,
        revision: i64,
    ) -> Result<(Vec<(String, Vec<u8>, i64)>, i64), etcd_client::Error> {
        let mut options = GetOptions::new().with_prefix();
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let resp = self
            .client
            .get(format!("{}/{dir}/", self.prefix), Some(options))
            .await?;
        let read = resp.header().map_or(revision, |h| h.revision());
        let kvs = resp
            .kvs()
            .iter()
            .filter_map(|kv| {
                let name = kv.key_str().ok()?.rsplit('/').next()?.to_string();
                Some((name, kv.value().to_vec(), kv.lease()))
            })
            .collect();
        Ok((kvs, read))
    }

    /// Whether the snapshot must be read whole before the next reconcile: there is
    /// none, it may be wrong (`stale`), or it is due for its resync.
    pub(super) fn needs_read(&self) -> bool {
        self.snapshot.is_none()
            || self.stale
            || self.read_at.elapsed() >= self.renew_every * RESYNC_POLLS
    }

    /// The cluster: the snapshot, read whole first when [`Follower::needs_read`] (hosts
    /// at the latest revision, owner keys and primaries at the same one).
    pub(super) async fn read_cluster(&mut self) -> Result<Snapshot, etcd_client::Error> {
        if !self.needs_read() {
            if let Some(snap) = &self.snapshot {
                return Ok(snap.clone());
            }
        }
        // Cleared before the reads: a failure during them sets it again.
        self.stale = false;
        let read_at = Instant::now();
        let (found, revision) = self.read_prefix("hosts", 0).await?;
        let hosts = found
            .into_iter()
            .filter_map(|(id, value, _)| Some((id, host_record(&value)?)))
            .collect();
        let (found, _) = self.read_prefix("shards", revision).await?;
        let keys = found
            .into_iter()
            .filter_map(|(shard, owner, lease)| {
                Some((shard.parse().ok()?, (String::from_utf8(owner).ok()?, lease)))
            })
            .collect();
        let (found, _) = self.read_prefix("primaries", revision).await?;
        let primaries = found
            .into_iter()
            .filter_map(|(shard, value, _)| {
                Some((shard.parse().ok()?, serde_json::from_slice(&value).ok()?))
            })
            .collect();
        let snap = Snapshot {
            hosts,
            keys,
            primaries,
            revision,
            own: BTreeMap::new(),
        };
        self.read_at = read_at;
        self.snapshot = Some(snap.clone());
        Ok(snap)
    }

    /// Every replicated shard's primary record (the latest).
    pub(super) async fn read_primaries(
        &mut self,
    ) -> Result<BTreeMap<ShardId, PrimaryRecord>, etcd_client::Error> {
        let (found, _) = self.read_prefix("primaries", 0).await?;
        Ok(found
            .into_iter()
            .filter_map(|(shard, value, _)| {
                Some((shard.parse().ok()?, serde_json::from_slice(&value).ok()?))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty(revision: i64) -> Snapshot {
        Snapshot {
            hosts: BTreeMap::new(),
            keys: BTreeMap::new(),
            primaries: BTreeMap::new(),
            revision,
            own: BTreeMap::new(),
        }
    }

    fn owner(s: &Snapshot, shard: ShardId) -> Option<&str> {
        s.keys.get(&shard).map(|(o, _)| o.as_str())
    }

    #[test]
    fn events_after_the_read_are_applied_and_those_in_it_skipped() {
        let mut s = empty(10);
        s.apply_one("shards/1", Some((b"a", 7)), 10);
        assert_eq!(owner(&s, 1), None, "an event the read holds already");
        s.apply_one("shards/1", Some((b"a", 7)), 11);
        assert_eq!(s.keys[&1], ("a".to_string(), 7));
        s.apply_one("shards/1", None, 12);
        assert_eq!(owner(&s, 1), None);
        s.apply_one("hosts/h1", Some((br#"{"addr":"x:1","tier":"t"}"#, 7)), 13);
        assert_eq!(s.hosts["h1"].addr, "x:1");
        s.apply_one("hosts/h1", None, 14);
        assert!(s.hosts.is_empty());
        s.apply_one("quota/ns", Some((b"{}", 0)), 15);
        s.apply_one("shards/nope", Some((b"a", 7)), 16);
        assert!(s.keys.is_empty());
    }

    #[test]
    fn an_older_event_on_its_way_does_not_undo_this_hosts_own_write() {
        let mut s = empty(10);
        // Taken by this host at 20 while the watch still brings the old owner's delete.
        s.apply_one("shards/1", Some((b"old", 5)), 11);
        s.own_write(1, Some(("me".into(), 9)), 20);
        s.apply_one("shards/1", None, 15);
        assert_eq!(owner(&s, 1), Some("me"), "an older delete undid the create");
        s.apply_one("shards/1", Some((b"me", 9)), 20);
        assert_eq!(owner(&s, 1), Some("me"));
        // The watch reached the write: later changes apply again.
        s.apply_one("shards/1", None, 21);
        assert_eq!(owner(&s, 1), None);
        // Given back at 30 while the watch still brings this host's own create.
        s.apply_one("shards/2", Some((b"me", 9)), 22);
        s.own_write(2, None, 30);
        s.apply_one("shards/2", Some((b"me", 9)), 25);
        assert_eq!(
            owner(&s, 2),
            None,
            "an older put brought back a key given back"
        );
        s.apply_one("shards/2", Some((b"other", 4)), 31);
        assert_eq!(owner(&s, 2), Some("other"));
    }
}
