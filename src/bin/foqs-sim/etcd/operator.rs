//! What the operator does to a simulated tier besides hosts coming and going: the
//! primaries' records etcd holds for replicated shards, a region's drain (replica sets
//! switched to another region, `drain_parallel_max` at a time, each set's owner region
//! moving at its pause, as `replication::switch` writes them), and shards added (their
//! records written, then each host learning the longer shard list at its own moment).

use std::collections::BTreeMap;

use foqs::model::{PrimaryRecord, PrimaryState, ShardId};

use super::world::{Change, Drain, Ev, Sim, ALL_REGIONS};

/// Replica sets a drain switches at once (`replication.drain_parallel_max`'s default).
pub(super) const DRAIN_PARALLEL: usize = 4;
/// One set's switch, from its pause to its primary serving in the new region: drawn from
/// this range (the replication tests measured 250-544 ms per set).
const SWITCH_MS: (u64, u64) = (150, 550);
/// Added shards reach every host's shard list within this (drawn per host).
pub(super) const RECONFIGURE_SPREAD_MS: u64 = 2_000;

fn record(set: usize, region: &str, generation: u64) -> PrimaryRecord {
    PrimaryRecord {
        addr: format!("db-{set}:3306"),
        region: region.to_string(),
        generation,
        state: PrimaryState::Serving,
        next_region: None,
    }
}

impl Sim {
    fn set_of(&self, s: ShardId) -> usize {
        s as usize / self.p.set_shards.max(1)
    }

    /// New shards: each replica set (`set_shards` consecutive shards) gets a region drawn
    /// from the seed and, with more than one region, its shards primaries' records (one
    /// write for them all). The tier's list grows; hosts learn of
    /// it as the caller arranges.
    pub(super) fn place_shards(&mut self, new: Vec<ShardId>) {
        let mut changes: Vec<Change> = Vec::new();
        for s in &new {
            self.unserved_since.insert(*s, self.now);
            if self.p.regions > 1 {
                // A set's shards share its primary: a shard added to a set that has
                // shards already takes its region.
                let set = self.set_of(*s);
                let region = match s.checked_sub(1).filter(|p| self.set_of(*p) == set) {
                    Some(p) => self.regions[&p],
                    None => ALL_REGIONS[self.rng.below(self.p.regions)],
                };
                self.regions.insert(*s, region);
                let value =
                    serde_json::to_vec(&record(self.set_of(*s), region, 1)).expect("serializable");
                changes.push((format!("primaries/{s}"), Some((value, 0))));
            }
        }
        self.shards.extend(new);
        if !changes.is_empty() {
            self.c.requests += 1;
            self.c.operator_requests += 1;
            self.write(changes);
        }
    }

    /// Adds `n` shards, which every host (up or not) learns within
    /// `RECONFIGURE_SPREAD_MS`.
    pub(super) fn add_shards(&mut self, n: usize) {
        let first = self.shards.len() as ShardId;
        self.place_shards((first..first + n as ShardId).collect());
        for i in 0..self.hosts.len() {
            self.pending += 1;
            let t = self.now + 1 + self.rng.below(RECONFIGURE_SPREAD_MS as usize) as u64;
            self.at(t, Ev::Reconfigure(i));
        }
    }

    pub(super) fn reconfigure(&mut self, i: usize) {
        let shards = self.shards.clone();
        self.change(i, |sim| sim.hosts[i].own.tier_shards = shards);
        self.operator_done();
        if self.hosts[i].up {
            self.plan(i);
        }
    }

    /// The region to drain (the one holding most primaries) and where to (the region
    /// with hosts holding fewest), if the tier has hosts in two regions.
    pub(super) fn drain_pick(&self) -> Option<(&'static str, &'static str)> {
        let mut held: BTreeMap<&'static str, usize> = BTreeMap::new();
        for r in self.regions.values() {
            *held.entry(*r).or_default() += 1;
        }
        let from = held
            .iter()
            .max_by_key(|(r, n)| (**n, std::cmp::Reverse(**r)))?
            .0;
        let to = ALL_REGIONS[..self.p.regions]
            .iter()
            .filter(|r| *r != from && self.hosts.iter().any(|h| h.up && h.region == **r))
            .min_by_key(|r| (held.get(*r).copied().unwrap_or(0), **r))?;
        Some((from, to))
    }

    /// Starts draining `from` into `to`: its sets switch `DRAIN_PARALLEL` at a time. The
    /// shards' regions once the drain is through.
    pub(super) fn drain(
        &mut self,
        from: &'static str,
        to: &'static str,
    ) -> BTreeMap<ShardId, &'static str> {
        let mut after = self.regions.clone();
        for r in after.values_mut().filter(|r| **r == from) {
            *r = to;
        }
        let mut sets: BTreeMap<usize, Vec<ShardId>> = BTreeMap::new();
        for (s, r) in &self.regions {
            if *r == from {
                sets.entry(self.set_of(*s)).or_default().push(*s);
            }
        }
        self.pending += sets.len();
        let n = sets.len();
        self.drain = Some(Drain {
            to,
            sets: sets.into_values().collect(),
        });
        for _ in 0..DRAIN_PARALLEL.min(n) {
            self.at(self.now, Ev::SwitchStart);
        }
        after
    }

    fn write_records(&mut self, set: &[ShardId], f: impl Fn(&mut PrimaryRecord)) {
        let changes: Vec<Change> = set
            .iter()
            .map(|s| {
                let mut r = self.mirror.primaries()[s].clone();
                f(&mut r);
                let value = serde_json::to_vec(&r).expect("serializable");
                (format!("primaries/{s}"), Some((value, 0)))
            })
            .collect();
        self.c.requests += 1;
        self.c.operator_requests += 1;
        self.write(changes);
    }

    /// Pauses the next set, its owner region moving to the drain's target at once.
    pub(super) fn switch_start(&mut self) {
        let Some(d) = self.drain.as_mut() else {
            return;
        };
        let Some(set) = d.sets.pop_front() else {
            return;
        };
        let to = d.to;
        self.write_records(&set, |r| {
            r.state = PrimaryState::Paused;
            r.next_region = Some(to.to_string());
        });
        for s in &set {
            self.regions.insert(*s, to);
        }
        let took = SWITCH_MS.0 + self.rng.below((SWITCH_MS.1 - SWITCH_MS.0) as usize) as u64;
        self.at(self.now + took, Ev::SwitchEnd(set));
    }

    /// The set serves in its new region; the drain's next set starts.
    pub(super) fn switch_end(&mut self, set: Vec<ShardId>) {
        self.write_records(&set, |r| {
            r.region = r.next_region.take().unwrap_or_else(|| r.region.clone());
            r.generation += 1;
            r.state = PrimaryState::Serving;
        });
        self.operator_done();
        if self.pending == 0 {
            self.drain = None;
        } else {
            self.switch_start();
        }
    }
}
