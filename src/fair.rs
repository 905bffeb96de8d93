//! [`FairGate`]: the host's work shared among namespaces by weight.
//!
//! Every enqueue and every dequeue's gathering (its claims and refills; never a long poll's
//! wait) takes a permit before it goes to the shards. Permits are few (`slots`), so the
//! shard workers' queues stay short and the order of work is decided here, not by who
//! reached a worker's queue first. When all are taken, a request waits in its namespace's
//! queue, and a freed permit goes to the waiting request with the smallest start tag of
//! start-time fair queuing (Goyal et al.): a request of cost c (items) from a namespace of
//! weight w gets start = max(virtual time, the namespace's last finish) and finish =
//! start + c / w; virtual time is the start of the request last served. So:
//! - namespaces share the permits in proportion to their weights while all wait;
//! - a namespace that was idle starts at the current virtual time: its request is served
//!   before the backlog of one that ran ahead (no credit saved while idle);
//! - work-conserving: a permit never stays free while anyone waits, whoever it is.
//!
//! Waiting is bounded, in requests and in bytes (the items' payloads). Past either bound,
//! a request of a namespace without a guarantee is refused (`RATE_LIMITED`, with a hint of
//! when to retry: how long the queue ahead of it takes to drain at the rate permits are
//! being freed); a namespace with a guarantee (a configured rate, which its quota already
//! caps) always waits instead: its own rate bounds what it can add. So overload sheds the
//! namespaces beyond their guarantee first, and never one within it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;

/// What a namespace gets: its weight, and whether it has a guarantee.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share {
    pub weight: f64,
    pub guaranteed: bool,
}

/// The gate's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Permits held at once across the host.
    pub slots: usize,
    /// Requests waiting, at most (beyond: refusals for namespaces without a guarantee).
    pub waiting_max: usize,
    /// Bytes of waiting requests, at most (same).
    pub waiting_bytes_max: usize,
}

impl Limits {
    /// The engine's settings (`engine.fair_slots`, `fair_waiting_max`,
    /// `fair_waiting_bytes_max`).
    pub fn from_engine(e: &crate::config::EngineConfig) -> Limits {
        Limits {
            slots: e.fair_slots,
            waiting_max: e.fair_waiting_max,
            waiting_bytes_max: e.fair_waiting_bytes_max,
        }
    }
}

/// Why a request was not let through.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// "requests" or "bytes": which bound was reached.
    pub bound: &'static str,
    pub retry_after_ms: u64,
}

struct Waiter {
    start: f64,
    bytes: usize,
    tx: oneshot::Sender<()>,
}

#[derive(Default)]
struct Flow {
    finish: f64,
    queue: VecDeque<Waiter>,
}

#[derive(Default)]
struct State {
    in_use: usize,
    vtime: f64,
    flows: HashMap<String, Flow>,
    waiting: usize,
    waiting_bytes: usize,
    /// Permits released, and since when: the rate the queue drains at.
    released: u64,
    since: Option<Instant>,
}

pub struct FairGate {
    limits: Limits,
    state: Mutex<State>,
}

/// Held while a request's work runs; dropping it passes the permit on.
pub struct Permit {
    gate: Arc<FairGate>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.release();
    }
}

impl FairGate {
    pub fn new(limits: Limits) -> Arc<FairGate> {
        Arc::new(FairGate {
            limits: Limits {
                slots: limits.slots.max(1),
                ..limits
            },
            state: Mutex::new(State::default()),
        })
    }

