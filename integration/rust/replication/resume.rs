//! A planned switch whose driving host dies (kill -9) at each of its steps, held there by
//! a failpoint, and one whose final publish fails: the next driver (the set's leader,
//! once the switch lock's lease lapses) finishes or undoes it with no operator action,
//! as its journal in etcd says: undone before the target caught up, finished after.
//! Load runs through every host meanwhile; nothing acknowledged may be lost.

use std::time::{Duration, Instant};

use serde_json::json;

use super::cluster::{spawn_host_with, Cluster};
use super::common::replicas::Replicas;
use super::common::Etcd;
use super::load::Load;
use super::{toml, Lines};
use foqs::thrift_gen::*;

/// The journal of the set's switch, as etcd holds it (None: no switch under way).
fn journal(etcd: &Etcd, tag: &str) -> Option<serde_json::Value> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([etcd.endpoint.as_str()], None)
            .await
            .ok()?;
        let r = c
            .get(
                format!("/{tag}/switch/"),
                Some(etcd_client::GetOptions::new().with_prefix()),
            )
            .await
            .ok()?;
        let kv = r.kvs().first()?;
        serde_json::from_slice(kv.value()).ok()
    })
}

/// Whether `server` replicates, as the hosts report it.
fn replicating(cluster: &Cluster, server: &str) -> bool {
    cluster
        .replication()
        .iter()
        .flat_map(|s| s.replicas.iter().flatten())
        .any(|x| x.server.as_deref() == Some(server) && x.io_running == Some(true))
}

