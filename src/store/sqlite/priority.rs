//! [`ThreadNice`]: the OS priority (nice value) a SQLite shard's threads run at, set by
//! the host through the store's knob (see `ShardStore::nice_knob`).
//!
//! Why: a SQLite shard's writes run on a thread of their own, and a turn cannot be
//! preempted by anything in foqsd. While a namespace with a guarantee is at work, the host
//! keeps one shard for it; the other shards' threads then run at a lower priority, so that
//! the kernel gives the cores to the kept shard's thread first when the flood's shards
//! compete for them. Measured by hand before it was built (docs/tenants.md): a victim's
//! p99 beside a flood went from 12.3 to 8.7 ms on SQLite.

use std::sync::atomic::Ordering;

/// Follows the wanted nice value on the thread that owns it (Linux sets it per thread),
/// as an offset from the value the thread started with (a foqsd started at nice 5 runs
/// the lowered threads at 15, and returns them to 5).
pub(super) struct ThreadNice {
    want: crate::store::NiceKnob,
    base: i32,
    now: i32,
    /// A change was refused once (logged); not tried again until the wish changes.
    refused: Option<i32>,
}

impl ThreadNice {
    pub(super) fn new(want: crate::store::NiceKnob) -> ThreadNice {
        let base = own_nice();
        ThreadNice {
            want,
            base,
            now: 0,
            refused: None,
        }
    }

    /// Called by the thread before each job: applies the wanted value if it changed.
    pub(super) fn follow(&mut self, shard: crate::model::ShardId) {
        let want = self.want.load(Ordering::Relaxed);
        if want == self.now || self.refused == Some(want) {
            return;
        }
        match set_own_nice((self.base + want).min(19)) {
            Ok(()) => {
                self.now = want;
                self.refused = None;
            }
            Err(e) => {
                // Typically EACCES: an unprivileged process may lower its priority but not
                // raise it back (RLIMIT_NICE; CAP_SYS_NICE lifts it).
                tracing::warn!(shard, nice = want, error = %e,
                    "cannot set the priority of a SQLite shard's thread (raising it back needs CAP_SYS_NICE or RLIMIT_NICE; engine.best_effort_nice = 0 turns this off)");
                self.refused = Some(want);
            }
        }
    }
}

#[cfg(target_os = "linux")]
fn set_own_nice(nice: i32) -> std::io::Result<()> {
    // SAFETY: plain system calls on the calling thread's own id.
    let r = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn set_own_nice(_nice: i32) -> std::io::Result<()> {
    Ok(())
}

/// The nice value of the calling thread (Linux; 0 elsewhere, or when it cannot be read).
fn own_nice() -> i32 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: as above; -1 is also a valid answer, so errno is cleared first and
        // read after.
        unsafe {
            *libc::__errno_location() = 0;
            let n = libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t);
            if *libc::__errno_location() != 0 {
                return 0;
            }
            n
        }
    }
    #[cfg(not(target_os = "linux"))]
    0
}

/// Whether this process may lower a thread's priority and raise it back (root with
/// CAP_SYS_NICE, or an `RLIMIT_NICE` that allows it): tried on a thread of its own.
/// Without it, lowered threads could never be raised again, so the host does not lower
/// them at all.
pub fn can_lower_and_restore() -> bool {
    if cfg!(not(target_os = "linux")) {
        return false;
    }
    std::thread::spawn(|| {
        let base = own_nice();
        if base >= 19 {
            return false;
        }
        set_own_nice(base + 1).is_ok() && set_own_nice(base).is_ok()
    })
    .join()
    .unwrap_or(false)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicI32;
    use std::sync::Arc;

    #[test]
    fn a_thread_follows_the_wanted_nice_value_from_where_it_started() {
        let privileged = can_lower_and_restore();
        std::thread::spawn(move || {
            let base = own_nice();
            if base > 12 {
                return; // no room to lower it by 7
            }
            let want = Arc::new(AtomicI32::new(0));
            let mut t = ThreadNice::new(want.clone());
            t.follow(0);
            assert_eq!(own_nice(), base);
            want.store(7, Ordering::Relaxed);
            t.follow(0);
            assert_eq!(own_nice(), base + 7);
            want.store(0, Ordering::Relaxed);
            t.follow(0);
            // Raised back only with the privilege to.
            assert_eq!(own_nice(), if privileged { base } else { base + 7 });
        })
        .join()
        .unwrap();
    }
}
