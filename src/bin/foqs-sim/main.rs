//! `foqs-sim`: a seeded, deterministic simulation of a tier's shard ownership at any size,
//! on the real assignment function (`foqs::cluster::assign_regional_from`, what every etcd
//! host computes from the hosts, primaries and shard owners it watches; here the owners
//! are the last event's assignment). No timing from the machine: what it counts is decided
//! by the seed alone.
//!
//! ```text
//! cargo run --release --bin foqs-sim -- --hosts 1000 --shards 10000 --seed 1 [--events 40]
//! ```
//!
//! `--stateless` runs the assignment foqsd had before (`assign_regional_with_slack`:
//! rendezvous hashing with bounded loads from the host list alone; `--slack-percent P`,
//! default 25) for comparison.
//!
//! Events drawn from the seed: a host joins, leaves, crashes (its lease lapses: for the
//! assignment, the same as a leave), a region is drained (the primaries of a region's
//! shards move to another region, so those shards go to hosts there), shards are added.
//! For each event it prints one JSON line:
//! - `moved`: shards whose owner changed; `ideal`: the fewest any assignment could move
//!   for that event (a join: the new host's fair share, `shards / hosts`; a leave or
//!   crash: what the host held; a drain: the shards whose region changed; added shards:
//!   how many); `ratio` = moved / ideal;
//! - `max_load` / `min_load`: the most and fewest shards a host holds after it;
//! - `scores_per_host`: the host-and-shard scores one host computes to recompute the
//!   assignment after the event (from the current owners: one per host for each shard
//!   that had to be placed, i.e. moved; stateless: every shard against every host),
//!   on every change it watches (every host does).
//!
//! - `polls_out_max` / `polls_in_max`: the most peers a host polls, and the most hosts that
//!   poll one host, per `cluster.peer_poll_ms`, on the real fan-out (`foqs::cluster::Rings`,
//!   `--fanout K`, default `cluster.peer_fanout`'s; all-to-all was hosts - 1 each);
//!   `poll_sets_changed`: the hosts whose polled set the event changed. A routed dequeue
//!   asks at most the polled peers of the tier (`polls_out_max`).
//!
//! The summary line gives, per kind of event, the worst and mean ratio, the worst
//! balance and the worst polling figures.
//!
//! `--etcd [--ttl-ms 10000] [--poll-ms 1000] [--watch-delay-ms 20] [--set-shards 10]`
//! runs instead the followers' protocol over a simulated etcd on a simulated clock, each
//! host on the real planning code (see `etcd/mod.rs`), with the same kinds of events (a
//! drain switching replica sets of `--set-shards` shards, 4 at a time): per event, the
//! time until every shard is served by one host again, moments with two, etcd's requests
//! and watch events. Not simulated: the routed dequeue's timing.

mod etcd;

use std::collections::{BTreeMap, BTreeSet};

use foqs::cluster::{assign_regional_from, assign_regional_with_slack, Rings, SLACK};
use foqs::model::HostAddr;
use foqs::model::ShardId;
use foqs::seeded::Rng;
use serde_json::json;

const ALL_REGIONS: [&str; 3] = ["r1", "r2", "r3"];

struct Tier {
    /// The regions hosts and primaries are drawn from (1 to 3).
    regions_used: usize,
    /// (host, region), in join order.
    hosts: Vec<(String, &'static str)>,
    shards: Vec<ShardId>,
    /// Each shard's primary region.
    regions: BTreeMap<ShardId, &'static str>,
    next_host: usize,
    /// `Some(slack)`: the stateless assignment (`--stateless`).
    stateless: Option<f64>,
}

impl Tier {
    fn new(hosts: usize, shards: usize, regions: usize, rng: &mut Rng) -> Tier {
        let mut t = Tier {
            regions_used: regions,
            hosts: Vec::new(),
            shards: Vec::new(),
            regions: BTreeMap::new(),
            next_host: 0,
            stateless: None,
        };
        for _ in 0..hosts {
            t.join(rng);
        }
        t.add_shards(shards, rng);
        t
    }

    fn join(&mut self, rng: &mut Rng) {
        let name = format!("host-{:05}", self.next_host);
        self.next_host += 1;
        self.hosts
            .push((name, ALL_REGIONS[rng.below(self.regions_used)]));
    }

    fn add_shards(&mut self, n: usize, rng: &mut Rng) {
        let first = self.shards.len() as ShardId;
        for s in first..first + n as ShardId {
            self.shards.push(s);
            self.regions
                .insert(s, ALL_REGIONS[rng.below(self.regions_used)]);
        }
    }

