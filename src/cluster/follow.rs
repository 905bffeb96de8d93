//! What an etcd follower decides, without etcd: the [`Cache`] of what etcd holds under
//! the cluster's prefix (hosts, owner keys, primaries, at one revision), and the
//! [`Ownership`] of one host, which plans from it (which shards it lost, which keys of
//! its own it takes up, which shards it gives back, which free ones it tries to take) and
//! makes the [`ClusterView`] it publishes. `etcd/` runs these against etcd; `foqs-sim`
//! runs the same code against a simulated etcd.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::assign_regional_from;
use crate::model::{ClusterView, HostAddr, PrimaryRecord, PrimaryState, ShardId};

/// A host's record, `P/hosts/<host_id>`.
#[derive(Debug, Serialize, Deserialize)]
pub struct HostRecord {
    pub addr: String,
    pub tier: String,
    #[serde(default)]
    pub region: String,
}

/// The hosts, owner keys and primaries at `revision`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cache {
    pub hosts: BTreeMap<String, HostAddr>,
    /// shard -> (owner, lease)
    /// (Private, with `primaries`: [`Cache::apply_one`] keeps indexes of both; read them
    /// through [`Cache::keys`] and [`Cache::primaries`].)
    keys: BTreeMap<ShardId, (String, i64)>,
    primaries: BTreeMap<ShardId, PrimaryRecord>,
    /// The range's other keys (acks, records that do not parse), by name under the
    /// prefix: not planned from, but counted (see [`Cache::keys_in_range`]).
    pub rest: BTreeSet<String>,
    /// etcd's revision this is the state of.
    pub revision: i64,
    /// Kept with `keys` and `primaries` by [`Cache::apply_one`], for plans that would
    /// otherwise scan every shard: each owner's shards, and the shards whose primary is paused.
    by_owner: BTreeMap<String, BTreeSet<ShardId>>,
    paused: BTreeSet<ShardId>,
}

impl Cache {
    /// Applies one change of `key` (`dir/name` under the prefix): put (value, lease) or
    /// deleted (None). Keys the follower does not plan from go to `rest`.
    pub fn apply_one(&mut self, key: &str, change: Option<(&[u8], i64)>) {
        let (dir, name) = key.split_once('/').unwrap_or(("", key));
        let shard = name.parse::<ShardId>().ok();
        // Whatever the key held before goes; what it holds now, if anything, comes back.
        self.rest.remove(key);
        match (dir, shard) {
            ("hosts", _) => {
                self.hosts.remove(name);
            }
            ("shards", Some(s)) => {
                if let Some((owner, _)) = self.keys.remove(&s) {
                    if let Some(set) = self.by_owner.get_mut(&owner) {
                        set.remove(&s);
                        if set.is_empty() {
                            self.by_owner.remove(&owner);
                        }
                    }
                }
            }
            ("primaries", Some(s)) => {
                self.primaries.remove(&s);
                self.paused.remove(&s);
            }
            _ => {}
        }
        let Some((value, lease)) = change else {
            return;
        };
        let kept = match (dir, shard) {
            ("hosts", _) => host_record(value)
                .map(|h| self.hosts.insert(name.to_string(), h))
                .is_some(),
            ("shards", Some(s)) => std::str::from_utf8(value)
                .map(|owner| {
                    self.by_owner
                        .entry(owner.to_string())
                        .or_default()
                        .insert(s);
                    self.keys.insert(s, (owner.to_string(), lease))
                })
                .is_ok(),
            ("primaries", Some(s)) => serde_json::from_slice::<PrimaryRecord>(value)
                .map(|p| {
                    if p.state == PrimaryState::Paused {
                        self.paused.insert(s);
                    }
                    self.primaries.insert(s, p)
                })
                .is_ok(),
            _ => false,
        };
        if !kept {
            self.rest.insert(key.to_string());
        }
    }

    /// The owner keys: shard -> (owner, lease).
    pub fn keys(&self) -> &BTreeMap<ShardId, (String, i64)> {
        &self.keys
    }

    /// The replicated shards' primaries' records.
    pub fn primaries(&self) -> &BTreeMap<ShardId, PrimaryRecord> {
        &self.primaries
    }

