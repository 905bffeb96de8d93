//! [`Shedder`]: enqueues of namespaces without a guarantee are shed while the machine's
//! CPUs are saturated and a namespace with a guarantee is at work.
//!
//! Why the CPU: on a host shared by a flood and a namespace within its guarantee, what the
//! guaranteed one waits for is not a queue (the fair gate orders those) but the cores.
//! Measured here (`docs/tenants.md`): a flooder enqueuing as fast as it can kept both
//! cores 91 % busy and the guaranteed namespace's p99 went from 1.2 ms to 6 ms; the same
//! flooder held to 85,000 items/s left them 67 % busy, the p99 at 2.9 ms, and consumed
//! more (79,000 items/s against 47,000), since its own dequeues were no longer starved by
//! its enqueues. Lower thread priorities did not help on this machine (a victim beside
//! two `SCHED_IDLE` busy loops still saw 8 ms): only leaving the cores some idle time did.
//!
//! So a controller samples the machine's busy fraction (`/proc/stat`) every [`TICK_MS`]
//! and keeps a rate, in items per second, for the enqueues of namespaces without a
//! guarantee, together (additive-increase, multiplicative-decrease, as TCP does with its
//! window):
//! - while a guaranteed namespace has enqueued within the last second (`protect`) and the
//!   CPUs are busier than `engine.overload_cpu_busy`, the rate drops to [`DECREASE`] of
//!   what was admitted in the last tick (never below [`FLOOR_PER_S`]);
//! - otherwise it grows by [`INCREASE`] each tick while at least half of it is used; with no
//!   guaranteed namespace at work there is no rate at all (nothing is shed: the flood
//!   alone has every core).
//!
//! An enqueue beyond the rate waits for its turn at the rate when that is at most
//! [`DELAY_MAX_MS`] away (so a few producers are paced by their replies, without refusals
//! and retries that would cost the cores what shedding saves), and is refused
//! `RATE_LIMITED` beyond, with `retry_after_ms` (when its turn is as things stand, at
//! most 1 s); a namespace that admitted less than an equal part
//! of the rate in the last tick is never refused, so a light namespace without a
//! guarantee is not shed for a heavy one. A namespace with a guarantee never passes here
//! (its quota already caps it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Instant;

/// How often the machine's CPUs are sampled and the rate adjusted.
pub const TICK_MS: i64 = 100;
/// On saturation, the rate becomes this much of what was admitted in the last tick.
pub const DECREASE: f64 = 0.85;
/// Without saturation, the rate grows by this factor each tick.
pub const INCREASE: f64 = 1.05;
/// The rate never goes below this many items per second: shed namespaces still move.
pub const FLOOR_PER_S: f64 = 1_000.0;
/// An enqueue beyond the rate waits for its turn when it is at most this far away (the
/// host paces its producers without a round trip); further, it is refused.
pub const DELAY_MAX_MS: u64 = 100;

/// Milliseconds on a monotonic clock (since this process first asked): the shedder's
/// time, which a step of the wall clock must not move.
pub fn monotonic_ms() -> i64 {
    static START: LazyLock<Instant> = LazyLock::new(Instant::now);
    START.elapsed().as_millis() as i64
}

/// The machine's CPU time counters, as `/proc/stat`'s first line gives them (all CPUs).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CpuTimes {
    pub total: u64,
    pub idle: u64,
}

impl CpuTimes {
    /// The counters now (`None` where `/proc/stat` cannot be read: not Linux).
    pub fn read() -> Option<CpuTimes> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        CpuTimes::parse(text.lines().next()?)
    }

    /// `cpu  user nice system idle iowait irq softirq steal ...`: idle is idle + iowait.
    pub fn parse(line: &str) -> Option<CpuTimes> {
        let mut fields = line.split_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let v: Vec<u64> = fields.map(|f| f.parse().ok()).collect::<Option<_>>()?;
        if v.len() < 5 {
            return None;
        }
        // guest and guest_nice (fields 9 and 10) are already counted in user and nice.
        let total = v.iter().take(8).sum();
        Some(CpuTimes {
            total,
            idle: v[3] + v[4],
        })
    }

    /// The busy fraction between `earlier` and `self` (`None` when no time passed).
    pub fn busy_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total)?;
        let idle = self.idle.checked_sub(earlier.idle)?;
        (total > 0).then(|| 1.0 - idle.min(total) as f64 / total as f64)
    }
}

