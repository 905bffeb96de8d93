//! The simulated world of `foqs-sim --etcd`: etcd (revisions, leases, one ordered watch
//! per host) and the hosts, each on the real planning code (see `mod.rs`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;

use foqs::cluster::follow::{Cache, HostRecord, Ownership};
use foqs::model::ShardId;
use foqs::seeded::Rng;

use super::balance::moves_needed;
use super::counters::Counters;
use super::Params;

/// The regions hosts and primaries are drawn from (`--regions` of them).
pub(super) const ALL_REGIONS: [&str; 3] = ["r1", "r2", "r3"];

/// How long a follower waits after a watch event for the rest of its batch.
pub(super) const COALESCE_MS: u64 = 20;
/// How long a host takes to stop serving a shard it gives back (buffers flushed).
pub(super) const RELEASE_MS: u64 = 5;
/// One request to etcd and its answer.
pub(super) const RTT_MS: u64 = 1;
/// How long the simulation waits for a tier to settle after an event.
pub(super) const SETTLE_MAX_MS: u64 = 60_000;
/// Assignments kept for hosts whose caches trail (see `Sim::plan`).
const ASSIGNMENTS_KEPT: usize = 256;
/// Polls between two counts of the range's keys (`cluster::etcd`'s).
pub(super) const CHECK_POLLS: u64 = 10;

/// A key as the simulation needs it (its value lives in `Sim::mirror`).
pub(super) struct Key {
    lease: i64,
    mod_rev: i64,
}

/// One key's change: its name under the prefix, and its new value and lease (None:
/// deleted).
pub(super) type Change = (String, Option<(Vec<u8>, i64)>);
/// One write: its revision and its changes.
pub(super) type Write = (i64, Vec<Change>);

pub(super) enum Ev {
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
    /// A drain switches its next replica set (pauses it, moving its owner region).
    SwitchStart,
    /// A set's switch is done: its shards' primaries serve in the new region.
    SwitchEnd(Vec<ShardId>),
    /// The host learns the tier's longer shard list.
    Reconfigure(usize),
}

pub(super) struct Host {
    pub(super) id: String,
    pub(super) region: &'static str,
    /// Running and reaching etcd.
    pub(super) up: bool,
    /// Cut from etcd: still serving what it holds until its fence closes.
    pub(super) cut: bool,
    pub(super) lease: Option<i64>,
    pub(super) cache: Cache,
    pub(super) own: Ownership,
    pub(super) written: i64,
    pub(super) plan_due: bool,
    /// Bumped whenever `own` may have changed; with the cache's revision and the lease,
    /// what the last plan was made from (a plan from the same is the same: skipped).
    pub(super) epoch: u64,
    pub(super) last_plan: Option<(i64, u64, Option<i64>)>,
    /// A delivery of the log is pending; the log's writes it has applied.
    pub(super) delivery_due: bool,
    pub(super) applied: usize,
    pub(super) polls: u64,
    pub(super) last_renewal: u64,
}

/// A drain under way: the sets still to switch, and where to.
pub(super) struct Drain {
    pub(super) to: &'static str,
    pub(super) sets: VecDeque<Vec<ShardId>>,
}

/// A tier's assignment at one revision: shard -> host, and each host's shards.
pub(super) struct Assignment {
    of: BTreeMap<ShardId, String>,
    by_host: BTreeMap<String, BTreeSet<ShardId>>,
}

pub(super) struct Sim {
    pub(super) p: Params,
    pub(super) rng: Rng,
    pub(super) now: u64,
    pub(super) seq: u64,
    pub(super) queue: BTreeMap<(u64, u64), Ev>,
    pub(super) rev: i64,
    /// Every write, in revision order: what the watches deliver.
    pub(super) log: Vec<Rc<Write>>,
    pub(super) kv: BTreeMap<String, Key>,
    /// lease -> (host, expiry)
    pub(super) leases: BTreeMap<i64, (usize, u64)>,
    pub(super) next_lease: i64,
    pub(super) hosts: Vec<Host>,
    pub(super) shards: Vec<ShardId>,
    /// Each shard's owner region (its primaries record's; empty with one region: no
    /// records, as a tier without replication).
    pub(super) regions: BTreeMap<ShardId, &'static str>,
    /// What etcd holds, as a follower's cache would: a registering host's read.
    pub(super) mirror: Cache,
    /// The operator's work under way (a drain's sets, hosts still to learn added shards);
    /// the time the last of it ended.
    pub(super) pending: usize,
    pub(super) quiet_since: u64,
    pub(super) drain: Option<Drain>,
    /// Shards served by no host, since when; the longest such gap since `gap_max` was
    /// last reset.
    pub(super) unserved_since: BTreeMap<ShardId, u64>,
    pub(super) gap_max: u64,
    /// Bumped when who serves what, the hosts or etcd change: `settled` is remembered
    /// for one version.
    pub(super) version: u64,
    pub(super) settled_memo: std::cell::Cell<Option<(u64, bool)>>,
    /// The last assignments computed, by (cache revision, shard list length).
    pub(super) assignments: BTreeMap<(i64, usize), Rc<Assignment>>,
    /// shard -> how many hosts serve it now; how many shards one host serves, and how
    /// many two or more.
    pub(super) served: BTreeMap<ShardId, usize>,
    pub(super) single: usize,
    pub(super) doubles: usize,
    pub(super) c: Counters,
}

