//! The follower's view of the cluster in etcd, kept as a watch cache the way Kubernetes'
//! reflectors keep theirs: one range read at one revision R, then one watch of the same
//! range from R + 1, whose events are applied in order. A change then costs etcd one
//! event per follower instead of a read of the whole cluster by every follower.
//!
//! Why this is exact (two earlier caches were not, and were taken out): the range
//! `[P/hosts/, P/shards0)` holds the hosts, the replicated shards' records and acks and the
//! owner keys, so one watch covers all the follower plans from, and etcd delivers one
//! watch's events in revision order, a revision's events never split over two answers.
//! After applying an answer the cache is etcd's state at that answer's revision, a state
//! etcd really had. Nothing is applied ahead of the watch: this host's own writes reach
//! the cache through it like anyone's, and the follower does not plan again until the
//! cache has reached its last write (`Follower::written`). (The earlier caches watched
//! three prefixes on separate streams, with no order between them, and applied their own
//! writes at once: their views were, for moments, states etcd never had.) The quota
//! buckets, written on every take, live outside the range (`P/tokens/`), so they cost the
//! followers nothing.
//!
//! The watch is read by a task of its own, so that the follower's own work (its writes,
//! the 20 ms it waits for a batch) never leaves etcd with answers it cannot send: etcd
//! 3.4 before 3.4.31 and 3.5 before 3.5.13 could drop events for such a slow watcher
//! (etcd-io/etcd#17529). Its connection requires a leader (a member cut off from its
//! cluster ends the watch). Every
//! [`CHECK_POLLS`] polls the follower asks the watch for its progress (an answer must
//! come within half the TTL: a watch open but silent is given up) and counts the
//! range's keys at the cache's revision (one request answered with a number: a lost
//! create or delete shows); every 5 to 6 minutes it compares the cache whole with etcd
//! at the cache's revision (a lost update shows too), so a lost change lasts at most that
//! long.
//!
//! Read whole again when the watch fails, ends, is cancelled or compacted, when the cache
//! has not reached this host's last write within half the lease TTL, when a progress
//! request goes unanswered, or when a check differs.

use std::time::{Duration, Instant};

use etcd_client::{EventType, GetOptions, KeyValue, WatchOptions, WatchResponse};

use super::watches::Feed;
use super::Follower;
use crate::cluster::follow::Cache;

/// Polls between two counts of the range's keys and two progress requests (see the
/// module's text).
pub(super) const CHECK_POLLS: u32 = 10;

/// How often the cache is compared whole with etcd at the cache's revision (plus up to a
/// minute, spread by host), so that a lost change the count cannot see (an update, or
/// the range's last write) lasts at most this long.
const VERIFY_EVERY: Duration = Duration::from_secs(300);

/// The follower's checks of its watch between two whole reads.
pub(super) struct Checks {
    polls: u32,
    /// A progress request sent and not answered yet.
    asked: Option<Instant>,
    verify_at: Instant,
}

impl Checks {
    /// `host`'s checks: its whole comparisons spread over a minute by its id.
    pub fn new(host: &str) -> Checks {
        let spread = Duration::from_millis(crate::hash::fnv1a([host.as_bytes()]) % 60_000);
        Checks {
            polls: 0,
            asked: None,
            verify_at: Instant::now() + VERIFY_EVERY + spread,
        }
    }

    /// The watch answered (events or progress): it is alive.
    pub fn answered(&mut self) {
        self.asked = None;
    }
}

/// The first and (excluded) last key of the range watched under prefix `p`.
pub(super) fn range(p: &str) -> (String, String) {
    (format!("{p}/hosts/"), format!("{p}/shards0"))
}

impl Cache {
    /// Applies one watch answer (its events are after `revision`, in order). The cache's
    /// revision follows the events alone, not the answer's header: a watcher catching up
    /// may be sent a header ahead of events still to come.
    pub(super) fn apply(&mut self, prefix: &str, r: &WatchResponse) {
        for e in r.events() {
            let Some(kv) = e.kv() else { continue };
            self.apply_kv(prefix, kv, e.event_type() == EventType::Put);
        }
    }

    fn apply_kv(&mut self, prefix: &str, kv: &KeyValue, put: bool) {
        let Some(key) = kv
            .key_str()
            .ok()
            .and_then(|k| k.strip_prefix(prefix))
            .and_then(|k| k.strip_prefix('/'))
        else {
            return;
        };
        // A delete's key carries the delete's revision.
        self.revision = self.revision.max(kv.mod_revision());
        self.apply_one(key, put.then(|| (kv.value(), kv.lease())));
    }
}

