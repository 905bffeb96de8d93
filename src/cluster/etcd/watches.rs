//! The follower's watch of its range (see `cache.rs`): the answers it brings, and when it
//! must be given up (the cache is then read whole again).

use etcd_client::{WatchResponse, WatchStream};
use futures::{FutureExt, StreamExt};

/// Whether a watch answer leaves the watch working: etcd cancels a watcher (a slow one
/// whose revision was compacted, say) with an answer, after which its stream stays open
/// and silent.
fn healthy(r: &WatchResponse) -> bool {
    !r.canceled() && r.compact_revision() == 0
}

/// Waits for the watch's next answer; None when the watch ended, failed or was cancelled
/// (with no watch, it never returns).
pub(super) async fn next_answer(watch: &mut Option<WatchStream>) -> Option<WatchResponse> {
    match watch {
        Some(w) => match w.next().await {
            Some(Ok(r)) if healthy(&r) => Some(r),
            _ => None,
        },
        None => std::future::pending().await,
    }
}

/// The answers that have already arrived, in order; false when the watch failed or ended
/// meanwhile (the answers before that are still given to `each`).
pub(super) fn drain_ready(w: &mut WatchStream, mut each: impl FnMut(&WatchResponse)) -> bool {
    loop {
        match w.next().now_or_never() {
            Some(Some(Ok(r))) if healthy(&r) => each(&r),
            None => return true,
            Some(_) => return false,
        }
    }
}