    /// The shards whose owner key names `owner`.
    pub fn shards_of(&self, owner: &str) -> impl Iterator<Item = ShardId> + '_ {
        self.by_owner.get(owner).into_iter().flatten().copied()
    }

    /// The shards whose primary is paused for a planned switch (of every tier).
    pub fn paused(&self) -> &BTreeSet<ShardId> {
        &self.paused
    }

    /// How many keys of the range etcd had at `revision`, by this cache.
    pub fn keys_in_range(&self) -> i64 {
        (self.hosts.len() + self.keys.len() + self.primaries.len() + self.rest.len()) as i64
    }
}

fn host_record(value: &[u8]) -> Option<HostAddr> {
    let r = serde_json::from_slice::<HostRecord>(value).ok()?;
    Some(HostAddr {
        addr: r.addr,
        tier: r.tier,
        region: r.region,
    })
}

/// One host's shards, as its follower keeps them between plans.
#[derive(Debug, Clone, Default)]
pub struct Ownership {
    pub me: String,
    pub tier: String,
    /// The shards of this host's tier: the ones it may be given.
    pub tier_shards: Vec<ShardId>,
    /// Shards whose key this host created under its current lease.
    pub held: BTreeSet<ShardId>,
    /// Held shards withdrawn from the view, waiting for the host to let them go.
    pub releasing: BTreeSet<ShardId>,
    /// Shards the host let go of whose key could not be deleted yet (tried again every
    /// poll): never taken up again meanwhile (the delete may have committed, its answer
    /// lost, and another host may take the shard as soon as its cache shows it).
    pub undeleted: BTreeSet<ShardId>,
}

/// What one plan found and decided (see [`Ownership::plan`]).
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Held shards whose key is gone or not under this host's lease: no longer held.
    pub lost: Vec<ShardId>,
    /// Keys under this host's lease it did not hold: now held.
    pub taken_up: Vec<ShardId>,
    /// Held shards newly withdrawn (to be given back), with the host they should go to.
    pub withdrawn: Vec<(ShardId, Option<String>)>,
    /// Free shards this host should own: their keys are to be created (if still absent).
    pub acquire: Vec<ShardId>,
}

impl Ownership {
    /// Plans from `cache` (etcd's state at one revision), given this host's lease (None:
    /// not registered) and whether it may take shards now (its fence is open). Updates
    /// `held` and `releasing`; the caller creates the keys of `acquire` and adds those it
    /// got to `held`.
    pub fn plan(&mut self, cache: &Cache, lease: Option<i64>, may_take: bool) -> Plan {
        let assignment = self.assignment(cache);
        let mine = assignment
            .iter()
            .filter(|(_, h)| **h == self.me)
            .map(|(s, _)| *s)
            .collect();
        self.plan_with(cache, lease, may_take, &assignment, &mine)
    }

