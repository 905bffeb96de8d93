//! [`ListingGate`]: the listing calls (topicStats, getActiveTopics, peek, dlqList) one
//! caller has in flight on this host, at most `server.listing_calls_per_caller_max`; past
//! it the call is refused at once (`RATE_LIMITED`, retryable). They are cheap one at a
//! time (served from memory, or by a shard's bounded reads beside its writer), but a
//! caller looping them over many connections would otherwise take every runtime thread
//! and every shard's read share from the others.
//!
//! A caller is its TLS identity, or its address when it has none. Peers are not counted
//! (they route many clients' calls); the host they route to counts the calls it serves
//! for them.
//!
//! Lock order: the gate's lock is taken alone and never held across an `.await`.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{Caller, Host};
use crate::error::{Error, ErrorCode};

#[derive(Debug)]
pub struct ListingGate {
    max: usize,
    in_flight: Mutex<HashMap<String, usize>>,
}

/// One listing call in flight; dropping it ends it.
#[derive(Debug)]
pub struct ListingPass<'a> {
    gate: &'a ListingGate,
    key: String,
}

impl ListingGate {
    pub fn new(max: usize) -> ListingGate {
        ListingGate {
            max,
            in_flight: Mutex::default(),
        }
    }

    /// A place for one more listing call of caller `key`, or the refusal.
    pub fn enter(&self, key: String) -> Result<ListingPass<'_>, Error> {
        let mut m = self.in_flight.lock().expect("not poisoned");
        let n = m.entry(key.clone()).or_insert(0);
        if *n >= self.max {
            return Err(Error {
                retry_after_ms: Some(100),
                ..Error::new(
                    ErrorCode::RateLimited,
                    format!(
                        "{} listing calls (topicStats, getActiveTopics, peek, dlqList) of this \
                         caller are in progress (server.listing_calls_per_caller_max)",
                        self.max
                    ),
                )
            });
        }
        *n += 1;
        Ok(ListingPass { gate: self, key })
    }
}

impl Drop for ListingPass<'_> {
    fn drop(&mut self) {
        let mut m = self.gate.in_flight.lock().expect("not poisoned");
        if let Some(n) = m.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

impl Host {
    /// A place for one listing call of `caller`, or the refusal; none is needed for a
    /// peer's call (one it routes for a client is counted on the host the client called).
    pub fn listing_pass(&self, caller: &Caller) -> Result<Option<ListingPass<'_>>, Error> {
        if self.is_peer(caller) {
            return Ok(None);
        }
        self.listing.enter(caller.bound_key()).map(Some)
    }

    /// Listing calls in progress here, of every caller.
    pub fn listing_calls_in_progress(&self) -> usize {
        self.listing
            .in_flight
            .lock()
            .expect("not poisoned")
            .values()
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_caller_has_its_own_places() {
        let gate = ListingGate::new(2);
        let a1 = gate.enter("a".into()).unwrap();
        let _a2 = gate.enter("a".into()).unwrap();
        let e = gate.enter("a".into()).unwrap_err();
        assert_eq!((e.code, e.retryable), (ErrorCode::RateLimited, true));
        let _b = gate.enter("b".into()).unwrap();
        drop(a1);
        let _a3 = gate.enter("a".into()).unwrap();
        drop((_a2, _a3, _b));
        assert!(gate.in_flight.lock().unwrap().is_empty());
    }
}