    /// Waits for a permit for `cost` items of `bytes` from namespace `ns`; see the
    /// module's notes.
    pub async fn enter(
        self: &Arc<FairGate>,
        ns: &str,
        share: Share,
        cost: usize,
        bytes: usize,
    ) -> Result<Permit, Refused> {
        let rx = {
            let mut s = self.state.lock().expect("not poisoned");
            let weight = share.weight.max(f64::MIN_POSITIVE);
            let vtime = s.vtime;
            let flow = s.flows.entry(ns.to_string()).or_default();
            let start = flow.finish.max(vtime);
            if s.in_use < self.limits.slots && s.waiting == 0 {
                // Nobody waits: through at once. With no backlog there is nobody to be
                // fair to, so what it ran ahead before is forgotten: its tag starts from
                // the virtual time, and contention, when it comes, starts even.
                let flow = s.flows.get_mut(ns).expect("just made");
                flow.finish = vtime + cost.max(1) as f64 / weight;
                s.in_use += 1;
                s.since.get_or_insert_with(Instant::now);
                return Ok(Permit { gate: self.clone() });
            }
            if !share.guaranteed {
                let bound = if s.waiting >= self.limits.waiting_max {
                    Some("requests")
                } else if s.waiting_bytes + bytes > self.limits.waiting_bytes_max {
                    Some("bytes")
                } else {
                    None
                };
                if let Some(bound) = bound {
                    let retry_after_ms = s.drain_ms();
                    drop(s);
                    return Err(Refused {
                        bound,
                        retry_after_ms,
                    });
                }
            }
            let (tx, rx) = oneshot::channel();
            let flow = s.flows.get_mut(ns).expect("just made");
            flow.finish = start + cost.max(1) as f64 / weight;
            flow.queue.push_back(Waiter { start, bytes, tx });
            s.waiting += 1;
            s.waiting_bytes += bytes;
            rx
        };
        // Dropped while waiting (the caller went away): the permit it may have been
        // passed is passed on by `release`, which skips closed waiters.
        match rx.await {
            Ok(()) => Ok(Permit { gate: self.clone() }),
            // Not reached: a waiter is answered, or dropped with the gate, which this
            // future holds.
            Err(_) => Err(Refused {
                bound: "closed",
                retry_after_ms: 100,
            }),
        }
    }

    fn release(&self) {
        let mut s = self.state.lock().expect("not poisoned");
        s.released += 1;
        s.in_use -= 1;
        while s.in_use < self.limits.slots {
            // The head with the smallest start tag.
            let Some(ns) = s
                .flows
                .iter()
                .filter_map(|(ns, f)| f.queue.front().map(|w| (w.start, ns)))
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(_, ns)| ns.clone())
            else {
                break;
            };
            let flow = s.flows.get_mut(&ns).expect("found above");
            let w = flow.queue.pop_front().expect("has a head");
            s.waiting -= 1;
            s.waiting_bytes -= w.bytes;
            s.vtime = s.vtime.max(w.start);
            // A waiter whose caller went away takes nothing.
            if w.tx.send(()).is_ok() {
                s.in_use += 1;
            }
        }
        // Flows with nothing waiting whose finish the virtual time has passed hold no
        // state worth keeping: forget them, so that the map holds active namespaces only.
        if s.flows.len() > 64 {
            let vtime = s.vtime;
            s.flows
                .retain(|_, f| !f.queue.is_empty() || f.finish > vtime);
        }
    }

    /// Requests waiting and their bytes (for the metrics).
    pub fn waiting(&self) -> (usize, usize) {
        let s = self.state.lock().expect("not poisoned");
        (s.waiting, s.waiting_bytes)
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }
}

