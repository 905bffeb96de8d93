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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AccessRule;
    use crate::core::Access;
    use crate::replication::{SwitchReport, Switched};
    use futures::future::BoxFuture;

    /// A switchboard that does every switch at once.
    struct Done;

    impl Switchboard for Done {
        fn switchover(&self, shard: ShardId, _: Option<String>) -> BoxFuture<'_, Switched> {
            Box::pin(async move {
                Ok(vec![SwitchReport {
                    shards: vec![shard],
                    ok: true,
                    ..Default::default()
                }])
            })
        }
        fn drain(&self, _: String, _: Option<String>) -> BoxFuture<'_, Switched> {
            Box::pin(async { Err(Refused::Invalid("no such region".into())) })
        }
        fn failover(&self, _: ShardId, _: bool) -> BoxFuture<'_, Switched> {
            Box::pin(async { Err(Refused::Unavailable("busy".into())) })
        }
        fn status(&self) -> BoxFuture<'_, Vec<ShardReplication>> {
            Box::pin(async { Vec::new() })
        }
    }

    fn rule(identity: &str, namespaces: &[&str]) -> AccessRule {
        AccessRule {
            identity: identity.into(),
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            allow: vec![Kind::Admin],
        }
    }

    #[tokio::test]
    async fn replication_calls_need_admin_on_every_namespace() {
        let mut host = Host::detached(std::sync::Arc::new(crate::clock::SystemClock));
        let ops = Caller::new("ops");
        // No replicated shard: a clear refusal, not a hang.
        let none = host.shard_switchover(&ops, 0, None).await.unwrap_err();
        assert_eq!(none.code, ErrorCode::InvalidArgument);
        host.switchboard = Some(Arc::new(Done));
        host.access = Access::new(vec![rule("ops", &["*"]), rule("team", &["billing"])]);
        let done = host.shard_switchover(&ops, 3, None).await.unwrap();
        assert!(done[0].ok && done[0].shards == vec![3]);
        // Admin of one namespace is not admin of the cluster; nobody else is either.
        for who in [Caller::new("team"), Caller::anonymous()] {
            let e = host.shard_switchover(&who, 3, None).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::PermissionDenied, "{e:?}");
            let e = host.replication(&who).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::PermissionDenied, "{e:?}");
        }
        // The switchboard's refusals keep their kind.
        let bad = host
            .region_drain(&ops, "r9".into(), None)
            .await
            .unwrap_err();
        assert_eq!(bad.code, ErrorCode::InvalidArgument);
        let busy = host.shard_failover(&ops, 3, false).await.unwrap_err();
        assert!(busy.code == ErrorCode::Unavailable && busy.retryable);
        let empty = host
            .region_drain(&ops, String::new(), None)
            .await
            .unwrap_err();
        assert_eq!(empty.code, ErrorCode::InvalidArgument);
    }
}
