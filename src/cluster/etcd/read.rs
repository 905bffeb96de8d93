//! The follower's reads of the cluster: every key under a prefix, and the [`Snapshot`] of
//! hosts, owner keys and primaries that a reconcile reuses while nothing changed.

use std::collections::BTreeMap;
use std::time::Instant;

use etcd_client::GetOptions;

use super::{primaries, Follower, HostRecord};
use crate::model::{HostAddr, PrimaryRecord, ShardId};

/// The hosts, owner keys and primaries as last read from etcd. A reconcile without a
/// change since (no watch event, no write of this host's, the watch open) reuses it
/// instead of reading the whole cluster again, so a quiet tier costs etcd no reads per
/// poll; it is read afresh at least every [`RESYNC_POLLS`] polls, in case a watch
/// missed something.
#[derive(Clone)]
pub(super) struct Snapshot {
    pub hosts: BTreeMap<String, HostAddr>,
    /// shard -> (owner, lease)
    pub keys: BTreeMap<ShardId, (String, i64)>,
    pub primaries: BTreeMap<ShardId, PrimaryRecord>,
    read_at: Instant,
}

/// Polls after which a snapshot is read afresh even with no change seen.
const RESYNC_POLLS: u32 = 10;

impl Follower {
    /// Every key under `P/<dir>/`: its last path segment, its value and its lease.
    pub(super) async fn read_prefix(
        &mut self,
        dir: &str,
    ) -> Result<Vec<(String, String, i64)>, etcd_client::Error> {
        let resp = self
            .client
            .get(
                format!("{}/{dir}/", self.prefix),
                Some(GetOptions::new().with_prefix()),
            )
            .await?;
        Ok(resp
            .kvs()
            .iter()
            .filter_map(|kv| {
                let name = kv.key_str().ok()?.rsplit('/').next()?.to_string();
                Some((name, kv.value_str().ok()?.to_string(), kv.lease()))
            })
            .collect())
    }

    /// The cluster: the snapshot when nothing may have changed since it was read, else
    /// read afresh (and kept).
    pub(super) async fn read_cluster(&mut self) -> Result<Snapshot, etcd_client::Error> {
        if let Some(snap) = &self.snapshot {
            if !self.stale && snap.read_at.elapsed() < self.renew_every * RESYNC_POLLS {
                return Ok(snap.clone());
            }
        }
        // Cleared before the reads: a change during them leaves a watch event behind.
        self.stale = false;
        let read_at = Instant::now();
        let mut hosts = BTreeMap::new();
        for (id, value, _) in self.read_prefix("hosts").await? {
            if let Ok(r) = serde_json::from_str::<HostRecord>(&value) {
                hosts.insert(
                    id,
                    HostAddr {
                        addr: r.addr,
                        tier: r.tier,
                        region: r.region,
                    },
                );
            }
        }
        let mut keys = BTreeMap::new();
        for (shard, owner, lease) in self.read_prefix("shards").await? {
            if let Ok(s) = shard.parse::<ShardId>() {
                keys.insert(s, (owner, lease));
            }
        }
        let primaries = self.read_primaries().await?;
        let snap = Snapshot {
            hosts,
            keys,
            primaries,
            read_at,
        };
        self.snapshot = Some(snap.clone());
        Ok(snap)
    }

    /// Every replicated shard's primary record.
    pub(super) async fn read_primaries(
        &mut self,
    ) -> Result<BTreeMap<ShardId, PrimaryRecord>, etcd_client::Error> {
        Ok(
            primaries::read::<PrimaryRecord>(&mut self.client, &self.prefix, "primaries")
                .await?
                .into_iter()
                .map(|(s, (r, _))| (s, r))
                .collect(),
        )
    }
}
