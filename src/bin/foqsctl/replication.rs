//! `foqsctl shard switchover|failover`, `foqsctl region drain` and `foqsctl shards`: the
//! replicated shards' admin calls.

use clap::Subcommand;
use foqs::client::SyncClient;
use foqs::thrift_gen::*;
use serde_json::{json, Value};

#[derive(Subcommand)]
pub enum ShardCmd {
    /// Planned switch of the shard's replica set (every shard on its primary) to --to
    /// (HOST:PORT or a mysql:// URL), or to the most caught-up replica in another region.
    Switchover {
        shard: i32,
        #[arg(long)]
        to: Option<String>,
    },
    /// Promote a replica now (the primary is gone). Refused when no semi-synchronous
    /// replica can vouch for every acknowledged item, unless --allow-loss.
    Failover {
        shard: i32,
        #[arg(long)]
        allow_loss: bool,
    },
}

#[derive(Subcommand)]
pub enum RegionCmd {
    /// Move every primary in region FROM to a replica in --to (or any other region).
    Drain {
        from: String,
        #[arg(long)]
        to: Option<String>,
    },
}

fn report_json(r: &SwitchReport) -> Value {
    json!({
        "kind": r.kind, "shards": r.shards, "from": r.from_server, "to": r.to_server,
        "to_region": r.to_region, "generation": r.generation, "ok": r.ok, "error": r.error,
        "pause_ms": r.pause_ms, "read_only_ms": r.read_only_ms, "catchup_ms": r.catchup_ms,
        "lost_transactions": r.lost_transactions,
    })
}

/// Prints each switch (and, for a drain, a last line with the whole drain's time and its
/// longest read-only window); Err when one of them did nothing.
fn print_switches(
    resp: SwitchResponse,
    json_out: bool,
    drain: bool,
    out: &mut dyn FnMut(&str) -> Result<(), String>,
) -> Result<(), String> {
    let switches = resp.switches.unwrap_or_default();
    let mut failed = 0;
    for r in &switches {
        if !r.ok.unwrap_or(false) {
            failed += 1;
        }
        if json_out {
            out(&report_json(r).to_string())?;
        } else {
            let shards = r.shards.clone().unwrap_or_default();
            match r.ok {
                Some(true) => out(&format!(
                    "{} of shards {shards:?}: {} -> {} ({}), generation {}, read-only {} ms (pause {} ms, catch-up {} ms){}",
                    r.kind.as_deref().unwrap_or(""),
                    r.from_server.as_deref().unwrap_or(""),
                    r.to_server.as_deref().unwrap_or(""),
                    r.to_region.as_deref().unwrap_or(""),
                    r.generation.unwrap_or(0),
                    r.read_only_ms.unwrap_or(0),
                    r.pause_ms.unwrap_or(0),
                    r.catchup_ms.unwrap_or(0),
                    r.error.as_deref().map(|e| format!("; note: {e}")).unwrap_or_default(),
                ))?,
                _ => out(&format!(
                    "{} of shards {shards:?} did nothing: {}",
                    r.kind.as_deref().unwrap_or(""),
                    r.error.as_deref().unwrap_or("unknown"),
                ))?,
            }
        }
    }
    if switches.is_empty() && !json_out {
        out("nothing to switch")?;
    }
    if drain {
        let ok = switches.iter().filter(|r| r.ok == Some(true)).count();
        let worst = switches
            .iter()
            .filter(|r| r.ok == Some(true))
            .filter_map(|r| r.read_only_ms)
            .max();
        if json_out {
            out(
                &json!({"drain": true, "sets": switches.len(), "switched": ok,
                "elapsed_ms": resp.elapsed_ms, "read_only_ms_max": worst})
                .to_string(),
            )?;
        } else if !switches.is_empty() {
            out(&format!(
                "drain: {ok} of {} replica sets switched in {} ms (longest read-only window {} ms)",
                switches.len(),
                resp.elapsed_ms.unwrap_or(0),
                worst.unwrap_or(0)
            ))?;
        }
    }
    if failed > 0 {
        return Err(format!(
            "{failed} of {} switches did nothing",
            switches.len()
        ));
    }
    Ok(())
}

pub fn shard(
    c: &mut SyncClient,
    cmd: &ShardCmd,
    json_out: bool,
    out: &mut dyn FnMut(&str) -> Result<(), String>,
    e: impl Fn(thrift::Error) -> String,
) -> Result<(), String> {
    let resp = match cmd {
        ShardCmd::Switchover { shard, to } => c
            .shard_switchover(SwitchoverRequest {
                shard_id: Some(*shard),
                to: to.clone(),
            })
            .map_err(e)?,
        ShardCmd::Failover { shard, allow_loss } => c
            .shard_failover(FailoverRequest {
                shard_id: Some(*shard),
                allow_loss: Some(*allow_loss),
            })
            .map_err(e)?,
    };
    print_switches(resp, json_out, false, out)
}

pub fn region(
    c: &mut SyncClient,
    cmd: &RegionCmd,
    json_out: bool,
    out: &mut dyn FnMut(&str) -> Result<(), String>,
    e: impl Fn(thrift::Error) -> String,
) -> Result<(), String> {
    let RegionCmd::Drain { from, to } = cmd;
    let resp = c
        .region_drain(RegionDrainRequest {
            from_region: Some(from.clone()),
            to_region: to.clone(),
        })
        .map_err(e)?;
    print_switches(resp, json_out, true, out)
}

pub fn shards(
    c: &mut SyncClient,
    json_out: bool,
    out: &mut dyn FnMut(&str) -> Result<(), String>,
    e: impl Fn(thrift::Error) -> String,
) -> Result<(), String> {
    let r = c.get_replication().map_err(e)?;
    for s in r.shards.unwrap_or_default() {
        let replicas: Vec<Value> = s
            .replicas
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|r| json!({"server": r.server, "region": r.region, "reachable": r.reachable,
                "read_only": r.read_only, "lag_transactions": r.lag_transactions, "lag_ms": r.lag_ms,
                "io_running": r.io_running, "sql_running": r.sql_running, "semi_sync": r.semi_sync,
                "error": r.error}))
            .collect();
        if json_out {
            out(&json!({"shard_id": s.shard_id, "primary": s.primary, "primary_region": s.primary_region,
                "generation": s.generation, "state": s.state, "owner": s.owner,
                "primary_reachable": s.primary_reachable, "semi_sync_on": s.semi_sync_on,
                "semi_sync_no_tx": s.semi_sync_no_tx, "replicas": replicas}).to_string())?;
            continue;
        }
        out(&format!(
            "shard {}\tprimary={} ({})\tgeneration={}\tstate={}\towner={}\tsemi_sync={}\tno_tx={}",
            s.shard_id.unwrap_or(-1),
            s.primary.unwrap_or_default(),
            s.primary_region.unwrap_or_default(),
            s.generation.unwrap_or(0),
            s.state.unwrap_or_default(),
            s.owner.unwrap_or_else(|| "-".into()),
            if s.semi_sync_on.unwrap_or(false) {
                "on"
            } else {
                "OFF"
            },
            s.semi_sync_no_tx.unwrap_or(0),
        ))?;
        for r in replicas {
            out(&format!(
                "  replica {} ({})\tlag={} tx {} ms\treplicating={}/{}\tsemi_sync={}\t{}",
                r["server"].as_str().unwrap_or(""),
                r["region"].as_str().unwrap_or(""),
                r["lag_transactions"],
                r["lag_ms"],
                r["io_running"],
                r["sql_running"],
                r["semi_sync"],
                r["error"].as_str().unwrap_or(""),
            ))?;
        }
    }
    Ok(())
}