impl Sim {
    pub(super) fn new(p: Params) -> Sim {
        let shards: Vec<ShardId> = (0..p.shards as ShardId).collect();
        let mut sim = Sim {
            rng: Rng::new(p.seed),
            unserved_since: shards.iter().map(|s| (*s, 0)).collect(),
            shards: Vec::new(),
            regions: BTreeMap::new(),
            mirror: Cache::default(),
            pending: 0,
            quiet_since: 0,
            drain: None,
            gap_max: 0,
            version: 0,
            settled_memo: Default::default(),
            assignments: BTreeMap::new(),
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
        // The primaries' records, one write by the operator before any host starts.
        sim.place_shards(shards);
        sim
    }

    pub(super) fn at(&mut self, t: u64, e: Ev) {
        self.seq += 1;
        self.queue.insert((t, self.seq), e);
    }

    pub(super) fn serving(h: &Host) -> BTreeSet<ShardId> {
        if !h.up && !h.cut {
            return BTreeSet::new();
        }
        h.own.held.difference(&h.own.releasing).copied().collect()
    }

    /// Runs `f` on host `i` and counts what it starts and stops serving.
    pub(super) fn change<T>(&mut self, i: usize, f: impl FnOnce(&mut Sim) -> T) -> T {
        let before = Self::serving(&self.hosts[i]);
        let was_up = self.hosts[i].up;
        self.hosts[i].epoch += 1;
        let out = f(self);
        let after = Self::serving(&self.hosts[i]);
        if before != after || was_up != self.hosts[i].up {
            self.version += 1;
        }
        for s in before.difference(&after) {
            let n = self.served.entry(*s).or_default();
            *n -= 1;
            match *n {
                0 => {
                    self.single -= 1;
                    self.unserved_since.insert(*s, self.now);
                }
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
                1 => {
                    self.single += 1;
                    if let Some(t) = self.unserved_since.remove(s) {
                        self.gap_max = self.gap_max.max(self.now - t);
                    }
                }
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
    pub(super) fn write(&mut self, changes: Vec<Change>) -> i64 {
        let n = changes.len() as u64;
        self.rev += 1;
        self.version += 1;
        for (k, v) in &changes {
            self.mirror
                .apply_one(k, v.as_ref().map(|(b, l)| (b.as_slice(), *l)));
            match v {
                Some((_, lease)) => {
                    self.kv.insert(
                        k.clone(),
                        Key {
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
        self.mirror.revision = self.rev;
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
    pub(super) fn join(&mut self, at_once: bool) -> usize {
        let i = self.hosts.len();
        let id = format!("h{i:04}");
        let region = match self.p.regions {
            1 => "",
            n => ALL_REGIONS[self.rng.below(n)],
        };
        self.hosts.push(Host {
            id: id.clone(),
            region,
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
            epoch: 0,
            last_plan: None,
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
    pub(super) fn register(&mut self, i: usize, at_once: bool) {
        self.next_lease += 1;
        let lease = self.next_lease;
        self.c.requests += 3;
        self.c.whole_reads += 1;
        self.leases.insert(lease, (i, self.now + self.p.ttl_ms));
        self.version += 1;
        let h = &mut self.hosts[i];
        h.up = true;
        h.cut = false;
        h.lease = Some(lease);
        h.last_renewal = self.now;
        h.epoch += 1;
        h.own.held.clear();
        h.own.releasing.clear();
        let record = serde_json::to_vec(&HostRecord {
            addr: format!("{}:1", h.id),
            tier: "t".into(),
            region: h.region.to_string(),
        })
        .expect("serializable");
        let key = format!("hosts/{}", h.id);
        let rev = self.write(vec![(key, Some((record, lease)))]);
        // The read, at the registration's revision: the watch brings what follows.
        debug_assert_eq!(self.mirror.revision, rev);
        let h = &mut self.hosts[i];
        h.cache = self.mirror.clone();
        h.applied = self.log.len();
        h.written = rev;
        let poll = self.now + self.p.poll_ms;
        self.at(poll, Ev::Poll(i));
        if at_once {
            self.at(self.now + RTT_MS, Ev::Plan(i));
        }
    }

    pub(super) fn plan(&mut self, i: usize) {
        self.hosts[i].plan_due = false;
        let h = &self.hosts[i];
        if !h.up || h.cache.revision < h.written {
            return;
        }
        let lease = h.lease;
        if h.last_plan == Some((h.cache.revision, h.epoch, lease)) {
            return;
        }
        self.c.plans += 1;
        // Every host whose cache is at this revision, with the same shard list, computes
        // the same assignment: computed once (the real `Ownership::assignment`).
        // Hosts' caches trail etcd by a few writes each: the last few are kept.
        let key = (h.cache.revision, h.own.tier_shards.len());
        let assignment = match self.assignments.get(&key) {
            Some(a) => Rc::clone(a),
            None => {
                let a = h.own.assignment(&h.cache);
                let mut by_host: BTreeMap<String, BTreeSet<ShardId>> = BTreeMap::new();
                for (s, o) in &a {
                    by_host.entry(o.to_string()).or_default().insert(*s);
                }
                let a = Rc::new(Assignment {
                    of: a.into_iter().map(|(s, o)| (s, o.to_string())).collect(),
                    by_host,
                });
                self.assignments.insert(key, Rc::clone(&a));
                if self.assignments.len() > ASSIGNMENTS_KEPT {
                    self.assignments.pop_first();
                }
                a
            }
        };
        let none = BTreeSet::new();
        let plan = self.change(i, |sim| {
            let h = &mut sim.hosts[i];
            let mine = assignment.by_host.get(&h.id).unwrap_or(&none);
            h.own.plan_with(&h.cache, lease, true, &assignment.of, mine)
        });
        for (s, _) in &plan.withdrawn {
            self.at(self.now + RELEASE_MS, Ev::Released(i, *s));
        }
        for s in plan.acquire {
            self.c.requests += 1;
            let key = format!("shards/{s}");
            match self.kv.get(&key) {
                Some(k) => {
                    self.c.creates_taken += 1;
                    let seen = k.mod_rev;
                    let h = &mut self.hosts[i];
                    h.written = h.written.max(seen);
                }
                None => {
                    let me = self.hosts[i].id.clone().into_bytes();
                    let lease = lease.expect("a plan acquires only with a lease");
                    let rev = self.write(vec![(key, Some((me, lease)))]);
                    self.c.taken += 1;
                    self.change(i, |sim| {
                        let h = &mut sim.hosts[i];
                        h.written = h.written.max(rev);
                        h.own.held.insert(s);
                    });
                }
            }
        }
        let h = &mut self.hosts[i];
        h.last_plan = Some((h.cache.revision, h.epoch, h.lease));
    }

    pub(super) fn released(&mut self, i: usize, s: ShardId) {
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
    pub(super) fn drop_lease(&mut self, lease: i64) {
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

    pub(super) fn step(&mut self, e: Ev) {
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
                    self.c.check_requests += 1;
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
            Ev::SwitchStart => self.switch_start(),
            Ev::SwitchEnd(set) => self.switch_end(set),
            Ev::Reconfigure(i) => self.reconfigure(i),
        }
    }

    /// The operator's work is done.
    pub(super) fn operator_done(&mut self) {
        self.pending -= 1;
        if self.pending == 0 {
            self.quiet_since = self.now;
        }
    }

    /// Every shard served by exactly one host, of its region's when the tier has hosts
    /// there, the loads within one inside each such group, and the operator done.
    pub(super) fn settled(&self) -> bool {
        if self.single != self.shards.len() || self.doubles > 0 || self.pending > 0 {
            return false;
        }
        if self.hosts.iter().any(|h| h.cut) {
            return false;
        }
        if let Some((v, answer)) = self.settled_memo.get() {
            if v == self.version {
                return answer;
            }
        }
        let answer =
            moves_needed(&self.shards, &self.live(), &self.owners(), &self.regions) == Some(0);
        self.settled_memo.set(Some((self.version, answer)));
        answer
    }

    /// Runs every event due by `t`; the clock is then `t`.
    pub(super) fn advance_to(&mut self, t: u64) {
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
    /// The time is counted from the call; the limit from the end of the operator's work.
    pub(super) fn run_until_settled(&mut self) -> Option<u64> {
        let start = self.now;
        loop {
            if self.now > start && self.settled() {
                return Some(self.now - start);
            }
            let ((t, _), e) = self.queue.pop_first()?;
            if self.pending == 0 && t - start.max(self.quiet_since) > SETTLE_MAX_MS {
                self.queue.insert((t, 0), e);
                return None;
            }
            self.now = t;
            self.step(e);
        }
    }

    /// The hosts up: (index, id, region).
    pub(super) fn live(&self) -> Vec<(usize, &str, &str)> {
        self.hosts
            .iter()
            .enumerate()
            .filter(|(_, h)| h.up)
            .map(|(i, h)| (i, h.id.as_str(), h.region))
            .collect()
    }

    pub(super) fn owners(&self) -> BTreeMap<ShardId, usize> {
        let mut out = BTreeMap::new();
        for (i, h) in self.hosts.iter().enumerate() {
            for s in Self::serving(h) {
                out.insert(s, i);
            }
        }
        out
    }
}
