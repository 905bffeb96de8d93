//! The cluster: which host owns which shard, as told by a pluggable [`ShardManager`].
//!
//! A manager publishes [`ClusterView`]s (live hosts, shard owners) on a watch channel. The
//! daemon follows them: it opens the shards the view gives this host (rebuilding their
//! indexes and checkpoints from MySQL) and stops those it loses, then tells the manager
//! it has let them go ([`ShardManager::released`]) so that it may hand them on.
//!
//! Implementations: [`StaticManager`] (one host owning every shard, or a fixed cluster
//! from the config file) and [`EtcdManager`] (hosts register under an etcd lease; shards
//! follow the live hosts, assigned from their current owners with the fewest moves (see
//! `assign.rs`); fenced by the lease).

mod assign;
mod budget;
mod clock;
pub mod config;
mod etcd;
mod fanout;
pub mod follow;
mod lease;
pub mod primaries;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::watch;

use crate::fence::Fence;
use crate::model::ShardId;

pub use crate::model::{ClusterView, HostAddr, TIER_DEFAULT};
pub use assign::*;
pub use budget::EtcdBudget;
pub use clock::{ClockCheck, ClockSample};
pub use config::{ClusterConfig, ManagerKind, TierConfig};
pub use etcd::{EtcdManager, Member};
pub use fanout::Rings;

/// The pluggable shard-manager client.
pub trait ShardManager: Send + Sync {
    /// "single", "static" or "etcd".
    fn kind(&self) -> &'static str;
    /// The current view, and every change after it.
    fn watch(&self) -> watch::Receiver<Arc<ClusterView>>;
    /// Until when this host may write the shards the view gives it.
    fn fence(&self) -> Fence;
    /// The host has stopped serving `shard` (buffers flushed, worker stopped): another
    /// host may take it now.
    fn released(&self, shard: ShardId);
    /// A replicated shard was paused for a switch of `generation`, or is served on the
    /// primary of `generation` (etcd: acks the switch driver waits for).
    fn report(&self, _shard: ShardId, _generation: u64, _what: Report) {}
    /// Leaves the cluster at shutdown, after every shard was released, so that the others
    /// take its shards at once instead of after the lease expires.
    fn leave(&self) -> BoxFuture<'_, ()>;
}

/// What a host says of a replicated shard (see [`ShardManager::report`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    Paused,
    Served,
}

/// Single host or a fixed cluster: the view never changes and the fence never closes.
pub struct StaticManager {
    kind: &'static str,
    view: watch::Sender<Arc<ClusterView>>,
}

impl StaticManager {
    /// One host owning every shard.
    pub fn single(host_id: &str, addr: &str, tier: &str, shards: &[ShardId]) -> StaticManager {
        let view = ClusterView {
            hosts: BTreeMap::from([(
                host_id.to_string(),
                HostAddr {
                    addr: addr.to_string(),
                    tier: tier.to_string(),
                    region: String::new(),
                },
            )]),
            owners: shards.iter().map(|s| (*s, host_id.to_string())).collect(),
            primaries: BTreeMap::new(),
            withdrawn: Default::default(),
        };
        StaticManager {
            kind: "single",
            view: watch::Sender::new(Arc::new(view)),
        }
    }

    /// The hosts and shards of `[[cluster.hosts]]`.
    pub fn from_config(c: &ClusterConfig) -> StaticManager {
        let mut view = ClusterView::default();
        for h in &c.hosts {
            view.hosts.insert(
                h.id.clone(),
                HostAddr {
                    addr: h.addr.clone(),
                    tier: h.tier.clone(),
                    region: String::new(),
                },
            );
            for s in &h.shards {
                view.owners.insert(*s, h.id.clone());
            }
        }
        StaticManager {
            kind: "static",
            view: watch::Sender::new(Arc::new(view)),
        }
    }
}

impl ShardManager for StaticManager {
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn watch(&self) -> watch::Receiver<Arc<ClusterView>> {
        self.view.subscribe()
    }
    fn fence(&self) -> Fence {
        Fence::open()
    }
    fn released(&self, _shard: ShardId) {}
    fn leave(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_names_owners_and_their_addresses() {
        let m = StaticManager::single("h1", "127.0.0.1:1", "default", &[0, 1]);
        let v = m.watch().borrow().clone();
        assert_eq!(v.shards_of("h1"), vec![0, 1]);
        assert_eq!(v.owner(1), Some(("h1", "127.0.0.1:1")));
        assert_eq!(v.owner(2), None);
    }
}