    /// The assignment after an event, from the owners before it.
    fn assignment(&self, owners: &BTreeMap<ShardId, String>) -> BTreeMap<ShardId, String> {
        let hosts: Vec<(&str, &str)> = self.hosts.iter().map(|(h, r)| (h.as_str(), *r)).collect();
        let plan = match self.stateless {
            Some(slack) => assign_regional_with_slack(&self.shards, &hosts, &self.regions, slack),
            None => {
                let current = owners.iter().map(|(s, h)| (*s, h.as_str())).collect();
                assign_regional_from(&self.shards, &hosts, &self.regions, &current)
            }
        };
        plan.into_iter().map(|(s, h)| (s, h.to_string())).collect()
    }
}

fn loads(a: &BTreeMap<ShardId, String>, tier: &Tier) -> (usize, usize) {
    let mut n: BTreeMap<&str, usize> = tier.hosts.iter().map(|(h, _)| (h.as_str(), 0)).collect();
    for h in a.values() {
        *n.entry(h.as_str()).or_default() += 1;
    }
    let max = n.values().copied().max().unwrap_or(0);
    let min = n.values().copied().min().unwrap_or(0);
    (max, min)
}

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| usage(&format!("{name} takes a number, not {v:?}")))
        })
        .unwrap_or(default)
}

fn usage(why: &str) -> ! {
    eprintln!("foqs-sim: {why}\nusage: foqs-sim --hosts N --shards S [--seed X] [--events E] [--regions 1-3] [--stateless [--slack-percent P]]");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    for a in args.iter().filter(|a| a.starts_with("--")) {
        if ![
            "--hosts",
            "--shards",
            "--seed",
            "--events",
            "--slack-percent",
            "--regions",
            "--stateless",
            "--fanout",
            "--etcd",
            "--ttl-ms",
            "--poll-ms",
            "--watch-delay-ms",
            "--set-shards",
        ]
        .contains(&a.as_str())
        {
            usage(&format!("unknown option {a}"));
        }
    }
    let hosts = arg(&args, "--hosts", 3) as usize;
    let shards = arg(&args, "--shards", 10 * hosts as u64) as usize;
    let seed = arg(&args, "--seed", 1);
    let events = arg(&args, "--events", 40) as usize;
    // The stateless assignment's slack in per cent (default: `cluster::SLACK`).
    let slack = args
        .iter()
        .position(|a| a == "--slack-percent")
        .map_or(SLACK, |_| arg(&args, "--slack-percent", 0) as f64 / 100.0);
    let stateless = args.iter().any(|a| a == "--stateless");
    let fanout = arg(
        &args,
        "--fanout",
        foqs::cluster::config::PEER_FANOUT_DEFAULT as u64,
    ) as usize;
    if hosts < 2 || shards == 0 {
        usage("at least 2 hosts and 1 shard");
    }
    if args.iter().any(|a| a == "--etcd") {
        etcd::run(etcd::Params {
            hosts,
            shards,
            seed,
            events,
            ttl_ms: arg(&args, "--ttl-ms", 10_000),
            poll_ms: arg(&args, "--poll-ms", 1_000),
            watch_delay_max_ms: arg(&args, "--watch-delay-ms", 20).max(1),
            regions: (arg(&args, "--regions", 3) as usize).clamp(1, ALL_REGIONS.len()),
            set_shards: arg(&args, "--set-shards", 10).max(1) as usize,
        });
        return;
    }
    let mut rng = Rng::new(seed);
    let regions = (arg(&args, "--regions", 3) as usize).clamp(1, ALL_REGIONS.len());
    let mut tier = Tier::new(hosts, shards, regions, &mut rng);
    tier.stateless = stateless.then_some(slack);
    let mut before = tier.assignment(&BTreeMap::new());
    // kind -> (worst ratio, sum of ratios, count)
    let mut by_kind: BTreeMap<&str, (f64, f64, usize)> = BTreeMap::new();
    let mut worst_spread = 0usize;
    let mut max_scores = 0usize;
    let mut polling = polling(&tier, fanout, &BTreeMap::new());
    let (mut polls_out_max, mut polls_in_max, mut changed_max) = (0usize, 0usize, 0usize);
    for n in 0..events {
        // Keep the tier near its size: joins when it shrank, leaves or crashes when it grew.
        let size = tier.hosts.len();
        let roll = rng.below(100);
        let kind = match roll {
            _ if size <= hosts.saturating_sub(2).max(2) => "join",
            0..=29 => "join",
            30..=54 => "leave",
            55..=79 => "crash",
            80..=92 => "drain",
            _ => "add_shards",
        };
        let kind = match kind {
            "leave" | "crash" if size <= 2 => "join",
            // One region: nothing to drain.
            "drain" if tier.regions_used == 1 => "add_shards",
            k => k,
        };
        let hosts_before = tier.hosts.len();
        let ideal = match kind {
            "join" => {
                tier.join(&mut rng);
                // Its fair share: of its region's shards among its region's hosts (region
                // affinity keeps shards in their primary's region).
                let (_, region) = tier.hosts.last().expect("just joined");
                let shards = tier.regions.values().filter(|r| *r == region).count();
                let peers = tier.hosts.iter().filter(|(_, r)| r == region).count();
                (shards as f64 / peers as f64).max(1.0)
            }
            "leave" | "crash" => {
                let i = rng.below(tier.hosts.len());
                let (gone, _) = tier.hosts.remove(i);
                before.values().filter(|h| **h == gone).count().max(1) as f64
            }
            "drain" => {
                let used = &ALL_REGIONS[..tier.regions_used];
                let from = used[rng.below(used.len())];
                let to = used
                    .iter()
                    .copied()
                    .filter(|r| *r != from)
                    .nth(rng.below(used.len() - 1))
                    .expect("another region");
                let mut changed = 0usize;
                for r in tier.regions.values_mut() {
                    if *r == from {
                        *r = to;
                        changed += 1;
                    }
                }
                changed.max(1) as f64
            }
            _ => {
                let k = (tier.shards.len() / 20).max(1);
                tier.add_shards(k, &mut rng);
                k as f64
            }
        };
        let after = tier.assignment(&before);
        let scores = |moved: usize| match tier.stateless {
            Some(_) => tier.shards.len() * tier.hosts.len(),
            None => moved * tier.hosts.len(),
        };
        let moved = after
            .iter()
            .filter(|(s, h)| before.get(*s).is_some_and(|b| b != *h))
            .count()
            + after.keys().filter(|s| !before.contains_key(s)).count();
        let (max, min) = loads(&after, &tier);
        worst_spread = worst_spread.max(max - min);
        max_scores = max_scores.max(scores(moved));
        let now_polling = self::polling(&tier, fanout, &polling.sets);
        polls_out_max = polls_out_max.max(now_polling.out_max);
        polls_in_max = polls_in_max.max(now_polling.in_max);
        changed_max = changed_max.max(now_polling.changed);
        let ratio = moved as f64 / ideal;
        let e = by_kind.entry(kind).or_insert((0.0, 0.0, 0));
        e.0 = e.0.max(ratio);
        e.1 += ratio;
        e.2 += 1;
        println!(
            "{}",
            json!({"event": n, "kind": kind, "hosts_before": hosts_before,
                "hosts": tier.hosts.len(), "shards": tier.shards.len(), "moved": moved,
                "ideal": ideal.round(), "ratio": (ratio * 1000.0).round() / 1000.0,
                "max_load": max, "min_load": min,
                "scores_per_host": scores(moved),
                "polls_out_max": now_polling.out_max, "polls_in_max": now_polling.in_max,
                "poll_sets_changed": now_polling.changed})
        );
        before = after;
        polling = now_polling;
    }
    let kinds: BTreeMap<&str, serde_json::Value> = by_kind
        .iter()
        .map(|(k, (worst, sum, n))| {
            (
                *k,
                json!({"events": n, "worst_ratio": (worst * 1000.0).round() / 1000.0,
                    "mean_ratio": (sum / *n as f64 * 1000.0).round() / 1000.0}),
            )
        })
        .collect();
    println!(
        "{}",
        json!({"summary": true, "seed": seed, "hosts": hosts, "shards": shards,
            "assignment": if stateless { format!("stateless, slack {}", (slack * 100.0).round()) } else { "from the current owners".to_string() },
            "regions": regions,
            "events": events, "by_kind": kinds, "worst_load_spread": worst_spread,
            "scores_per_host_per_event_max": max_scores,
            "fanout": fanout, "polls_out_max": polls_out_max, "polls_in_max": polls_in_max,
            "poll_sets_changed_max": changed_max})
    );
}

