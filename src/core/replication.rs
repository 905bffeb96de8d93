//! The replication admin calls (switchover, region drain, failover, status): access
//! checked here, the work done by the [`Switchboard`] the daemon gave the host.

use std::sync::Arc;

use super::{Caller, Host, Kind};
use crate::error::{Error, ErrorCode, Result};
use crate::model::ShardId;
use crate::replication::{Refused, ShardReplication, SwitchReport, Switchboard};

/// Replication calls act on every namespace's shards: under access rules they need
/// "admin" on all of them.
const EVERY_NAMESPACE: &str = "*";

impl Host {
    fn switchboard(&self, caller: &Caller) -> Result<&Arc<dyn Switchboard>> {
        self.allow(caller, EVERY_NAMESPACE, Kind::Admin)?;
        self.switchboard.as_ref().ok_or_else(|| {
            Error::new(
                ErrorCode::InvalidArgument,
                "no shard of this cluster has replicas ([[shards.replicas]] under cluster.manager = \"etcd\")",
            )
        })
    }

    pub async fn shard_switchover(
        &self,
        caller: &Caller,
        shard: ShardId,
        to: Option<String>,
    ) -> Result<Vec<SwitchReport>> {
        self.switchboard(caller)?
            .switchover(shard, to)
            .await
            .map_err(refused)
    }

    pub async fn region_drain(
        &self,
        caller: &Caller,
        from: String,
        to: Option<String>,
    ) -> Result<Vec<SwitchReport>> {
        if from.is_empty() {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                "from_region is empty",
            ));
        }
        self.switchboard(caller)?
            .drain(from, to)
            .await
            .map_err(refused)
    }

    pub async fn shard_failover(
        &self,
        caller: &Caller,
        shard: ShardId,
        allow_loss: bool,
    ) -> Result<Vec<SwitchReport>> {
        self.switchboard(caller)?
            .failover(shard, allow_loss)
            .await
            .map_err(refused)
    }

    pub async fn replication(&self, caller: &Caller) -> Result<Vec<ShardReplication>> {
        Ok(self.switchboard(caller)?.status().await)
    }
}

fn refused(r: Refused) -> Error {
    match r {
        Refused::Invalid(m) => Error::new(ErrorCode::InvalidArgument, m),
        Refused::Unavailable(m) => Error::new(ErrorCode::Unavailable, m),
    }
}
