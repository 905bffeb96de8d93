//! The region drill: replica sets of three real MariaDB servers each (one server per
//! region, semi-synchronous, through `scripts/replicas.sh --sets`; the sets' primaries
//! start in r1, r2, r3 in turn), a private etcd, three real `foqsd` processes (one per
//! region), producers and consumers through every host and a checker that records every
//! acknowledged enqueue and ack; then planned switchovers of every set, region drains
//! that gather every primary into r1 and move them all at once to r2 and back, a drain
//! one set refuses (its target lags) while the others switch, a kill -9 of one set's
//! primary while another set is drained, a kill -9 of a foqsd host during a drain, and a
//! SIGSTOP/SIGCONT of a primary. Nothing acknowledged may be lost, no call answered with
//! an error may have applied, nothing delivered after a successful ack, no two leases of
//! one item overlap, no server holds an errant GTID, and every set's servers converge.
//!
//! The short form (the test suite's) runs two sets; `FOQS_DRILL=long`
//! (`scripts/region-drill.sh`) three sets, nine servers, ten switchovers and longer load;
//! `FOQS_DRILL_NEGATIVE=1` adds the negative control (semi-sync off, the replicas' IO
//! threads stopped, a forced failover: the checker must see loss).

#[path = "replication/cluster.rs"]
mod cluster;
mod common;
#[path = "replication/load.rs"]
mod load;
#[path = "replication/resume.rs"]
mod resume;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cluster::{
    any_starved, converged, drain, percentile, spawn_host, switch_line, Cluster, Lines,
    STARVED_RETRIES,
};
use common::replicas::Replicas;
use common::{now_ms, Etcd};
use foqs::client::{connect, Protocol, SyncClient};
use foqs::thrift_gen::*;
use load::Load;
use serde_json::json;

/// Shards per replica set (shard s is on set s / SHARDS_PER_SET).
const SHARDS_PER_SET: u32 = 2;
const NS: &str = "drill";
const TOPICS: usize = 4;
const LEASE_MS: i64 = 5000;
/// The namespace whose quota must hold across the switches (its budget is in etcd).
const QUOTA_NS: &str = "q";
const QUOTA_PER_MINUTE: u64 = 600;
/// `replication.lag_max_ms` (the default): a target further behind is refused.
const LAG_MAX_MS: i64 = 2000;

fn toml(r: &Replicas, etcd: &Etcd, tag: &str) -> PathBuf {
    let mut t = format!(
        "[engine]\nstore_timeout_ms = 1000\nscan_interval_ms = 50\ncheckpoint_interval_ms = 200\n\
         [defaults]\nlease_ms = {LEASE_MS}\n\
         [[namespaces]]\nname = \"{NS}\"\n[[namespaces]]\nname = \"{QUOTA_NS}\"\nenqueues_per_minute = {QUOTA_PER_MINUTE}\nquota_burst_ms = 1000\n\
         [cluster]\nmanager = \"etcd\"\npeer_secret = \"foqs-test-peer-secret\"\npeer_poll_ms = 100\n\
         [cluster.etcd]\nendpoints = [\"{}\"]\nprefix = \"/{tag}\"\nlease_ttl_ms = 3000\npoll_ms = 100\n\
         [replication]\nadmin_user = \"foqs_admin\"\nadmin_password = \"foqs_admin\"\nfailover_after_ms = 1500\nprobe_interval_ms = 200\nlag_max_ms = {LAG_MAX_MS}\n",
        etcd.endpoint
    );
    // Every server requires TLS: the shards' data, owner-lock and heartbeat connections,
    // the admin's (the shards' settings), and the replication channels.
    let ca = r.certs.join("ca.pem").display().to_string();
    t += &format!("repl_ssl_ca = \"{ca}\"\n");
    let tls = format!("tls = {{ ca_file = \"{ca}\" }}\n");
    for k in 0..r.sets {
        let [p, a, b] = r.set_servers(k);
        for j in 0..SHARDS_PER_SET {
            let s = k as u32 * SHARDS_PER_SET + j;
            let url = |n: u16| format!("mysql://foqs:foqs@{}/foqs_{tag}_{s}", r.addr(n));
            t += &format!(
                "[[shards]]\nid = {s}\nurl = \"{}\"\nregion = \"{}\"\n{tls}replicas = [{{ url = \"{}\", region = \"{}\" }}, {{ url = \"{}\", region = \"{}\" }}]\n",
                url(p),
                r.region(p),
                url(a),
                r.region(a),
                url(b),
                r.region(b)
            );
        }
    }
    // In the replicas' folder: removed with them.
    let path = r.dir.join(format!("foqs-{tag}.toml"));
    std::fs::write(&path, t).unwrap();
    path
}

