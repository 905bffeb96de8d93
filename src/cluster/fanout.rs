//! Which peers a host polls for their loads and ready topics (`getHostInfo`), and which
//! peers it announces its ready topics to: a bounded number per tier, so that a host's
//! background calls stay flat however large the tier grows.
//!
//! Each tier's hosts sit on a ring (a hash of tier and host id). A host polls, in each
//! tier, the `fanout` hosts that follow its own position on that tier's ring (every host
//! of a tier with no more than `fanout` others: a small tier is polled whole, as before).
//! On a tier's own ring every host is then polled by exactly `fanout` of its tier (the
//! ones before it); a host of another tier lands on the ring at its hash, so a host is
//! polled by about `fanout` x (that tier's hosts / its own tier's) of each other tier.
//! A join or a leave changes the polled set of the `fanout` hosts before it, by one host.
//! (Consistent-hashing's ring, as in Chord's successor lists: each host keeps a bounded
//! window of the ring fresh instead of all of it.)
//!
//! What it costs: routed dequeues and overflow forwards see only the polled peers' loads
//! and ready topics (a host's items are reached through itself and the `fanout` hosts
//! polling it); calls that must be complete (stats, dead letters, topics lists) still ask
//! every host of the tier, on demand.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::HostAddr;

/// A host's place on `tier`'s ring.
fn position(tier: &str, host: &str) -> u64 {
    crate::hash::mixed([tier.as_bytes(), &[0xff], host.as_bytes()])
}

/// Each tier's ring: its hosts in ring order.
pub struct Rings {
    rings: BTreeMap<String, Vec<(u64, String)>>,
}

impl Rings {
    pub fn new(hosts: &BTreeMap<String, HostAddr>) -> Self {
        let mut rings: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
        for (id, h) in hosts {
            rings
                .entry(h.tier.clone())
                .or_default()
                .push((position(&h.tier, id), id.clone()));
        }
        for ring in rings.values_mut() {
            ring.sort_unstable();
        }
        Self { rings }
    }

    /// The hosts `me` polls: in each tier, the `fanout` after its place on that tier's
    /// ring (all of a tier with at most `fanout` others). Never `me`.
    pub fn polled(&self, me: &str, fanout: usize) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for (tier, ring) in &self.rings {
            let at = position(tier, me);
            let has_me = ring
                .binary_search_by(|(p, id)| (*p, id.as_str()).cmp(&(at, me)))
                .is_ok();
            let others = ring.len() - usize::from(has_me);
            if others <= fanout {
                out.extend(
                    ring.iter()
                        .filter(|(_, id)| id != me)
                        .map(|(_, id)| id.clone()),
                );
                continue;
            }
            // The first host past `me`'s place (wrapping), then on round the ring.
            let start = ring.partition_point(|(p, id)| (*p, id.as_str()) <= (at, me));
            out.extend(
                (0..ring.len())
                    .map(|i| &ring[(start + i) % ring.len()].1)
                    .filter(|id| id.as_str() != me)
                    .take(fanout)
                    .cloned(),
            );
        }
        out
    }

    /// The hosts that poll `me` (whose `polled` holds it): those `me` announces its ready
    /// topics to.
    pub fn pollers(&self, me: &str, fanout: usize) -> BTreeSet<String> {
        self.rings
            .values()
            .flatten()
            .map(|(_, id)| id)
            .filter(|id| id.as_str() != me && self.polled(id, fanout).contains(me))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(tiers: &[(&str, usize)]) -> BTreeMap<String, HostAddr> {
        let mut out = BTreeMap::new();
        for (tier, n) in tiers {
            for i in 0..*n {
                out.insert(
                    format!("{tier}-h{i}"),
                    HostAddr {
                        addr: format!("127.0.0.1:{i}"),
                        tier: tier.to_string(),
                        region: String::new(),
                    },
                );
            }
        }
        out
    }

    #[test]
    fn a_small_tier_is_polled_whole() {
        let h = hosts(&[("default", 3), ("gold", 2)]);
        let rings = Rings::new(&h);
        let polled = rings.polled("default-h0", 8);
        let all: BTreeSet<String> = h.keys().filter(|k| *k != "default-h0").cloned().collect();
        assert_eq!(polled, all);
        assert_eq!(rings.pollers("default-h0", 8), all);
    }

    #[test]
    fn a_large_tier_polls_and_is_polled_by_exactly_fanout() {
        let h = hosts(&[("default", 1000)]);
        let rings = Rings::new(&h);
        let mut polled_by: BTreeMap<String, usize> = BTreeMap::new();
        for id in h.keys() {
            let p = rings.polled(id, 8);
            assert_eq!(p.len(), 8, "{id} polls {p:?}");
            assert!(!p.contains(id));
            for q in p {
                *polled_by.entry(q).or_default() += 1;
            }
        }
        assert!(polled_by.values().all(|&n| n == 8), "in-degree is fanout");
        assert_eq!(polled_by.len(), 1000);
        for id in h.keys().take(20) {
            let pollers = rings.pollers(id, 8);
            assert_eq!(pollers.len(), 8);
            assert!(pollers.iter().all(|p| rings.polled(p, 8).contains(id)));
        }
    }

    #[test]
    fn a_join_changes_the_polled_sets_of_fanout_hosts_by_one() {
        let mut h = hosts(&[("default", 300)]);
        let before = Rings::new(&h);
        h.insert(
            "newcomer".into(),
            HostAddr {
                addr: "127.0.0.1:1".into(),
                tier: "default".into(),
                region: String::new(),
            },
        );
        let after = Rings::new(&h);
        let mut changed = 0;
        for id in h.keys().filter(|k| *k != "newcomer") {
            let (a, b) = (before.polled(id, 8), after.polled(id, 8));
            if a != b {
                changed += 1;
                assert_eq!(a.difference(&b).count(), 1);
                assert!(b.contains("newcomer"));
            }
        }
        assert_eq!(changed, 8);
    }

    #[test]
    fn every_other_tier_is_polled_with_the_same_bound() {
        let h = hosts(&[("default", 50), ("gold", 50), ("tiny", 2)]);
        let rings = Rings::new(&h);
        let p = rings.polled("default-h7", 4);
        let count = |tier: &str| p.iter().filter(|id| h[*id].tier == tier).count();
        assert_eq!((count("default"), count("gold"), count("tiny")), (4, 4, 2));
    }
}
