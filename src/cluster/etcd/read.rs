//! The follower's view of the cluster in etcd: the [`Snapshot`] of hosts, owner keys and
//! primaries, read whole once at one revision and then kept current by applying the
//! watch's events to it (a watch cache, as Kubernetes' informers keep one): a change
//! costs etcd one event per follower, not a read of the whole cluster by each.

use std::collections::BTreeMap;
use std::time::Instant;

use etcd_client::{EventType, GetOptions, WatchResponse};

use super::{Follower, HostRecord};
use crate::model::{HostAddr, PrimaryRecord, ShardId};

/// The hosts, owner keys and primaries as of `revision`: read whole, then brought up to
/// date by the watch (opened from the revision after it). Read whole again when the watch
/// fails or is cancelled, after a change this host could not apply, and at least every
/// [`RESYNC_POLLS`] polls (a safety net: etcd's watch misses nothing it does not cancel).
#[derive(Clone)]
pub(super) struct Snapshot {
    pub hosts: BTreeMap<String, HostAddr>,
    /// shard -> (owner, lease)
    pub keys: BTreeMap<ShardId, (String, i64)>,
    pub primaries: BTreeMap<ShardId, PrimaryRecord>,
    /// The revision of the whole read, and the latest event applied since.
    pub revision: i64,
    /// Each owner key's last change known (deletes too): this host's own writes are put
    /// in the snapshot at once, so the watch's older events of the same key, arriving
    /// after them, are skipped.
    key_revisions: BTreeMap<ShardId, i64>,
    read_at: Instant,
}

/// Polls after which the snapshot is read whole again even with the watch healthy.
const RESYNC_POLLS: u32 = 10;

impl Snapshot {
    /// Applies one watch answer's events under `prefix` (`P/hosts/..`, `P/shards/..`,
    /// `P/primaries/..`); others are ignored.
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
            let Some((dir, name)) = rest.split_once('/') else {
                continue;
            };
            let put = e.event_type() == EventType::Put;
            match dir {
                "hosts" => match host_record(kv.value()).filter(|_| put) {
                    Some(h) => {
                        self.hosts.insert(name.to_string(), h);
                    }
                    None => {
                        self.hosts.remove(name);
                    }
                },
                "shards" => {
                    let Ok(s) = name.parse::<ShardId>() else {
                        continue;
                    };
                    let known = self.key_revisions.entry(s).or_insert(0);
                    if kv.mod_revision() <= *known {
                        continue;
                    }
                    *known = kv.mod_revision();
                    match kv.value_str().ok().filter(|_| put) {
                        Some(owner) => {
                            self.keys.insert(s, (owner.to_string(), kv.lease()));
                        }
                        None => {
                            self.keys.remove(&s);
                        }
                    }
                }
                "primaries" => {
                    let Ok(s) = name.parse::<ShardId>() else {
                        continue;
                    };
                    match serde_json::from_slice::<PrimaryRecord>(kv.value())
                        .ok()
                        .filter(|_| put)
                    {
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
            self.revision = self.revision.max(kv.mod_revision());
        }
    }

    /// This host's own write of `shard`'s key at `revision`: `owner` (None: deleted).
    pub fn own_write(&mut self, shard: ShardId, owner: Option<(String, i64)>, revision: i64) {
        let known = self.key_revisions.entry(shard).or_insert(0);
        *known = (*known).max(revision);
        match owner {
            Some(o) => self.keys.insert(shard, o),
            None => self.keys.remove(&shard),
        };
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
    ) -> Result<(Vec<(String, Vec<u8>, i64, i64)>, i64), etcd_client::Error> {
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
                Some((name, kv.value().to_vec(), kv.lease(), kv.mod_revision()))
            })
            .collect();
        Ok((kvs, read))
    }

    /// Whether the snapshot must be read whole before the next reconcile: there is
    /// none, or it may have missed a change (`stale`), or it is due for its resync.
    pub(super) fn needs_read(&self) -> bool {
        match &self.snapshot {
            Some(snap) => self.stale || snap.read_at.elapsed() >= self.renew_every * RESYNC_POLLS,
            None => true,
        }
    }

    /// The cluster: the snapshot, read whole first when [`Follower::needs_read`] (at one
    /// revision: hosts first, then owner keys and primaries as of the hosts' read).
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
            .filter_map(|(id, value, _, _)| Some((id, host_record(&value)?)))
            .collect();
        let (found, _) = self.read_prefix("shards", revision).await?;
        let mut keys = BTreeMap::new();
        let mut key_revisions = BTreeMap::new();
        for (shard, owner, lease, changed) in found {
            let (Ok(s), Ok(owner)) = (shard.parse::<ShardId>(), String::from_utf8(owner)) else {
                continue;
            };
            keys.insert(s, (owner, lease));
            key_revisions.insert(s, changed);
        }
        let (found, _) = self.read_prefix("primaries", revision).await?;
        let primaries = found
            .into_iter()
            .filter_map(|(shard, value, _, _)| {
                Some((shard.parse().ok()?, serde_json::from_slice(&value).ok()?))
            })
            .collect();
        let snap = Snapshot {
            hosts,
            keys,
            primaries,
            revision,
            key_revisions,
            read_at,
        };
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
            .filter_map(|(shard, value, _, _)| {
                Some((shard.parse().ok()?, serde_json::from_slice(&value).ok()?))
            })
            .collect())
    }
}
