//! Forwarded acks whose outcome is in doubt: the call went out to the shard's owner and
//! no answer came back (the owner died or was cut off mid-call), so the owner may have
//! deleted the items. Answering `UNAVAILABLE` ("nothing was applied; retry") would be
//! wrong when it did, and its retry would get `NOT_FOUND`: the client could not tell
//! done from not done. So the forwarding host resolves the outcome before it replies:
//! it acks those items again, through whichever host serves their shards now (the
//! shard's next owner after a death), until each answer is certain or
//! `ClusterSettings::in_doubt_max` has passed:
//! - done now: acked (whichever of the two acks deleted it);
//! - the item is gone: acked. An item leaves its table only when it is finished (acked,
//!   expired by its TTL, or delivered at most once); either way this delivery's item
//!   will not come back, which is what an ack's OK promises. (Which ack deleted it is
//!   not known: the owner's memory of acks died with it.)
//! - the item is on another delivery's lease (`lease_ended`): that answer, certain: an
//!   applied ack would have deleted it;
//! - no owner yet, in doubt again, or `WRONG_HOST` (views of the owner disagree while
//!   the shard moves): tried again;
//! - still no owner, or in doubt again, when the bound passes: `UNAVAILABLE`, with the
//!   message saying the outcome is unknown.

use std::time::Instant;

use super::host::Host;
use super::{AckRequestItem, Caller};
use crate::error::{ErrorCode, Result};

/// Between tries: the shard's next owner appears within a poll of the shard manager.
const RETRY_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

impl Host {
    /// Resolves the in-doubt results among `results` (see the module's notes), in place.
    pub(super) async fn resolve_in_doubt_acks(
        &self,
        caller: &Caller,
        items: &[AckRequestItem],
        results: &mut [Result<()>],
        may_forward: bool,
    ) {
        let deadline = Instant::now() + self.cluster.settings.in_doubt_max;
        let mut open: Vec<usize> = (0..items.len())
            .filter(|&i| results[i].as_ref().is_err_and(|e| e.in_doubt))
            .collect();
        let mut tries = 0u32;
        while !open.is_empty() && Instant::now() < deadline {
            if tries > 0 {
                tokio::time::sleep(RETRY_EVERY).await;
            }
            tries += 1;
            let sub: Vec<AckRequestItem> = open.iter().map(|&i| items[i].clone()).collect();
            // Each try within what is left of the bound (a try can take a store's or a
            // peer's whole timeout).
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(again) =
                tokio::time::timeout(left, self.ack_once(caller, &sub, may_forward)).await
            else {
                break;
            };
            let mut still = Vec::new();
            for (i, r) in open.into_iter().zip(again) {
                match r {
                    Ok(()) => results[i] = Ok(()),
                    // The item is gone (not: another lease; not: an unknown shard).
                    Err(e)
                        if e.code == ErrorCode::NotFound
                            && e.message.contains(ITEM_NOT_FOUND)
                            && !e.message.contains(LEASE_ENDED) =>
                    {
                        results[i] = Ok(())
                    }
                    // No owner yet, in doubt again, or two hosts' views of the shard's
                    // owner disagree while it moves: again.
                    Err(e)
                        if e.in_doubt
                            || matches!(e.code, ErrorCode::Unavailable | ErrorCode::WrongHost) =>
                    {
                        still.push(i)
                    }
                    // A certain refusal of this try (the item on another lease): the
                    // first try was not applied either.
                    Err(e) if e.code == ErrorCode::NotFound => results[i] = Err(e),
                    // Anything else says nothing of the first try: still in doubt.
                    Err(mut e) => {
                        e.in_doubt = true;
                        results[i] = Err(e)
                    }
                }
            }
            open = still;
        }
        if open.is_empty() {
            tracing::info!(tries, "forwarded acks in doubt resolved");
        } else {
            tracing::warn!(
                unresolved = open.len(),
                tries,
                "forwarded acks still in doubt at the bound: answered UNAVAILABLE, outcome unknown"
            );
        }
    }
}

/// What the shard answers for an ack on another delivery's lease (see `Host::settle`).
pub(super) const LEASE_ENDED: &str = "lease ended";

/// What the shard answers for an ack of an item it does not hold (see `Host::settle`).
pub(super) const ITEM_NOT_FOUND: &str = "not found";
