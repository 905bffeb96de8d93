//! The fewest shards that must move for a tier to be balanced: every shard served by a
//! host of its group (`cluster::region_groups`, the real grouping: its primary's region
//! when the tier has hosts there, else any host) and each group's hosts within one shard
//! of each other. Zero is "settled"; before an event, on the event's outcome, it is the
//! least any assignment could move for it (a join: the newcomer's share; a crash: what
//! the host held; a drain: the drained shards not already in their new region; added
//! shards: how many).

use std::collections::BTreeMap;

use foqs::cluster::region_groups;
use foqs::model::ShardId;

/// With `owners` (shard -> host index) and `regions` (shard -> owner region), over the
/// hosts up (`live`: index, id, region) and the tier's `shards`. None: no host is up.
pub(super) fn moves_needed(
    shards: &[ShardId],
    live: &[(usize, &str, &str)],
    owners: &BTreeMap<ShardId, usize>,
    regions: &BTreeMap<ShardId, &str>,
) -> Option<usize> {
    if live.is_empty() {
        return None;
    }
    let hosts: Vec<(&str, &str)> = live.iter().map(|(_, id, r)| (*id, *r)).collect();
    let index: BTreeMap<&str, usize> = live.iter().map(|(i, id, _)| (*id, *i)).collect();
    let mut needed = 0;
    for (pool, group) in region_groups(shards, &hosts, regions) {
        let mut load: BTreeMap<usize, usize> = pool.iter().map(|h| (index[h], 0)).collect();
        for s in &group {
            if let Some(l) = owners.get(s).and_then(|o| load.get_mut(o)) {
                *l += 1;
            }
        }
        // Every host ends with q or q + 1; the r that hold most keep q + 1, so the most
        // shards stay where they are.
        let (n, p) = (group.len(), pool.len());
        let (q, r) = (n / p, n % p);
        let mut loads: Vec<usize> = load.into_values().collect();
        loads.sort_unstable_by(|a, b| b.cmp(a));
        let kept: usize = loads
            .iter()
            .enumerate()
            .map(|(i, l)| (*l).min(if i < r { q + 1 } else { q }))
            .sum();
        needed += n - kept;
    }
    Some(needed)
}
