//! [`Staged`]: a shard's claimed items that no consumer holds yet.
//!
//! A claim leases rows in the store, but until the host hands a claimed item to a
//! consumer (at once, or later from the prefetch stage) nobody holds that lease: as far
//! as clients can tell the item is ready. This set is what makes that true for the calls
//! that settle leases, which all go through the shard's worker:
//! - an ack takes the key out before it deletes the row, so a staged copy can no longer
//!   be handed out (an item an ack deleted is never delivered again);
//! - a nack or touch of a key in the set answers `NOT_FOUND`, as for any ready item;
//! - lease expiry of a key still in the set is a release (ready again, the delivery nobody
//!   saw not counted), never an expiry that would delete an at-most-once item unseen;
//! - a release applies only to a key still in the set under the same claim.
//!
//! Handing out is the other side: [`Staged::hand_out`] takes keys out under the same lock,
//! so each staged item is either delivered or settled, never both.
//!
//! A claim's keys are in the set from before its statement runs (as a hand-off's are), so
//! the set always holds every lease this worker may have made and handed to nobody, even
//! while the statement is still out. A shard abandoned because its server was fenced
//! (see `Host::abandon_shard`) closes the set ([`Staged::close`]): nothing is handed out
//! of it any more, and what it holds goes to the successor as unseen leases at once,
//! without waiting for claims in flight on the frozen server to time out. A closed set
//! takes no new claim ([`Staged::stage_claim`]): a claim planned after the successor
//! learned what this set held would be a lease nobody knows.
//!
//! The successor takes those leases as inherited ([`Staged::inherit`]): given back
//! uncounted when they end, like any staged lease, but never handed out (nor live for the
//! prefetch stage), so a late answer of the old worker's claim that reaches a dequeue
//! after the successor opened is not delivered through it.
//!
//! A handed-out item is "in reply" until the host's reply leaves (see
//! `core::useful_lease`): a dequeue hands items out topic by topic, but replies once. While
//! in reply (for at most [`IN_REPLY_MAX_MS`] past its lease's end) the expiry scan leaves
//! its lease alone, so the host can still renew a lease that ended while the reply waited
//! instead of the scan counting a delivery nobody received.
//!
//! Lock order: `keys` is taken alone, or under `Prefetch.topics`; under it only
//! `in_reply` (moving an item between the two), which is otherwise taken alone. Neither
//! is held across an `.await`.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use crate::model::Item;

/// What the set holds under its one lock.
#[derive(Debug, Default)]
struct Held {
    /// Key → the tokens of the claims that may have leased it and handed it to nobody:
    /// one, usually; more when claims of the key failed with an unknown outcome (each may
    /// yet commit late, and the lease it makes must come back uncounted too).
    tokens: HashMap<u64, Vec<i64>>,
    /// Of those, (key, token) inherited from an abandoned or dead predecessor (see
    /// [`Staged::inherit`]): held, never handed out.
    inherited: HashSet<(u64, i64)>,
    /// Closed (see [`Staged::close`]).
    closed: bool,
}

impl Held {
    fn push(&mut self, key: u64, token: i64) {
        let ts = self.tokens.entry(key).or_default();
        if !ts.contains(&token) {
            ts.push(token);
        }
    }

    fn take(&mut self, key: u64, token: i64) -> bool {
        let Some(ts) = self.tokens.get_mut(&key) else {
            return false;
        };
        let Some(at) = ts.iter().position(|t| *t == token) else {
            return false;
        };
        ts.swap_remove(at);
        if ts.is_empty() {
            self.tokens.remove(&key);
        }
        self.inherited.remove(&(key, token));
        true
    }
}

#[derive(Debug, Default)]
pub struct Staged {
    keys: Mutex<Held>,
    /// (key, token) handed out to a reply that has not left the host yet.
    in_reply: Mutex<HashSet<(u64, i64)>>,
}

/// How long past its lease's end an item in reply is left alone by the expiry scan: a
/// reply (and its renewal) that takes longer than this was lost (its task cancelled), and
/// the lease ends as any other.
pub const IN_REPLY_MAX_MS: i64 = 10_000;

impl Staged {
    fn keys(&self) -> std::sync::MutexGuard<'_, Held> {
        // Poisoned only by a worker that died holding it: its shard is being reopened, and
        // the prefetch task that reads it must not die with it.
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Claimed, not handed out yet.
    pub fn add(&self, items: &[Item]) {
        let mut held = self.keys();
        for i in items {
            held.push(i.id.key, i.lease_token);
        }
    }

