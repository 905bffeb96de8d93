//! Namespace enqueue quotas, enforced across every host of a tier.
//!
//! # Algorithm
//! Each limited namespace has one token bucket for its whole tier: it refills at
//! `enqueues_per_minute / 60000` tokens per millisecond and holds at most one second of
//! that rate (`burst`). Where the bucket lives is the [`QuotaBudget`]: in etcd (one key
//! per namespace, updated with compare-and-swap by whichever host needs tokens, see
//! `cluster::EtcdBudget`), or in the process ([`LocalBudget`]) for a single host, or for a
//! static cluster where each host gets `1 / hosts` of the rate.
//!
//! A host does not ask the budget for every item: [`Quotas::admit`] takes from tokens it
//! already holds and, when they run short, takes a chunk of at least 100 ms of the rate
//! from the budget (one etcd transaction). Hosts that see traffic take tokens; idle hosts
//! take none, so the shares follow the traffic with no per-host configuration.
//!
//! # Error bounds
//! Over any interval of length T, a tier admits at most `burst + rate x T + H x chunk`
//! enqueues, where H is the number of hosts and `chunk` is what one host may hold unused
//! (at most 100 ms of the rate, or the last batch's size when larger). It admits less than
//! `rate x T` only while clients ask for less, or by the tokens idle hosts hold (at most
//! `H x chunk`). Hosts' wall clocks refill the shared bucket: a clock that runs ahead by
//! d refills at most `d x rate` early, once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use crate::clock::SharedClock;

/// Where a tier's token buckets live.
pub trait QuotaBudget: Send + Sync {
    /// Takes up to `want` tokens from namespace `ns`'s bucket (refilled at `per_minute`);
    /// returns how many it got (0 when the bucket is empty or cannot be reached).
    fn take(&self, ns: &str, per_minute: u64, want: u64) -> BoxFuture<'_, u64>;
}

/// A bucket's capacity: one second of the rate, at least one token.
pub fn burst(per_minute: u64) -> f64 {
    (per_minute as f64 / 60.0).max(1.0)
}

/// The tokens of a bucket that held `tokens` at `last_ms`, at `now_ms`. A clock behind
/// `last_ms` refills nothing (it never drains the bucket).
pub fn refilled(tokens: f64, last_ms: i64, now_ms: i64, per_minute: u64) -> f64 {
    let elapsed = (now_ms - last_ms).max(0) as f64;
    (tokens + elapsed * per_minute as f64 / 60_000.0).min(burst(per_minute))
}

/// Token buckets in this process, each refilling at `1 / divisor` of the namespace's rate.
pub struct LocalBudget {
    divisor: u64,
    clock: SharedClock,
    buckets: Mutex<HashMap<String, (f64, i64)>>,
}

impl LocalBudget {
    pub fn new(divisor: u64, clock: SharedClock) -> LocalBudget {
        LocalBudget {
            divisor: divisor.max(1),
            clock,
            buckets: Mutex::new(HashMap::new()),
        }
    }
}

impl QuotaBudget for LocalBudget {
    fn take(&self, ns: &str, per_minute: u64, want: u64) -> BoxFuture<'_, u64> {
        let per_minute = (per_minute / self.divisor).max(1);
        let now = self.clock.now_ms();
        let mut buckets = self.buckets.lock().expect("not poisoned");
        let b = buckets
            .entry(ns.to_string())
            .or_insert((burst(per_minute), now));
        let tokens = refilled(b.0, b.1, now, per_minute);
        let got = (tokens.floor() as u64).min(want);
        *b = (tokens - got as f64, now.max(b.1));
        Box::pin(async move { got })
    }
}

/// The tokens this host holds per namespace, in front of the shared budget.
pub struct Quotas {
    budget: Arc<dyn QuotaBudget>,
    held: Mutex<HashMap<String, Arc<tokio::sync::Mutex<u64>>>>,
}

impl Quotas {
    pub fn new(budget: Arc<dyn QuotaBudget>) -> Quotas {
        Quotas {
            budget,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// How many of `n` enqueues of `ns` may go ahead now (the first ones of the batch).
    pub async fn admit(&self, ns: &str, per_minute: u64, n: u64) -> u64 {
        let slot = self
            .held
            .lock()
            .expect("not poisoned")
            .entry(ns.to_string())
            .or_default()
            .clone();
        // One budget call per namespace at a time: concurrent requests share its chunk.
        let mut held = slot.lock().await;
        if *held < n {
            let chunk = (n - *held).max(per_minute / 600).max(1);
            *held += self.budget.take(ns, per_minute, chunk).await;
        }
        let ok = (*held).min(n);
        *held -= ok;
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[tokio::test]
    async fn a_bucket_admits_its_burst_then_its_rate() {
        let clock = ManualClock::new(1_000_000);
        let quotas = Quotas::new(Arc::new(LocalBudget::new(1, Arc::new(clock.clone()))));
        // 600 per minute: 10 per second, burst 10.
        assert_eq!(quotas.admit("ns", 600, 25).await, 10);
        assert_eq!(quotas.admit("ns", 600, 1).await, 0);
        let mut admitted = 0;
        for _ in 0..600 {
            clock.advance(100);
            admitted += quotas.admit("ns", 600, 5).await;
        }
        // 60 s at 10/s, give or take the chunk held at the end.
        assert!((599..=601).contains(&admitted), "admitted {admitted}");
        // Other namespaces have their own buckets.
        assert_eq!(quotas.admit("other", 600, 3).await, 3);
    }

    #[tokio::test]
    async fn a_static_share_gets_its_fraction() {
        let clock = ManualClock::new(0);
        let quotas = Quotas::new(Arc::new(LocalBudget::new(3, Arc::new(clock.clone()))));
        let mut admitted = 0;
        for _ in 0..600 {
            clock.advance(100);
            admitted += quotas.admit("ns", 1800, 100).await;
        }
        // 1800 / 3 = 600 per minute, plus the 10-token burst.
        assert!((600..=611).contains(&admitted), "admitted {admitted}");
    }

    #[test]
    fn refill_is_capped_and_ignores_a_clock_behind() {
        assert_eq!(refilled(0.0, 0, 6_000, 600), 10.0);
        assert_eq!(refilled(2.0, 0, 100, 600), 3.0);
        assert_eq!(refilled(2.0, 1000, 0, 600), 2.0);
    }
}
