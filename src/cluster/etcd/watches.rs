//! The follower's watch on the hosts, owner keys and primaries: any change it reports
//! leads to a reconcile (see `Follower::run`).

use etcd_client::{WatchOptions, WatchResponse};
use futures::stream::{BoxStream, SelectAll, StreamExt};
use futures::FutureExt;

use super::Follower;

/// The watches of hosts, owner keys and primaries, as one stream; each ends with an
/// error, so that one that ends is noticed (the others would go on without it).
pub(super) type Watches = SelectAll<BoxStream<'static, Result<WatchResponse, etcd_client::Error>>>;

impl Follower {
    /// Watches the hosts, owners and primaries, on the watches' own connection (None when
    /// etcd cannot be reached: the poll goes on, and the next tick tries again).
    pub(super) async fn open_watch(&mut self) -> Option<Watches> {
        let mut streams = Vec::new();
        for dir in ["hosts", "shards", "primaries"] {
            let k = format!("{}/{dir}/", self.prefix);
            let options = WatchOptions::new().with_prefix();
            let stream = self.watcher.watch(k, Some(options)).await.ok()?;
            let ended = futures::stream::once(async {
                Err(etcd_client::Error::WatchError("the watch ended".into()))
            });
            streams.push(stream.chain(ended).boxed());
        }
        Some(futures::stream::select_all(streams))
    }
}

/// Takes the watch answers that have already arrived; false when the watch failed or
/// ended meanwhile.
pub(super) fn drain_ready(w: &mut Watches) -> bool {
    loop {
        match w.next().now_or_never() {
            Some(Some(Ok(r))) if healthy(&r) => continue,
            None => return true,
            Some(_) => return false,
        }
    }
}

/// Whether a watch answer leaves the watch working: etcd cancels a watcher (a slow one
/// whose revision was compacted, say) with an answer, after which its stream stays open
/// and silent; such a watch is dropped and opened again, or its prefix's changes would be
/// seen only at the snapshot's resync.
fn healthy(r: &etcd_client::WatchResponse) -> bool {
    !r.canceled() && r.compact_revision() == 0
}

/// Waits for the next change the watch reports; false when the watch ended, failed or was
/// cancelled (with no watch, it never returns).
pub(super) async fn next_change(watch: &mut Option<Watches>) -> bool {
    match watch {
        Some(w) => matches!(w.next().await, Some(Ok(r)) if healthy(&r)),
        None => std::future::pending().await,
    }
}