fn client(addr: SocketAddr) -> Option<SyncClient> {
    connect(addr, Protocol::Binary, Duration::from_secs(10)).ok()
}

/// The tests of this file start their own servers and hosts: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_switch_whose_driver_stops_at_any_step_is_finished_or_undone() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    resume::a_switch_whose_driver_stops_at_any_step_is_settled();
}

#[test]
fn region_drill_loses_nothing_acknowledged() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let long = std::env::var("FOQS_DRILL").as_deref() == Ok("long");
    let sets: u16 = if long { 3 } else { 2 };
    let r = Replicas::up(sets);
    let etcd = Etcd::start();
    let tag = format!("drill{}", std::process::id());
    let config = toml(&r, &etcd, &tag);
    let hosts = (1..=3).map(|n| spawn_host(&config, n, None)).collect();
    let mut cluster = Cluster {
        hosts,
        sets,
        config,
    };
    let mut primaries = cluster.settled(Duration::from_secs(30));
    let set_of = |addr: &str| r.set_of(r.number(addr)) as usize;
    let region_of = |addr: &str| r.region(r.number(addr));
    let load = Load::start(&cluster.addrs());
    // At-most-once items while shards move only by plan (the switchovers and drains
    // below): the strict checker.
    let amo = load::AmoLoad::start(&cluster.addrs());
    let load_started = Instant::now();
    let pause = Duration::from_millis(if long { 1500 } else { 700 });
    std::thread::sleep(pause);
    // Read-only windows of every planned switch, and the whole time of every drain that
    // moved every set at once.
    let mut planned = Vec::new();
    let mut all_set_drains = Vec::new();
    let mut lines = Lines;
    // Planned switchovers of every set in turn, each to the most caught-up replica
    // outside its region.
    let switches = if long { 10 } else { 4 };
    for i in 0..switches {
        let k = (i % sets as usize) as u32;
        let shard = k * SHARDS_PER_SET + (i / sets as usize) as u32 % SHARDS_PER_SET;
        let t0 = Instant::now();
        let mut resp = None;
        for _ in 0..=STARVED_RETRIES {
            let r = cluster
                .admin(i)
                .shard_switchover(SwitchoverRequest {
                    shard_id: Some(shard as i32),
                    to: None,
                })
                .expect("shardSwitchover");
            let starved = any_starved(r.switches.as_deref().unwrap_or_default());
            if starved {
                for s in r.switches.iter().flatten() {
                    lines.push(switch_line(s, 0));
                }
            }
            resp = Some(r);
            if !starved {
                break;
            }
        }
        let resp = resp.unwrap();
        std::thread::sleep(pause);
        for s in resp.switches.unwrap_or_default() {
            assert_eq!(s.ok, Some(true), "switchover failed: {s:?}");
            planned.push(s.read_only_ms.unwrap_or(0) as u64);
            lines.push(switch_line(&s, load.gap_ms(t0, Instant::now(), Some(k))));
            let to = s.to_server.clone().unwrap();
            let k = set_of(&to);
            primaries[k] = to;
        }
    }
    // Region drains: every primary gathered into r1, then all of them at once to r2 and
    // back.
    for (from, to, all) in [
        ("r2", "r1", false),
        ("r3", "r1", false),
        ("r1", "r2", true),
        ("r2", "r1", true),
    ] {
        let expect = primaries.iter().filter(|p| region_of(p) == from).count();
        if all {
            assert_eq!(
                expect, sets as usize,
                "every primary in {from}: {primaries:?}"
            );
        }
        let resp = drain(&cluster, 1, from, to, &mut lines);
        std::thread::sleep(pause);
        let switches = resp.switches.unwrap_or_default();
        assert_eq!(switches.len(), expect, "sets to drain out of {from}");
        for s in &switches {
            assert_eq!(s.ok, Some(true), "drain {from} -> {to} failed: {s:?}");
            assert_eq!(s.to_region.as_deref(), Some(to));
            planned.push(s.read_only_ms.unwrap_or(0) as u64);
            let to = s.to_server.clone().unwrap();
            let k = set_of(&to);
            primaries[k] = to;
        }
        if all {
            // The whole drain, timed by the host that ran it: at least its longest switch.
            let elapsed = resp.elapsed_ms.expect("a drain's elapsed_ms") as u64;
            let longest = switches.iter().filter_map(|s| s.read_only_ms).max();
            assert!(
                longest.is_some_and(|l| elapsed >= l as u64),
                "drain {from} -> {to}: elapsed {elapsed} ms against read-only {longest:?}"
            );
            all_set_drains.push(elapsed);
        }
    }
    let moves = planned.len();
    let (amo_acknowledged, amo_received, amo_missing, amo_lost_replies) =
        amo.finish(Duration::from_secs(30));
    lines.push(json!({"at_most_once": true, "planned_set_switches": moves,
        "acknowledged": amo_acknowledged, "received": amo_received,
        "missing": amo_missing.len(), "dequeue_replies_lost": amo_lost_replies,
        "missing_first": amo_missing.iter().take(5).collect::<Vec<_>>()}));
    assert!(
        moves >= 8 && amo_acknowledged > 100,
        "too little to mean anything: {moves} switches, {amo_acknowledged} at-most-once items"
    );
    assert!(
        amo_missing.is_empty(),
        "at-most-once items acknowledged, never received, gone across {moves} planned switches \
         ({amo_lost_replies} dequeue replies lost): {:?}",
        amo_missing.iter().take(10).collect::<Vec<_>>()
    );
    // A drain one set refuses: set 1's replica in r2 applies 4 s late (MASTER_DELAY), so
    // it lags past lag_max_ms; the other sets switch all the same, and the refusal names
    // the set and why.
    let laggard = r.set_servers(1)[..]
        .iter()
        .copied()
        .find(|n| r.region(*n) == "r2")
        .unwrap();
    let laggard_addr = r.addr(laggard);
    r.query(
        laggard,
        "STOP SLAVE; CHANGE MASTER TO MASTER_DELAY = 4; START SLAVE",
    )
    .expect("delay set 1's replica in r2");
    let end = Instant::now() + Duration::from_secs(20);
    while cluster
        .lag_ms(&laggard_addr)
        .is_none_or(|l| l <= LAG_MAX_MS + 500)
    {
        assert!(Instant::now() < end, "{laggard_addr} never lagged");
        std::thread::sleep(Duration::from_millis(100));
    }
    let resp = drain(&cluster, 2, "r1", "r2", &mut lines);
    let switches = resp.switches.unwrap_or_default();
    assert_eq!(switches.len(), sets as usize, "{switches:?}");
    for s in &switches {
        let set = s.shards.as_ref().unwrap()[0] as u32 / SHARDS_PER_SET;
        if set == 1 {
            assert_eq!(
                s.ok,
                Some(false),
                "set 1 switched to a lagging target: {s:?}"
            );
            let e = s.error.clone().unwrap_or_default();
            assert!(
                e.contains(&laggard_addr) && e.contains("lag"),
                "the refusal says which target and why: {e}"
            );
        } else {
            assert_eq!(
                s.ok,
                Some(true),
                "set {set} was stopped by set 1's refusal: {s:?}"
            );
            planned.push(s.read_only_ms.unwrap_or(0) as u64);
            let to = s.to_server.clone().unwrap();
            let k = set_of(&to);
            primaries[k] = to;
        }
    }
    r.query(
        laggard,
        "STOP SLAVE; CHANGE MASTER TO MASTER_DELAY = 0; START SLAVE",
    )
    .expect("undelay");
    primaries = cluster.settled(Duration::from_secs(30));
    std::thread::sleep(pause);
    // Overlapping: a kill -9 of set 0's primary while the region of set 1's primary is
    // drained; the monitor fails set 0 over by itself, the drain switches set 1 (and set
    // 0 too, or refuses it, if its dead primary is in that region).
    let victim = r.number(&primaries[0]);
    let drained = region_of(&primaries[1]);
    let away = if drained == "r3" { "r1" } else { "r3" };
    let t0 = Instant::now();
    r.kill(victim);
    let resp = drain(&cluster, 0, &drained, away, &mut lines);
    for s in resp.switches.unwrap_or_default() {
        let set = s.shards.as_ref().unwrap()[0] as u32 / SHARDS_PER_SET;
        if set != 0 {
            assert_eq!(
                s.ok,
                Some(true),
                "set {set}'s drain beside a failover: {s:?}"
            );
            planned.push(s.read_only_ms.unwrap_or(0) as u64);
        }
    }
    let dead = primaries[0].clone();
    primaries = cluster.settled_without(&dead, Duration::from_secs(30));
    let kill_outage = load.gap_ms(t0, Instant::now(), Some(0));
    lines.push(
        json!({"switch": "failover", "cause": "kill -9", "set": 0, "from": dead,
        "to": primaries[0], "during_drain_of": drained, "client_gap_ms": kill_outage}),
    );
    r.start(victim);
    primaries = cluster.settled(Duration::from_secs(30));
    std::thread::sleep(pause);
    // A foqsd host killed (kill -9) during a drain: its shards' switch may be undone (its
    // owner never pauses) or done; either way nothing is lost, and the host comes back.
    let from = region_of(&primaries[0]);
    let to = if from == "r2" { "r3" } else { "r2" };
    let killer = {
        let mut c = cluster.admin(0);
        let (from, to) = (from.clone(), to.to_string());
        std::thread::spawn(move || {
            c.region_drain(RegionDrainRequest {
                from_region: Some(from),
                to_region: Some(to),
            })
        })
    };
    std::thread::sleep(Duration::from_millis(30));
    let port = cluster.hosts[2].addr.port();
    cluster.hosts[2].sigkill();
    let resp = killer
        .join()
        .unwrap()
        .expect("regionDrain beside a host's kill -9");
    for s in resp.switches.clone().unwrap_or_default() {
        lines.push(json!({"drain_beside_host_kill": switch_line(&s, 0)}));
        if s.ok == Some(true) {
            planned.push(s.read_only_ms.unwrap_or(0) as u64);
        }
    }
    cluster.hosts[2] = spawn_host(&cluster.config, 3, Some(port));
    primaries = cluster.settled(Duration::from_secs(30));
    std::thread::sleep(pause);
    // Unplanned: SIGSTOP; once replaced, SIGCONT: the old primary must take no write.
    let frozen_set = (1 % sets) as usize;
    let frozen = r.number(&primaries[frozen_set]);
    let old = primaries[frozen_set].clone();
    let t0 = Instant::now();
    r.freeze(frozen);
    primaries = cluster.settled_without(&old, Duration::from_secs(30));
    let stop_outage = load.gap_ms(t0, Instant::now(), Some(frozen_set as u32));
    r.thaw(frozen);
    // What it did after it resumed, from its own binlog and counters, at once and two
    // seconds later: transactions under its own server id (its binlog may otherwise grow
    // by replication, once the monitor has made it a replica of the new primary; its
    // statement counters grow with the replication's applier too). A statement that was in its sockets when it froze runs when it
    // resumes (nothing can stop it first: its thread wakes before any admin connection
    // is through its handshake); it is then held by semi-sync (AFTER_SYNC: binlogged,
    // not committed) waiting for an acknowledgement no replica gives, never visible, and
    // the rejoin drops it.
    let own_seq = || {
        let state = r.value(frozen, "SELECT @@global.gtid_binlog_state")?;
        state.split(',').find_map(|g| {
            let mut p = g.trim().split('-');
            let (d, id, seq) = (p.next()?, p.next()?, p.next()?);
            (d == "0" && id == frozen.to_string())
                .then(|| seq.parse::<u64>().ok())
                .flatten()
        })
    };
    let at_resume = r.value(frozen, "SELECT @@global.gtid_binlog_pos");
    let own_at_resume = own_seq();
    std::thread::sleep(Duration::from_secs(2));
    let later = r.value(frozen, "SELECT @@global.gtid_binlog_pos");
    let stuck: u64 = r
        .value(frozen, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE LIKE '%semi-sync%' OR STATE = 'Commit'")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let own_after_resume = own_seq()
        .unwrap_or(0)
        .saturating_sub(own_at_resume.unwrap_or(0));
    // Written after it resumed and not held waiting for an acknowledgement: committed.
    let wrote_after_resume = own_after_resume > stuck;
    lines.push(
        json!({"switch": "failover", "cause": "SIGSTOP", "set": frozen_set, "from": old,
        "to": primaries[frozen_set], "client_gap_ms": stop_outage, "binlog_at_resume": at_resume,
        "binlog_2s_later": later, "commits_stuck_waiting_for_ack": stuck,
        "own_transactions_after_resume": own_after_resume}),
    );
    // Its commits that were waiting for an acknowledgement when it froze are dropped by
    // a restart as a replica (init_rpl_role = SLAVE).
    r.rejoin(frozen, r.number(&primaries[frozen_set]));
    primaries = cluster.settled(Duration::from_secs(30));
    std::thread::sleep(pause);
    let failed_calls = load.failed_calls.load(Ordering::Relaxed);
    let quota_secs = load_started.elapsed().as_secs_f64();
    let (ledger, lost) = load.finish(Duration::from_secs(if long { 60 } else { 40 }));
    let primary_ns: Vec<u16> = primaries.iter().map(|p| r.number(p)).collect();
    let (same, errant) = converged(&r, &primary_ns, &tag);
    let stored = |id: &str| {
        let (shard, key) = id.split_once(':').unwrap();
        let set = load::set_of_id(id) as usize;
        r.value(
            primary_ns[set],
            &format!("SELECT COUNT(*) FROM foqs_{tag}_{shard}.items WHERE id = {key}"),
        )
        .as_deref()
            != Some("0")
    };
    // An item whose ack failed and that never came back must be gone from storage (the
    // ack took effect); one still stored is stuck: counted as lost. One whose ack was
    // answered with an error and that is gone was applied: its answer was wrong.
    let unknown: Vec<&String> = ledger
        .ack_unknown
        .iter()
        .filter(|p| !ledger.acked.contains(*p))
        .collect();
    // An answer that says its outcome is unknown (a forwarded call whose peer died after
    // it was sent, unresolved: see src/core/in_doubt.rs) is not a wrong answer; it is
    // counted apart, and only the rest must be 0.
    let in_doubt = |why: &str| why.contains("outcome_unknown: Some(true)");
    let mut stuck_after_failed_ack = 0u64;
    let mut error_but_applied = 0u64;
    let mut in_doubt_applied = 0u64;
    for pl in &unknown {
        let Some(id) = ledger.acknowledged.get(*pl) else {
            continue;
        };
        if stored(id) {
            stuck_after_failed_ack += 1;
        } else if let Some((why, at)) = ledger.ack_refused.get(*pl) {
            println!("ack of {pl} ({id}) answered {why} at {at}, but the item is gone");
            if in_doubt(why) {
                in_doubt_applied += 1;
            } else {
                error_but_applied += 1;
            }
        }
    }
    let mut enqueue_error_but_stored = 0u64;
    for (pl, (why, at)) in &ledger.enqueue_refused {
        if ledger.delivered.contains(pl) {
            println!("enqueue of {pl} answered {why} at {at}, but it was delivered");
            if in_doubt(why) {
                in_doubt_applied += 1;
            } else {
                enqueue_error_but_stored += 1;
            }
        }
    }
    let lost = lost + stuck_after_failed_ack;
    let no_tx: i64 = (1..=3 * sets)
        .map(|n| r.status(n, "Rpl_semi_sync_master_no_tx"))
        .sum();
    let summary = json!({
        "summary": if long { "long" } else { "short" }, "sets": sets,
        "acknowledged": ledger.acknowledged.len(), "acked": ledger.acked.len(),
        "deliveries": ledger.deliveries, "lost": lost,
        "delivered_after_ack": ledger.delivered_after_ack,
        "overlapping_leases": ledger.overlapping_leases,
        "answered_error_but_applied": error_but_applied + enqueue_error_but_stored,
        "answered_outcome_unknown_and_applied": in_doubt_applied,
        "planned_switches": planned.len(),
        "read_only_ms_p50": percentile(planned.clone(), 0.5),
        "read_only_ms_max": planned.iter().max(),
        "all_set_drain_ms": all_set_drains,
        "starved_refusals": cluster::STARVED.load(Ordering::Relaxed),
        "kill9_client_gap_ms": kill_outage, "sigstop_client_gap_ms": stop_outage,
        "rpl_semi_sync_master_no_tx": no_tx, "errant_gtids": errant.len(),
        "converged": same, "wrote_after_resume": wrote_after_resume,
        "failed_calls": failed_calls,
        "ack_failed_and_gone": unknown.len() as u64 - stuck_after_failed_ack,
        "ack_errors": ledger.ack_errors,
        "quota_admitted": ledger.quota_admitted,
        "quota_allowed": quota_allowed(quota_secs),
    });
    println!("{summary}");
    // What became of the items lost, as every server of their set holds them (for the
    // failure message).
    for (pl, id) in ledger
        .acknowledged
        .iter()
        .filter(|(p, _)| !ledger.acked.contains(*p) && !ledger.ack_unknown.contains(*p))
        .take(10)
    {
        let (shard, key) = id.split_once(':').unwrap();
        let set = load::set_of_id(id) as u16;
        let rows: Vec<_> = r
            .set_servers(set)
            .iter()
            .map(|n| {
                r.value(*n, &format!("SELECT CONCAT_WS(' ', state, delivery_count, lease_expires_ms, next_event_ms) FROM foqs_{tag}_{shard}.items WHERE id = {key}"))
            })
            .collect();
        println!(
            "lost {pl} {id}: last lease {:?}; set {set}'s servers {:?} (primary {}) hold {rows:?}",
            ledger.leased.get(pl),
            r.set_servers(set),
            primary_ns[set as usize]
        );
    }
    assert!(
        (ledger.quota_admitted as f64) <= quota_allowed(quota_secs) * 1.1 + 5.0,
        "the quota did not hold across the switches: {summary}"
    );
    assert!(
        ledger.acknowledged.len() > 500,
        "too little load to mean anything: {summary}"
    );
    assert_eq!(lost, 0, "acknowledged items lost: {summary}");
    assert_eq!(
        error_but_applied + enqueue_error_but_stored,
        0,
        "a call answered with an error had applied: {summary}"
    );
    assert_eq!(ledger.delivered_after_ack, 0, "{summary}");
    assert_eq!(ledger.overlapping_leases, 0, "{summary}");
    assert!(errant.is_empty(), "errant GTIDs {errant:?}: {summary}");
    assert!(same, "the servers did not converge: {summary}");
    assert_eq!(no_tx, 0, "a commit fell back to asynchronous: {summary}");
    assert!(
        !wrote_after_resume,
        "the frozen primary committed a write after it resumed: {summary}"
    );
    assert!(
        percentile(planned, 1.0) < 2000,
        "a planned switch was read-only too long: {summary}"
    );
    if std::env::var("FOQS_DRILL_NEGATIVE").as_deref() == Ok("1") {
        negative_control(&r, &cluster, &primaries[0]);
    }
}