    pub fn insert(&self, key: u64, token: i64) {
        self.keys().push(key, token);
    }

    /// A claim's keys, staged before its statement runs; false (nothing staged) once the
    /// set is closed: the claim must not run.
    pub fn stage_claim(&self, keys: &[u64], token: i64) -> bool {
        let mut held = self.keys();
        if held.closed {
            return false;
        }
        for k in keys {
            held.push(*k, token);
        }
        true
    }

    /// A lease a predecessor left with nobody: held (given back uncounted when it ends),
    /// never handed out.
    pub fn inherit(&self, key: u64, token: i64) {
        let mut held = self.keys();
        held.push(key, token);
        held.inherited.insert((key, token));
    }

    /// Staged under any claim.
    pub fn contains_key(&self, key: u64) -> bool {
        self.keys().tokens.contains_key(&key)
    }

    /// Staged under claim `token` and not inherited: a copy that may still be handed out.
    pub fn contains(&self, key: u64, token: i64) -> bool {
        let held = self.keys();
        held.tokens.get(&key).is_some_and(|ts| ts.contains(&token))
            && !held.inherited.contains(&(key, token))
    }

    /// The claims `key` is staged under (none: empty).
    pub fn tokens(&self, key: u64) -> Vec<i64> {
        self.keys().tokens.get(&key).cloned().unwrap_or_default()
    }

    /// Takes `key` out, whatever its claims; returns their tokens.
    pub fn remove(&self, key: u64) -> Vec<i64> {
        let mut held = self.keys();
        let tokens = held.tokens.remove(&key).unwrap_or_default();
        for t in &tokens {
            held.inherited.remove(&(key, *t));
        }
        tokens
    }

    /// Takes `key` out of claim `token` when it is in under it.
    pub fn take(&self, key: u64, token: i64) -> bool {
        self.keys().take(key, token)
    }

    /// Nothing is handed out from here on. Keys still come in and go out (a claim in
    /// flight, an ack): only hand-outs end, so [`Self::entries`] holds every lease nobody
    /// was handed, for a successor.
    pub fn close(&self) {
        self.keys().closed = true;
    }

    /// Keeps the items still waiting under their claim (taking them out: they are
    /// deliveries now, in reply until [`Self::replied`]), in order, and drops the rest;
    /// all of them once closed.
    pub fn hand_out(&self, mut items: Vec<Item>) -> Vec<Item> {
        // Both locks at once: an item is never in neither set, where the scan would count
        // its lease's end as a delivery.
        let mut held = self.keys();
        if held.closed {
            return Vec::new();
        }
        items.retain(|i| !held.inherited.contains(&(i.id.key, i.lease_token)));
        let mut in_reply = self.in_reply();
        items.retain(|i| held.take(i.id.key, i.lease_token));
        in_reply.extend(items.iter().map(|i| (i.id.key, i.lease_token)));
        items
    }

    /// Takes deliveries still in reply back as never handed out (staged again under their
    /// claim); returns those it took. One no longer in reply (the scan ended its lease:
    /// too long past its end) is left alone.
    pub fn unhand(&self, mut items: Vec<Item>) -> Vec<Item> {
        let mut held = self.keys();
        let mut in_reply = self.in_reply();
        items.retain(|i| in_reply.remove(&(i.id.key, i.lease_token)));
        for i in &items {
            held.push(i.id.key, i.lease_token);
        }
        items
    }

    fn in_reply(&self) -> std::sync::MutexGuard<'_, HashSet<(u64, i64)>> {
        self.in_reply
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Handed out under claim `token` and its reply has not left yet.
    pub fn is_in_reply(&self, key: u64, token: i64) -> bool {
        self.in_reply().contains(&(key, token))
    }

    /// The reply carrying these deliveries left (or gave up on them).
    pub fn replied(&self, leases: impl IntoIterator<Item = (u64, i64)>) {
        let mut in_reply = self.in_reply();
        for l in leases {
            in_reply.remove(&l);
        }
    }

    /// Deliveries whose reply has not left yet: (key, token).
    pub fn in_reply_entries(&self) -> Vec<(u64, i64)> {
        self.in_reply().iter().copied().collect()
    }