#[derive(Default)]
struct State {
    /// Items per second admitted for namespaces without a guarantee; `None`: no limit.
    rate: Option<f64>,
    /// Tokens now (negative: a batch larger than what was there went through on credit).
    tokens: f64,
    tokens_at_ms: i64,
    /// Items admitted since the last tick, by namespace, and in the tick before.
    admitted: HashMap<String, u64>,
    last_admitted: HashMap<String, u64>,
    last_tick_ms: Option<i64>,
    last_busy: f64,
}

/// What [`Shedder::tick`] saw and decided, for metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tick {
    pub busy: f64,
    pub rate: Option<f64>,
}

/// See the module's notes. `busy_max` is `engine.overload_cpu_busy` (0: never shed).
pub struct Shedder {
    busy_max: f64,
    /// Whether something samples the CPUs and ticks (see [`Shedder::start`]).
    ticking: AtomicBool,
    state: Mutex<State>,
}

impl Shedder {
    pub fn new(busy_max: f64) -> Shedder {
        Shedder {
            busy_max,
            ticking: AtomicBool::new(false),
            state: Mutex::new(State::default()),
        }
    }

    /// Says that [`Shedder::tick`] will be called every [`TICK_MS`] from now on; before,
    /// nothing is shed nor counted.
    pub fn start(&self) {
        self.ticking.store(true, Ordering::Relaxed);
    }

    /// Whether `engine.overload_cpu_busy` asks for shedding at all.
    pub fn configured(&self) -> bool {
        self.busy_max > 0.0
    }

    /// Whether shedding can happen now (configured, and ticking).
    pub fn enabled(&self) -> bool {
        self.configured() && self.ticking.load(Ordering::Relaxed)
    }

    /// Adjusts the rate at `now_ms`, the CPUs having been `busy` since the last tick, with
    /// a guaranteed namespace at work or not (`protect`).
    pub fn tick(&self, now_ms: i64, busy: f64, protect: bool) -> Tick {
        let mut s = self.state.lock().unwrap();
        let elapsed_ms = s.last_tick_ms.map_or(TICK_MS, |t| (now_ms - t).max(1));
        s.last_tick_ms = Some(now_ms);
        s.last_busy = busy;
        let admitted: u64 = s.admitted.values().sum();
        let admitted_per_s = admitted as f64 * 1000.0 / elapsed_ms as f64;
        s.last_admitted = std::mem::take(&mut s.admitted);
        s.rate = if !self.enabled() || !protect {
            None
        } else if busy > self.busy_max {
            match s.rate {
                None => Some((admitted_per_s * DECREASE).max(FLOOR_PER_S)),
                // Cut only while the shed namespaces use at least half of their rate:
                // otherwise they are not what keeps the CPUs busy (a backlog being
                // drained, the guaranteed namespace's own work, another process), and
                // cutting again would only ratchet them down to the floor.
                Some(r) if 2.0 * admitted_per_s >= r => {
                    Some((r.min(admitted_per_s) * DECREASE).max(FLOOR_PER_S))
                }
                Some(r) => Some(r),
            }
        } else {
            // Grows only while used: a rate far above what is offered would let the next
            // burst through whole.
            s.rate.map(|r| {
                if 2.0 * admitted_per_s >= r {
                    r * INCREASE
                } else {
                    r
                }
            })
        };
        if s.rate.is_none() {
            s.tokens = 0.0;
        }
        Tick { busy, rate: s.rate }
    }