impl Follower {
    /// Reads the range whole, in one request: at `revision`, or the latest (0).
    async fn read_range(&mut self, revision: i64) -> Result<Cache, etcd_client::Error> {
        let (from, to) = range(&self.prefix);
        let mut options = GetOptions::new().with_range(to);
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let resp = self.client.get(from, Some(options)).await?;
        let mut cache = Cache::default();
        cache.revision = if revision > 0 {
            revision
        } else {
            resp.header().map_or(0, |h| h.revision())
        };
        // (Every key's mod revision is at most the read's.)
        for kv in resp.kvs() {
            cache.apply_kv(&self.prefix, kv, true);
        }
        Ok(cache)
    }

    /// Reads the range whole at the latest revision.
    pub(super) async fn load(&mut self) -> Result<Cache, etcd_client::Error> {
        self.read_range(0).await
    }

    /// Watches the range from revision `from` (a whole read's next: every event after the
    /// read, none in it), on the watches' own connection.
    pub(super) async fn open_feed(&mut self, from: i64) -> Result<Feed, etcd_client::Error> {
        let (key, to) = range(&self.prefix);
        let options = WatchOptions::new().with_range(to).with_start_revision(from);
        let stream = self.watcher.watch(key, Some(options)).await?;
        Ok(Feed::start(stream))
    }

    /// The checks of a poll (see the module's text); the reason to read whole again, if
    /// one failed.
    pub(super) async fn check_watch(
        &mut self,
        watch: &mut Option<Feed>,
        checks: &mut Checks,
    ) -> Option<&'static str> {
        let feed = watch.as_mut()?;
        // A watch that has not brought this host's own write within half the TTL went
        // silent (half: a watch merely slow, on a busy host, catches up sooner than a
        // whole read would help it; a stalled one still leaves time to act).
        let (revision, count) = {
            let c = self.cache.as_ref()?;
            (c.revision, c.keys_in_range())
        };
        if revision < self.written && self.written_at.elapsed() >= self.ttl / 2 {
            tracing::warn!("etcd: the watch is behind this host's own write; reading again");
            return Some("watch_behind");
        }
        // A progress request unanswered for half the TTL: the watch is open but silent
        // (etcd answers at once when the watch is caught up, and a watch catching up
        // brings events; the reader task notes any answer, however busy the follower).
        if let Some(t) = checks.asked {
            if feed.answered_since(t) {
                checks.asked = None;
            }
        }
        if checks.asked.is_some_and(|t| t.elapsed() >= self.ttl / 2) {
            tracing::warn!("etcd: the watch does not answer; reading again");
            return Some("watch_silent");
        }
        checks.polls = checks.polls.wrapping_add(1);
        if checks.polls.is_multiple_of(CHECK_POLLS) {
            if checks.asked.is_none() {
                if !feed.ask_progress().await {
                    return Some("watch_ended");
                }
                checks.asked = Some(Instant::now());
            }
            if !self.count_agrees((revision, count)).await {
                tracing::warn!(
                    revision,
                    "etcd: the watch cache lost a change (its key count differs from etcd's); reading again"
                );
                return Some("count_differs");
            }
        }
        if Instant::now() >= checks.verify_at {
            checks.verify_at = Instant::now() + VERIFY_EVERY;
            // An error (the revision compacted, say) says nothing.
            if let Ok(then) = self.read_range(revision).await {
                let cache = self.cache.as_ref()?;
                if then != *cache {
                    tracing::warn!(
                        revision,
                        "etcd: the watch cache differs from etcd at its revision; reading again"
                    );
                    return Some("verify_differs");
                }
            }
        }
        None
    }

    /// Whether etcd had as many keys in the range at the cache's revision as the cache
    /// holds (one request, answered with a count). An error (a revision compacted, etcd
    /// not answering) says nothing: true.
    pub(super) async fn count_agrees(&mut self, (revision, count): (i64, i64)) -> bool {
        let (from, to) = range(&self.prefix);
        let options = GetOptions::new()
            .with_range(to)
            .with_count_only()
            .with_revision(revision);
        match self.client.get(from, Some(options)).await {
            Ok(r) => r.count() == count,
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_holds_every_directory_the_follower_plans_from_and_not_the_buckets() {
        let (from, to) = range("/p");
        let inside = |k: &str| k >= from.as_str() && k < to.as_str();
        for k in [
            "/p/hosts/h1",
            "/p/primaries/3",
            "/p/paused/3",
            "/p/served/3",
            "/p/shards/0",
            "/p/shards/9999",
        ] {
            assert!(inside(k), "{k} is watched");
        }
        for k in [
            "/p/tokens/ns",
            "/p/switch/a",
            "/p/demoted/a",
            "/p2/hosts/h1",
        ] {
            assert!(!inside(k), "{k} is not watched");
        }
    }
}
