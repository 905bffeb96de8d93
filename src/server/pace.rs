//! [`LogPace`]: at most so many log lines a second for events a client can cause at will
//! (connections opened, closed, refused, handshakes failed); the lines left out are
//! counted and said with the next one. Without it, a client opening connections in a loop
//! fills the disk through the log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

pub struct LogPace {
    per_second: u32,
    window: Mutex<(Instant, u32)>,
    skipped: AtomicU64,
}

impl LogPace {
    pub fn new(per_second: u32) -> LogPace {
        LogPace {
            per_second,
            window: Mutex::new((Instant::now(), 0)),
            skipped: AtomicU64::new(0),
        }
    }

    /// `Some(lines left out since the last one logged)` when a line may be logged now.
    pub fn allow(&self) -> Option<u64> {
        let mut w = self.window.lock().expect("not poisoned");
        if w.0.elapsed().as_secs() >= 1 {
            *w = (Instant::now(), 0);
        }
        if w.1 >= self.per_second {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        w.1 += 1;
        Some(self.skipped.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_past_the_pace_are_left_out_and_counted() {
        let pace = LogPace::new(3);
        assert_eq!(pace.allow(), Some(0));
        assert_eq!(pace.allow(), Some(0));
        assert_eq!(pace.allow(), Some(0));
        assert_eq!(pace.allow(), None);
        assert_eq!(pace.allow(), None);
        // The next window says how many were left out.
        *pace.window.lock().unwrap() = (Instant::now() - std::time::Duration::from_secs(1), 3);
        assert_eq!(pace.allow(), Some(2));
    }
}
