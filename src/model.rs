//! Domain types shared by every layer: item ids, delivery policies, the ready-order key,
//! items as enqueued and as delivered. Nothing here knows Thrift or MySQL.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// Index of a shard; the part of an item id before the colon.
pub type ShardId = u32;

/// `"<shard_id>:<primary_key>"`: names the shard an item lives on, so any host can route
/// an ack or nack to the shard's owner without a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ItemId {
    pub shard: ShardId,
    pub key: u64,
}

impl fmt::Display for ItemId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.shard, self.key)
    }
}

impl FromStr for ItemId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || {
            Error::invalid(format!(
                "malformed item id {s:?}: want \"<shard_id>:<key>\""
            ))
        };
        let (shard, key) = s.split_once(':').ok_or_else(bad)?;
        // Plain decimal only: `parse` would also take a leading '+', which no id we hand
        // out contains.
        let decimal =
            |p: &str| !p.is_empty() && p.len() <= 20 && p.bytes().all(|b| b.is_ascii_digit());
        if !decimal(shard) || !decimal(key) {
            return Err(bad());
        }
        Ok(ItemId {
            shard: shard.parse().map_err(|_| bad())?,
            key: key.parse().map_err(|_| bad())?,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Lease expiry makes the item ready again, until `max_attempts` is reached.
    AtLeastOnce = 1,
    /// Lease expiry deletes the item: it is never delivered twice.
    AtMostOnce = 2,
}

impl Policy {
    pub fn from_i32(v: i32) -> Option<Policy> {
        match v {
            1 => Some(Policy::AtLeastOnce),
            2 => Some(Policy::AtMostOnce),
            _ => None,
        }
    }
}

/// Where an item is in its life. Deferred is `Ready` with `deliver_after_ms` in the future.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ItemState {
    Ready = 0,
    Leased = 1,
    /// Attempts exhausted, or nacked to the dead letters: kept, never delivered, until
    /// requeued or purged.
    Dead = 2,
}

impl ItemState {
    pub fn from_i8(v: i8) -> Option<ItemState> {
        match v {
            0 => Some(ItemState::Ready),
            1 => Some(ItemState::Leased),
            2 => Some(ItemState::Dead),
            _ => None,
        }
    }
}

/// The delivery order within a topic: lower priority first, then older `deliver_after_ms`,
/// then lower key. Field order matters: the derived `Ord` is that order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReadyKey {
    pub priority: i32,
    pub deliver_after_ms: i64,
    pub key: u64,
}

/// The order across shards: the key, and the shard id to make ties total.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GlobalKey {
    pub priority: i32,
    pub deliver_after_ms: i64,
    pub key: u64,
    pub shard: ShardId,
}

impl GlobalKey {
    pub fn new(shard: ShardId, k: ReadyKey) -> Self {
        GlobalKey {
            priority: k.priority,
            deliver_after_ms: k.deliver_after_ms,
            key: k.key,
            shard,
        }
    }
}

/// A place in a topic's delivery order, ids aside: an item with a lower `Head` goes first.
/// A topic's head on a host is its most urgent ready item's; routed dequeues compare them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Head {
    pub priority: i32,
    pub deliver_after_ms: i64,
}

impl Head {
    pub fn of(i: &Item) -> Head {
        Head {
            priority: i.priority,
            deliver_after_ms: i.deliver_after_ms,
        }
    }
}

impl From<ReadyKey> for Head {
    fn from(k: ReadyKey) -> Head {
        Head {
            priority: k.priority,
            deliver_after_ms: k.deliver_after_ms,
        }
    }
}

impl From<GlobalKey> for Head {
    fn from(k: GlobalKey) -> Head {
        Head {
            priority: k.priority,
            deliver_after_ms: k.deliver_after_ms,
        }
    }
}

/// A topic with ready items on a host: how many, and its head when the host knows it
/// (`None`: it may be anything).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyTopic {
    pub topic: TopicName,
    pub ready: i64,
    pub head: Option<Head>,
    /// The keys of its most urgent ready items there, most urgent first, at most
    /// [`HEADS_MAX`]: every ready item not listed is no more urgent than the last one
    /// listed (empty: nothing known past `head`).
    pub heads: Vec<Head>,
}

/// How many of a topic's head keys a host tells its peers (see [`ReadyTopic::heads`]).
pub const HEADS_MAX: usize = 32;

/// A (namespace, topic) pair; both are exact byte strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicName {
    pub ns: String,
    pub topic: String,
}

