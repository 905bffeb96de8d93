//! A delivery leaves the host with a useful lease. Items are handed out (taken out of
//! their shard's staged set, see [`crate::shard::Staged`]) as each topic's claim comes
//! back, but the reply waits for every topic of the dequeue, for further rounds and, when
//! routed, for peers. Under a slow store that wait can outlast a short lease: the consumer
//! would get an item whose lease has ended, which another consumer may already hold.
//!
//! So before the reply leaves, every item with less than half its lease left is re-leased
//! for a whole lease (a touch of its delivery):
//! - on a shard of this host, the item is still "in reply" there: the expiry scan has left
//!   its lease alone, so the renewal succeeds while the row is on that delivery's lease,
//!   even when its time has passed (nobody else can hold it yet);
//! - on a peer's shard (a routed dequeue), the peer renewed it before it answered; this
//!   host touches it through the owner like any client, which works while its lease
//!   lasts.
//!
//! Renewals run in rounds (a round that waited on a slow store may leave other items
//! under half), so every item that goes out has at least half its lease as the reply
//! leaves. An item whose renewal fails is left out:
//! - while it is in reply on its shard here, its row is still on that lease (nothing else
//!   ends a lease in reply): it is taken back as never handed out and given back
//!   uncounted (ready again, the delivery nobody saw not counted, whatever its policy);
//! - otherwise its lease is over where it lives (a peer, past the in-reply bound here, a
//!   TTL): an at-least-once item is left out (delivered again, or dead when its attempts
//!   are used up), an at-most-once one still goes out (its delivery has counted, and
//!   leaving it out would lose it unseen), and either goes out while its lease lasts.
//!
//! A shard whose worker died while a reply held its items is served by a successor that
//! took those items over as handed to nobody (see `Host::stop_shard`): each round and
//! the last check take them from it again, so that it neither refuses their renewal nor
//! gives them back while a consumer holds them.

use std::collections::{BTreeMap, HashSet};

use futures::future::join_all;

use super::access::Caller;
use super::api::TouchRequestItem;
use super::host::{Host, ShardMap};
use super::validate::limits;
use crate::config::LEASE_MS_DEFAULT;
use crate::model::{Item, Policy, ShardId};
use crate::shard::{Settled, TouchOp};

/// Whether `item` has less than half of its lease left at `now_ms` (items of unknown
/// lease length are judged by whether the lease has ended).
pub(super) fn needs_renewal(item: &Item, now_ms: i64) -> bool {
    let left = item.lease_expires_ms - now_ms;
    if item.lease_ms <= 0 {
        return left <= 0;
    }
    left * 2 < item.lease_ms
}

/// How far a renewal extends an item's lease: a whole lease of it (unknown length, from
/// an older peer: the default lease).
fn extend_ms(item: &Item) -> i64 {
    if item.lease_ms > 0 {
        item.lease_ms
    } else {
        LEASE_MS_DEFAULT
    }
}

/// Renewal rounds in one reply: a round that waited on a slow store may leave other
/// items under half their lease, which the next round renews.
const RENEWAL_ROUNDS_MAX: usize = 3;

impl Host {
    /// `items` as they may leave the host: each with at least half its lease left, or
    /// left out (see the module comment). In order, as given. Ends the "in reply" state of
    /// this host's items, whatever becomes of them.
    pub(super) async fn with_useful_leases(
        &self,
        caller: &Caller,
        mut items: Vec<Item>,
    ) -> Vec<Item> {
        // Positions renewed at least once, and those whose renewal failed (whatever the
        // cause: what becomes of them depends on where they are, see the module comment).
        let mut renewed: HashSet<usize> = HashSet::new();
        let mut failed: HashSet<usize> = HashSet::new();
        for _ in 0..RENEWAL_ROUNDS_MAX {
            let now = self.clock.now_ms();
            let stale: Vec<usize> = (0..items.len())
                .filter(|i| !failed.contains(i) && needs_renewal(&items[*i], now))
                .collect();
            if stale.is_empty() {
                break;
            }
            for (i, r) in self.renew(caller, &items, &stale).await {
                match r {
                    Some(expires) => {
                        let it = &mut items[i];
                        it.lease_expires_ms = it.lease_expires_ms.max(expires);
                        renewed.insert(i);
                    }
                    None => {
                        failed.insert(i);
                    }
                }
            }
        }
        // Still under half after every round (each waited on a slow store): as if its
        // renewal had failed.
        let now = self.clock.now_ms();
        for (i, it) in items.iter().enumerate() {
            if needs_renewal(it, now) {
                failed.insert(i);
            }
        }
        // The workers serving the shards now (one may have died meanwhile).
        let fresh = self.shards();
        let mut out = Vec::with_capacity(items.len());
        let mut back: BTreeMap<ShardId, Vec<Item>> = BTreeMap::new();
        // The leases (key, token) of the items that leave reply as they are.
        let mut settled: BTreeMap<ShardId, Vec<(u64, i64)>> = BTreeMap::new();
        let (mut kept, mut dropped) = (0u64, 0u64);
        for (i, it) in items.into_iter().enumerate() {
            // On a shard of this host (not a peer's, nor one this host let go meanwhile).
            let here = fresh.get(&it.id.shard);
            if let Some(shard) = here.filter(|s| !s.is_in_reply(&it)) {
                // Taken over as handed to nobody by a worker that started since: take it.
                shard.hand_out(vec![it.clone()]);
            }
            if !failed.contains(&i) {
                kept += u64::from(renewed.contains(&i));
                if here.is_some() {
                    settled
                        .entry(it.id.shard)
                        .or_default()
                        .push((it.id.key, it.lease_token));
                }
                out.push(it);
            } else if here.is_some_and(|s| s.is_in_reply(&it)) {
                // Not renewed but in reply here: still on its lease (nothing else ends a
                // lease in reply), and nobody saw this delivery.
                back.entry(it.id.shard).or_default().push(it);
            } else if it.lease_expires_ms > now || it.policy == Policy::AtMostOnce {
                // Its fate is decided where it lives (a peer; here, its shard ended its
                // lease meanwhile): see the module comment.
                out.push(it);
            } else {
                dropped += 1;
            }
        }
        // Out of reply: from here the expiry scan treats them as any delivery.
        for (id, leases) in settled {
            fresh[&id].replied(leases);
        }
        let mut released = 0u64;
        for (id, its) in back {
            // Staged again (taken out of reply in the same step), then given back beside
            // the reply, which need not wait for it. A failed release leaves them staged:
            // the scan gives them back.
            let shard = fresh[&id].clone();
            let n = its.len();
            let its = shard.unhand(its);
            // Not in reply any more (its shard ended its lease meanwhile): left out.
            dropped += (n - its.len()) as u64;
            released += its.len() as u64;
            tokio::spawn(async move {
                if let Err(e) = shard.release(its).await {
                    tracing::debug!(shard = id, error = %e, "giving back items whose re-lease failed");
                }
            });
        }
        self.metrics
            .leases_renewed_at_handout(kept, released, dropped);
        out
    }

