//! [`Faulty`]: any [`ShardStore`] with faults injected around it, for tests (feature
//! `faults`; never in a release build). The store underneath is real: a fault changes when
//! an operation runs, whether it runs, and what its caller hears, never what it does.
//!
//! Faults come two ways: armed by name for one call (`faults.arm("apply", ...)`), or drawn
//! from a seed for every call while [`Faults::storm`] is on, which is how the seeded
//! simulation runs. The fault kinds are those a production store meets:
//! - [`Fault::FailBefore`]: refused before it runs (a connection refused, a deadlock);
//! - [`Fault::FailAfterCommit`]: runs and commits, then the caller hears a timeout (a reply
//!   lost after the commit);
//! - [`Fault::CommitLate`]: the caller hears a timeout at once; the operation commits later
//!   (a statement that MySQL goes on running after the client gave up, SQLite's thread
//!   finishing a job its caller no longer waits for);
//! - [`Fault::Delay`]: runs, late (a slow disk, a busy server);
//! - [`Fault::Hang`]: never answers; the caller's timeout ends the wait and the operation
//!   never runs (a stalled server);
//! - [`Fault::Hold`]: waits until the test lets it go (to stop a worker at a chosen point);
//! - a full disk ([`Faults::set_full`]): every write refused, reads served.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::{
    Change, Handoff, ItemMeta, Recovered, ShardStore, StateCount, StoreError, StoreResult,
};
use crate::model::{Item, NewItem, ReadyKey, TopicCounts, TopicName, Totals};
use crate::seeded::Rng;

/// What an operation meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    FailBefore,
    FailAfterCommit,
    /// The caller hears a timeout now; the operation runs this much later.
    CommitLate(Duration),
    Delay(Duration),
    Hang,
    Hold,
}

impl Fault {
    pub fn label(self) -> &'static str {
        match self {
            Fault::FailBefore => "fail_before",
            Fault::FailAfterCommit => "fail_after_commit",
            Fault::CommitLate(_) => "commit_late",
            Fault::Delay(_) => "delay",
            Fault::Hang => "hang",
            Fault::Hold => "hold",
        }
    }
}

/// A seeded stream of faults: each call meets one with probability `per_mille` / 1000.
pub struct Storm {
    rng: Rng,
    per_mille: u32,
    /// The longest delay, and the longest a late commit comes after its timeout.
    late_max: Duration,
}

impl Storm {
    pub fn new(seed: u64, per_mille: u32, late_max: Duration) -> Storm {
        Storm {
            rng: Rng::new(seed),
            per_mille,
            late_max,
        }
    }

    fn draw(&mut self, write: bool) -> Option<Fault> {
        if !self.rng.chance(self.per_mille) {
            return None;
        }
        let late =
            Duration::from_millis(self.rng.below(self.late_max.as_millis() as usize + 1) as u64);
        // A read has no outcome to lose: it fails, is late, or hangs.
        let kinds = if write { 5 } else { 3 };
        Some(match self.rng.below(kinds) {
            0 => Fault::FailBefore,
            1 => Fault::Delay(late),
            2 => Fault::Hang,
            3 => Fault::FailAfterCommit,
            _ => Fault::CommitLate(late),
        })
    }
}

/// The faults of one store (clones share them).
#[derive(Clone, Default)]
pub struct Faults {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    armed: Mutex<BTreeMap<&'static str, Fault>>,
    always: Mutex<BTreeMap<&'static str, Fault>>,
    storm: Mutex<Option<Storm>>,
    full: AtomicBool,
    /// Faults met so far, by (operation, kind).
    met: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// Notified when a held operation gets there; it goes on when `open` is notified.
    waiting: Notify,
    open: Notify,
}

impl Faults {
    /// The next call of `op` (`"apply"`, `"insert"`, ...) meets `fault`.
    pub fn arm(&self, op: &'static str, fault: Fault) {
        self.inner.armed.lock().unwrap().insert(op, fault);
    }

    /// Every call of `op` meets `fault`, until [`Self::calm`].
    pub fn always(&self, op: &'static str, fault: Fault) {
        self.inner.always.lock().unwrap().insert(op, fault);
    }

    /// Every call meets a fault drawn from `storm`, until [`Self::calm`].
    pub fn storm(&self, storm: Storm) {
        *self.inner.storm.lock().unwrap() = Some(storm);
    }

    /// No more faults: the storm ends, the disk has room, nothing is armed. (Late commits
    /// already under way still land.)
    pub fn calm(&self) {
        *self.inner.storm.lock().unwrap() = None;
        self.inner.armed.lock().unwrap().clear();
        self.inner.always.lock().unwrap().clear();
        self.set_full(false);
    }

    /// While full, every write is refused as SQLite and MySQL refuse on a full disk.
    pub fn set_full(&self, full: bool) {
        self.inner.full.store(full, Ordering::SeqCst);
    }

    /// Notified when an operation armed with [`Fault::Hold`] gets there.
    pub fn waiting(&self) -> &Notify {
        &self.inner.waiting
    }

