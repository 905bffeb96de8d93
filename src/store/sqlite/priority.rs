//! [`ThreadNice`]: the OS priority (nice value) a SQLite shard's threads run at, set by
//! the host through the store's knob (see `ShardStore::nice_knob`).
//!
//! Why: a SQLite shard's writes run on a thread of their own, and a turn cannot be
//! preempted by anything in foqsd. While a namespace with a guarantee is at work, the host
//! keeps one shard for it; the other shards' threads then run at a lower priority, so that
//! the kernel gives the cores to the kept shard's thread first when the flood's shards
//! compete for them. Measured by hand before it was built (docs/tenants.md): a victim's
//! p99 beside a flood went from 12.3 to 8.7 ms on SQLite.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

/// Follows the wanted nice value on the thread that owns it (Linux sets it per thread).
pub(super) struct ThreadNice {
    want: Arc<AtomicI32>,
    now: i32,
    /// A change was refused once (logged); not tried again until the wish changes.
    refused: Option<i32>,
}

impl ThreadNice {
    pub(super) fn new(want: Arc<AtomicI32>) -> ThreadNice {
        ThreadNice {
            want,
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
        match set_own_nice(want) {
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

/// The nice value of the calling thread (Linux; 0 elsewhere).
#[cfg(test)]
fn own_nice() -> i32 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: as above; -1 is also a valid answer, so errno is cleared first.
        unsafe {
            *libc::__errno_location() = 0;
            libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t)
        }
    }
    #[cfg(not(target_os = "linux"))]
    0
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_thread_follows_the_wanted_nice_value() {
        std::thread::spawn(|| {
            let want = Arc::new(AtomicI32::new(0));
            let mut t = ThreadNice::new(want.clone());
            t.follow(0);
            assert_eq!(own_nice(), 0);
            want.store(7, Ordering::Relaxed);
            t.follow(0);
            assert_eq!(own_nice(), 7);
            want.store(0, Ordering::Relaxed);
            t.follow(0);
            // Raised back only with the privilege to (the suite runs as root).
            let privileged = unsafe { libc::geteuid() } == 0;
            assert_eq!(own_nice(), if privileged { 0 } else { 7 });
        })
        .join()
        .unwrap();
    }
}
