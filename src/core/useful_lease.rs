//! A delivery leaves the host with a useful lease. Items are handed out (taken out of
//! their shard's staged set, see [`crate::shard::Staged`]) as each topic's claim comes
//! back, but the reply waits for every topic of the dequeue, for further rounds and, when
//! routed, for peers. Under a slow store that wait can outlast a short lease: the consumer
//! would get an item whose lease has ended, which another consumer may already hold.
//!
//! So before the reply leaves, every item with less than half its lease left is re-leased
//! for a whole lease (a `touch` naming its delivery, through the owner of its shard):
//! - done: it goes out with the new lease;
//! - refused (`NOT_FOUND`: that lease ended and the item was settled or delivered again):
//!   it is left out, since the consumer would hold a lease that is no longer theirs;
//! - failed otherwise: it goes out with the lease it has while some of it is left, and is
//!   left out once it has ended.
//!
//! An at-most-once item always goes out: its delivery has already counted, and leaving it
//! out would lose it unseen, while a consumer that gets it late still gets it once.

use std::collections::HashMap;

use super::access::Caller;
use super::api::TouchRequestItem;
use super::host::Host;
use super::validate::limits;
use crate::error::ErrorCode;
use crate::model::{Item, Policy};

/// Whether `item` has less than half of its lease left at `now_ms` (items of unknown
/// lease length are judged by whether the lease has ended).
pub(super) fn needs_renewal(item: &Item, now_ms: i64) -> bool {
    let left = item.lease_expires_ms - now_ms;
    if item.lease_ms <= 0 {
        return left <= 0;
    }
    left * 2 < item.lease_ms
}

impl Host {
    /// `items` as they may leave the host: each with at least half its lease left, or
    /// left out (see the module comment). In order, as given.
    pub(super) async fn with_useful_leases(&self, caller: &Caller, items: Vec<Item>) -> Vec<Item> {
        let now = self.clock.now_ms();
        let stale: Vec<usize> = (0..items.len())
            .filter(|&i| needs_renewal(&items[i], now))
            .collect();
        if stale.is_empty() {
            return items;
        }
        let mut renewed: HashMap<usize, Option<i64>> = HashMap::new();
        for chunk in stale.chunks(limits::ITEMS_PER_REQUEST_MAX) {
            let asked = self.clock.now_ms();
            let touches = chunk
                .iter()
                .map(|&i| {
                    let it = &items[i];
                    TouchRequestItem {
                        id: it.id.to_string(),
                        // Unknown length (an older peer's item): a whole default lease.
                        extend_ms: if it.lease_ms > 0 { it.lease_ms } else { 30_000 },
                        lease_id: Some(it.lease_token),
                    }
                })
                .collect::<Vec<_>>();
            let extends: Vec<i64> = touches.iter().map(|t| t.extend_ms).collect();
            let outcomes = match self.touch(caller, touches, (None, None)).await {
                Ok(o) => o,
                Err(e) => vec![Err(e); chunk.len()],
            };
            for ((&i, extend), r) in chunk.iter().zip(extends).zip(outcomes) {
                let verdict = match r {
                    // The worker extended it from its own now, at or after `asked`.
                    Ok(()) => Some(asked + extend),
                    Err(e) => {
                        let it = &items[i];
                        tracing::debug!(id = %it.id, error = %e, "re-lease at hand-out failed");
                        let ended = it.lease_expires_ms <= self.clock.now_ms();
                        let lost = e.code == ErrorCode::NotFound || ended;
                        (it.policy == Policy::AtMostOnce || !lost).then_some(it.lease_expires_ms)
                    }
                };
                renewed.insert(i, verdict);
            }
        }
        let mut out = Vec::with_capacity(items.len());
        let mut dropped = 0u64;
        for (i, mut it) in items.into_iter().enumerate() {
            match renewed.get(&i) {
                None => out.push(it),
                Some(Some(expires)) => {
                    it.lease_expires_ms = it.lease_expires_ms.max(*expires);
                    out.push(it);
                }
                Some(None) => dropped += 1,
            }
        }
        let kept = stale.len() as u64 - dropped;
        self.metrics.leases_renewed_at_handout(kept, dropped);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ItemId;

    fn item(lease_ms: i64, lease_expires_ms: i64) -> Item {
        Item {
            id: ItemId { shard: 0, key: 1 },
            ns: "n".into(),
            topic: "t".into(),
            priority: 0,
            payload: vec![],
            metadata: vec![],
            deliver_after_ms: 0,
            enqueued_at_ms: 0,
            delivery_count: 1,
            lease_expires_ms,
            lease_ms,
            policy: Policy::AtLeastOnce,
            expires_at_ms: None,
            lease_token: 7,
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
