//! `foqs-sim --etcd`: the followers' protocol over a simulated etcd, on a simulated clock.
//!
//! Each host runs the real planning code of the etcd follower (`foqs::cluster::follow`:
//! the [`Cache`] its watch keeps, and [`Ownership::plan`], which decides what it lost,
//! takes up, gives back and tries to take, from the real assignment) and the follower's
//! protocol around it as `cluster/etcd/` runs it: a lease renewed every poll, one watch
//! of the cluster's range applied in order, a plan 20 ms after a batch of events, and
//! none until the cache shows the host's own last write; a key created only if absent,
//! deleted only under the host's lease, and only after the host stopped serving its shard
//! (`release_ms`). The simulated etcd keeps revisions and leases and delivers each write
//! to every watching host after a delay drawn from the seed (per host in order). Nothing
//! reads the machine's clock: a seed replays exactly.
//!
//! Events drawn from the seed: a host joins, leaves (revokes its lease), crashes (its
//! lease lapses one TTL after its last renewal), or is cut from etcd (a partition: no
//! renewals, no events; it stops serving at its fence, TTL - `fence_margin_ms` after its
//! last renewal, and comes back as a new member two TTLs later); the operator drains a
//! region (its replica sets switched to another region 4 at a time, each set's shards'
//! owner region moving at its pause, as the primaries' records in etcd say) or adds
//! shards (their records written, then each host learning the longer list within 2 s:
//! foqsd reads its shard list at start, so this is what a tier would do if its hosts
//! learned of new shards without a restart; a rolling restart is leaves and joins).
//! Hosts and replica sets are spread over `--regions` regions.
//!
//! After each event the simulation runs until every shard is served by exactly one host
//! of its group (`cluster::region_groups`: its region's hosts, or any when its region has
//! none), the loads within one in each group and the operator done (or 60 simulated
//! seconds pass after the operator's last write), and prints one JSON line: the time that
//! took (from the event, and after the operator's last write), the longest a shard went
//! unserved, the moments a shard was served by two hosts (must be 0), etcd's requests
//! (the operator's apart too), the watch events it sent (in all and per host), the plans
//! one host made, whole reads, the shards moved and the hand-overs (keys created, interim
//! moves included) against the fewest the event needed (`balance.rs`).

mod balance;
mod counters;
mod operator;
mod world;

use serde_json::json;

use balance::moves_needed;
use counters::Counters;
use world::{Ev, Sim};

pub struct Params {
    pub hosts: usize,
    pub shards: usize,
    pub seed: u64,
    pub events: usize,
    pub ttl_ms: u64,
    pub poll_ms: u64,
    /// The most a watch event takes to reach a host (drawn from 1 ms to this).
    pub watch_delay_max_ms: u64,
    /// Regions hosts and primaries are drawn from (1 to 3; 1: no primaries' records).
    pub regions: usize,
    /// Shards per replica set: what a drain switches together.
    pub set_shards: usize,
}