/// An item that passed validation, with every default applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewItem {
    pub ns: String,
    pub topic: String,
    pub priority: i32,
    pub payload: Vec<u8>,
    pub metadata: Vec<u8>,
    pub deliver_after_ms: i64,
    pub enqueued_at_ms: i64,
    pub lease_ms: i64,
    /// `enqueued_at_ms + ttl_ms`, or `None` for no TTL.
    pub expires_at_ms: Option<i64>,
    pub policy: Policy,
    pub max_attempts: i32,
    /// At most one item with this key exists per (ns, topic).
    pub dedup_key: Option<String>,
}

/// An item as handed to a consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub id: ItemId,
    pub ns: String,
    pub topic: String,
    pub priority: i32,
    pub payload: Vec<u8>,
    pub metadata: Vec<u8>,
    pub deliver_after_ms: i64,
    pub enqueued_at_ms: i64,
    pub delivery_count: i32,
    pub lease_expires_ms: i64,
    /// The lease each delivery of it gets (its enqueue's `lease_ms`); 0 when unknown (a
    /// peer's reply from a version without the field).
    pub lease_ms: i64,
    pub policy: Policy,
    /// When the TTL deletes it, if ever (not sent to clients).
    pub expires_at_ms: Option<i64>,
    /// Names the claim that leased it, so that only that lease can be released.
    pub lease_token: i64,
}

impl Item {
    /// An at-least-once item of shard 0, namespace "n", topic "t", delivered once, for unit
    /// tests to change what they need of.
    #[cfg(test)]
    pub(crate) fn for_test(key: u64) -> Item {
        Item {
            id: ItemId { shard: 0, key },
            ns: "n".into(),
            topic: "t".into(),
            priority: 0,
            payload: vec![],
            metadata: vec![],
            deliver_after_ms: 0,
            enqueued_at_ms: 0,
            delivery_count: 1,
            lease_expires_ms: 0,
            lease_ms: 0,
            policy: Policy::AtLeastOnce,
            expires_at_ms: None,
            lease_token: 0,
        }
    }

    pub fn global_key(&self) -> GlobalKey {
        GlobalKey {
            priority: self.priority,
            deliver_after_ms: self.deliver_after_ms,
            key: self.id.key,
            shard: self.id.shard,
        }
    }
}

/// Per-topic counts for `getActiveTopics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicCounts {
    pub topic: String,
    pub ready: i64,
    pub deferred: i64,
    pub leased: i64,
    /// Ids of the hosts whose shards hold the topic's items (filled in by hosts; a
    /// store leaves it empty).
    pub hosts: Vec<String>,
}

/// Running totals of a topic's traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Totals {
    pub enqueued: i64,
    pub delivered: i64,
    pub acked: i64,
    pub nacked: i64,
    pub expired: i64,
}

impl Totals {
    pub fn add(&mut self, o: &Totals) {
        self.enqueued += o.enqueued;
        self.delivered += o.delivered;
        self.acked += o.acked;
        self.nacked += o.nacked;
        self.expired += o.expired;
    }

    pub fn is_zero(&self) -> bool {
        *self == Totals::default()
    }
}

/// What one shard knows of a topic, for `topicStats`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicSnapshot {
    pub ready: i64,
    pub deferred: i64,
    pub leased: i64,
    pub dead: i64,
    /// The smallest `deliver_after_ms` among ready items.
    pub oldest_ready_ms: Option<i64>,
    pub totals: Totals,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardStatus {
    pub shard: ShardId,
    pub healthy: bool,
    pub state: ShardState,
    pub items: i64,
}

/// What a shard on this host is doing, for operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardState {
    Serving,
    /// Its storage is failing or slow: no new enqueues go to it.
    BreakerOpen,
    /// Its worker panicked; the shard is reopened by itself.
    WorkerDead,
    /// Its worker stopped (the shard is being handed over, or the host stops).
    Stopped,
}

impl ShardState {
    /// The state `label` names (an unknown one: `Stopped`).
    pub fn from_label(label: &str) -> ShardState {
        match label {
            "serving" => ShardState::Serving,
            "breaker_open" => ShardState::BreakerOpen,
            "worker_dead" => ShardState::WorkerDead,
            _ => ShardState::Stopped,
        }
    }

    /// As `getHostInfo` and `/readyz` say it.
    pub fn label(self) -> &'static str {
        match self {
            ShardState::Serving => "serving",
            ShardState::BreakerOpen => "breaker_open",
            ShardState::WorkerDead => "worker_dead",
            ShardState::Stopped => "stopped",
        }
    }
}

/// How far a batched admin call (`dlqRequeueAll`, `dlqPurge`) got within its time bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    pub count: i64,
    /// It stopped at its bound with work left: call again.
    pub more: bool,
}