impl State {
    /// How long the requests waiting now take to get permits at the rate permits have been
    /// freed since the gate's first (at least 1 ms, at most 10 s).
    fn drain_ms(&self) -> u64 {
        let Some(since) = self.since else {
            return 100;
        };
        let per_ms = self.released as f64 / since.elapsed().as_millis().max(1) as f64;
        if per_ms <= 0.0 {
            return 100;
        }
        ((self.waiting as f64 / per_ms).ceil() as u64).clamp(1, 10_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(slots: usize, waiting_max: usize) -> Arc<FairGate> {
        FairGate::new(Limits {
            slots,
            waiting_max,
            waiting_bytes_max: 1 << 20,
        })
    }

    const EQUAL: Share = Share {
        weight: 1.0,
        guaranteed: false,
    };

    /// Two namespaces keep requests waiting at all times; the permits they got split as
    /// their weights (3:1) within 10 %.
    #[tokio::test]
    async fn weights_split_a_saturated_gate() {
        let g = gate(1, 10_000);
        let heavy = Share {
            weight: 3.0,
            guaranteed: true,
        };
        let light = Share {
            weight: 1.0,
            guaranteed: true,
        };
        let hold = g.enter("x", EQUAL, 1, 0).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..400 {
            let (ns, share) = if i % 2 == 0 {
                ("heavy", heavy)
            } else {
                ("light", light)
            };
            let (g, order) = (g.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let p = g.enter(ns, share, 1, 0).await.unwrap();
                order.lock().unwrap().push(ns);
                tokio::task::yield_now().await;
                drop(p);
            }));
            tokio::task::yield_now().await;
        }
        // Everyone is queued behind the held permit.
        while g.waiting().0 < 400 {
            tokio::task::yield_now().await;
        }
        drop(hold);
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap();
        // While both had requests waiting (the first 200 served hold 200 light at most).
        let first: Vec<_> = order.iter().take(200).collect();
        let heavy_n = first.iter().filter(|n| ***n == "heavy").count() as f64;
        let ratio = heavy_n / (200.0 - heavy_n);
        assert!(
            (ratio - 3.0).abs() <= 0.3,
            "heavy:light = {ratio} ({heavy_n} of 200)"
        );
    }

    /// A namespace idle until now is served before the backlog of one that ran ahead.
    #[tokio::test]
    async fn a_newcomer_goes_before_a_backlog() {
        let g = gate(1, 10_000);
        let hold = g.enter("flood", EQUAL, 100, 0).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for ns in std::iter::repeat_n("flood", 20).chain(["victim"]) {
            let (g2, order) = (g.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let p = g2.enter(ns, EQUAL, 100, 0).await.unwrap();
                order.lock().unwrap().push(ns);
                drop(p);
            }));
            while g.waiting().0 < tasks.len() {
                tokio::task::yield_now().await;
            }
        }
        drop(hold);
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap();
        let at = order.iter().position(|n| *n == "victim").unwrap();
        assert!(at <= 1, "the victim was served {at}th: {order:?}");
    }

    /// Past the bound, a namespace without a guarantee is refused with a hint; one with a
    /// guarantee waits.
    #[tokio::test]
    async fn overload_sheds_only_namespaces_beyond_their_guarantee() {
        let g = gate(1, 2);
        let hold = g.enter("a", EQUAL, 1, 0).await.unwrap();
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let g = g.clone();
                tokio::spawn(async move { g.enter("a", EQUAL, 1, 0).await.map(drop) })
            })
            .collect();
        while g.waiting().0 < 2 {
            tokio::task::yield_now().await;
        }
        let refused = g.enter("b", EQUAL, 1, 0).await.err().expect("refused");
        assert_eq!(refused.bound, "requests");
        assert!(refused.retry_after_ms >= 1);
        let guaranteed = Share {
            weight: 1.0,
            guaranteed: true,
        };
        let g2 = g.clone();
        let victim = tokio::spawn(async move { g2.enter("v", guaranteed, 1, 0).await.map(drop) });
        while g.waiting().0 < 3 {
            tokio::task::yield_now().await;
        }
        drop(hold);
        assert!(victim.await.unwrap().is_ok());
        for w in waiters {
            assert!(w.await.unwrap().is_ok());
        }
        assert_eq!(g.waiting(), (0, 0));
    }

    /// The bytes bound holds as the requests bound does.
    #[tokio::test]
    async fn waiting_bytes_are_bounded() {
        let g = FairGate::new(Limits {
            slots: 1,
            waiting_max: 1_000,
            waiting_bytes_max: 1_000,
        });
        let hold = g.enter("a", EQUAL, 1, 0).await.unwrap();
        let g2 = g.clone();
        let w = tokio::spawn(async move { g2.enter("a", EQUAL, 1, 900).await.map(drop) });
        while g.waiting().0 < 1 {
            tokio::task::yield_now().await;
        }
        let refused = g.enter("a", EQUAL, 1, 200).await.err().expect("refused");
        assert_eq!(refused.bound, "bytes");
        assert_eq!(g.waiting(), (1, 900));
        drop(hold);
        assert!(w.await.unwrap().is_ok());
    }
}
