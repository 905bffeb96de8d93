//! The drill's cluster: its foqsd hosts, what they say of the replica sets, the waits for
//! a settled cluster, region drains, and the checks of the servers' convergence.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use foqs::client::SyncClient;
use foqs::thrift_gen::*;
use serde_json::json;

use super::common::replicas::Replicas;
use super::common::{now_ms, Proc};
use super::{client, SHARDS_PER_SET};

pub struct Cluster {
    pub hosts: Vec<Proc>,
    pub sets: u16,
    pub config: PathBuf,
}

pub fn spawn_host(config: &Path, n: usize, port: Option<u16>) -> Proc {
    spawn_host_with(config, n, port, &[])
}

/// [`spawn_host`], with `extra` in its environment.
pub fn spawn_host_with(config: &Path, n: usize, port: Option<u16>, extra: &[(&str, &str)]) -> Proc {
    let env = [
        ("FOQS__SERVER__HOST_ID", format!("h{n}")),
        ("FOQS__CLUSTER__REGION", format!("r{n}")),
    ];
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.extend_from_slice(extra);
    match port {
        Some(p) => Proc::spawn_on(config, p, &env),
        None => Proc::spawn(config, &env),
    }
}

impl Cluster {
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.hosts.iter().map(|p| p.addr).collect()
    }

    /// The replication status, asked of any host that answers.
    pub fn replication(&self) -> Vec<ShardReplicationInfo> {
        for a in self.addrs() {
            if let Some(mut c) = client(a) {
                if let Ok(r) = c.get_replication() {
                    return r.shards.unwrap_or_default();
                }
            }
        }
        Vec::new()
    }

    /// Each set's primary, when every shard is served on its set's one primary by an
    /// owner (and, with `replicating`, every replica replicates).
    pub fn primaries(&self, r: &[ShardReplicationInfo], replicating: bool) -> Option<Vec<String>> {
        if r.len() != (self.sets as u32 * SHARDS_PER_SET) as usize {
            return None;
        }
        let mut by_set: Vec<Option<String>> = vec![None; self.sets as usize];
        for s in r {
            let set = (s.shard_id? as u32 / SHARDS_PER_SET) as usize;
            let p = s.primary.clone()?;
            let serving = s.state.as_deref() == Some("serving") && s.owner.is_some();
            let running = s
                .replicas
                .iter()
                .flatten()
                .all(|x| x.io_running == Some(true) && x.sql_running == Some(true));
            if !serving || (replicating && !running) {
                return None;
            }
            match &by_set[set] {
                None => by_set[set] = Some(p),
                Some(q) if *q == p => {}
                Some(_) => return None,
            }
        }
        by_set.into_iter().collect()
    }

    /// Every shard served by exactly one host, as the hosts themselves say (`getHostInfo`:
    /// opened, not only owned in etcd).
    pub fn served_once(&self) -> bool {
        let mut served = Vec::new();
        for a in self.addrs() {
            let Some(info) = client(a).and_then(|mut c| c.get_host_info().ok()) else {
                return false;
            };
            served.extend(
                info.shards
                    .unwrap_or_default()
                    .iter()
                    .filter(|s| s.state.as_deref() == Some("serving"))
                    .filter_map(|s| s.shard_id),
            );
        }
        served.sort();
        served == (0..(self.sets as u32 * SHARDS_PER_SET) as i32).collect::<Vec<_>>()
    }

    /// Waits until every set is served on one primary, every replica replicating, and
    /// every shard opened by one host; returns each set's primary.
    pub fn settled(&self, within: Duration) -> Vec<String> {
        let end = Instant::now() + within;
        loop {
            let r = self.replication();
            if let Some(p) = self.primaries(&r, true).filter(|_| self.served_once()) {
                return p;
            }
            assert!(Instant::now() < end, "the cluster did not settle: {r:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every shard is served again, none on `old`; returns each set's primary.
    pub fn settled_without(&self, old: &str, within: Duration) -> Vec<String> {
        let end = Instant::now() + within;
        loop {
            let r = self.replication();
            if let Some(p) = self
                .primaries(&r, false)
                .filter(|p| !p.iter().any(|x| x == old))
            {
                return p;
            }
            assert!(Instant::now() < end, "no failover away from {old}: {r:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn admin(&self, i: usize) -> SyncClient {
        let addrs = self.addrs();
        client(addrs[i % addrs.len()]).expect("connect for an admin call")
    }

    /// Lag of `server` as the hosts report it, in ms.
    pub fn lag_ms(&self, server: &str) -> Option<i64> {
        self.replication()
            .iter()
            .flat_map(|s| s.replicas.iter().flatten())
            .find(|x| x.server.as_deref() == Some(server))
            .and_then(|x| x.lag_ms)
    }
}

pub fn switch_line(r: &SwitchReport, gap_ms: u64) -> serde_json::Value {
    json!({"switch": r.kind, "shards": r.shards, "from": r.from_server, "to": r.to_server,
        "to_region": r.to_region, "generation": r.generation, "ok": r.ok, "error": r.error,
        "pause_ms": r.pause_ms, "read_only_ms": r.read_only_ms, "catchup_ms": r.catchup_ms,
        "client_gap_ms": gap_ms})
}

pub fn percentile(mut v: Vec<u64>, p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The tables of set k's shards.
pub fn tables(k: u16, tag: &str) -> String {
    (0..SHARDS_PER_SET)
        .map(|j| format!("foqs_{tag}_{}.items", k as u32 * SHARDS_PER_SET + j))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Waits until each set's primary's binlog position is its every server's, then compares
/// the set's shards' tables; returns (converged, errant GTIDs).
pub fn converged(r: &Replicas, primaries: &[u16], tag: &str) -> (bool, Vec<String>) {
    let mut same = true;
    let mut errant = Vec::new();
    for (k, &primary) in primaries.iter().enumerate() {
        let servers = r.set_servers(k as u16);
        let end = Instant::now() + Duration::from_secs(20);
        let pos = |n| r.value(n, "SELECT @@global.gtid_binlog_pos");
        // The last transaction's sequence number (domain 0): the primary's heartbeat
        // writes on, so each server must reach what the primary had when read first.
        let seq = |n| {
            pos(n).and_then(|p: String| p.rsplit('-').next().and_then(|s| s.parse::<u64>().ok()))
        };
        loop {
            let p = seq(primary);
            if p.is_some() && servers.iter().all(|n| seq(*n) >= p) {
                break;
            }
            if Instant::now() > end {
                same = false;
                errant.push(format!(
                    "set {k}: positions differ: {:?}",
                    servers.iter().map(|n| pos(*n)).collect::<Vec<_>>()
                ));
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let sums = |n| r.query(n, &format!("CHECKSUM TABLE {}", tables(k as u16, tag)));
        let first = sums(primary);
        same &= first.is_some() && servers.iter().all(|n| sums(*n) == first);
        let state = |n| {
            r.value(n, "SELECT @@global.gtid_binlog_state")
                .unwrap_or_default()
        };
        errant.extend(
            servers
                .iter()
                .filter(|n| **n != primary)
                .flat_map(|n| foqs::replication::server::errant(&state(*n), &state(primary))),
        );
    }
    (same, errant)
}

/// Whether a switch was refused before it changed anything because its target could not
/// come close while the primary took writes (a starved replica): an operator asks again.
pub fn refused_as_starved(r: &SwitchReport) -> bool {
    r.ok != Some(true)
        && r.error
            .as_deref()
            .is_some_and(|e| e.contains("nothing was paused"))
}

/// How many times a switch refused as starved is asked again (as an operator would).
pub const STARVED_RETRIES: usize = 10;

/// Switches refused as starved over the run (the summary's `starved_refusals`).
pub static STARVED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether any of `reports` was refused as starved, counted in [`STARVED`].
pub fn any_starved(reports: &[SwitchReport]) -> bool {
    let n = reports.iter().filter(|r| refused_as_starved(r)).count();
    STARVED.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    n > 0
}

/// A region drain through host `via`, with the JSON line of each set's switch and one of
/// the whole drain. Sets refused as starved ([`refused_as_starved`]) are drained again
/// (the same call moves only what is still in `from`), up to [`STARVED_RETRIES`] times;
/// the answer holds each set's last report, and `elapsed_ms` the calls' sum.
pub fn drain(
    cluster: &Cluster,
    via: usize,
    from: &str,
    to: &str,
    lines: &mut Lines,
) -> SwitchResponse {
    let mut merged: Option<SwitchResponse> = None;
    for attempt in 0..=STARVED_RETRIES {
        let resp = cluster
            .admin(via)
            .region_drain(RegionDrainRequest {
                from_region: Some(from.into()),
                to_region: Some(to.into()),
            })
            .expect("regionDrain");
        let switches = resp.switches.clone().unwrap_or_default();
        for s in &switches {
            lines.push(switch_line(s, 0));
        }
        lines.push(
            json!({"drain": from, "to": to, "sets": switches.len(), "attempt": attempt,
            "switched": switches.iter().filter(|s| s.ok == Some(true)).count(),
            "elapsed_ms": resp.elapsed_ms,
            "read_only_ms_max": switches.iter().filter_map(|s| s.read_only_ms).max()}),
        );
        let again = any_starved(&switches);
        merged = Some(match merged {
            None => resp,
            Some(mut m) => {
                let mut all = m.switches.take().unwrap_or_default();
                for s in switches {
                    match all.iter_mut().find(|x| x.shards == s.shards) {
                        Some(x) => *x = s,
                        None => all.push(s),
                    }
                }
                m.switches = Some(all);
                m.elapsed_ms = Some(m.elapsed_ms.unwrap_or(0) + resp.elapsed_ms.unwrap_or(0));
                m
            }
        });
        if !again {
            break;
        }
    }
    merged.expect("at least one drain")
}

/// The drill's JSON lines, printed as they come (a failure shows how far it got).
pub struct Lines;

impl Lines {
    pub fn push(&mut self, mut l: serde_json::Value) {
        l["at_ms"] = json!(now_ms());
        println!("{l}");
    }
}
