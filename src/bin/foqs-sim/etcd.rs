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
//! last renewal, and comes back as a new member two TTLs later). After each event the
//! simulation runs until every shard is served by exactly one host and the loads are
//! within one (or 60 simulated seconds pass), and prints one JSON line: the time that
//! took, the moments a shard was served by two hosts (must be 0), etcd's requests, the
//! watch events it sent (in all and per host), whole reads, and the shards moved against
//! the fewest the event needed.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use foqs::cluster::follow::{Cache, HostRecord, Ownership};
use foqs::model::ShardId;
use foqs::seeded::Rng;
use serde_json::json;

/// How long a follower waits after a watch event for the rest of its batch.
const COALESCE_MS: u64 = 20;
/// How long a host takes to stop serving a shard it gives back (buffers flushed).
const RELEASE_MS: u64 = 5;
/// One request to etcd and its answer.
const RTT_MS: u64 = 1;
/// How long the simulation waits for a tier to settle after an event.
const SETTLE_MAX_MS: u64 = 60_000;
/// Polls between two counts of the range's keys (`cluster::etcd`'s).
const CHECK_POLLS: u64 = 10;

pub struct Params {
    pub hosts: usize,
    pub shards: usize,
    pub seed: u64,
    pub events: usize,
    pub ttl_ms: u64,
    pub poll_ms: u64,
    /// The most a watch event takes to reach a host (drawn from 1 ms to this).
    pub watch_delay_max_ms: u64,
}

struct Key {
    value: Vec<u8>,
    lease: i64,
    mod_rev: i64,
}

#[derive(Default)]
struct Counters {
    requests: u64,
    watch_events: u64,
    whole_reads: u64,
    double_served: u64,
}

/// One key's change: its name under the prefix, and its new value and lease (None:
/// deleted).
type Change = (String, Option<(Vec<u8>, i64)>);
/// One write: its revision and its changes.
type Write = (i64, Vec<Change>);

enum Ev {
    /// The writes so far reach a host's watch (each host has at most one such event
    /// pending; it brings every write made before it fires, in order).
    Deliver(usize),
    Plan(usize),
    Poll(usize),
    /// The host has stopped serving the shard.
    Released(usize, ShardId),
    /// The lease lapses unless renewed since.
    Expire(i64),
    /// A partitioned host's fence closes.
    Fenced(usize),
    /// A partitioned host can reach etcd again (as a new member).
    Heal(usize),
}

struct Host {
    id: String,
    /// Running and reaching etcd.
    up: bool,
    /// Cut from etcd: still serving what it holds until its fence closes.
    cut: bool,
    lease: Option<i64>,
    cache: Cache,
    own: Ownership,
    written: i64,
    plan_due: bool,
    /// A delivery of the log is pending; the log's writes it has applied.
    delivery_due: bool,
    applied: usize,
    polls: u64,
    last_renewal: u64,
}

struct Sim {
    p: Params,
    rng: Rng,
    now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Ev>,
    rev: i64,
    /// Every write, in revision order: what the watches deliver.
    log: Vec<Rc<Write>>,
    kv: BTreeMap<String, Key>,
    /// lease -> (host, expiry)
    leases: BTreeMap<i64, (usize, u64)>,
    next_lease: i64,
    hosts: Vec<Host>,
    shards: Vec<ShardId>,
    /// shard -> how many hosts serve it now; how many shards one host serves, and how
    /// many two or more.
    served: BTreeMap<ShardId, usize>,
    single: usize,
    doubles: usize,
    c: Counters,
}

impl Sim {
    fn at(&mut self, t: u64, e: Ev) {
        self.seq += 1;
        self.queue.insert((t, self.seq), e);
    }

    fn serving(h: &Host) -> BTreeSet<ShardId> {
        if !h.up && !h.cut {
            return BTreeSet::new();
        }
        h.own.held.difference(&h.own.releasing).copied().collect()
    }

    /// Runs `f` on host `i` and counts what it starts and stops serving.
    fn change<T>(&mut self, i: usize, f: impl FnOnce(&mut Sim) -> T) -> T {
        let before = Self::serving(&self.hosts[i]);
        let out = f(self);
        let after = Self::serving(&self.hosts[i]);
        for s in before.difference(&after) {
            let n = self.served.entry(*s).or_default();
            *n -= 1;
            match *n {
                0 => self.single -= 1,
                1 => {
                    self.doubles -= 1;
                    self.single += 1;
                }
                _ => {}
            }
        }
        for s in after.difference(&before) {
            let n = self.served.entry(*s).or_default();
            *n += 1;
            match *n {
                1 => self.single += 1,
                2 => {
                    self.single -= 1;
                    self.doubles += 1;
                    self.c.double_served += 1;
                }
                _ => self.c.double_served += 1,
            }
        }
        out
    }