    /// Every (key, token) held: the leases nobody was handed.
    pub fn entries(&self) -> Vec<(u64, i64)> {
        self.keys()
            .tokens
            .iter()
            .flat_map(|(k, ts)| ts.iter().map(move |t| (*k, *t)))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.keys().tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(key: u64, token: i64) -> Item {
        Item {
            lease_token: token,
            ..Item::for_test(key)
        }
    }

    #[test]
    fn a_closed_set_hands_nothing_out_and_says_what_it_held() {
        let s = Staged::default();
        // A claim in flight: its keys are in before its statement runs.
        s.insert(1, 10);
        s.insert(2, 10);
        s.add(&[item(3, 9)]);
        s.close();
        let mut held = s.entries();
        held.sort();
        assert_eq!(held, vec![(1, 10), (2, 10), (3, 9)]);
        // The claim's answer comes back late: nothing of it is handed out.
        s.add(&[item(1, 10)]);
        assert!(s.hand_out(vec![item(1, 10), item(3, 9)]).is_empty());
        assert!(s.in_reply_entries().is_empty());
        // No claim is planned on it any more.
        assert!(!s.stage_claim(&[4], 11));
        assert!(!s.contains_key(4));
    }

    #[test]
    fn inherited_leases_are_held_never_handed_out() {
        let s = Staged::default();
        s.inherit(1, 10);
        s.add(&[item(2, 12)]);
        assert!(s.contains_key(1) && !s.contains(1, 10));
        // A late answer of the predecessor's claim reaches a dequeue: not delivered.
        let out = s.hand_out(vec![item(1, 10), item(2, 12)]);
        assert_eq!(out.iter().map(|i| i.id.key).collect::<Vec<_>>(), vec![2]);
        // Its lease's end gives it back (the scan takes it out under its token).
        assert!(s.take(1, 10));
        assert!(s.is_empty());
        // Claimed again by this worker: handed out as any.
        s.add(&[item(1, 13)]);
        assert_eq!(s.hand_out(vec![item(1, 13)]).len(), 1);
    }

    #[test]
    fn each_claimed_item_is_handed_out_once_unless_settled_first() {
        let s = Staged::default();
        s.add(&[item(1, 10), item(2, 10), item(3, 10)]);
        // An ack took key 2 out; key 3 was released and claimed again under another token.
        assert_eq!(s.remove(2), vec![10]);
        assert!(s.take(3, 10));
        s.add(&[item(3, 11)]);
        let out = s.hand_out(vec![item(1, 10), item(2, 10), item(3, 10)]);
        assert_eq!(out.iter().map(|i| i.id.key).collect::<Vec<_>>(), vec![1]);
        // Handed out: a second hand-out of the same copy gets nothing.
        assert!(s.hand_out(vec![item(1, 10)]).is_empty());
        assert!(!s.take(3, 10), "another claim's token");
        assert!(s.contains(3, 11));
        assert!(s.take(3, 11));
        assert!(s.is_empty());
    }

    #[test]
    fn a_delivery_is_in_reply_until_its_reply_leaves_or_it_is_taken_back() {
        let s = Staged::default();
        s.add(&[item(1, 10), item(2, 10)]);
        assert_eq!(s.hand_out(vec![item(1, 10), item(2, 10)]).len(), 2);
        // Handed out: in reply, not staged (a touch may renew it, the scan leaves it).
        assert!(s.is_in_reply(1, 10) && !s.contains(1, 10));
        // Taken back (its renewal failed): staged again, out of reply, once.
        assert_eq!(s.unhand(vec![item(1, 10)]).len(), 1);
        assert!(s.contains(1, 10) && !s.is_in_reply(1, 10));
        assert!(
            s.unhand(vec![item(1, 10)]).is_empty(),
            "not in reply any more"
        );
        // Its reply left: neither (the scan ends its lease as any delivery's).
        s.replied([(2, 10)]);
        assert!(!s.is_in_reply(2, 10) && !s.contains(2, 10));
        assert!(s.unhand(vec![item(2, 10)]).is_empty());
        assert!(s.in_reply_entries().is_empty());
    }

    #[test]
    fn every_claim_with_an_unknown_outcome_keeps_its_own_token() {
        // Two claims of key 5 failed with unknown outcomes; either may have leased it.
        let s = Staged::default();
        s.insert(5, 1);
        s.insert(5, 2);
        assert_eq!(s.entries().len(), 2);
        // The first one's lease ends: it comes back uncounted (before, the second claim's
        // token had replaced it, and the ending lease counted as a delivery).
        assert!(s.take(5, 1));
        assert!(s.contains(5, 2));
        // A later successful claim's copy is handed out; the other unknown one stays.
        s.add(&[item(5, 3)]);
        assert_eq!(s.hand_out(vec![item(5, 3)]).len(), 1);
        assert_eq!(s.tokens(5), vec![2]);
        assert_eq!(s.remove(5), vec![2]);
        assert!(s.is_empty());
    }
}
