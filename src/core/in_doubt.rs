//! Acks (and below, nacks and touches) whose outcome is in doubt: the call went out to
//! the shard's owner, or to its store, and no answer came back (the owner died or was
//! cut off mid-call, the connection broke at commit), so the items may be deleted. Answering `UNAVAILABLE` ("nothing was applied; retry") would be
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
//!
//! Enqueues in doubt are resolved by asking their shards (see `enqueue_doubt`).
//!
//! Nacks and touches in doubt are resolved the same way:
//! - a nack: done now, or already (the row's `settled_token` is what settled it: this
//!   delivery's lease for a nack naming it (`lease_id`), else the nack's token (see
//!   `Host::nack`); its first try applied, whatever became of the item since), or the
//!   item is gone (finished: this delivery's nack has nothing left to release): OK;
//!   `lease_ended` or "not leased" (the row is there on another lease, or ready or dead
//!   and settled by something else): that answer, certain. (One case stays wrong: the
//!   item nacked by this try, delivered again and nacked by that delivery too, all before
//!   the retry: `lease_ended`, or for an unnamed nack of an item on a third delivery by
//!   then, that delivery settled.)
//! - a touch: done now: OK; `NOT_FOUND` or `lease_ended`: that answer, certain for what
//!   matters (the lease is over now, whatever the first try did). A touch without
//!   `lease_id` is retried too: it extends whatever lease the item is on when it arrives,
//!   so its retry does what the same touch arriving late would (the first try's lease
//!   again, or the next delivery's if that one ended within the bound).

use std::time::Instant;

use futures::future::BoxFuture;

use super::host::Host;
use crate::error::{Error, ErrorCode, Result};

/// Between tries: the shard's next owner appears within a poll of the shard manager.
const RETRY_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// The call whose doubt is resolved: what its retry's answers mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Resolving {
    Ack,
    Nack,
    Touch,
    /// A dead-letter requeue (under its token: see `Host::dlq_requeue`).
    Requeue,
}

/// What one retry's answer says of the first try.
enum Verdict {
    Certain(Result<()>),
    Again,
}

fn judge(call: Resolving, r: Result<()>) -> Verdict {
    let gone = |e: &Error| {
        e.code == ErrorCode::NotFound
            && e.message.contains(ITEM_NOT_FOUND)
            && !e.message.contains(LEASE_ENDED)
    };
    match r {
        Ok(()) => Verdict::Certain(Ok(())),
        // No owner yet, in doubt again, or two hosts' views of the shard's owner disagree
        // while it moves: again.
        Err(e) if e.in_doubt || matches!(e.code, ErrorCode::Unavailable | ErrorCode::WrongHost) => {
            Verdict::Again
        }
        // The item is gone (not: another lease; not: an unknown shard): an ack's or nack's
        // work is done. (Not a requeue's: its first try would have left the item ready.)
        Err(e) if gone(&e) && matches!(call, Resolving::Ack | Resolving::Nack) => {
            Verdict::Certain(Ok(()))
        }
        // A certain refusal of this try (the item on another lease, or, for a touch, no
        // lease at all): the first try was not applied either (or, for a touch, its lease
        // is over anyway).
        Err(e) if e.code == ErrorCode::NotFound => Verdict::Certain(Err(e)),
        // Anything else says nothing of the first try: still in doubt.
        Err(mut e) => {
            e.in_doubt = true;
            Verdict::Certain(Err(e))
        }
    }
}

impl Host {
    /// The token a nack or a dead-letter requeue settles its rows under (see `Host::nack`,
    /// `Host::dlq_requeue`): the forwarding host's (`forwarded_by` set), else drawn here;
    /// negative, so never a lease's. A client's own is ignored: one that matched a row's
    /// `settled_token` (0, say) would make the call a no-op answered OK. (Only a peer may
    /// set `forwarded_by`: see `Access::acting_for`.) A peer's token drawn more than a
    /// minute ahead of this host's clock is refused.
    pub(super) fn call_token(&self, given: Option<i64>, forwarded_by: Option<&str>) -> Result<i64> {
        let now = self.clock.now_ms();
        match given.filter(|t| forwarded_by.is_some() && *t < 0) {
            Some(t) if crate::store::token_from_the_future(t.saturating_neg(), now) => {
                Err(Error::invalid(
                    "the call's token was drawn more than a minute ahead of this host's clock",
                ))
            }
            Some(t) => Ok(t),
            None => Ok(-crate::store::new_batch_token(now)),
        }
    }

    /// Resolves the in-doubt results among `results` (the answers to `items`, see the
    /// module's notes), in place: `retry` runs the call again for some of the items.
    pub(super) async fn resolve_in_doubt<'a, T: Clone>(
        &'a self,
        call: Resolving,
        items: &[T],
        results: &mut [Result<()>],
        retry: impl Fn(Vec<T>) -> BoxFuture<'a, Vec<Result<()>>>,
    ) {
        let deadline = Instant::now() + self.cluster.settings.in_doubt_max;
        let mut open: Vec<usize> = (0..results.len())
            .filter(|&i| results[i].as_ref().is_err_and(|e| e.in_doubt))
            .collect();
        if open.is_empty() {
            return;
        }
        let mut tries = 0u32;
        while !open.is_empty() && Instant::now() < deadline {
            if tries > 0 {
                tokio::time::sleep(RETRY_EVERY).await;
            }
            tries += 1;
            // Each try within what is left of the bound (a try can take a store's or a
            // peer's whole timeout).
            let left = deadline.saturating_duration_since(Instant::now());
            let sub = open.iter().map(|&i| items[i].clone()).collect();
            let Ok(again) = tokio::time::timeout(left, retry(sub)).await else {
                break;
            };
            let mut still = Vec::new();
            for (i, r) in open.into_iter().zip(again) {
                match judge(call, r) {
                    Verdict::Certain(r) => results[i] = r,
                    Verdict::Again => still.push(i),
                }
            }
            open = still;
        }
        if open.is_empty() {
            tracing::info!(?call, tries, "calls in doubt resolved");
        } else {
            tracing::warn!(
                ?call,
                unresolved = open.len(),
                tries,
                "calls still in doubt at the bound: answered UNAVAILABLE, outcome unknown"
            );
        }
    }
}

/// What the shard answers for an ack on another delivery's lease (see `Host::settle`).
pub(super) const LEASE_ENDED: &str = "lease ended";

/// What the shard answers for an ack of an item it does not hold (see `Host::settle`).
pub(super) const ITEM_NOT_FOUND: &str = "not found";