    /// Renews the leases of `items[i]` for each `i` of `stale`: at this host's shards as
    /// deliveries in reply, at peers' as a touch. For each, when its lease now ends (None:
    /// not renewed).
    async fn renew(
        &self,
        caller: &Caller,
        items: &[Item],
        stale: &[usize],
    ) -> Vec<(usize, Option<i64>)> {
        let shards = self.shards();
        // A shard whose worker died since it handed these out serves them from a new
        // worker, which took them over as handed to nobody: take them from it again (a
        // touch refuses what its worker holds as staged).
        for (id, its) in by_local_shard(&shards, stale.iter().map(|&i| &items[i])) {
            shards[&id].hand_out(its);
        }
        let mut local: BTreeMap<ShardId, Vec<usize>> = BTreeMap::new();
        let mut remote = Vec::new();
        for &i in stale {
            match shards.contains_key(&items[i].id.shard) {
                true => local.entry(items[i].id.shard).or_default().push(i),
                false => remote.push(i),
            }
        }
        let mut out = Vec::with_capacity(stale.len());
        let asked = self.clock.now_ms();
        let at_shards = join_all(local.iter().map(|(id, positions)| {
            let shard = shards[id].clone();
            let ops = positions
                .iter()
                .map(|&i| TouchOp {
                    key: items[i].id.key,
                    extend_ms: extend_ms(&items[i]),
                    lease_id: Some(items[i].lease_token),
                    in_reply: true,
                })
                .collect();
            async move { shard.touch(ops).await }
        }))
        .await;
        for ((_, positions), r) in local.iter().zip(at_shards) {
            for (n, &i) in positions.iter().enumerate() {
                if let Err(e) = &r {
                    tracing::debug!(id = %items[i].id, error = %e, "re-lease at hand-out failed");
                }
                let done = matches!(&r, Ok(s) if s.get(n) == Some(&Settled::Done));
                out.push((i, done.then(|| asked + extend_ms(&items[i]))));
            }
        }
        for chunk in remote.chunks(limits::ITEMS_PER_REQUEST_MAX) {
            let asked = self.clock.now_ms();
            let touches = chunk
                .iter()
                .map(|&i| TouchRequestItem {
                    id: items[i].id.to_string(),
                    extend_ms: extend_ms(&items[i]),
                    lease_id: Some(items[i].lease_token),
                })
                .collect::<Vec<_>>();
            let outcomes = match self.touch(caller, touches, (None, None)).await {
                Ok(o) => o,
                Err(e) => vec![Err(e); chunk.len()],
            };
            for (&i, r) in chunk.iter().zip(outcomes) {
                out.push((i, r.is_ok().then(|| asked + extend_ms(&items[i]))));
            }
        }
        out
    }
}

/// Clones of the items of this host's shards, by shard.
fn by_local_shard<'a>(
    shards: &ShardMap,
    items: impl Iterator<Item = &'a Item>,
) -> BTreeMap<ShardId, Vec<Item>> {
    let mut out: BTreeMap<ShardId, Vec<Item>> = BTreeMap::new();
    for it in items.filter(|it| shards.contains_key(&it.id.shard)) {
        out.entry(it.id.shard).or_default().push(it.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(lease_ms: i64, lease_expires_ms: i64) -> Item {
        Item {
            lease_expires_ms,
            lease_ms,
            lease_token: 7,
            ..Item::for_test(1)
        }
    }

    #[test]
    fn an_item_with_less_than_half_its_lease_left_is_renewed() {
        assert!(!needs_renewal(&item(1000, 1500), 1000), "half left exactly");
        assert!(needs_renewal(&item(1000, 1499), 1000));
        assert!(needs_renewal(&item(1000, 900), 1000), "ended");
        // Unknown length: only an ended lease.
        assert!(!needs_renewal(&item(0, 1001), 1000));
        assert!(needs_renewal(&item(0, 1000), 1000));
    }
}
