//! A per-shard circuit breaker over a rolling window of the shard's storage operations.
//!
//! Closed: every operation's outcome and latency go into the window. The breaker opens
//! when `failures_max` operations in a row fail, when at least half of a full-enough
//! window failed, or when the window's median latency exceeds `slow_ms` (a shard can be
//! sick without erroring; a timed-out operation counts as a failure). Open: no new
//! enqueues are routed to the shard (its items wait there; nothing is lost) and outcomes
//! are not recorded. After `open_ms` one probe runs; a fast success closes the breaker
//! with an empty window, anything else keeps it open for another `open_ms`.

use std::collections::VecDeque;

/// Outcomes kept in the window.
const WINDOW: usize = 20;
/// Outcomes needed before the rate and latency rules apply.
const WINDOW_MIN: usize = 8;

#[derive(Debug, Clone)]
pub struct Breaker {
    window: VecDeque<(bool, u64)>,
    consecutive_failures: u32,
    failures_max: u32,
    slow_ms: u64,
    open_ms: i64,
    /// While open: when the next probe may run.
    open_until_ms: Option<i64>,
}

impl Breaker {
    pub fn new(failures_max: u32, slow_ms: u64, open_ms: u64) -> Self {
        Breaker {
            window: VecDeque::with_capacity(WINDOW),
            consecutive_failures: 0,
            failures_max: failures_max.max(1),
            slow_ms,
            open_ms: open_ms as i64,
            open_until_ms: None,
        }
    }

    pub fn is_open(&self) -> bool {
        self.open_until_ms.is_some()
    }

    /// True when the breaker is open and its wait is over: time for a probe.
    pub fn probe_due(&self, now_ms: i64) -> bool {
        self.open_until_ms.is_some_and(|t| now_ms >= t)
    }

    /// Records an operation; returns why the breaker opened, when this made it open.
    pub fn observe(&mut self, ok: bool, latency_ms: u64, now_ms: i64) -> Option<String> {
        if self.is_open() {
            return None;
        }
        if self.window.len() == WINDOW {
            self.window.pop_front();
        }
        self.window.push_back((ok, latency_ms));
        self.consecutive_failures = if ok { 0 } else { self.consecutive_failures + 1 };
        let why = self.reason()?;
        self.open_until_ms = Some(now_ms + self.open_ms);
        self.window.clear();
        self.consecutive_failures = 0;
        Some(why)
    }

    fn reason(&self) -> Option<String> {
        if self.consecutive_failures >= self.failures_max {
            return Some(format!("{} failures in a row", self.consecutive_failures));
        }
        if self.window.len() < WINDOW_MIN {
            return None;
        }
        let failed = self.window.iter().filter(|(ok, _)| !ok).count();
        if failed * 2 >= self.window.len() {
            return Some(format!(
                "{failed} of the last {} operations failed",
                self.window.len()
            ));
        }
        let mut latencies: Vec<u64> = self.window.iter().map(|(_, l)| *l).collect();
        latencies.sort_unstable();
        let median = latencies[latencies.len() / 2];
        (median > self.slow_ms)
            .then(|| format!("median latency {median} ms over {} ms", self.slow_ms))
    }

    /// The outcome of a probe; true when it closed the breaker.
    pub fn probe(&mut self, ok: bool, latency_ms: u64, now_ms: i64) -> bool {
        if ok && latency_ms <= self.slow_ms {
            self.open_until_ms = None;
            true
        } else {
            self.open_until_ms = Some(now_ms + self.open_ms);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_and_closes_after_a_good_probe() {
        let mut b = Breaker::new(3, 500, 1000);
        assert!(b.observe(false, 1, 0).is_none());
        assert!(b.observe(false, 1, 1).is_none());
        assert!(b.observe(true, 1, 2).is_none());
        assert!(b.observe(false, 1, 3).is_none());
        assert!(b.observe(false, 1, 4).is_none());
        assert!(!b.is_open(), "failures were not consecutive");
        assert!(b.observe(false, 1, 5).unwrap().contains("in a row"));
        assert!(b.is_open());
        assert!(
            b.observe(true, 1, 6).is_none(),
            "outcomes while open are ignored"
        );
        assert!(b.is_open());
        assert!(!b.probe_due(1004));
        assert!(b.probe_due(1005));
        assert!(!b.probe(false, 1, 1005), "a failed probe keeps it open");
        assert!(!b.probe_due(1500));
        assert!(!b.probe(true, 900, 2005), "a slow probe keeps it open");
        assert!(b.probe(true, 3, 3005));
        assert!(!b.is_open());
    }

    #[test]
    fn opens_when_half_the_window_fails_even_without_a_streak() {
        let mut b = Breaker::new(100, 500, 1000);
        let mut opened = None;
        for i in 0..WINDOW as i64 {
            opened = opened.or(b.observe(i % 2 == 0, 1, i));
        }
        assert!(opened.unwrap().contains("failed"));
    }

    #[test]
    fn opens_when_the_median_latency_is_too_high() {
        let mut b = Breaker::new(3, 500, 1000);
        for i in 0..WINDOW_MIN as i64 - 1 {
            assert!(b.observe(true, 900, i).is_none());
        }
        assert!(b.observe(true, 900, 10).unwrap().contains("latency"));
        // A few slow operations among fast ones do not open it.
        let mut b = Breaker::new(3, 500, 1000);
        for i in 0..WINDOW as i64 {
            assert!(b
                .observe(true, if i % 4 == 0 { 5000 } else { 2 }, i)
                .is_none());
        }
    }
}
