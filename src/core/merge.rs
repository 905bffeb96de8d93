//! The k-way merge at the heart of the prefetch buffer: each shard offers its most urgent
//! keys in order; the merge picks the `n` most urgent across all shards.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::model::{GlobalKey, ReadyKey, ShardId};

/// Merges per-shard sorted key lists into the `n` globally most urgent keys, in order.
pub fn kway_merge(heads: &[(ShardId, Vec<ReadyKey>)], n: usize) -> Vec<GlobalKey> {
    let mut heap = BinaryHeap::with_capacity(heads.len());
    for (i, (shard, keys)) in heads.iter().enumerate() {
        if let Some(k) = keys.first() {
            heap.push(Reverse((GlobalKey::new(*shard, *k), i, 0usize)));
        }
    }
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let Some(Reverse((g, i, pos))) = heap.pop() else {
            break;
        };
        out.push(g);
        let (shard, keys) = &heads[i];
        if let Some(k) = keys.get(pos + 1) {
            heap.push(Reverse((GlobalKey::new(*shard, *k), i, pos + 1)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(priority: i32, deliver_after_ms: i64, key: u64) -> ReadyKey {
        ReadyKey {
            priority,
            deliver_after_ms,
            key,
        }
    }

    #[test]
    fn merges_across_shards_in_priority_then_age_then_id_order() {
        let heads = vec![
            (0, vec![k(1, 5, 10), k(3, 0, 11)]),
            (1, vec![k(1, 4, 99), k(2, 0, 1)]),
            (2, vec![]),
            (3, vec![k(1, 5, 3)]),
        ];
        let got: Vec<(ShardId, u64)> = kway_merge(&heads, 10)
            .iter()
            .map(|g| (g.shard, g.key))
            .collect();
        assert_eq!(got, vec![(1, 99), (3, 3), (0, 10), (1, 1), (0, 11)]);
    }

    #[test]
    fn stops_at_n() {
        let heads = vec![(0, vec![k(1, 0, 1), k(2, 0, 2)]), (1, vec![k(0, 0, 5)])];
        let got: Vec<u64> = kway_merge(&heads, 2).iter().map(|g| g.key).collect();
        assert_eq!(got, vec![5, 1]);
        assert!(kway_merge(&heads, 0).is_empty());
        assert!(kway_merge(&[], 3).is_empty());
    }

    #[test]
    fn matches_a_full_sort_on_many_random_lists() {
        // A small deterministic generator: the property must hold for any input.
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..200 {
            let shards = (next() % 6) as usize;
            let mut heads = Vec::new();
            let mut all = Vec::new();
            for s in 0..shards {
                let mut keys: Vec<ReadyKey> = (0..next() % 20)
                    .map(|_| k((next() % 5) as i32 - 2, (next() % 3) as i64, next() % 1000))
                    .collect();
                keys.sort();
                keys.dedup();
                all.extend(keys.iter().map(|kk| GlobalKey::new(s as ShardId, *kk)));
                heads.push((s as ShardId, keys));
            }
            all.sort();
            let n = (next() % 30) as usize;
            all.truncate(n);
            assert_eq!(kway_merge(&heads, n), all);
        }
    }
}
