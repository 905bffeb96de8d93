//! Which host of a tier should own which shard: every etcd host computes the same answer
//! from what etcd holds (the tier's live hosts, the shards' regions, their owners now).

use std::collections::BTreeMap;

use crate::model::ShardId;

/// Rendezvous (highest random weight) hashing: the owner of `shard` is the host with the
/// highest score. Adding a host moves only the shards it now wins; removing one moves only
/// the shards it had. Deterministic, so every host computes the same assignment.
pub fn rendezvous_owner<'a>(
    shard: ShardId,
    hosts: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    hosts.into_iter().max_by_key(|h| (score(h, shard), *h))
}

/// Assigns `shards` to `hosts` by rendezvous hashing with bounded loads: shards in id
/// order, each to its highest-scoring host that holds fewer than its bound, the fair share
/// rounded up (plus [`SLACK`] of it in tiers of more than [`SLACK_FROM_HOSTS`] hosts, once
/// that adds at least one whole shard). Pure
/// rendezvous leaves 8 shards on 3 hosts as unevenly as 5/2/1; the bound keeps them even,
/// at the price of a few more moves when the hosts change (still deterministic: every host
/// computes the same assignment). The slack is what keeps those moves few at scale: with
/// every host filled to exactly its share, each shard that spilled past its first choice
/// pushed the next one on, and a host joining a tier of 1,000 with 10 shards each moved up
/// to 115 times its share (`foqs-sim --regions 1 --slack-percent 0`); with a quarter's
/// room, at most 1.7 times, hosts holding up to 13 shards instead of 10.
pub fn assign<'a>(shards: &[ShardId], hosts: &[&'a str]) -> BTreeMap<ShardId, &'a str> {
    assign_with_slack(shards, hosts, SLACK)
}

/// How far past its fair share a host may be filled (see [`assign_with_slack`]) ...
pub const SLACK: f64 = 0.25;
/// ... in tiers of more hosts than this.
pub const SLACK_FROM_HOSTS: usize = 8;

/// [`assign`] with each host's bound raised by `slack` (0.25: a quarter more than its fair
/// share, rounded up): fewer shards spill past their first choice, so fewer move when the
/// hosts change, at the price of a less even spread.
pub fn assign_with_slack<'a>(
    shards: &[ShardId],
    hosts: &[&'a str],
    slack: f64,
) -> BTreeMap<ShardId, &'a str> {
    let mut out = BTreeMap::new();
    if hosts.is_empty() {
        return out;
    }
    // The fair share rounded up; with the slack in tiers of more than SLACK_FROM_HOSTS
    // hosts, once it adds at least one whole shard (small tiers stay exactly even: their
    // moves stay within about twice the least).
    let fair = shards.len() as f64 / hosts.len() as f64;
    let exact = shards.len().div_ceil(hosts.len());
    let cap = if hosts.len() > SLACK_FROM_HOSTS && fair * slack >= 1.0 {
        ((fair * (1.0 + slack)).ceil() as usize).max(exact)
    } else {
        exact
    };
    let mut load: BTreeMap<&str, usize> = hosts.iter().map(|h| (*h, 0)).collect();
    let mut sorted = shards.to_vec();
    sorted.sort_unstable();
    for s in sorted {
        let best = hosts
            .iter()
            .filter(|h| load[**h] < cap)
            .max_by_key(|h| (score(h, s), **h))
            .expect("cap x hosts >= shards");
        *load.get_mut(best).expect("a host") += 1;
        out.insert(s, *best);
    }
    out
}

/// [`assign`] with region affinity: a shard whose primary is in a region where the tier
/// has hosts goes to one of those (bounded loads among them); the rest to any host.
pub fn assign_regional<'a>(
    shards: &[ShardId],
    hosts: &[(&'a str, &str)],
    regions: &BTreeMap<ShardId, &str>,
) -> BTreeMap<ShardId, &'a str> {
    assign_regional_with_slack(shards, hosts, regions, SLACK)
}

/// [`assign_regional`] with the bound's slack given (see [`assign_with_slack`]).
pub fn assign_regional_with_slack<'a>(
    shards: &[ShardId],
    hosts: &[(&'a str, &str)],
    regions: &BTreeMap<ShardId, &str>,
    slack: f64,
) -> BTreeMap<ShardId, &'a str> {
    let mut groups: BTreeMap<Option<&str>, Vec<ShardId>> = BTreeMap::new();
    for s in shards {
        let r = regions
            .get(s)
            .copied()
            .filter(|r| !r.is_empty() && hosts.iter().any(|(_, hr)| hr == r));
        groups.entry(r).or_default().push(*s);
    }
    let mut out = BTreeMap::new();
    for (region, group) in groups {
        let pool: Vec<&'a str> = hosts
            .iter()
            .filter(|(_, hr)| region.is_none_or(|r| *hr == r))
            .map(|(h, _)| *h)
            .collect();
        out.extend(assign_with_slack(&group, &pool, slack));
    }
    out
}