/// Who polls whom in a tier, on the real fan-out.
struct Polling {
    /// Each host's polled set.
    sets: BTreeMap<String, BTreeSet<String>>,
    out_max: usize,
    in_max: usize,
    /// Hosts (there before and after) whose polled set differs from `before`'s.
    changed: usize,
}

fn polling(tier: &Tier, fanout: usize, before: &BTreeMap<String, BTreeSet<String>>) -> Polling {
    let hosts: BTreeMap<String, HostAddr> = tier
        .hosts
        .iter()
        .map(|(id, region)| {
            (
                id.clone(),
                HostAddr {
                    addr: String::new(),
                    tier: foqs::model::TIER_DEFAULT.to_string(),
                    region: region.to_string(),
                },
            )
        })
        .collect();
    let rings = Rings::new(&hosts);
    let sets: BTreeMap<String, BTreeSet<String>> = hosts
        .keys()
        .map(|id| (id.clone(), rings.polled(id, fanout)))
        .collect();
    let mut polled_by: BTreeMap<&str, usize> = BTreeMap::new();
    for set in sets.values() {
        for p in set {
            *polled_by.entry(p.as_str()).or_default() += 1;
        }
    }
    let changed = sets
        .iter()
        .filter(|(id, s)| before.get(*id).is_some_and(|b| b != *s))
        .count();
    Polling {
        out_max: sets.values().map(BTreeSet::len).max().unwrap_or(0),
        in_max: polled_by.values().copied().max().unwrap_or(0),
        changed,
        sets,
    }
}
