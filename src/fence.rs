//! [`Fence`]: until when this host may write its shards. A host that holds its shards
//! under a coordination-service lease (etcd) may write only while it is sure the lease has
//! not expired, so that a shard never has two writers; the shard manager moves the fence
//! forward on every renewal and every store checks it before each operation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Monotonic time, so a wall-clock jump cannot move a fence.
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn since_base(t: Instant) -> u64 {
    t.saturating_duration_since(base()).as_micros() as u64
}

#[derive(Debug, Clone)]
pub struct Fence {
    /// Microseconds after `base()` until which writes are allowed.
    until_us: Arc<AtomicU64>,
}

impl Fence {
    /// A fence that never closes: the shards are this host's by configuration.
    pub fn open() -> Fence {
        Fence {
            until_us: Arc::new(AtomicU64::new(u64::MAX)),
        }
    }

    /// A fence that is closed until [`Fence::extend_to`] opens it.
    pub fn closed() -> Fence {
        base();
        Fence {
            until_us: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Allows writes until `until` (never moves the fence back; see [`Fence::close`]).
    pub fn extend_to(&self, until: Instant) {
        self.until_us.fetch_max(since_base(until), Ordering::SeqCst);
    }

    /// No more writes until the fence is extended again.
    pub fn close(&self) {
        self.until_us.store(0, Ordering::SeqCst);
    }

    /// True while writes are allowed.
    pub fn is_open(&self) -> bool {
        since_base(Instant::now()) < self.until_us.load(Ordering::SeqCst)
    }

    /// How long writes remain allowed (`None`: forever).
    pub fn remaining(&self) -> Option<Duration> {
        let until = self.until_us.load(Ordering::SeqCst);
        if until == u64::MAX {
            return None;
        }
        Some(Duration::from_micros(
            until.saturating_sub(since_base(Instant::now())),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_opens_until_its_deadline_and_closes_on_demand() {
        let f = Fence::closed();
        assert!(!f.is_open());
        f.extend_to(Instant::now() + Duration::from_secs(60));
        assert!(f.is_open());
        // Extending to an earlier time does not shorten it.
        f.extend_to(Instant::now());
        assert!(f.is_open());
        f.close();
        assert!(!f.is_open());
        f.extend_to(Instant::now() - Duration::from_millis(1));
        assert!(!f.is_open());
        assert!(Fence::open().is_open());
        assert_eq!(Fence::open().remaining(), None);
    }
}