    /// One write of etcd at a new revision, delivered to every watching host.
    fn write(&mut self, changes: Vec<Change>) -> i64 {
        let n = changes.len() as u64;
        self.rev += 1;
        for (k, v) in &changes {
            match v {
                Some((value, lease)) => {
                    self.kv.insert(
                        k.clone(),
                        Key {
                            value: value.clone(),
                            lease: *lease,
                            mod_rev: self.rev,
                        },
                    );
                }
                None => {
                    self.kv.remove(k);
                }
            }
        }
        self.log.push(Rc::new((self.rev, changes)));
        for i in 0..self.hosts.len() {
            if !self.hosts[i].up {
                continue;
            }
            self.c.watch_events += n;
            if !self.hosts[i].delivery_due {
                self.hosts[i].delivery_due = true;
                let delay = 1 + self.rng.below(self.p.watch_delay_max_ms as usize) as u64;
                self.at(self.now + delay, Ev::Deliver(i));
            }
        }
        self.rev
    }

    /// A new host; `at_once`: it plans as soon as it has registered (a later join; the
    /// tier's first hosts, starting together, plan once their watches bring the others).
    fn join(&mut self, at_once: bool) -> usize {
        let i = self.hosts.len();
        let id = format!("h{i:04}");
        self.hosts.push(Host {
            id: id.clone(),
            up: false,
            cut: false,
            lease: None,
            cache: Cache::default(),
            own: Ownership {
                me: id,
                tier: "t".into(),
                tier_shards: self.shards.clone(),
                ..Ownership::default()
            },
            written: 0,
            plan_due: false,
            delivery_due: false,
            applied: 0,
            polls: 0,
            last_renewal: 0,
        });
        self.register(i, at_once);
        i
    }

    /// Grants a lease, puts the host's key, reads the range whole and watches from the
    /// next revision (as `Follower::register` and `Follower::load`).
    fn register(&mut self, i: usize, at_once: bool) {
        self.next_lease += 1;
        let lease = self.next_lease;
        self.c.requests += 3;
        self.c.whole_reads += 1;
        self.leases.insert(lease, (i, self.now + self.p.ttl_ms));
        let h = &mut self.hosts[i];
        h.up = true;
        h.cut = false;
        h.lease = Some(lease);
        h.last_renewal = self.now;
        h.own.held.clear();
        h.own.releasing.clear();
        let record = serde_json::to_vec(&HostRecord {
            addr: format!("{}:1", h.id),
            tier: "t".into(),
            region: String::new(),
        })
        .expect("serializable");
        let key = format!("hosts/{}", h.id);
        let rev = self.write(vec![(key, Some((record, lease)))]);
        // The read, at the registration's revision: the watch brings what follows.
        let mut cache = Cache {
            revision: rev,
            ..Cache::default()
        };
        for (k, v) in &self.kv {
            cache.apply_one(k, Some((&v.value, v.lease)));
        }
        let h = &mut self.hosts[i];
        h.cache = cache;
        h.applied = self.log.len();
        h.written = rev;
        let poll = self.now + self.p.poll_ms;
        self.at(poll, Ev::Poll(i));
        if at_once {
            self.at(self.now + RTT_MS, Ev::Plan(i));
        }
    }

    fn plan(&mut self, i: usize) {
        self.hosts[i].plan_due = false;
        let h = &self.hosts[i];
        if !h.up || h.cache.revision < h.written {
            return;
        }
        let lease = h.lease;
        let plan = self.change(i, |sim| {
            let h = &mut sim.hosts[i];
            h.own.plan(&h.cache, lease, true)
        });
        for (s, _) in &plan.withdrawn {
            self.at(self.now + RELEASE_MS, Ev::Released(i, *s));
        }
        for s in plan.acquire {
            self.c.requests += 1;
            let key = format!("shards/{s}");
            match self.kv.get(&key) {
                Some(k) => {
                    let seen = k.mod_rev;
                    let h = &mut self.hosts[i];
                    h.written = h.written.max(seen);
                }
                None => {
                    let me = self.hosts[i].id.clone().into_bytes();
                    let lease = lease.expect("a plan acquires only with a lease");
                    let rev = self.write(vec![(key, Some((me, lease)))]);
                    self.change(i, |sim| {
                        let h = &mut sim.hosts[i];
                        h.written = h.written.max(rev);
                        h.own.held.insert(s);
                    });
                }
            }
        }
    }