/// The checker can see loss: with semi-sync off on set 0 and its replicas' IO threads
/// stopped, its primary's acknowledged items are on it alone; a forced failover after its
/// kill -9 must show them lost.
fn negative_control(r: &Replicas, cluster: &Cluster, primary: &str) {
    let p = r.number(primary);
    // The replicas first: the primary's owner turns semi-sync back on whenever a replica
    // could acknowledge, and then every commit would wait (nothing acknowledged, nothing
    // to lose).
    for n in r.set_servers(0).into_iter().filter(|n| *n != p) {
        r.query(
            n,
            "STOP SLAVE IO_THREAD; SET GLOBAL rpl_semi_sync_slave_enabled = OFF",
        )
        .expect("IO thread stopped");
    }
    // And the primary's side off until it stays off for longer than the owner's
    // housekeeping cycle (1 s): a cycle that read the replicas before they stopped may
    // still turn it back on once.
    let end = Instant::now() + Duration::from_secs(10);
    let mut off_since = None;
    loop {
        let on = r
            .query(p, "SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_status'")
            .is_some_and(|rows| rows.iter().any(|l| l.ends_with("ON")));
        if on || off_since.is_none() {
            r.query(p, "SET GLOBAL rpl_semi_sync_master_enabled = OFF")
                .expect("semi-sync off");
            off_since = (!on).then(Instant::now).or(off_since.filter(|_| !on));
        }
        if off_since.is_some_and(|t| t.elapsed() > Duration::from_millis(1500)) {
            break;
        }
        assert!(
            Instant::now() < end,
            "the primary's semi-sync kept coming back on"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let load = Load::start(&cluster.addrs());
    // What is enqueued now stays pending: consumed at once (before the kill), an item the
    // new primary lacks is never missed (the control saw no loss twice for that).
    load.hold_consumers(true);
    // Both kept so through the load too: foqsd heals what the control breaks (an owner's
    // housekeeping, held up by a busy machine, can turn the primary's semi-sync back on
    // from a look taken before the replicas stopped, or a replica's IO thread be started
    // again), and then nothing acknowledged is lost (the control failed once, under two
    // busy loops, with "no loss" and no transaction missing on the new primary).
    let keep_off = std::sync::atomic::AtomicBool::new(true);
    let replicas: Vec<u16> = r.set_servers(0).into_iter().filter(|n| *n != p).collect();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while keep_off.load(Ordering::Relaxed) {
                let on = r
                    .query(p, "SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_status'")
                    .is_some_and(|rows| rows.iter().any(|l| l.ends_with("ON")));
                if on {
                    let _ = r.query(p, "SET GLOBAL rpl_semi_sync_master_enabled = OFF");
                }
                for n in &replicas {
                    let _ = r.query(*n, "STOP SLAVE IO_THREAD");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        std::thread::sleep(Duration::from_secs(2));
        keep_off.store(false, Ordering::Relaxed);
    });
    r.kill(p);
    // The monitor refuses: no semi-synchronous replica can vouch for what was acknowledged.
    std::thread::sleep(Duration::from_millis(2500));
    let refused = cluster
        .replication()
        .iter()
        .filter(|s| s.shard_id.unwrap_or(0) < SHARDS_PER_SET as i32)
        .all(|s| s.primary.as_deref() == Some(primary));
    // (Retried while the monitor's own attempt holds the set's switch lock.)
    let mut tries = 0;
    let resp = loop {
        let r = cluster.admin(tries).shard_failover(FailoverRequest {
            shard_id: Some(0),
            allow_loss: Some(true),
        });
        let busy = |resp: &SwitchResponse| {
            resp.switches.iter().flatten().any(|s| {
                s.ok != Some(true) && s.error.as_deref().is_some_and(|e| e.contains("under way"))
            })
        };
        match r {
            Ok(resp) if busy(&resp) && tries < 20 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(300));
            }
            Ok(resp) => break resp,
            Err(e) if tries < 20 => {
                eprintln!("shardFailover: {e}; again");
                tries += 1;
                std::thread::sleep(Duration::from_millis(300));
            }
            Err(e) => panic!("shardFailover --allow-loss: {e}"),
        }
    };
    let report = resp.switches.unwrap_or_default().pop().expect("a report");
    cluster.settled_without(primary, Duration::from_secs(30));
    load.hold_consumers(false);
    let (ledger, lost) = load.finish(Duration::from_secs(15));
    let line = json!({"negative_control": true, "refused_without_allow_loss": refused,
        "acknowledged": ledger.acknowledged.len(), "lost": lost,
        "lost_transactions": report.lost_transactions, "failover": switch_line(&report, 0)});
    println!("{line}");
    assert!(
        refused,
        "the monitor promoted an asynchronous replica by itself: {line}"
    );
    assert!(
        lost > 0,
        "the checker saw no loss where there must be some: {line}"
    );
}

/// The quota's burst (one second of its rate, as configured) plus its rate over `secs`.
fn quota_allowed(secs: f64) -> f64 {
    let rate = foqs::quota::Rate {
        per_minute: QUOTA_PER_MINUTE,
        burst_ms: 1000,
    };
    rate.burst() + QUOTA_PER_MINUTE as f64 / 60.0 * secs
}
