//! [`Lease`]: this host's etcd lease, kept alive by a task of its own, so that a renewal
//! never waits behind the follower's reads of the cluster (in a storm of watch events a
//! busy follower renewed late, closed its own fence, gave up every shard and could not
//! register again until its old lease expired: the tier then had shards nobody served).
//!
//! Each renewal (every `poll_ms`, at most a third of the TTL) moves the fence to when it
//! was sent + the TTL granted - the margin; one that fails or times out leaves the fence
//! counting down, and the stream is reopened. Dropping the [`Lease`] stops the renewals
//! (the lease then lapses after its TTL, unless revoked).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use tokio::task::JoinHandle;

use crate::fence::Fence;
use crate::metrics::Metrics;

/// Logs an etcd problem: the first of an outage as a warning, the rest at debug level,
/// so that a partition does not flood the log. `in_trouble` remembers the outage.
pub(super) fn trouble(in_trouble: &mut bool, what: &str) {
    if *in_trouble {
        tracing::debug!("etcd: {what}");
    } else {
        tracing::warn!("etcd: {what} (repeats logged at debug level until it recovers)");
        *in_trouble = true;
    }
}

/// What the renewals need besides the lease.
pub(super) struct Renewals {
    pub client: Client,
    /// How often to renew.
    pub every: Duration,
    pub ttl: Duration,
    /// How long before the lease can expire the fence closes.
    pub margin: Duration,
    pub fence: Fence,
    pub metrics: Arc<Metrics>,
    /// While this host's clock is out of bound, the lease is not renewed (see
    /// `cluster::clock`).
    pub clock: Arc<super::ClockCheck>,
}

pub(super) struct Lease {
    pub id: i64,
    /// Set when etcd answered that the lease has expired.
    expired: Arc<AtomicBool>,
    /// `None` only once [`Lease::stop`] took it.
    renewing: Option<JoinHandle<()>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(task) = &self.renewing {
            task.abort();
        }
    }
}

impl Lease {
    /// Starts renewing lease `id` over `keeper` and `stream`.
    pub(super) fn start(
        id: i64,
        keeper: LeaseKeeper,
        stream: LeaseKeepAliveStream,
        r: Renewals,
    ) -> Lease {
        let expired = Arc::new(AtomicBool::new(false));
        let renewing = tokio::spawn(renew(id, keeper, stream, r, expired.clone()));
        Lease {
            id,
            expired,
            renewing: Some(renewing),
        }
    }

    /// Whether etcd has said the lease expired (renewals have stopped).
    pub(super) fn expired(&self) -> bool {
        self.expired.load(Ordering::Acquire)
    }

    /// Stops the renewals and waits until they have (none can move the fence after
    /// this); the lease's id, to revoke it.
    pub(super) async fn stop(mut self) -> i64 {
        if let Some(task) = self.renewing.take() {
            task.abort();
            let _ = task.await;
        }
        self.id
    }
}

async fn renew(
    id: i64,
    mut keeper: LeaseKeeper,
    mut stream: LeaseKeepAliveStream,
    r: Renewals,
    expired: Arc<AtomicBool>,
) {
    let mut tick = tokio::time::interval(r.every.min(r.ttl / 3));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once; the registration has just moved the fence.
    tick.tick().await;
    let mut in_trouble = false;
    // After a failed or timed-out renewal the stream is replaced before the next one: a
    // late answer to the old request would still sit in it and be read as the answer to
    // the next, moving the fence from a later send than etcd's renewal.
    let mut new_stream = false;
    loop {
        tick.tick().await;
        if new_stream {
            let mut client = r.client.clone();
            let reopen = client.lease_keep_alive(id);
            match tokio::time::timeout(r.ttl / 4, reopen).await {
                Ok(Ok((k, s))) => {
                    keeper = k;
                    stream = s;
                    new_stream = false;
                }
                // Nothing to renew on: the fence counts down; the next tick tries again.
                _ => continue,
            }
        }
        if r.clock.out_of_bound() {
            // The fence counts down and the lease lapses: the shards move to hosts whose
            // clocks agree. Renewals resume once the clock is back in bound (etcd then
            // says the lease expired, and the host registers again).
            trouble(
                &mut in_trouble,
                "this host's clock is out of bound (cluster.clock_skew_max_ms): lease not renewed",
            );
            continue;
        }
        let sent = Instant::now();
        let answer = tokio::time::timeout(r.ttl / 4, async {
            keeper.keep_alive().await?;
            stream.message().await
        })
        .await;
        let renewed = matches!(&answer, Ok(Ok(Some(resp))) if resp.ttl() > 0);
        r.metrics.lease_renewal(renewed);
        match answer {
            Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                let granted = Duration::from_secs(resp.ttl() as u64);
                r.fence.extend_to(sent + granted.saturating_sub(r.margin));
                if in_trouble {
                    tracing::info!("etcd: lease renewals working again");
                    in_trouble = false;
                }
            }
            Ok(Ok(Some(_))) => {
                tracing::warn!("etcd: lease expired");
                r.fence.close();
                expired.store(true, Ordering::Release);
                return;
            }
            // The stream ended (connection lost): not an expiry. The fence keeps counting
            // down meanwhile; a new stream is tried on every tick.
            Ok(Ok(None)) | Ok(Err(_)) => {
                trouble(&mut in_trouble, "lease renewal failed");
                new_stream = true;
            }
            Err(_) => {
                trouble(&mut in_trouble, "lease renewal timed out");
                new_stream = true;
            }
        }
    }
}