impl Progress {
    pub fn add(&mut self, other: Progress) {
        self.count += other.count;
        self.more |= other.more;
    }
}

/// The tier of shards and namespaces that name none.
pub const TIER_DEFAULT: &str = "default";

/// A live host of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAddr {
    /// "host:port" clients and peers use.
    pub addr: String,
    pub tier: String,
    /// `cluster.region` of the host ("" when it names none).
    pub region: String,
}

/// A replicated shard's current primary, as etcd holds it (see `crate::replication`):
/// every switch raises the generation, and a host writes only the server named by the
/// generation it opened the shard with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PrimaryRecord {
    /// "host:port" of the MySQL server.
    pub addr: String,
    pub region: String,
    pub generation: u64,
    pub state: PrimaryState,
    /// Paused for a planned switch: the region of the switch's target. The shard's owner
    /// moves there at the pause, not once it is served (see [`Self::owner_region`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_region: Option<String>,
}

impl PrimaryRecord {
    /// The region whose hosts should own the shard: its primary's, or while a planned
    /// switch pauses it, its target's. The new owner then opens the shard during the
    /// pause (on the old primary, whose rows no host changes any more) and holds it, so
    /// that serving it on the new primary needs no reopen inside the set's read-only
    /// window (see `Host::hold_shard`).
    pub fn owner_region(&self) -> &str {
        match (&self.state, &self.next_region) {
            (PrimaryState::Paused, Some(r)) => r,
            _ => &self.region,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrimaryState {
    /// Hosts serve the shard on `addr`.
    Serving,
    /// A switch is under way: no host serves the shard; its owner pauses it (buffers
    /// flushed, worker stopped) and says so.
    Paused,
    /// A failover is under way (the primary does not answer): no host serves the shard,
    /// and its owner stops it without writing to the fenced primary on the way out.
    Fenced,
}

/// The cluster as a shard manager sees it at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// Live hosts by id, this host included.
    pub hosts: BTreeMap<String, HostAddr>,
    /// The owner (host id) of each shard that has one now; a shard that is moving has none.
    pub owners: BTreeMap<ShardId, String>,
    /// The current primary of each replicated shard (none for a shard without replicas).
    pub primaries: BTreeMap<ShardId, PrimaryRecord>,
    /// Shards this host still holds (in the manager) that it must let go of: not its own
    /// any more in `owners`. One it does not serve (it was taken and moved on between two
    /// views this host saw) has nothing to stop: the host says it released it at once, or
    /// nobody would (a shard it serves is released once stopped, as it leaves `owners`).
    pub withdrawn: BTreeSet<ShardId>,
}

impl ClusterView {
    /// The shards `host` owns.
    pub fn shards_of(&self, host: &str) -> Vec<ShardId> {
        self.owners
            .iter()
            .filter(|(_, h)| h.as_str() == host)
            .map(|(s, _)| *s)
            .collect()
    }

    /// The owner of `shard` and its address.
    pub fn owner(&self, shard: ShardId) -> Option<(&str, &str)> {
        let h = self.owners.get(&shard)?;
        let a = self.hosts.get(h)?;
        Some((h.as_str(), a.addr.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_id_round_trips() {
        let id = ItemId {
            shard: 3,
            key: 18446744073709551615,
        };
        assert_eq!(id.to_string(), "3:18446744073709551615");
        assert_eq!(id.to_string().parse::<ItemId>().unwrap(), id);
    }

    #[test]
    fn malformed_item_ids_are_invalid_argument() {
        for bad in [
            "",
            ":",
            "1:",
            ":1",
            "1",
            "a:1",
            "1:b",
            "+1:2",
            "1:-2",
            "1:2:3",
            " 1:2",
            "1:18446744073709551616",
            "4294967296:1",
        ] {
            let err = bad.parse::<ItemId>().unwrap_err();
            assert_eq!(
                err.code,
                crate::error::ErrorCode::InvalidArgument,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn ready_key_orders_by_priority_then_age_then_key() {
        let k = |priority, deliver_after_ms, key| ReadyKey {
            priority,
            deliver_after_ms,
            key,
        };
        let mut keys = vec![
            k(5, 1, 1),
            k(-3, 9, 9),
            k(5, 0, 7),
            k(5, 0, 2),
            k(i32::MIN, 100, 100),
        ];
        keys.sort();
        assert_eq!(
            keys,
            vec![
                k(i32::MIN, 100, 100),
                k(-3, 9, 9),
                k(5, 0, 2),
                k(5, 0, 7),
                k(5, 1, 1)
            ]
        );
    }
}
