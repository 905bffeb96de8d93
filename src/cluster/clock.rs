//! [`ClockCheck`]: how far this host's wall clock is from its peers', measured on every
//! peer poll, and whether it is out of bound (`cluster.clock_skew_max_ms`).
//!
//! Leases, due times and TTLs are wall-clock instants a host writes and another may judge
//! after a shard moves; and clients read lease ends in the serving host's clock. A host
//! whose clock is off by `d` makes leases that another host ends `d` early (or late). So a
//! host that finds its clock beyond the bound from most of its peers stops holding shards:
//! it stops renewing its etcd lease (its fence closes, its shards move to hosts that
//! agree), and says so in a metric and in `/readyz`, until its clock is back in bound.
//!
//! A poll sent at `t0` and answered at `t1` (this host's clock), carrying the peer's clock
//! `p`, gives the offset `p - (t0 + t1) / 2` within `(t1 - t0) / 2` (the round trip's
//! asymmetry); only what lies beyond that uncertainty counts. With fewer than two peers
//! answering nothing is decided (two hosts that disagree cannot tell which one is wrong).
//!
//! Lock order: the offsets' lock is taken alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// One poll's view of a peer's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSample {
    /// The peer's clock minus this host's (> 0: the peer is ahead).
    pub offset_ms: i64,
    /// Half the poll's round trip: the offset is known only within it.
    pub uncertainty_ms: i64,
}

impl ClockSample {
    /// How far beyond what the round trip can explain the clocks differ (0: within it).
    pub fn beyond_ms(&self) -> i64 {
        (self.offset_ms.abs() - self.uncertainty_ms).max(0)
    }
}

#[derive(Debug)]
pub struct ClockCheck {
    bound_ms: i64,
    samples: Mutex<HashMap<String, ClockSample>>,
    out: AtomicBool,
}

impl ClockCheck {
    pub fn new(bound_ms: u64) -> ClockCheck {
        ClockCheck {
            bound_ms: bound_ms as i64,
            samples: Mutex::default(),
            out: AtomicBool::new(false),
        }
    }

    /// A poll of `peer` sent at `t0_ms` and answered at `t1_ms` by this host's clock,
    /// when the peer's clock said `theirs_ms`.
    pub fn observe(&self, peer: &str, t0_ms: i64, t1_ms: i64, theirs_ms: i64) -> ClockSample {
        let s = ClockSample {
            offset_ms: theirs_ms - (t0_ms + t1_ms) / 2,
            uncertainty_ms: ((t1_ms - t0_ms).max(0) + 1) / 2,
        };
        self.lock().insert(peer.to_string(), s);
        s
    }

    /// Keeps only the peers `polled` says this host still polls.
    pub fn retain(&self, polled: impl Fn(&str) -> bool) {
        self.lock().retain(|p, _| polled(p));
    }

    /// Forgets a peer that did not answer (or is no longer polled): only peers heard in
    /// the last round count.
    pub fn forget(&self, peer: &str) {
        self.lock().remove(peer);
    }

    /// After a round of polls: whether this host's clock is out of bound (beyond it from
    /// more than half of the peers heard, and at least two of them). Returns the new state
    /// when it changed.
    pub fn decide(&self) -> Option<bool> {
        let (heard, beyond) = {
            let samples = self.lock();
            let beyond = samples
                .values()
                .filter(|s| s.beyond_ms() > self.bound_ms)
                .count();
            (samples.len(), beyond)
        };
        let out = heard >= 2 && beyond * 2 > heard;
        (self.out.swap(out, Ordering::SeqCst) != out).then_some(out)
    }

    /// Whether this host's clock is out of bound (see [`Self::decide`]).
    pub fn out_of_bound(&self) -> bool {
        self.out.load(Ordering::SeqCst)
    }

    pub fn bound_ms(&self) -> i64 {
        self.bound_ms
    }

    /// The last sample of each peer heard.
    pub fn samples(&self) -> Vec<(String, ClockSample)> {
        let mut v: Vec<_> = self.lock().iter().map(|(p, s)| (p.clone(), *s)).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, ClockSample>> {
        self.samples.lock().expect("not poisoned")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_most_peers_disagree_with_is_out_of_bound() {
        let c = ClockCheck::new(500);
        // A peer 2 s behind, seen over a 40 ms round trip.
        let s = c.observe("a", 10_000, 10_040, 8_020);
        assert_eq!(
            (s.offset_ms, s.uncertainty_ms, s.beyond_ms()),
            (-2_000, 20, 1_980)
        );
        // One peer alone decides nothing: which of the two is wrong?
        assert_eq!(c.decide(), None);
        assert!(!c.out_of_bound());
        // One of two beyond: not a majority.
        c.observe("b", 10_000, 10_010, 10_005);
        assert_eq!(c.decide(), None);
        // Both: this host is the odd one out.
        c.observe("b", 10_000, 10_010, 8_000);
        assert_eq!(c.decide(), Some(true));
        assert!(c.out_of_bound());
        assert_eq!(c.decide(), None);
        // A peer not heard any more no longer counts; the clock back in bound clears it.
        c.forget("a");
        c.observe("b", 10_000, 10_010, 10_100);
        c.observe("c", 10_000, 10_010, 9_900);
        assert_eq!(c.decide(), Some(false));
    }

    #[test]
    fn a_slow_round_trip_is_not_taken_for_skew() {
        let c = ClockCheck::new(500);
        // 1.2 s round trip, peer clock equal: the midpoint guess may be 600 ms off.
        let s = c.observe("a", 0, 1_200, 0);
        assert_eq!(s.beyond_ms(), 0);
    }
}