    /// Lets `items` of namespace `ns` (one without a guarantee) through at `now_ms`:
    /// `Ok(delay_ms)`, to go on after that long (its turn at the rate, at most
    /// [`DELAY_MAX_MS`] away; 0 when nothing is shed), or `Err(retry_after_ms)` when its
    /// turn is further away than that (the hint: when that turn is, at most 1 s).
    pub fn admit(&self, ns: &str, items: usize, now_ms: i64) -> Result<u64, u64> {
        let mut guard = self.state.lock().unwrap();
        let s = &mut *guard;
        let mut delay_ms = 0;
        if let Some(rate) = s.rate {
            let burst = rate * TICK_MS as f64 / 1000.0;
            let since = (now_ms - s.tokens_at_ms).max(0) as f64;
            s.tokens = (s.tokens + since * rate / 1000.0).min(burst);
            s.tokens_at_ms = now_ms;
            // An equal part of the rate, per tick, among those that enqueued lately.
            let active = s.last_admitted.len().max(s.admitted.len()).max(1);
            let part = burst / active as f64;
            // This batch included: one larger than the part is never light.
            let light = (s.last_admitted.get(ns).copied().unwrap_or(0) + items as u64) as f64
                <= part
                && (s.admitted.get(ns).copied().unwrap_or(0) + items as u64) as f64 <= part;
            let after = s.tokens - items as f64;
            if !light && after < 0.0 {
                // Negative tokens are the turns already given out: this one comes after.
                let wait_ms = -after * 1000.0 / rate;
                if wait_ms > DELAY_MAX_MS as f64 {
                    // Its turn as things stand: sooner, a retry would mostly be refused
                    // again (a storm of refusals costs the cores too).
                    return Err((wait_ms.ceil() as u64).clamp(1, 1000));
                }
                delay_ms = wait_ms.ceil() as u64;
            }
            // A light namespace's items are owed like the others', but never more than the
            // waiting room: it cannot push the rest past their 100 ms.
            s.tokens = after.max(-burst);
        }
        // Every enqueue of a namespace without a rate passes here: no allocation once the
        // namespace is counted in this tick.
        match s.admitted.get_mut(ns) {
            Some(n) => *n += items as u64,
            None => {
                s.admitted.insert(ns.to_owned(), items as u64);
            }
        }
        Ok(delay_ms)
    }

