//! The follower's watch of its range (see `cache.rs`), read by a task of its own: the
//! answers it brings, and when it must be given up (the cache is then read whole again).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use etcd_client::{WatchRequestSender, WatchResponse, WatchStream};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The answers of one watch, read as they come by a task of its own (so that etcd never
/// waits on this follower to send them: see `cache.rs`); None, last, when the watch
/// ended, failed or was cancelled. Dropped, the task stops and the watch with it.
pub(super) struct Feed {
    answers: mpsc::UnboundedReceiver<Option<WatchResponse>>,
    reader: JoinHandle<()>,
    /// The watch's requests (progress requests); kept open, as etcd may end a watch
    /// whose requests stream closed.
    requests: WatchRequestSender,
    /// When the reader last got an answer, in ms after `started` (the reader keeps it, so
    /// a follower busy elsewhere does not take its own lateness for a silent watch).
    started: Instant,
    answered_ms: Arc<AtomicU64>,
}

impl Feed {
    pub fn start(stream: WatchStream) -> Feed {
        let (requests, mut stream) = stream.split();
        let (tx, answers) = mpsc::unbounded_channel();
        let started = Instant::now();
        let answered_ms = Arc::new(AtomicU64::new(0));
        let answered = answered_ms.clone();
        let reader = tokio::spawn(async move {
            loop {
                let next = stream.next().await;
                answered.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                let answer = match next {
                    Some(Ok(r)) if healthy(&r) => Some(r),
                    _ => None,
                };
                let last = answer.is_none();
                if tx.send(answer).is_err() || last {
                    return;
                }
            }
        });
        Feed {
            answers,
            reader,
            requests,
            started,
            answered_ms,
        }
    }

    /// Whether the watch has answered anything since `t`.
    pub fn answered_since(&self, t: Instant) -> bool {
        let at = self.started
            + std::time::Duration::from_millis(self.answered_ms.load(Ordering::Relaxed));
        at >= t
    }

    /// Asks etcd to say where the watch is (an answer without events comes back when the
    /// watch is caught up); false when the request could not be sent.
    pub async fn ask_progress(&mut self) -> bool {
        self.requests.request_progress().await.is_ok()
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Whether a watch answer leaves the watch working: etcd cancels a watcher (a slow one
/// whose revision was compacted, say) with an answer, after which its stream stays open
/// and silent.
fn healthy(r: &WatchResponse) -> bool {
    !r.canceled() && r.compact_revision() == 0
}

/// Waits for the watch's next answer; None when the watch ended, failed or was cancelled
/// (with no watch, it never returns).
pub(super) async fn next_answer(feed: &mut Option<Feed>) -> Option<WatchResponse> {
    match feed {
        Some(f) => f.answers.recv().await.flatten(),
        None => std::future::pending().await,
    }
}

/// The answers that have already arrived, in order; false when the watch failed or ended
/// meanwhile (the answers before that are still given to `each`).
pub(super) fn drain_ready(feed: &mut Feed, mut each: impl FnMut(&WatchResponse)) -> bool {
    loop {
        match feed.answers.try_recv() {
            Ok(Some(r)) => each(&r),
            Err(mpsc::error::TryRecvError::Empty) => return true,
            Ok(None) | Err(mpsc::error::TryRecvError::Disconnected) => return false,
        }
    }
}