    fn released(&mut self, i: usize, s: ShardId) {
        let given = self.change(i, |sim| {
            let own = &mut sim.hosts[i].own;
            own.releasing.remove(&s) && own.held.remove(&s)
        });
        if !given || !self.hosts[i].up {
            return;
        }
        self.c.requests += 1;
        let key = format!("shards/{s}");
        if self.kv.get(&key).map(|k| k.lease) == self.hosts[i].lease {
            let rev = self.write(vec![(key, None)]);
            let h = &mut self.hosts[i];
            h.written = h.written.max(rev);
        }
    }

    /// Deletes a lease and every key under it, in one revision.
    fn drop_lease(&mut self, lease: i64) {
        if self.leases.remove(&lease).is_none() {
            return;
        }
        let gone: Vec<Change> = self
            .kv
            .iter()
            .filter(|(_, k)| k.lease == lease)
            .map(|(name, _)| (name.clone(), None))
            .collect();
        if !gone.is_empty() {
            self.write(gone);
        }
    }

    fn step(&mut self, e: Ev) {
        match e {
            Ev::Deliver(host) => {
                let h = &mut self.hosts[host];
                h.delivery_due = false;
                if !h.up {
                    return;
                }
                for w in &self.log[h.applied..] {
                    let (rev, changes) = &**w;
                    for (k, v) in changes {
                        h.cache
                            .apply_one(k, v.as_ref().map(|(b, l)| (b.as_slice(), *l)));
                    }
                    h.cache.revision = h.cache.revision.max(*rev);
                }
                h.applied = self.log.len();
                if !h.plan_due {
                    h.plan_due = true;
                    self.at(self.now + COALESCE_MS, Ev::Plan(host));
                }
            }
            Ev::Plan(i) => self.plan(i),
            Ev::Poll(i) => {
                let h = &mut self.hosts[i];
                if !h.up {
                    return;
                }
                h.polls += 1;
                h.last_renewal = self.now;
                if h.polls.is_multiple_of(CHECK_POLLS) {
                    self.c.requests += 1;
                }
                if let Some(l) = h.lease {
                    if let Some(e) = self.leases.get_mut(&l) {
                        e.1 = self.now + self.p.ttl_ms;
                    }
                }
                let next = self.now + self.p.poll_ms;
                self.at(next, Ev::Poll(i));
                self.plan(i);
            }
            Ev::Released(i, s) => self.released(i, s),
            Ev::Expire(lease) => {
                if let Some((_, expiry)) = self.leases.get(&lease) {
                    if *expiry <= self.now {
                        self.drop_lease(lease);
                    } else {
                        let t = *expiry;
                        self.at(t, Ev::Expire(lease));
                    }
                }
            }
            Ev::Fenced(i) => {
                self.change(i, |sim| {
                    let h = &mut sim.hosts[i];
                    h.cut = false;
                    h.own.held.clear();
                    h.own.releasing.clear();
                });
            }
            Ev::Heal(i) => {
                if !self.hosts[i].up && self.hosts[i].lease.is_none() {
                    self.register(i, true);
                }
            }
        }
    }

    fn settled(&self) -> bool {
        if self.single != self.shards.len() || self.doubles > 0 {
            return false;
        }
        if self.hosts.iter().any(|h| h.cut) {
            return false;
        }
        let loads: Vec<usize> = self
            .hosts
            .iter()
            .filter(|h| h.up)
            .map(|h| h.own.held.len() - h.own.releasing.len())
            .collect();
        !loads.is_empty()
            && loads.iter().max().unwrap_or(&0) - loads.iter().min().unwrap_or(&0) <= 1
    }

    /// Runs every event due by `t`; the clock is then `t`.
    fn advance_to(&mut self, t: u64) {
        while let Some(entry) = self.queue.first_entry() {
            if entry.key().0 > t {
                break;
            }
            let ((at, _), e) = entry.remove_entry();
            self.now = at;
            self.step(e);
        }
        self.now = self.now.max(t);
    }

