//! What the etcd follower writes for one shard outside reconciling: the acks of shards it
//! paused or serves (under its lease), and the deletion of the key of a shard it let go
//! (only while the key is still under its lease; one that fails is tried again every
//! poll).

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::Follower;
use crate::cluster::primaries::{self, Ack};
use crate::cluster::Report;
use crate::model::ShardId;

impl Follower {
    /// Puts the ack of a paused or served shard under this host's lease.
    pub(super) async fn report(&mut self, (s, generation, what): (ShardId, u64, Report)) {
        let Some(lease) = self.lease.as_ref().map(|l| l.id) else {
            return;
        };
        if !self.own.held.contains(&s) {
            return;
        }
        let dir = match what {
            Report::Paused => "paused",
            Report::Served => "served",
        };
        let a = Ack {
            generation,
            host: self.member.host_id.clone(),
        };
        if let Err(e) = primaries::ack(&mut self.client, &self.prefix, dir, s, &a, lease).await {
            tracing::warn!(shard = s, error = %e, "etcd: cannot say the shard is {dir}");
        }
    }

    /// The host stopped serving `s`: delete its key (only if still ours) so that its new
    /// owner can take it.
    pub(super) async fn give_back(&mut self, s: ShardId) {
        if !self.own.releasing.remove(&s) || !self.own.held.remove(&s) {
            return;
        }
        self.delete_key(s).await;
    }

    /// Deletes `s`'s key if it is still under this host's lease. One that fails is tried
    /// again every poll (`undeleted`): the host let the shard go, and while its lease
    /// lives nobody else would delete the key. (Before, it stayed; and taken up again as
    /// a key of ours not held, moved on, it was never released again: the view did not
    /// change, so the host was not told.)
    pub(super) async fn delete_key(&mut self, s: ShardId) {
        let Some(lease) = &self.lease else {
            self.own.undeleted.remove(&s);
            return;
        };
        let key = self.shard_key(s);
        let txn = Txn::new()
            .when([Compare::lease(key.clone(), CompareOp::Equal, lease.id)])
            .and_then([TxnOp::delete(key, None)]);
        match self.client.txn(txn).await {
            Ok(r) => {
                self.own.undeleted.remove(&s);
                if r.succeeded() {
                    self.wrote(super::seen_after(&r));
                    tracing::info!(shard = s, "handed shard over");
                }
            }
            Err(e) => {
                self.own.undeleted.insert(s);
                tracing::warn!(shard = s, error = %e, "etcd: cannot delete shard key; trying again");
            }
        }
    }
}