fn until(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < end, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Each failpoint, whether the driver is killed there (else the step fails once),
/// whether the switch must end finished (the target serves) or undone (the old primary
/// serves again), and whether it is a failover (asked of a primary that answers) rather
/// than a planned switchover.
const CASES: [(&str, bool, bool, bool); 8] = [
    ("switch-paused", true, false, false),
    ("switch-read-only", true, false, false),
    ("switch-caught-up", true, true, false),
    ("switch-promoted", true, true, false),
    ("switch-final-publish-fails", false, true, false),
    ("failover-fenced", true, false, true),
    ("failover-caught-up", true, true, true),
    ("switch-final-publish-fails", false, true, true),
];

pub fn a_switch_whose_driver_stops_at_any_step_is_settled() {
    let r = Replicas::up(1);
    let etcd = Etcd::start();
    let tag = format!("resume{}", std::process::id());
    let config = toml(&r, &etcd, &tag);
    let hosts = (1..=3)
        .map(|n| spawn_host_with(&config, n, None, &[]))
        .collect();
    let mut cluster = Cluster {
        hosts,
        sets: 1,
        config,
    };
    cluster.settled(Duration::from_secs(30));
    let load = Load::start(&cluster.addrs());
    let port = cluster.hosts[0].addr.port();
    let mut lines = Lines;
    let read_only = |addr: &str| r.value(r.number(addr), "SELECT @@global.read_only");
    for (point, kill, finished, failover) in CASES {
        // The driver: host 1, restarted on its port with the failpoint set.
        if cluster.hosts.len() == 3 {
            cluster.hosts.remove(0).sigkill();
        }
        let action = if kill { "return(600000)" } else { "1*return" };
        let fp = format!("{point}={action}");
        let h1 = spawn_host_with(&cluster.config, 1, Some(port), &[("FAILPOINTS", &fp)]);
        cluster.hosts.insert(0, h1);
        let primary = cluster.settled(Duration::from_secs(30)).remove(0);
        let addr = cluster.hosts[0].addr;
        // Asked again while refused (a host just started may not be registered yet);
        // no answer at all once the driver is killed.
        let asked = std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(15);
            loop {
                let mut c = super::client(addr)?;
                let r = if failover {
                    c.shard_failover(FailoverRequest {
                        shard_id: Some(0),
                        allow_loss: None,
                    })
                } else {
                    c.shard_switchover(SwitchoverRequest {
                        shard_id: Some(0),
                        to: None,
                    })
                };
                // A switch refused before it began (its target not ready yet, the
                // lock held by a settle) is asked again too.
                let refused = |resp: &SwitchResponse| {
                    resp.switches.iter().flatten().any(|s| {
                        s.ok == Some(false)
                            && !s
                                .error
                                .as_deref()
                                .unwrap_or("")
                                .contains("could not be told")
                    })
                };
                match r {
                    Ok(resp) if refused(&resp) && Instant::now() < end => {
                        eprintln!("{point}: refused, asking again: {:?}", resp.switches);
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Ok(resp) => return Some(resp),
                    Err(thrift::Error::User(e)) if Instant::now() < end => {
                        eprintln!("{point}: refused, asking again: {e}");
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Err(_) => return None,
                }
            }
        });
        // The driver at the failpoint: what the step before it leaves behind.
        let mut target = String::new();
        if kill {
            until(Duration::from_secs(20), point, || {
                let Some(j) = journal(&etcd, &tag) else {
                    return false;
                };
                target = j["to"].as_str().unwrap_or_default().to_string();
                let r = cluster.replication();
                let state =
                    |st: &str| !r.is_empty() && r.iter().all(|s| s.state.as_deref() == Some(st));
                match point {
                    "switch-paused" => state("paused") && j["step"] == "pausing",
                    "failover-fenced" => state("fenced") && j["step"] == "fencing",
                    "switch-read-only" => {
                        j["step"] == "read_only" && read_only(&primary).as_deref() == Some("1")
                    }
                    "switch-caught-up" | "failover-caught-up" => j["step"] == "promoting",
                    _ => j["step"] == "promoting" && read_only(&target).as_deref() == Some("0"),
                }
            });
            // A moment for the step to end (the failpoint follows it at once).
            std::thread::sleep(Duration::from_millis(100));
            // Out of the cluster until the next case starts it again.
            cluster.hosts.remove(0).sigkill();
            assert!(
                asked.join().unwrap().is_none(),
                "{point}: the killed driver answered"
            );
        } else {
            let resp = asked.join().unwrap().expect("switchover answered");
            let s = &resp.switches.unwrap()[0];
            assert_eq!(s.ok, Some(false), "{point}: {s:?}");
            assert!(
                s.error
                    .as_deref()
                    .unwrap_or("")
                    .contains("etcd could not be told"),
                "{point}: {s:?}"
            );
            target = s.to_server.clone().unwrap();
        }
        let t0 = Instant::now();
        if failover && finished {
            // A primary failed over while it still took writes may hold commits that
            // were waiting for an acknowledgement when its replicas stopped receiving
            // (binlogged, never acknowledged): it cannot rejoin by itself, and the
            // docs/replication.md's step for it is a restart as a replica, which drops them.
            until(Duration::from_secs(30), "the failover settled", || {
                journal(&etcd, &tag).is_none()
            });
            let rejoined = (0..50).any(|_| {
                std::thread::sleep(Duration::from_millis(100));
                replicating(&cluster, &primary)
            });
            if !rejoined {
                r.rejoin(r.number(&primary), r.number(&target));
                lines.push(json!({"rejoined_by_restart": primary}));
            }
        }
        // Settled by the next driver: every shard served on one primary again, the
        // journal gone.
        let now = cluster.settled(Duration::from_secs(30)).remove(0);
        until(Duration::from_secs(10), "the journal ends", || {
            journal(&etcd, &tag).is_none()
        });
        let settled_ms = t0.elapsed().as_millis() as u64;
        let expected = if finished { &target } else { &primary };
        assert_eq!(&now, expected, "{point}: finished {finished}");
        // Exactly one writable server: the one etcd names.
        for n in r.set_servers(0) {
            let want = if r.addr(n) == now { "0" } else { "1" };
            assert_eq!(
                read_only(&r.addr(n)).as_deref(),
                Some(want),
                "{point}: server {n}"
            );
        }
        lines.push(
            json!({"driver_stopped_at": point, "killed": kill, "failover": failover,
            "settled": if finished { "finished" } else { "undone" },
            "from": primary, "primary": now, "settled_ms": settled_ms}),
        );
    }
    let (ledger, lost) = load.finish(Duration::from_secs(30));
    lines.push(
        json!({"acknowledged": ledger.acknowledged.len(), "lost": lost,
        "delivered_after_ack": ledger.delivered_after_ack,
        "overlapping_leases": ledger.overlapping_leases}),
    );
    assert!(ledger.acknowledged.len() > 50, "too little load");
    assert_eq!(lost, 0);
    assert_eq!(ledger.delivered_after_ack, 0);
    assert_eq!(ledger.overlapping_leases, 0);
}