fn score(host: &str, shard: ShardId) -> u64 {
    let mut h = crate::hash::fnv1a([host.as_bytes(), &shard.to_le_bytes()[..]]);
    // splitmix64's finalizer: FNV alone leaves scores of similar names correlated.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replicated_shard_goes_to_a_host_of_its_primarys_region() {
        let hosts = [("a1", "r1"), ("a2", "r1"), ("b1", "r2"), ("c1", "r3")];
        let regions = BTreeMap::from([(0, "r2"), (1, "r2"), (2, "r1"), (3, "r9")]);
        let plan = assign_regional(&[0, 1, 2, 3, 4], &hosts, &regions);
        assert_eq!(plan[&0], "b1");
        assert_eq!(plan[&1], "b1");
        assert!(["a1", "a2"].contains(&plan[&2]));
        // No host in its region, or no region: any host.
        assert!(plan.contains_key(&3) && plan.contains_key(&4));
        assert_eq!(plan.len(), 5);
    }

    fn pure(hosts: &[&str], shards: u32) -> BTreeMap<ShardId, String> {
        (0..shards)
            .map(|s| {
                (
                    s,
                    rendezvous_owner(s, hosts.iter().copied())
                        .unwrap()
                        .to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn rendezvous_moves_only_what_a_joining_or_leaving_host_wins_or_had() {
        let three = pure(&["a", "b", "c"], 64);
        let four = pure(&["a", "b", "c", "d"], 64);
        for s in 0..64 {
            if four[&s] != "d" {
                assert_eq!(four[&s], three[&s], "shard {s} moved between old hosts");
            }
        }
        let moved = (0..64).filter(|s| four[s] == "d").count();
        assert!((5..=30).contains(&moved), "d won {moved} of 64");
        let two = pure(&["a", "c"], 64);
        for s in 0..64 {
            if three[&s] != "b" {
                assert_eq!(two[&s], three[&s]);
            }
        }
        // Every host gets some shards.
        for h in ["a", "b", "c"] {
            assert!(three.values().any(|o| o == h));
        }
        assert_eq!(rendezvous_owner(1, std::iter::empty()), None);
    }

    #[test]
    fn bounded_loads_balance_and_move_little() {
        let shards: Vec<ShardId> = (0..8).collect();
        let three = assign(&shards, &["h1", "h2", "h3"]);
        for h in ["h1", "h2", "h3"] {
            let n = three.values().filter(|o| **o == h).count();
            assert!((2..=3).contains(&n), "{h} has {n}: {three:?}");
        }
        let two = assign(&shards, &["h1", "h3"]);
        let moved = shards
            .iter()
            .filter(|s| three[s] != "h2" && two[s] != three[s])
            .count();
        eprintln!("3 -> 2 hosts: {moved} shards of live hosts moved; {three:?} -> {two:?}");
        assert!(moved <= 2, "{moved} shards of live hosts moved");
        let big: Vec<ShardId> = (0..64).collect();
        let four = assign(&big, &["a", "b", "c", "d"]);
        let five = assign(&big, &["a", "b", "c", "d", "e"]);
        let moved = big.iter().filter(|s| four[s] != five[s]).count();
        // Ideal: 64 / 5 ~ 13 move to the new host.
        eprintln!("4 -> 5 hosts: {moved} of 64 moved");
        assert!(moved <= 26, "{moved} of 64 moved");
        assert_eq!(assign(&big, &[]).len(), 0);
    }

    /// The shards a change of hosts moves, against the fewest it could (foqs-sim measures
    /// the same over seeded event streams). Before the slack, a host joining a tier of 300
    /// with 10 shards each moved up to 30 times its share: with every host filled to
    /// exactly its share, each shard that spilled past its first choice pushed the next.
    #[test]
    fn a_join_or_a_leave_at_scale_moves_near_the_least_it_can() {
        let names: Vec<String> = (0..301).map(|i| format!("host-{i:05}")).collect();
        let shards: Vec<ShardId> = (0..3000).collect();
        let all: Vec<&str> = names.iter().map(String::as_str).collect();
        let before = assign(&shards, &all[..300]);
        let moved = |after: &BTreeMap<ShardId, &str>| {
            shards.iter().filter(|s| before[s] != after[s]).count()
        };
        // A join: its fair share is 3000 / 301, about 10.
        let joined = assign(&shards, &all);
        let n = moved(&joined);
        assert!(n <= 20, "a join moved {n} shards (ideal about 10)");
        // A leave: what the host held.
        for gone in [0usize, 150, 299] {
            let rest: Vec<&str> = all[..300]
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != gone)
                .map(|(_, h)| *h)
                .collect();
            let held = before.values().filter(|h| **h == all[gone]).count();
            let n = moved(&assign(&shards, &rest));
            assert!(
                n <= 2 * held.max(5),
                "a leave of a host holding {held} moved {n}"
            );
        }
        // Bounded: no host past a quarter over its share.
        let mut load: BTreeMap<&str, usize> = BTreeMap::new();
        for h in joined.values() {
            *load.entry(h).or_default() += 1;
        }
        assert!(load.values().all(|n| *n <= 13), "{:?}", load.values().max());
    }
}