    /// Lets a held operation go on.
    pub fn release(&self) {
        self.inner.open.notify_one();
    }

    /// How many faults were met, by operation and kind.
    pub fn met(&self) -> Vec<(String, String, u64)> {
        let met = self.inner.met.lock().unwrap();
        met.iter()
            .map(|((op, kind), n)| (op.to_string(), kind.to_string(), *n))
            .collect()
    }

    fn draw(&self, op: &'static str, write: bool) -> Option<Fault> {
        let always = self.inner.always.lock().unwrap().get(op).copied();
        let fault = always
            .or_else(|| self.inner.armed.lock().unwrap().remove(op))
            .or_else(|| {
                let mut storm = self.inner.storm.lock().unwrap();
                storm.as_mut().and_then(|s| s.draw(write))
            });
        if let Some(f) = fault {
            *self
                .inner
                .met
                .lock()
                .unwrap()
                .entry((op, f.label()))
                .or_default() += 1;
        }
        fault
    }

    fn full(&self, op: &'static str) -> bool {
        let full = self.inner.full.load(Ordering::SeqCst);
        if full {
            *self
                .inner
                .met
                .lock()
                .unwrap()
                .entry((op, "disk_full"))
                .or_default() += 1;
        }
        full
    }
}

pub struct Faulty<S> {
    inner: Arc<S>,
    faults: Faults,
}

impl<S: ShardStore> Faulty<S> {
    pub fn new(inner: S, faults: Faults) -> Faulty<S> {
        Faulty {
            inner: Arc::new(inner),
            faults,
        }
    }
}

/// How long a late commit over MySQL may take once it starts (see `under`).
const LATE_RUN_MAX: Duration = Duration::from_millis(200);

/// The timeout a caller hears when the store "did not answer": its length is not known
/// here (the worker's own timeout is what ends a real wait).
const HEARD: StoreError = StoreError::Timeout(0);

fn refused(op: &str) -> StoreError {
    StoreError::Transient(format!("injected fault: {op} refused"))
}

fn disk_full() -> StoreError {
    StoreError::Transient("injected fault: database or disk is full".into())
}

/// Runs `run` under `fault`; `late` is the same operation over owned arguments, for a
/// commit that lands after its caller gave up. Over a store that `runs_in_order` (SQLite's
/// one thread), a late commit takes its place in the store's queue now, as a real job
/// whose caller gave up does, and lands when the queue gets to it; elsewhere (MySQL) it
/// starts `after` later, so that the caller's next operations can overtake it.
async fn under<T, F, L>(
    faults: &Faults,
    op: &'static str,
    fault: Option<Fault>,
    run: F,
    late: Option<L>,
    in_order: bool,
) -> StoreResult<T>
where
    F: Future<Output = StoreResult<T>>,
    L: Future<Output = StoreResult<T>> + Send + 'static,
    T: Send + 'static,
{
    match fault {
        None => run.await,
        Some(Fault::FailBefore) => Err(refused(op)),
        Some(Fault::FailAfterCommit) => {
            let _ = run.await;
            Err(HEARD)
        }
        Some(Fault::CommitLate(after)) => {
            if let Some(late) = late {
                if in_order {
                    // One poll puts the job in the queue; the rest runs on its own.
                    let mut late = Box::pin(late);
                    if futures::poll!(late.as_mut()).is_pending() {
                        tokio::spawn(late);
                    }
                } else {
                    // A statement the server runs on after its client gave up is bounded
                    // (MariaDB's max_statement_time, which the MySQL store sets): one that
                    // cannot start and finish in time here (a busy pool, a starved
                    // runtime) is dropped, as the server would kill it, rather than land
                    // later than any real one could.
                    tokio::spawn(tokio::time::timeout(after + LATE_RUN_MAX, async move {
                        tokio::time::sleep(after).await;
                        let _ = late.await;
                    }));
                }
            }
            Err(HEARD)
        }
        Some(Fault::Delay(d)) => {
            tokio::time::sleep(d).await;
            run.await
        }
        Some(Fault::Hang) => std::future::pending().await,
        Some(Fault::Hold) => {
            let opened = faults.inner.open.notified();
            faults.inner.waiting.notify_one();
            opened.await;
            run.await
        }
    }
}

/// Reads: faults but no full disk, and nothing to commit late.
macro_rules! reads {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $out:ty;)*) => {
        $(async fn $name(&self, $($arg: $ty),*) -> StoreResult<$out> {
            let fault = self.faults.draw(stringify!($name), false);
            let none: Option<std::future::Ready<StoreResult<$out>>> = None;
            under(&self.faults, stringify!($name), fault, self.inner.$name($($arg),*), none, false).await
        })*
    };
}

