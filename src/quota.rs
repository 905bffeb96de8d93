//! Namespace enqueue quotas, enforced across every host of a tier.
//!
//! # Algorithm
//! Each limited namespace has one token bucket for its whole tier: it refills at
//! `enqueues_per_minute / 60000` tokens per millisecond and holds at most `quota_burst_ms`
//! of that rate (its `burst`; default 10 s, as Kafka measures its quotas over windows of
//! about ten seconds). A producer that offers exactly its rate but is held up for a while
//! (a slow network, a GC pause, a tier busy with another tenant's flood) sends what it owes
//! at once when it resumes: a bucket of one second refused that catch-up once the stall
//! passed a second, so a namespace within its guarantee was refused for another's load. Where the bucket lives is the [`QuotaBudget`]: in etcd (one key
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

/// `quota_burst_ms` when the configuration sets none.
pub const BURST_MS_DEFAULT: u64 = 10_000;
/// The largest `quota_burst_ms` (an hour of the rate).
pub const BURST_MS_MAX: u64 = 3_600_000;

/// A namespace's quota: its rate, and how many ms of it its bucket holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub per_minute: u64,
    pub burst_ms: u64,
}

impl Rate {
    /// The bucket's capacity: `burst_ms` of the rate, at least one token.
    pub fn burst(self) -> f64 {
        (self.per_minute as f64 * self.burst_ms as f64 / 60_000.0).max(1.0)
    }

    /// `1 / divisor` of this rate (at least one per minute), with the same burst time.
    fn share(self, divisor: u64) -> Rate {
        Rate {
            per_minute: (self.per_minute / divisor.max(1)).max(1),
            ..self
        }
    }
}

/// Where a tier's token buckets live.
pub trait QuotaBudget: Send + Sync {
    /// Takes up to `want` tokens from namespace `ns`'s bucket (refilled at `rate`);
    /// returns how many it got (0 when the bucket is empty or cannot be reached).
    fn take(&self, ns: &str, rate: Rate, want: u64) -> BoxFuture<'_, u64>;
}

/// The tokens of a bucket that held `tokens` at `last_ms`, at `now_ms`. A clock behind
/// `last_ms` refills nothing (it never drains the bucket).
pub fn refilled(tokens: f64, last_ms: i64, now_ms: i64, rate: Rate) -> f64 {
    let elapsed = (now_ms - last_ms).max(0) as f64;
    (tokens + elapsed * rate.per_minute as f64 / 60_000.0).min(rate.burst())
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
    fn take(&self, ns: &str, rate: Rate, want: u64) -> BoxFuture<'_, u64> {
        let rate = rate.share(self.divisor);
        let now = self.clock.now_ms();
        let mut buckets = self.buckets.lock().expect("not poisoned");
        let b = buckets.entry(ns.to_string()).or_insert((rate.burst(), now));
        let tokens = refilled(b.0, b.1, now, rate);
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
    pub async fn admit(&self, ns: &str, rate: Rate, n: u64) -> u64 {
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
            let chunk = (n - *held).max(rate.per_minute / 600).max(1);
            *held += self.budget.take(ns, rate, chunk).await;
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

    /// `per_minute` with a bucket of one second.
    fn rate(per_minute: u64) -> Rate {
        Rate {
            per_minute,
            burst_ms: 1000,
        }
    }

    #[tokio::test]
    async fn a_bucket_admits_its_burst_then_its_rate() {
        let clock = ManualClock::new(1_000_000);
        let quotas = Quotas::new(Arc::new(LocalBudget::new(1, Arc::new(clock.clone()))));
        // 600 per minute: 10 per second, burst 10.
        assert_eq!(quotas.admit("ns", rate(600), 25).await, 10);
        assert_eq!(quotas.admit("ns", rate(600), 1).await, 0);
        let mut admitted = 0;
        for _ in 0..600 {
            clock.advance(100);
            admitted += quotas.admit("ns", rate(600), 5).await;
        }
        // 60 s at 10/s, give or take the chunk held at the end.
        assert!((599..=601).contains(&admitted), "admitted {admitted}");
        // Other namespaces have their own buckets.
        assert_eq!(quotas.admit("other", rate(600), 3).await, 3);
    }

    #[tokio::test]
    async fn a_static_share_gets_its_fraction() {
        let clock = ManualClock::new(0);
        let quotas = Quotas::new(Arc::new(LocalBudget::new(3, Arc::new(clock.clone()))));
        let mut admitted = 0;
        for _ in 0..600 {
            clock.advance(100);
            admitted += quotas.admit("ns", rate(1800), 100).await;
        }
        // 1800 / 3 = 600 per minute, plus the 10-token burst.
        assert!((600..=611).contains(&admitted), "admitted {admitted}");
    }

    #[test]
    fn refill_is_capped_and_ignores_a_clock_behind() {
        assert_eq!(refilled(0.0, 0, 6_000, rate(600)), 10.0);
        assert_eq!(refilled(2.0, 0, 100, rate(600)), 3.0);
        assert_eq!(refilled(2.0, 1000, 0, rate(600)), 2.0);
        let ten_s = Rate {
            per_minute: 600,
            burst_ms: 10_000,
        };
        assert_eq!(refilled(0.0, 0, 60_000, ten_s), 100.0);
    }

    /// A producer offering exactly its rate, held up for 3 s and then sending what it owes
    /// at once, is admitted in full with the default bucket; a one-second bucket refused
    /// most of the catch-up (what the tenants bench saw beside a flood).
    #[tokio::test]
    async fn a_producer_catching_up_after_a_stall_is_admitted_at_its_rate() {
        for (burst_ms, refused_max, refused_min) in [(BURST_MS_DEFAULT, 0, 0), (1000, u64::MAX, 15)]
        {
            let clock = ManualClock::new(0);
            let quotas = Quotas::new(Arc::new(LocalBudget::new(1, Arc::new(clock.clone()))));
            let r = Rate {
                per_minute: 600,
                burst_ms,
            };
            let (mut offered, mut admitted) = (0u64, 0u64);
            // 10 items/s for 20 s, one every 100 ms, except nothing from 5 s to 8 s,
            // then the 30 owed at 8 s.
            for tick in 1..=200u64 {
                clock.advance(100);
                if (51..80).contains(&tick) {
                    continue;
                }
                let n = if tick == 80 { 30 } else { 1 };
                offered += n;
                admitted += quotas.admit("ns", r, n).await;
            }
            let refused = offered - admitted;
            assert!(
                refused <= refused_max && refused >= refused_min,
                "burst {burst_ms} ms: {refused} of {offered} refused"
            );
        }
    }
}
