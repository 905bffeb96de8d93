//! The replication admin methods on the wire: decoding, the call into the host, and the
//! conversion of its reports.

use std::time::Instant;

use thrift::protocol::{TInputProtocol, TOutputProtocol};

use super::convert::split;
use crate::core::{Caller, Host};
use crate::replication::{ShardReplication, SwitchReport};
use crate::thrift_gen as t;

pub(super) enum Call {
    Switchover(t::SwitchoverRequest),
    Drain(t::RegionDrainRequest),
    Failover(t::FailoverRequest),
    Status,
}

pub(super) enum Reply {
    Switchover(t::FoqsShardSwitchoverResult),
    Drain(t::FoqsRegionDrainResult),
    Failover(t::FoqsShardFailoverResult),
    Status(t::FoqsGetReplicationResult),
}

pub(super) const METHODS: [&str; 4] = [
    "shardSwitchover",
    "regionDrain",
    "shardFailover",
    "getReplication",
];

/// The call named `name`, if it is one of these methods.
pub(super) fn decode(name: &str, i: &mut dyn TInputProtocol) -> Option<thrift::Result<Call>> {
    Some(match name {
        "shardSwitchover" => {
            t::FoqsShardSwitchoverArgs::read_from_in_protocol(i).map(|a| Call::Switchover(a.req))
        }
        "regionDrain" => {
            t::FoqsRegionDrainArgs::read_from_in_protocol(i).map(|a| Call::Drain(a.req))
        }
        "shardFailover" => {
            t::FoqsShardFailoverArgs::read_from_in_protocol(i).map(|a| Call::Failover(a.req))
        }
        "getReplication" => {
            t::FoqsGetReplicationArgs::read_from_in_protocol(i).map(|_| Call::Status)
        }
        _ => return None,
    })
}

impl Reply {
    pub(super) fn write(&self, o: &mut dyn TOutputProtocol) -> thrift::Result<()> {
        match self {
            Reply::Switchover(r) => r.write_to_out_protocol(o),
            Reply::Drain(r) => r.write_to_out_protocol(o),
            Reply::Failover(r) => r.write_to_out_protocol(o),
            Reply::Status(r) => r.write_to_out_protocol(o),
        }
    }

    pub(super) fn err(&self) -> Option<&t::FoqsError> {
        match self {
            Reply::Switchover(r) => r.err.as_ref(),
            Reply::Drain(r) => r.err.as_ref(),
            Reply::Failover(r) => r.err.as_ref(),
            Reply::Status(r) => r.err.as_ref(),
        }
    }
}

fn shard_id(id: Option<i32>) -> crate::error::Result<u32> {
    u32::try_from(id.unwrap_or(-1)).map_err(|_| {
        crate::error::Error::new(
            crate::error::ErrorCode::InvalidArgument,
            "shard_id must be >= 0",
        )
    })
}

/// The reports of a switch call that started at `t0`.
fn switched(
    r: crate::error::Result<Vec<SwitchReport>>,
    t0: Instant,
) -> (Option<t::SwitchResponse>, Option<t::FoqsError>) {
    split(r.map(|v| t::SwitchResponse {
        switches: Some(v.into_iter().map(report).collect()),
        elapsed_ms: Some(t0.elapsed().as_millis() as i64),
    }))
}

pub(super) async fn dispatch(host: &Host, caller: &Caller, call: Call) -> Reply {
    let t0 = Instant::now();
    match call {
        Call::Switchover(req) => {
            let r = match shard_id(req.shard_id) {
                Ok(s) => {
                    host.shard_switchover(caller, s, req.to.filter(|t| !t.is_empty()))
                        .await
                }
                Err(e) => Err(e),
            };
            let (result_value, err) = switched(r, t0);
            Reply::Switchover(t::FoqsShardSwitchoverResult { result_value, err })
        }
        Call::Drain(req) => {
            let from = req.from_region.unwrap_or_default();
            let to = req.to_region.filter(|t| !t.is_empty());
            let (result_value, err) = switched(host.region_drain(caller, from, to).await, t0);
            Reply::Drain(t::FoqsRegionDrainResult { result_value, err })
        }
        Call::Failover(req) => {
            let r = match shard_id(req.shard_id) {
                Ok(s) => {
                    host.shard_failover(caller, s, req.allow_loss.unwrap_or(false))
                        .await
                }
                Err(e) => Err(e),
            };
            let (result_value, err) = switched(r, t0);
            Reply::Failover(t::FoqsShardFailoverResult { result_value, err })
        }
        Call::Status => {
            let r = host
                .replication(caller)
                .await
                .map(|v| t::ReplicationResponse {
                    shards: Some(v.into_iter().map(status).collect()),
                });
            let (result_value, err) = split(r);
            Reply::Status(t::FoqsGetReplicationResult { result_value, err })
        }
    }
}

fn report(r: SwitchReport) -> t::SwitchReport {
    t::SwitchReport {
        kind: Some(r.kind),
        shards: Some(r.shards.into_iter().map(|s| s as i32).collect()),
        from_server: Some(r.from),
        to_server: Some(r.to),
        to_region: Some(r.to_region),
        generation: Some(r.generation as i64),
        ok: Some(r.ok),
        error: r.error,
        pause_ms: Some(r.pause_ms as i64),
        read_only_ms: Some(r.read_only_ms as i64),
        catchup_ms: Some(r.catchup_ms as i64),
        lost_transactions: Some(r.lost_transactions as i64),
    }
}

fn status(s: ShardReplication) -> t::ShardReplicationInfo {
    t::ShardReplicationInfo {
        shard_id: Some(s.shard as i32),
        primary: Some(s.primary),
        primary_region: Some(s.primary_region),
        generation: Some(s.generation as i64),
        state: Some(s.state),
        owner: s.owner,
        primary_reachable: Some(s.primary_reachable),
        semi_sync_on: Some(s.semi_sync_on),
        semi_sync_no_tx: Some(s.semi_sync_no_tx),
        replicas: Some(
            s.replicas
                .into_iter()
                .map(|r| t::ReplicaInfo {
                    server: Some(r.addr),
                    region: Some(r.region),
                    reachable: Some(r.reachable),
                    read_only: Some(r.read_only),
                    lag_transactions: r.lag_transactions,
                    lag_ms: r.lag_ms,
                    io_running: Some(r.io_running),
                    sql_running: Some(r.sql_running),
                    semi_sync: Some(r.semi_sync_replica),
                    error: (!r.error.is_empty()).then_some(r.error),
                })
                .collect(),
        ),
    }
}