    /// Runs until the tier settles (or `SETTLE_MAX_MS`); the time it took.
    fn run_until_settled(&mut self) -> Option<u64> {
        let start = self.now;
        loop {
            if self.settled() && self.now > start {
                return Some(self.now - start);
            }
            let ((t, _), e) = self.queue.pop_first()?;
            if t - start > SETTLE_MAX_MS {
                self.queue.insert((t, 0), e);
                return None;
            }
            self.now = t;
            self.step(e);
        }
    }

    fn owners(&self) -> BTreeMap<ShardId, usize> {
        let mut out = BTreeMap::new();
        for (i, h) in self.hosts.iter().enumerate() {
            for s in Self::serving(h) {
                out.insert(s, i);
            }
        }
        out
    }
}

pub fn run(p: Params) {
    let mut sim = Sim {
        rng: Rng::new(p.seed),
        shards: (0..p.shards as ShardId).collect(),
        p,
        now: 0,
        seq: 0,
        queue: BTreeMap::new(),
        rev: 0,
        log: Vec::new(),
        kv: BTreeMap::new(),
        leases: BTreeMap::new(),
        next_lease: 0,
        hosts: Vec::new(),
        served: BTreeMap::new(),
        single: 0,
        doubles: 0,
        c: Counters::default(),
    };
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
        let line = json!({"kind": kind, "hosts": live, "shards": sim.shards.len(),
            "settled_ms": took, "double_served": sim.c.double_served - before.double_served,
            "etcd_requests": sim.c.requests - before.requests,
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
        w["events"] = json!(w["events"].as_u64().unwrap_or(0) + 1);
        let per_host = (sim.c.watch_events - before.watch_events) / live;
        let requests = sim.c.requests - before.requests;
        for (k, v) in [
            ("watch_events_per_host_max", per_host),
            ("etcd_requests_max", requests),
            ("moved_max", moved as u64),
        ] {
            w[k] = json!(w[k].as_u64().unwrap_or(0).max(v));
        }
    };
    let took = sim.run_until_settled();
    report("join all", &sim, took, &start, 0, 0);
    for _ in 0..sim.p.events {
        start = Counters {
            requests: sim.c.requests,
            watch_events: sim.c.watch_events,
            whole_reads: sim.c.whole_reads,
            double_served: sim.c.double_served,
        };
        let before = sim.owners();
        let live: Vec<usize> = (0..sim.hosts.len()).filter(|i| sim.hosts[*i].up).collect();
        let roll = sim.rng.below(100);
        let kind = match roll {
            _ if live.len() <= sim.p.hosts.saturating_sub(2).max(2) => "join",
            0..=34 => "join",
            35..=59 => "leave",
            60..=84 => "crash",
            _ => "partition",
        };
        let victim = live[sim.rng.below(live.len())];
        let cut_at = sim.now;
        let held = before.values().filter(|h| **h == victim).count();
        let ideal = match kind {
            "join" => {
                sim.join(true);
                sim.shards.len() / (live.len() + 1)
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
                held
            }
            "crash" => {
                sim.change(victim, |sim| sim.hosts[victim].up = false);
                if let Some(l) = sim.hosts[victim].lease.take() {
                    let expiry = sim.leases.get(&l).map_or(sim.now, |e| e.1);
                    sim.at(expiry, Ev::Expire(l));
                }
                held
            }
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
                held
            }
        };
        let took = sim.run_until_settled();
        let after = sim.owners();
        let moved = after
            .iter()
            .filter(|(s, h)| before.get(*s).is_some_and(|b| b != *h))
            .count();
        report(kind, &sim, took, &start, moved, ideal);
        // A partitioned host comes back, as a new member, two TTLs after it was cut.
        if kind == "partition" {
            let heal = sim.now.max(cut_at + 2 * sim.p.ttl_ms);
            sim.advance_to(heal);
            let mark = Counters {
                requests: sim.c.requests,
                watch_events: sim.c.watch_events,
                whole_reads: sim.c.whole_reads,
                double_served: sim.c.double_served,
            };
            sim.step(Ev::Heal(victim));
            let took = sim.run_until_settled();
            report("partition healed", &sim, took, &mark, 0, 0);
        }
    }
    println!(
        "{}",
        json!({"summary": true, "etcd": true, "seed": sim.p.seed, "hosts": sim.p.hosts,
            "shards": sim.p.shards, "ttl_ms": sim.p.ttl_ms, "poll_ms": sim.p.poll_ms,
            "watch_delay_max_ms": sim.p.watch_delay_max_ms,
            "double_served": sim.c.double_served, "by_kind": worst})
    );
}