    /// The rate now (`None`: not shedding) and the busy fraction last sampled.
    pub fn now(&self) -> (Option<f64>, f64) {
        let s = self.state.lock().unwrap();
        (s.rate, s.last_busy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Offers `n` enqueues of `items` each at `at`: (delayed, refused).
    fn offer(s: &Shedder, ns: &str, n: usize, items: usize, at: i64) -> (usize, usize) {
        let (mut delayed, mut refused) = (0, 0);
        for _ in 0..n {
            match s.admit(ns, items, at) {
                Ok(0) => {}
                Ok(ms) => {
                    assert!(ms <= DELAY_MAX_MS, "{ms}");
                    delayed += 1;
                }
                Err(retry) => {
                    assert!((1..=1000).contains(&retry), "{retry}");
                    refused += 1;
                }
            }
        }
        (delayed, refused)
    }

    #[test]
    fn proc_stat_lines_are_read() {
        let t = CpuTimes::parse("cpu  79029 12428 9323 181837 1180 0 650 47 0 0").unwrap();
        assert_eq!(t.total, 79029 + 12428 + 9323 + 181837 + 1180 + 650 + 47);
        assert_eq!(t.idle, 181837 + 1180);
        let later = CpuTimes {
            total: t.total + 200,
            idle: t.idle + 50,
        };
        assert_eq!(later.busy_since(&t), Some(0.75));
        assert_eq!(t.busy_since(&t), None);
        assert!(CpuTimes::parse("cpu0 1 2 3 4 5").is_none());
        assert!(CpuTimes::parse("cpu 1 2 x 4 5").is_none());
    }

    #[test]
    fn nothing_is_shed_without_a_guaranteed_namespace_at_work_however_busy() {
        let s = Shedder::new(0.75);
        s.start();
        assert_eq!(offer(&s, "flood", 500, 100, 0), (0, 0));
        let t = s.tick(100, 1.0, false);
        assert_eq!(t.rate, None);
        assert_eq!(offer(&s, "flood", 500, 100, 150), (0, 0));
    }

    #[test]
    fn saturation_beside_a_guarantee_cuts_the_rate_and_idle_cpus_give_it_back() {
        let s = Shedder::new(0.75);
        s.start();
        // 50,000 items in the first 100 ms: 500,000 items/s admitted.
        assert_eq!(offer(&s, "flood", 500, 100, 0), (0, 0));
        let t = s.tick(100, 0.95, true);
        assert_eq!(t.rate, Some(500_000.0 * DECREASE));
        assert_eq!(DECREASE, 0.85, "the figures below are for 0.85");
        // 100 ms of the rate is 42,500 items: 425 batches go at once, the next 425 wait
        // their turns (up to 100 ms), the rest are refused.
        assert_eq!(offer(&s, "flood", 1000, 100, 200), (425, 150));
        assert_eq!(s.admit("flood", 100, 200), Err(101));
        // Still saturated: down again, from what went through.
        let rate = 500_000.0 * DECREASE * DECREASE;
        assert_eq!(s.tick(200, 0.9, true).rate, Some(rate));
        // The CPUs idle while the flood uses what it gets: it grows back a step at a time.
        // (100 ms of refill repays 36,125 of the 42,500 owed: 297 batches fit in 100 ms.)
        assert_eq!(offer(&s, "flood", 500, 100, 300), (297, 203));
        assert_eq!(s.tick(300, 0.5, true).rate, Some(rate * INCREASE));
        // Unused, it stays where it is.
        assert_eq!(s.tick(400, 0.5, true).rate, Some(rate * INCREASE));
        // The guaranteed namespace left: no rate.
        assert_eq!(s.tick(500, 0.99, false).rate, None);
        assert_eq!(offer(&s, "flood", 500, 100, 550), (0, 0));
    }

    #[test]
    fn the_rate_never_goes_below_the_floor_and_a_light_namespace_is_not_shed() {
        let s = Shedder::new(0.75);
        s.start();
        assert_eq!(offer(&s, "flood", 10, 10, 0), (0, 0));
        assert_eq!(s.tick(100, 1.0, true).rate, Some(FLOOR_PER_S));
        // The flood spends the tick's tokens, then waits, then is refused; a namespace
        // with a few items still passes at once.
        assert_eq!(offer(&s, "flood", 30, 10, 100), (10, 10));
        assert_eq!(offer(&s, "light", 2, 1, 100), (0, 0));
    }

    #[test]
    fn a_big_batch_is_never_light_and_an_unused_rate_is_not_cut_again() {
        let s = Shedder::new(0.75);
        s.start();
        assert_eq!(offer(&s, "flood", 1, 100, 0), (0, 0));
        assert_eq!(s.tick(100, 1.0, true).rate, Some(FLOOR_PER_S));
        // At the floor a tick holds 100 items: a namespace that sent nothing lately but
        // now sends 1,000 at once is not light; it waits or is refused like the flood.
        assert_eq!(offer(&s, "burst", 1, 1000, 100), (0, 1));
        assert_eq!(offer(&s, "light", 1, 50, 100), (0, 0));
        // Saturated, but the shed namespaces used little of their rate: not cut again (a
        // rate held at 1,200 items/s stays there).
        let s = Shedder::new(0.75);
        s.start();
        assert_eq!(offer(&s, "flood", 1, 1412, 0), (0, 0));
        let rate = s.tick(100, 1.0, true).rate.unwrap();
        assert!(rate > FLOOR_PER_S, "{rate}");
        assert_eq!(offer(&s, "flood", 1, 10, 150), (0, 0));
        assert_eq!(s.tick(200, 1.0, true).rate, Some(rate));
        assert_eq!(s.tick(300, 1.0, true).rate, Some(rate));
    }

    #[test]
    fn disabled_never_sheds() {
        let s = Shedder::new(0.0);
        s.start();
        assert!(!s.enabled());
        // Configured but nothing ticking: not enabled either.
        assert!(!Shedder::new(0.75).enabled());
        assert_eq!(s.tick(100, 1.0, true).rate, None);
        assert_eq!(offer(&s, "flood", 100, 100, 150), (0, 0));
    }
}
