//! A per-shard circuit breaker: after `failures_max` consecutive storage failures the shard
//! is open (no new enqueues are routed to it) for `open_ms`, then one probe decides whether
//! it closes again. Items already on the shard wait there; nothing is lost.

#[derive(Debug, Clone)]
pub struct Breaker {
    failures: u32,
    failures_max: u32,
    open_ms: i64,
    /// While open: when the next probe may run.
    open_until_ms: Option<i64>,
}

impl Breaker {
    pub fn new(failures_max: u32, open_ms: u64) -> Self {
        Breaker {
            failures: 0,
            failures_max: failures_max.max(1),
            open_ms: open_ms as i64,
            open_until_ms: None,
        }
    }

    pub fn is_open(&self) -> bool {
        self.open_until_ms.is_some()
    }

    /// True when the breaker is open and its wait is over.
    pub fn probe_due(&self, now_ms: i64) -> bool {
        self.open_until_ms.is_some_and(|t| now_ms >= t)
    }

    pub fn success(&mut self) {
        self.failures = 0;
        self.open_until_ms = None;
    }

    pub fn failure(&mut self, now_ms: i64) {
        self.failures = self.failures.saturating_add(1);
        if self.failures >= self.failures_max {
            self.open_until_ms = Some(now_ms + self.open_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_and_closes_on_success() {
        let mut b = Breaker::new(3, 1000);
        b.failure(0);
        b.failure(1);
        b.success();
        b.failure(2);
        b.failure(3);
        assert!(!b.is_open(), "failures were not consecutive");
        b.failure(4);
        assert!(b.is_open());
        assert!(!b.probe_due(1003));
        assert!(b.probe_due(1004));
        b.failure(1004); // the probe failed: wait again
        assert!(!b.probe_due(1500));
        assert!(b.probe_due(2004));
        b.success();
        assert!(!b.is_open());
    }
}