/// Writes: refused on a full disk; a late commit runs over owned copies of the arguments
/// (`$own` makes them).
macro_rules! writes {
    ($($name:ident($($arg:ident: $ty:ty => $own:expr),*) -> $out:ty;)*) => {
        $(async fn $name(&self, $($arg: $ty),*) -> StoreResult<$out> {
            let op = stringify!($name);
            if self.faults.full(op) {
                return Err(disk_full());
            }
            let fault = self.faults.draw(op, true);
            let late = match fault {
                Some(Fault::CommitLate(_)) => {
                    let store = self.inner.clone();
                    $(let $arg = $own;)*
                    Some(async move { store.$name($($arg.as_ref_arg()),*).await })
                }
                _ => None,
            };
            under(&self.faults, op, fault, self.inner.$name($($arg),*), late, self.inner.runs_in_order()).await
        })*
    };
}

/// How an owned copy is passed back where the store takes a borrow.
trait AsRefArg<'a, T: ?Sized + 'a> {
    fn as_ref_arg(&'a self) -> &'a T;
}

impl<'a, T: 'a> AsRefArg<'a, [T]> for Vec<T> {
    fn as_ref_arg(&'a self) -> &'a [T] {
        self
    }
}

/// Arguments passed by value are copied as they are.
#[derive(Clone, Copy)]
struct ByValue<T>(T);

impl<T: Copy> ByValue<T> {
    fn as_ref_arg(&self) -> T {
        self.0
    }
}

impl<S: ShardStore> ShardStore for Faulty<S> {
    async fn open(&self) -> StoreResult<Recovered> {
        self.inner.open().await
    }

    async fn retarget(&self, to: &crate::store::Retarget) -> StoreResult<()> {
        self.inner.retarget(to).await
    }

    async fn close(&self) {
        self.inner.close().await
    }

    fn runs_in_order(&self) -> bool {
        self.inner.runs_in_order()
    }

    fn nice_knob(&self) -> Option<crate::store::NiceKnob> {
        self.inner.nice_knob()
    }

    async fn ping(&self) -> StoreResult<()> {
        // The breaker's probe: refused on a full disk as a write is, else as a read.
        if self.faults.full("ping") {
            return Err(disk_full());
        }
        let fault = self.faults.draw("ping", false);
        let none: Option<std::future::Ready<StoreResult<()>>> = None;
        under(&self.faults, "ping", fault, self.inner.ping(), none, false).await
    }

    writes! {
        insert(rows: &[(u64, NewItem)] => rows.to_vec(), key_high_water: Option<u64> => ByValue(key_high_water), marks: &crate::store::Marks => marks.clone(), handoff: &Handoff => handoff.clone(), now_ms: i64 => ByValue(now_ms)) -> ();
        claim(keys: &[u64] => keys.to_vec(), now_ms: i64 => ByValue(now_ms), token: i64 => ByValue(token)) -> Vec<Item>;
        delete(keys: &[u64] => keys.to_vec()) -> Vec<ItemMeta>;
        apply(changes: &[Change] => changes.to_vec(), now_ms: i64 => ByValue(now_ms)) -> ();
        save_checkpoint(checkpoint_ms: i64 => ByValue(checkpoint_ms)) -> ();
        batch_committed(batch: i64 => ByValue(batch)) -> crate::store::BatchOutcome;
        forward_committed(token: i64 => ByValue(token), items: u32 => ByValue(items)) -> crate::store::ForwardOutcome;
        forget_batches(before_ms: i64 => ByValue(before_ms)) -> u64;
        add_totals(deltas: &[(TopicName, Totals)] => deltas.to_vec()) -> ();
        forget_topics(topics: &[TopicName] => topics.to_vec()) -> Vec<TopicName>;
        purge_dead(ns: &str => ns.to_string(), topic: &str => topic.to_string(), limit: usize => ByValue(limit)) -> u64;
    }

    reads! {
        ready_keys(ns: &str, topic: &str, after: Option<ReadyKey>, now_ms: i64, limit: usize) -> Vec<ReadyKey>;
        fetch_ready(keys: &[u64], now_ms: i64) -> Vec<Item>;
        dead_items(ns: &str, topic: &str, after: Option<ReadyKey>, limit: usize) -> Vec<(Item, i64)>;
        dedup_lookup(ns: &str, topic: &str, dedup_keys: &[&str]) -> Vec<(String, u64)>;
        lookup(keys: &[u64]) -> Vec<ItemMeta>;
        scan(after: (i64, u64), now_ms: i64, limit: usize) -> Vec<ItemMeta>;
        topic_counts(ns: &str, after: Option<&str>, now_ms: i64, limit: usize) -> Vec<TopicCounts>;
        totals() -> Vec<(TopicName, Totals)>;
        state_counts(topic: Option<&TopicName>) -> Vec<StateCount>;
    }
}

impl AsRefArg<'_, Handoff> for Handoff {
    fn as_ref_arg(&self) -> &Handoff {
        self
    }
}

impl AsRefArg<'_, crate::store::Marks> for crate::store::Marks {
    fn as_ref_arg(&self) -> &crate::store::Marks {
        self
    }
}

impl AsRefArg<'_, str> for String {
    fn as_ref_arg(&self) -> &str {
        self
    }
}