    /// The tier's assignment from `cache` (shard -> host): the same on every host of the
    /// tier whose cache is at the same revision and whose shard list is the same.
    pub fn assignment<'c>(&self, cache: &'c Cache) -> BTreeMap<ShardId, &'c str> {
        let tier_hosts: Vec<(&str, &str)> = cache
            .hosts
            .iter()
            .filter(|(_, h)| h.tier == self.tier)
            .map(|(id, h)| (id.as_str(), h.region.as_str()))
            .collect();
        let regions: BTreeMap<ShardId, &str> = cache
            .primaries
            .iter()
            .map(|(s, r)| (*s, r.owner_region()))
            .collect();
        let current: BTreeMap<ShardId, &str> = cache
            .keys
            .iter()
            .map(|(s, (o, _))| (*s, o.as_str()))
            .collect();
        assign_regional_from(&self.tier_shards, &tier_hosts, &regions, &current)
    }

    /// [`Self::plan`] given the tier's [`Self::assignment`] from the same `cache` and the
    /// shards it gives this host (`mine`; `foqs-sim` computes both once for all the hosts
    /// it runs).
    pub fn plan_with<H: AsRef<str>>(
        &mut self,
        cache: &Cache,
        lease: Option<i64>,
        may_take: bool,
        assignment: &BTreeMap<ShardId, H>,
        mine: &BTreeSet<ShardId>,
    ) -> Plan {
        let mut out = Plan::default();
        let keys = &cache.keys;
        // A held shard whose key is gone or not ours any more is lost (should not happen
        // while the lease lives; if it does, stop serving it).
        out.lost = self
            .held
            .iter()
            .copied()
            .filter(|s| keys.get(s).map(|(_, l)| Some(*l)) != Some(lease))
            .collect();
        for s in &out.lost {
            self.held.remove(s);
            self.releasing.remove(s);
        }
        // A key under our lease that we do not hold: a create that committed but whose
        // answer was lost, or a hand-over whose delete failed. The assignment counts it
        // ours (it starts from the keys), so it is taken up: served, or given back again
        // when it should be elsewhere; left alone, nobody would serve it until our lease
        // ended.
        // (A key under this host's lease names this host: only it writes with its lease.)
        out.taken_up = cache
            .shards_of(&self.me)
            .filter(|s| {
                keys.get(s).map(|(_, l)| Some(*l)) == Some(lease)
                    && !self.held.contains(s)
                    && !self.undeleted.contains(s)
                    && self.tier_shards.contains(s)
            })
            .collect();
        self.held.extend(out.taken_up.iter().copied());
        let registered = cache.hosts.contains_key(&self.me) && lease.is_some();
        let settling = self.settling(cache, |s| assignment.contains_key(&s));
        // What a plan decides concerns the shards this host holds and those it should:
        // not every shard of the tier.
        let concerned: BTreeSet<ShardId> = self.held.union(mine).copied().collect();
        for s in &concerned {
            let desired = assignment.get(s).map(AsRef::as_ref);
            if self.held.contains(s) {
                if desired.is_some_and(|d| d != self.me)
                    && !self.releasing.contains(s)
                    && settling.as_ref().is_some_and(|keep| keep(*s))
                {
                    // Kept for now (see `settling`).
                    continue;
                }
                if desired.is_some_and(|d| d != self.me) {
                    if self.releasing.insert(*s) {
                        out.withdrawn.push((*s, desired.map(str::to_string)));
                    }
                } else {
                    self.releasing.remove(s);
                }
                continue;
            }
            if desired == Some(self.me.as_str()) && registered && may_take && !keys.contains_key(s)
            {
                out.acquire.push(*s);
            }
        }
        out
    }

    /// While a planned switch is under way in the tier (a primary paused: a region's
    /// drain keeps one paused nearly all along), shards are not moved for balance alone:
    /// a drain takes a region's shards away set by set, and evening out the loads of the
    /// region they leave after each set moves shards that are about to leave anyway (in
    /// `foqs-sim --etcd`, up to a third more hand-overs than the drain needed). Some(f):
    /// f(shard) is true for a held shard this host keeps even if the assignment puts it
    /// elsewhere, because its region's hosts (or any host, for a shard whose region has
    /// none) include this one. A shard whose region moved away still goes at once, and a
    /// free shard is taken as usual; the loads even out once the switches end.
    /// `in_tier`: whether a shard is one of this host's tier's (a drain in another tier
    /// does not hold this one's balance).
    fn settling<'c>(
        &self,
        cache: &'c Cache,
        in_tier: impl Fn(ShardId) -> bool,
    ) -> Option<impl Fn(ShardId) -> bool + 'c> {
        if !cache.paused().iter().any(|s| in_tier(*s)) {
            return None;
        }
        let mine = cache.hosts.get(&self.me)?.region.clone();
        let staffed: BTreeSet<&str> = cache
            .hosts
            .values()
            .filter(|h| h.tier == self.tier)
            .map(|h| h.region.as_str())
            .collect();
        Some(move |s: ShardId| {
            match cache
                .primaries
                .get(&s)
                .map(PrimaryRecord::owner_region)
                .filter(|r| !r.is_empty() && staffed.contains(r))
            {
                None => true,
                Some(r) => r == mine,
            }
        })
    }

    /// The view to publish: every owner key in `cache`, this host's only while it holds
    /// the shard and is not giving it back, and the shards it has just taken.
    pub fn view(&self, cache: &Cache) -> ClusterView {
        let mut owners: BTreeMap<ShardId, String> = cache
            .keys
            .iter()
            .filter(|(s, (owner, _))| *owner != self.me || self.serves(**s))
            .map(|(s, (owner, _))| (*s, owner.clone()))
            .collect();
        for s in &self.held {
            if self.serves(*s) {
                owners.insert(*s, self.me.clone());
            }
        }
        ClusterView {
            hosts: cache.hosts.clone(),
            owners,
            primaries: cache.primaries.clone(),
            withdrawn: self.releasing.clone(),
        }
    }

    fn serves(&self, s: ShardId) -> bool {
        self.held.contains(&s) && !self.releasing.contains(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(c: &Cache, shard: ShardId) -> Option<&str> {
        c.keys.get(&shard).map(|(o, _)| o.as_str())
    }

    #[test]
    fn puts_and_deletes_of_each_directory_are_applied_and_others_ignored() {
        let mut c = Cache::default();
        c.apply_one("shards/1", Some((b"a", 7)));
        assert_eq!(c.keys[&1], ("a".to_string(), 7));
        c.apply_one("shards/2", Some((b"a", 7)));
        c.apply_one("shards/2", Some((b"b", 8)));
        assert_eq!(c.shards_of("a").collect::<Vec<_>>(), vec![1]);
        assert_eq!(c.shards_of("b").collect::<Vec<_>>(), vec![2]);
        c.apply_one("shards/1", None);
        c.apply_one("shards/2", None);
        assert_eq!(owner(&c, 1), None);
        assert_eq!(c.shards_of("a").count(), 0);
        c.apply_one("hosts/h1", Some((br#"{"addr":"x:1","tier":"t"}"#, 7)));
        assert_eq!(c.hosts["h1"].addr, "x:1");
        assert_eq!(c.hosts["h1"].region, "", "a record without a region");
        c.apply_one("hosts/h1", None);
        assert!(c.hosts.is_empty());
        // Acks, an older build's quota bucket, keys that do not parse: not planned
        // from, but counted.
        c.apply_one("paused/3", Some((br#"{"generation":1,"host":"h"}"#, 7)));
        c.apply_one("quota/ns", Some((b"{}", 0)));
        c.apply_one("shards/nope", Some((b"a", 7)));
        c.apply_one("hosts/h2", Some((b"not json", 7)));
        assert!(c.hosts.is_empty() && c.keys.is_empty() && c.primaries.is_empty());
        assert_eq!(c.keys_in_range(), 4);
        // A record that stops parsing leaves the plan; one that starts, joins it.
        c.apply_one("hosts/h2", Some((br#"{"addr":"x:2","tier":"t"}"#, 7)));
        c.apply_one("primaries/5", Some((b"{}", 0)));
        assert_eq!(c.hosts["h2"].addr, "x:2");
        assert_eq!(c.keys_in_range(), 5);
        c.apply_one("hosts/h2", Some((b"broken", 7)));
        assert!(c.hosts.is_empty());
        assert_eq!(c.keys_in_range(), 5);
        for k in [
            "paused/3",
            "quota/ns",
            "shards/nope",
            "hosts/h2",
            "primaries/5",
        ] {
            c.apply_one(k, None);
        }
        assert_eq!(c, Cache::default());
    }

    fn host(c: &mut Cache, id: &str) {
        let r = format!(r#"{{"addr":"{id}:1","tier":"t"}}"#);
        c.apply_one(&format!("hosts/{id}"), Some((r.as_bytes(), 1)));
    }

    fn seat(me: &str, shards: u32) -> Ownership {
        Ownership {
            me: me.into(),
            tier: "t".into(),
            tier_shards: (0..shards as ShardId).collect(),
            ..Ownership::default()
        }
    }

    fn primary(c: &mut Cache, shard: ShardId, region: &str, paused_to: Option<&str>) {
        let r = PrimaryRecord {
            addr: "db:3306".into(),
            region: region.into(),
            generation: 1,
            state: match paused_to {
                Some(_) => PrimaryState::Paused,
                None => PrimaryState::Serving,
            },
            next_region: paused_to.map(str::to_string),
        };
        let v = serde_json::to_vec(&r).unwrap();
        c.apply_one(&format!("primaries/{shard}"), Some((&v, 0)));
    }

    #[test]
    fn while_a_switch_is_under_way_shards_move_for_their_region_but_not_for_balance() {
        let mut c = Cache::default();
        for (id, region) in [("a", "r1"), ("b", "r1"), ("c", "r2")] {
            let r = format!(r#"{{"addr":"{id}:1","tier":"t","region":"{region}"}}"#);
            c.apply_one(&format!("hosts/{id}"), Some((r.as_bytes(), 1)));
        }
        // Shards 0-3 in r1, all held by a (b holds none: a is over its share); 4 in r2.
        let mut a = seat("a", 5);
        for s in 0..4 {
            primary(&mut c, s, "r1", None);
            c.apply_one(&format!("shards/{s}"), Some((b"a", 7)));
            a.held.insert(s);
        }
        primary(&mut c, 4, "r2", None);
        c.apply_one("shards/4", Some((b"c", 9)));
        // A switch in another tier (shard 99 is not a's tier's) holds nothing here: a,
        // over its share in r1, gives b two shards.
        let mut other = c.clone();
        primary(&mut other, 99, "r1", Some("r2"));
        let p = a.clone().plan(&other, Some(7), true);
        let to_b = p
            .withdrawn
            .iter()
            .filter(|(_, h)| h.as_deref() == Some("b"));
        assert_eq!(to_b.count(), 2, "{p:?}");
        // Shard 3's set is paused on its way to r2: it goes to c at once, while the
        // shards a holds beyond its share in r1 stay until the switch is done.
        primary(&mut c, 3, "r1", Some("r2"));
        assert_eq!(c.paused().iter().collect::<Vec<_>>(), vec![&3]);
        let mut during = a.clone();
        let p = during.plan(&c, Some(7), true);
        assert_eq!(p.withdrawn, vec![(3, Some("c".to_string()))], "{p:?}");
        // The switch done: balance resumes, and a gives b its share.
        primary(&mut c, 3, "r2", None);
        assert!(c.paused().is_empty());
        let p = a.plan(&c, Some(7), true);
        let to_b = p
            .withdrawn
            .iter()
            .filter(|(_, h)| h.as_deref() == Some("b"));
        assert_eq!(to_b.count(), 1, "{p:?}");
        assert!(p.withdrawn.contains(&(3, Some("c".to_string()))), "{p:?}");
    }

    #[test]
    fn a_plan_takes_free_shards_gives_back_moved_ones_and_notices_lost_keys() {
        let mut c = Cache::default();
        host(&mut c, "a");
        let mut a = seat("a", 4);
        // Alone: every free shard is a's to take, unless its fence is closed or it has no
        // lease.
        assert!(a.plan(&c, None, true).acquire.is_empty());
        assert!(a.plan(&c, Some(7), false).acquire.is_empty());
        let p = a.plan(&c, Some(7), true);
        assert_eq!(p.acquire, vec![0, 1, 2, 3]);
        for s in p.acquire {
            a.held.insert(s);
            c.apply_one(&format!("shards/{s}"), Some((b"a", 7)));
        }
        assert_eq!(a.view(&c).owners.len(), 4);
        // b joins: a gives back half, and stops showing them as its own at once.
        host(&mut c, "b");
        let p = a.plan(&c, Some(7), true);
        assert_eq!(p.withdrawn.len(), 2);
        assert!(p.withdrawn.iter().all(|(_, to)| to.as_deref() == Some("b")));
        let v = a.view(&c);
        assert_eq!(v.owners.len(), 2, "{v:?}");
        assert_eq!(v.withdrawn.len(), 2);
        // A key of a's deleted behind its back: lost. A key under a's lease it did not
        // hold: taken up.
        let (gone, _) = p.withdrawn[0];
        c.apply_one(&format!("shards/{gone}"), None);
        let kept = *a.held.iter().find(|s| !a.releasing.contains(s)).unwrap();
        c.apply_one(&format!("shards/{kept}"), None);
        // The other withdrawn shard given back: no longer held, its key deleted.
        let stray = p.withdrawn[1].0;
        a.held.remove(&stray);
        a.releasing.remove(&stray);
        c.apply_one(&format!("shards/{stray}"), None);
        let p2 = a.plan(&c, Some(7), true);
        assert!(p2.lost.contains(&gone) && p2.lost.contains(&kept), "{p2:?}");
        assert!(!a.held.contains(&gone));
        assert!(p2.taken_up.is_empty());
        let mut c2 = c.clone();
        c2.apply_one(&format!("shards/{stray}"), Some((b"a", 7)));
        let p3 = a.plan(&c2, Some(7), true);
        assert_eq!(p3.taken_up, vec![stray]);
        assert!(a.held.contains(&stray));
        assert_eq!(owner(&c2, stray), Some("a"));
    }
}