pub fn run(p: Params) {
    let mut sim = Sim::new(p);
    let mut start = Counters::default();
    for _ in 0..sim.p.hosts {
        sim.join(false);
    }
    let mut worst = serde_json::Map::new();
    let mut report = |kind: &str,
                      sim: &Sim,
                      took: Option<u64>,
                      before: &Counters,
                      moved: usize,
                      ideal: usize| {
        let live = sim.hosts.iter().filter(|h| h.up).count().max(1) as u64;
        // After the operator's last write (a drain's last switch, the last host to learn
        // of added shards); for other events, the same as `settled_ms`.
        let after_operator = took.map(|t| sim.now - (sim.now - t).max(sim.quiet_since));
        let line = json!({"kind": kind, "hosts": live, "shards": sim.shards.len(),
            "settled_ms": took,
            "settled_after_operator_ms": after_operator,
            "longest_unserved_ms": sim.gap_max,
            "double_served": sim.c.double_served - before.double_served,
            "etcd_requests": sim.c.requests - before.requests,
            "operator_requests": sim.c.operator_requests - before.operator_requests,
            "check_requests": sim.c.check_requests - before.check_requests,
            "creates_taken": sim.c.creates_taken - before.creates_taken,
            "taken": sim.c.taken - before.taken,
            "plans_per_host": (sim.c.plans - before.plans) / live,
            "watch_events": sim.c.watch_events - before.watch_events,
            "watch_events_per_host": (sim.c.watch_events - before.watch_events) / live,
            "whole_reads": sim.c.whole_reads - before.whole_reads,
            "moved": moved, "ideal": ideal});
        println!("{line}");
        let w = worst
            .entry(kind.to_string())
            .or_insert(json!({"settled_ms_max": 0, "ratio_max": 0.0, "events": 0}));
        let settled = took.unwrap_or(u64::MAX);
        w["settled_ms_max"] = json!(w["settled_ms_max"].as_u64().unwrap_or(0).max(settled));
        let ratio = moved as f64 / ideal.max(1) as f64;
        w["ratio_max"] = json!(w["ratio_max"]
            .as_f64()
            .unwrap_or(0.0)
            .max((ratio * 1000.0).round() / 1000.0));
        // Hand-overs (keys created) against the least: interim moves show here.
        let taken = (sim.c.taken - before.taken) as f64 / ideal.max(1) as f64;
        w["taken_ratio_max"] = json!(w["taken_ratio_max"]
            .as_f64()
            .unwrap_or(0.0)
            .max((taken * 1000.0).round() / 1000.0));
        w["events"] = json!(w["events"].as_u64().unwrap_or(0) + 1);
        let per_host = (sim.c.watch_events - before.watch_events) / live;
        let requests = sim.c.requests - before.requests;
        for (k, v) in [
            ("watch_events_per_host_max", per_host),
            ("etcd_requests_max", requests),
            (
                "operator_requests_max",
                sim.c.operator_requests - before.operator_requests,
            ),
            (
                "check_requests_max",
                sim.c.check_requests - before.check_requests,
            ),
            (
                "event_requests_max",
                requests
                    - (sim.c.operator_requests - before.operator_requests)
                    - (sim.c.check_requests - before.check_requests),
            ),
            ("moved_max", moved as u64),
            ("taken_max", sim.c.taken - before.taken),
            ("plans_per_host_max", (sim.c.plans - before.plans) / live),
            ("ideal_max", ideal as u64),
            ("longest_unserved_ms_max", sim.gap_max),
            (
                "settled_after_operator_ms_max",
                after_operator.unwrap_or(u64::MAX),
            ),
        ] {
            w[k] = json!(w[k].as_u64().unwrap_or(0).max(v));
        }
    };
    let took = sim.run_until_settled();
    report("join all", &sim, took, &start, 0, 0);
    let mut deck = Vec::new();
    for _ in 0..sim.p.events {
        start = sim.c;
        sim.gap_max = 0;
        let before = sim.owners();
        let live: Vec<usize> = (0..sim.hosts.len()).filter(|i| sim.hosts[*i].up).collect();
        let drain = sim.drain_pick();
        // A tier that shrank by two takes a join without drawing a card.
        let kind = if live.len() <= sim.p.hosts.saturating_sub(2).max(2) {
            "join"
        } else {
            match deal(&mut deck, &mut sim) {
                // One region, or none other with hosts: nothing to drain.
                "drain" if drain.is_none() => "add shards",
                k => k,
            }
        };
        let victim = live[sim.rng.below(live.len())];
        let cut_at = sim.now;
        // The regions once the event is through (a drain moves them set by set).
        let mut drained = None;
        match kind {
            "join" => {
                sim.join(true);
            }
            "leave" => {
                // Stops serving, then revokes its lease (its keys go at once).
                sim.change(victim, |sim| {
                    let h = &mut sim.hosts[victim];
                    h.up = false;
                    h.own.held.clear();
                    h.own.releasing.clear();
                });
                if let Some(l) = sim.hosts[victim].lease.take() {
                    sim.c.requests += 1;
                    sim.drop_lease(l);
                }
            }
            "crash" => {
                sim.change(victim, |sim| sim.hosts[victim].up = false);
                if let Some(l) = sim.hosts[victim].lease.take() {
                    let expiry = sim.leases.get(&l).map_or(sim.now, |e| e.1);
                    sim.at(expiry, Ev::Expire(l));
                }
            }
            "drain" => {
                let (from, to) = drain.expect("picked");
                drained = Some(sim.drain(from, to));
            }
            "add shards" => sim.add_shards((sim.shards.len() / 20).max(1)),
            _ => {
                // Cut from etcd: serves what it holds until its fence, then nothing; comes
                // back as a new member (a new lease) two TTLs later.
                let ttl = sim.p.ttl_ms;
                let h = &mut sim.hosts[victim];
                h.up = false;
                h.cut = true;
                let fence = h.last_renewal + ttl - ttl / 10;
                if let Some(l) = h.lease.take() {
                    let expiry = sim.leases.get(&l).map_or(sim.now, |e| e.1);
                    sim.at(expiry, Ev::Expire(l));
                }
                sim.at(fence.max(sim.now), Ev::Fenced(victim));
            }
        };
        // The least any assignment could move for this event: from the owners before it
        // to a balance of the tier after it.
        let regions = drained.unwrap_or_else(|| sim.regions.clone());
        let ideal = moves_needed(&sim.shards, &sim.live(), &before, &regions).unwrap_or(0);
        let took = sim.run_until_settled();
        let moved = moved_since(&sim, &before);
        report(kind, &sim, took, &start, moved, ideal);
        // A partitioned host comes back, as a new member, two TTLs after it was cut.
        if kind == "partition" {
            let heal = sim.now.max(cut_at + 2 * sim.p.ttl_ms);
            sim.advance_to(heal);
            let mark = sim.c;
            sim.gap_max = 0;
            let before = sim.owners();
            sim.step(Ev::Heal(victim));
            let ideal = moves_needed(&sim.shards, &sim.live(), &before, &sim.regions).unwrap_or(0);
            let took = sim.run_until_settled();
            let moved = moved_since(&sim, &before);
            report("partition healed", &sim, took, &mark, moved, ideal);
        }
    }
    println!(
        "{}",
        json!({"summary": true, "etcd": true, "seed": sim.p.seed, "hosts": sim.p.hosts,
            "shards": sim.p.shards, "ttl_ms": sim.p.ttl_ms, "poll_ms": sim.p.poll_ms,
            "watch_delay_max_ms": sim.p.watch_delay_max_ms, "regions": sim.p.regions,
            "set_shards": sim.p.set_shards, "drain_parallel": operator::DRAIN_PARALLEL,
            "reconfigure_spread_ms": operator::RECONFIGURE_SPREAD_MS,
            "double_served": sim.c.double_served, "by_kind": worst})
    );
}

/// Shards whose owner is not the one in `before`, new shards placed included.
fn moved_since(
    sim: &Sim,
    before: &std::collections::BTreeMap<foqs::model::ShardId, usize>,
) -> usize {
    sim.owners()
        .iter()
        .filter(|(s, h)| before.get(*s).is_none_or(|b| b != *h))
        .count()
}

/// The kinds of event, one deck: dealt in an order shuffled by the seed, a new deck when
/// one runs out, so every kind comes up in every 20 events.
const DECK: [(&str, usize); 6] = [
    ("join", 6),
    ("leave", 4),
    ("crash", 4),
    ("partition", 2),
    ("drain", 2),
    ("add shards", 2),
];

fn deal(deck: &mut Vec<&'static str>, sim: &mut Sim) -> &'static str {
    if deck.is_empty() {
        for (kind, n) in DECK {
            deck.extend(std::iter::repeat_n(kind, n));
        }
        // Fisher-Yates, on the simulation's generator.
        for i in (1..deck.len()).rev() {
            let j = sim.rng.below(i + 1);
            deck.swap(i, j);
        }
    }
    deck.pop().expect("a full deck")
}
