//! [`ClockCheck`]: how far this host's wall clock is from its peers', measured on every
//! peer poll, and whether it is out of bound (`cluster.clock_skew_max_ms`).
//!
//! Leases, due times and TTLs are wall-clock instants a host writes and another may judge
//! after a shard moves; and clients read lease ends in the serving host's clock. A host
//! whose clock is off by `d` makes leases that another host ends `d` early (or late). So a
//! host that finds its clock beyond the bound from its peers' stops holding shards:
//! it stops renewing its etcd lease (its fence closes, its shards move to hosts that
//! agree), and says so in a metric and in `/readyz`, until its clock is back in bound.
//!
//! A poll sent at `t0` and answered at `t1` (this host's clock), carrying the peer's clock
//! `p`, gives the offset `p - (t0 + t1) / 2` within `(t1 - t0) / 2` (the round trip's
//! asymmetry); only what lies beyond that uncertainty counts.
//!
//! This host's clock is judged by the median of its own offset (0) and its peers': the
//! cluster's middle clock. One host far off moves the median of the others by nothing, so
//! only it goes out; two hosts off in opposite directions leave the one in the middle in
//! (judged pairwise, each would find both peers beyond the bound, and every host would
//! give its shards up). It goes out past the bound and comes back only under half of it,
//! so a clock near the bound does not make its shards flap. With fewer than two peers
//! answering nothing changes (two hosts that disagree cannot tell which one is wrong).
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

    /// How far this host's clock is from the cluster's middle clock: the median of 0 (its
    /// own) and its peers' offsets, each net of its uncertainty (of an even number, the
    /// one nearer 0). `None` with fewer than two peers heard.
    pub fn from_middle_ms(&self) -> Option<i64> {
        let mut all: Vec<i64> = self
            .lock()
            .values()
            .map(|s| s.offset_ms.signum() * s.beyond_ms())
            .collect();
        if all.len() < 2 {
            return None;
        }
        all.push(0);
        all.sort_unstable();
        let n = all.len();
        let m = if n % 2 == 1 {
            all[n / 2]
        } else {
            let (a, b) = (all[n / 2 - 1], all[n / 2]);
            if a.abs() <= b.abs() {
                a
            } else {
                b
            }
        };
        // The peers' clocks minus this host's: this host is off by the opposite.
        Some(-m)
    }

    /// After a round of polls: whether this host's clock is out of bound (see the module
    /// doc). Returns the new state when it changed.
    pub fn decide(&self) -> Option<bool> {
        let off = self.from_middle_ms()?.abs();
        let was = self.out.load(Ordering::SeqCst);
        let out = if was {
            off >= self.bound_ms / 2
        } else {
            off > self.bound_ms
        };
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
    fn the_host_off_the_clusters_middle_clock_is_out_of_bound() {
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
        // One of two far off: the middle clock is this host's own.
        c.observe("b", 10_000, 10_010, 10_005);
        assert_eq!(c.decide(), None);
        // Both behind by 2 s: this host is the odd one out (2 s ahead).
        c.observe("b", 10_000, 10_010, 8_000);
        assert_eq!(c.from_middle_ms(), Some(1_980));
        assert_eq!(c.decide(), Some(true));
        assert!(c.out_of_bound());
        assert_eq!(c.decide(), None);
        // Hearing fewer than two peers changes nothing.
        c.forget("a");
        assert_eq!(c.decide(), None);
        assert!(c.out_of_bound());
        // Back, but near the bound: still out until under half of it.
        c.observe("b", 10_000, 10_010, 9_600);
        c.observe("c", 10_000, 10_010, 9_600);
        assert_eq!(c.decide(), None);
        c.observe("b", 10_000, 10_010, 10_100);
        c.observe("c", 10_000, 10_010, 9_900);
        assert_eq!(c.decide(), Some(false));
    }

    #[test]
    fn two_hosts_off_in_opposite_directions_leave_the_middle_one_in() {
        // This host is correct; b is 600 ms ahead, c 600 ms behind.
        let a = ClockCheck::new(500);
        a.observe("b", 0, 0, 600);
        a.observe("c", 0, 0, -600);
        assert_eq!(a.decide(), None);
        assert!(!a.out_of_bound());
        // b sees a 600 ms behind and c 1,200 ms behind: b is out.
        let b = ClockCheck::new(500);
        b.observe("a", 0, 0, -600);
        b.observe("c", 0, 0, -1_200);
        assert_eq!(b.decide(), Some(true));
    }

    #[test]
    fn a_slow_round_trip_is_not_taken_for_skew() {
        let c = ClockCheck::new(500);
        // 1.2 s round trip, peer clock equal: the midpoint guess may be 600 ms off.
        let s = c.observe("a", 0, 1_200, 0);
        assert_eq!(s.beyond_ms(), 0);
    }
}
