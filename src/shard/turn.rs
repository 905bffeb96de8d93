//! One turn of a shard worker: the commands waiting are taken together, sorted by kind,
//! planned against the index, run against the store (the writes concurrently, the reads
//! that need no order beside the loop, bounded), and finished: the index updated and the
//! callers answered.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::exec::{self, nack_exec};
use super::worker::{storage_error, timed, ShardWorker, READS_BESIDE_MAX};
use super::ShardError;
use super::{Command, Reply};
use crate::store::{ShardStore, StoreError, StoreResult};

impl<S: ShardStore> ShardWorker<S> {
    /// Applies one turn's commands; returns the shutdown acknowledgement if one was asked.
    pub(super) async fn turn(&mut self, commands: Vec<Command>) -> Option<oneshot::Sender<()>> {
        // A worker that dies mid-turn, or stalls (tests arm it: `panic`, or `return(MS)`
        // for a pause that leaves the runtime's threads free, `sleep(MS)` for one that
        // blocks its thread; nothing without the `failpoints` feature): its shard must be
        // noticed as dead and reopened, or stuck and left behind.
        #[cfg(feature = "failpoints")]
        crate::failpoint::pause(&format!("shard-{}-turn", self.id)).await;
        let mut enqueues = Vec::new();
        let mut acks = Vec::new();
        let mut nacks = Vec::new();
        let mut claims = Vec::new();
        let mut releases = Vec::new();
        let mut touches = Vec::new();
        let mut shutdown = None;
        let mut peeks = Vec::new();
        let mut dead_letters = Vec::new();
        for c in commands {
            match c {
                Command::Enqueue {
                    items,
                    forward,
                    reply,
                } => enqueues.push((items, forward, reply)),
                Command::Ack { ops, reply } => acks.push((ops, reply)),
                Command::Nack { nacks: n, reply } => nacks.push((n, reply)),
                Command::Release { items, reply } => releases.push((items, reply)),
                Command::Touch { ops, reply } => touches.push((ops, reply)),
                Command::Shutdown { done } => shutdown = Some(done),
                Command::Hold { held, resume } => self.hold = Some((held, resume, true)),
                Command::Claim { topic, keys, reply } => {
                    // Claims take their keys out of the index first, so that this turn's
                    // peeks do not offer them again. Only keys still indexed are free:
                    // another dequeue may have claimed the rest since they were peeked.
                    let mut index = self.index();
                    let t = index.topic(&topic);
                    let free: Vec<u64> =
                        keys.iter().filter(|k| t.remove(k)).map(|k| k.key).collect();
                    // A worker that dies holding the index poisons it (tests arm it).
                    fail::fail_point!(&format!("shard-{}-claim-holding-index", self.id));
                    drop(index);
                    claims.push((topic, free, reply));
                }
                Command::Peek { topic, n, reply } => peeks.push((topic, n, reply)),
                c @ (Command::Revive { .. }
                | Command::ReviveSome { .. }
                | Command::PurgeSome { .. }) => dead_letters.push(c),
                // Reads run beside the loop: this worker is the only writer, so they need
                // no ordering with its writes, and some (GROUP BYs) are slow.
                Command::DeadItems {
                    topic,
                    after,
                    limit,
                    reply,
                } => {
                    // One listing at a time reads storage (see `LISTING_READS_MAX`).
                    let share = self.listing_reads.clone();
                    self.read_beside(reply, move |store, _| async move {
                        let _turn = share.acquire_owned().await;
                        store
                            .dead_items(&topic.ns, &topic.topic, after, limit)
                            .await
                    })
                }
                Command::FetchReady { keys, reply } => self
                    .read_beside(reply, move |store, now| async move {
                        store.fetch_ready(&keys, now).await
                    }),
                // A write, but of a row only it and the insert it decides write: beside
                // the loop too, so a worker busy with a full turn answers it at once.
                Command::BatchCommitted {
                    batch,
                    tally,
                    reply,
                } => {
                    let shared = self.shared.clone();
                    self.read_beside(reply, move |store, _| async move {
                        let r = store.batch_committed(batch).await;
                        if let Ok(crate::store::BatchOutcome::Committed) = r {
                            let mut late = shared
                                .late_enqueues
                                .lock()
                                .unwrap_or_else(|p| p.into_inner());
                            late.extend(tally);
                        }
                        r
                    })
                }
                Command::ForwardCommitted {
                    token,
                    items,
                    reply,
                } => self.read_beside(reply, move |store, now| async move {
                    if crate::store::forward_token_too_old(token, now) {
                        return Ok(crate::store::ForwardOutcome {
                            stored: Vec::new(),
                            forgotten: true,
                        });
                    }
                    store.forward_committed(token, items).await
                }),
                Command::Lookup { keys, reply } => self.read_beside(
                    reply,
                    move |store, _| async move { store.lookup(&keys).await },
                ),
            }
        }
        for (topic, n, reply) in peeks {
            let claiming = claims.iter().any(|(t, _, _)| *t == topic);
            let r = self.peek(&topic, n, !claiming).await;
            let _ = reply.send(r);
        }
        // Dead-letter work is rare and comes in bounded batches: one at a time.
        for c in dead_letters {
            match c {
                Command::Revive { keys, token, reply } => {
                    let r = self.revive(keys, token).await;
                    let _ = reply.send(r);
                }
                Command::ReviveSome {
                    topic,
                    limit,
                    reply,
                } => {
                    let r = self.revive_some(&topic, limit).await;
                    let _ = reply.send(r);
                }
                Command::PurgeSome {
                    topic,
                    limit,
                    reply,
                } => {
                    let r = self.purge_some(&topic, limit).await;
                    let _ = reply.send(r);
                }
                _ => unreachable!("only dead-letter commands are collected here"),
            }
        }

        // Every write of the turn at once; their outcomes are applied afterwards, in order.
        let (enqueues, existing) = self.resolve_dedup(enqueues).await;
        let mut inserts = self.plan_inserts(enqueues, &existing);
        // An ack settles its item before anything else of the turn: a staged copy can no
        // longer be handed out, and a claim of the same key (the row is being deleted)
        // is dropped, so that no delivery follows the ack.
        // An ack that names a lease settles only that delivery: a staged or claimed copy
        // is another lease, which it leaves alone (its row's check in `ack_exec` fails).
        let mut ack_plan = exec::AckPlan::default();
        for op in acks.iter().flat_map(|(o, _)| o.iter()) {
            match op.lease_id {
                Some(lease) => ack_plan.named.push((op.key, lease)),
                None => ack_plan.plain.push(op.key),
            }
        }
        let acked: HashSet<u64> = acks
            .iter()
            .flat_map(|(o, _)| o.iter().map(|op| op.key))
            .collect();
        let plain: HashSet<u64> = ack_plan.plain.iter().copied().collect();
        // What the acks undo if their DELETE fails (see `AckPlan`).
        for k in &plain {
            for token in self.shared.staged.remove(*k) {
                ack_plan.unstaged.push((*k, token));
            }
        }
        for (topic, free, _) in &mut claims {
            let before = free.len();
            free.retain(|k| !plain.contains(k));
            if free.len() < before {
                ack_plan.unclaimed.push(topic.clone());
            }
        }
        let claim = self.plan_claim(claims);
        // Nacks and touches settle leases that consumers hold. A key staged (claimed, not
        // handed out) or claimed in this turn is ready as far as clients can tell; one
        // acked in this turn is being deleted.
        let settling: Vec<u64> = nacks
            .iter()
            .flat_map(|(n, _)| n.iter().map(|op| op.key))
            .chain(touches.iter().flat_map(|(t, _)| t.iter().map(|op| op.key)))
            .collect();
        let unheld = exec::Unheld {
            keys: settling
                .iter()
                .copied()
                .filter(|k| acked.contains(k) || claim.as_ref().is_some_and(|c| c.keys.contains(k)))
                .collect(),
            staged: settling
                .iter()
                .map(|k| (*k, self.shared.staged.tokens(*k)))
                .filter(|(_, ts)| !ts.is_empty())
                .collect(),
        };
        // A touch of a delivery that a nack of this turn also settles waits for the next
        // turn: run together, as concurrent statements, both could answer success, the
        // touch for an item the nack had made ready again. Next turn the touch sees what
        // the nack did (refused if it gave the item back, done if it was a stale nack).
        let nacked: HashSet<u64> = nacks
            .iter()
            .flat_map(|(n, _)| n.iter().map(|op| op.key))
            .collect();
        let (later, touches): (Vec<_>, Vec<_>) = touches
            .into_iter()
            .partition(|(t, _)| t.iter().any(|op| nacked.contains(&op.key)));
        for (ops, reply) in later {
            self.deferred.push(Command::Touch { ops, reply });
        }
        let releases = exec::plan_releases(&self.shared.staged, releases);
        let release_changes = exec::release_changes(&releases);
        let now = self.clock.now_ms();
        self.plan_handoff(&mut inserts, now);
        #[cfg(feature = "failpoints")]
        if inserts.iter().any(|g| !g.handoff.keys.is_empty()) {
            crate::failpoint::pause(&format!("shard-{}-handoff-planned", self.id)).await;
        }
        let store = self.store.clone();
        let nack_ops: Vec<&[super::NackOp]> = nacks.iter().map(|(n, _)| n.as_slice()).collect();
        let touch_ops: Vec<&[super::TouchOp]> = touches.iter().map(|(t, _)| t.as_slice()).collect();
        let t = self.timeout();
        let (inserted, claimed, acked_rows, nacked, released, touched) = tokio::join!(
            futures::future::join_all(inserts.iter().map(|g| timed(
                t,
                store.insert(&g.rows, g.key_high_water, &g.marks, &g.handoff, now)
            ))),
            async {
                match &claim {
                    Some(c) => Some(timed(t, store.claim(&c.keys, now, c.token)).await),
                    None => None,
                }
            },
            async {
                if acks.is_empty() {
                    None
                } else {
                    let started = std::time::Instant::now();
                    let r = exec::ack_exec(&*store, &ack_plan, t).await;
                    Some((r, started.elapsed().as_millis() as u64))
                }
            },
            async {
                if nack_ops.is_empty() {
                    None
                } else {
                    let started = std::time::Instant::now();
                    let r =
                        match tokio::time::timeout(t, nack_exec(&*store, &nack_ops, &unheld, now))
                            .await
                        {
                            Ok(r) => r,
                            // Cut off mid-transaction: which rows changed is unknown.
                            Err(_) => Err((StoreError::Timeout(t.as_millis() as u64), None)),
                        };
                    Some((r, started.elapsed().as_millis() as u64))
                }
            },
            async {
                if release_changes.is_empty() {
                    None
                } else {
                    Some(timed(t, store.apply(&release_changes, now)).await)
                }
            },
            async {
                if touch_ops.is_empty() {
                    None
                } else {
                    Some(timed(t, exec::touch_exec(&*store, &touch_ops, &unheld, now)).await)
                }
            },
        );
        #[cfg(feature = "failpoints")]
        if inserts
            .iter()
            .zip(&inserted)
            .any(|(g, (r, _))| r.is_ok() && !g.handoff.keys.is_empty())
        {
            // Committed, not handed over yet.
            crate::failpoint::pause(&format!("shard-{}-handoff-committed", self.id)).await;
        }
        for (group, r) in inserts.into_iter().zip(inserted) {
            self.finish_insert(group, r);
        }
        if let (Some(c), Some(r)) = (claim, claimed) {
            self.finish_claim(c, r);
        }
        if let Some(r) = acked_rows {
            self.finish_ack(acks, ack_plan, r);
        }
        if let Some(r) = nacked {
            self.finish_nack(nacks, r);
        }
        if let Some(r) = released {
            self.finish_release(releases, r);
        }
        if let Some(r) = touched {
            self.finish_touch(touches, r);
        }
        shutdown
    }

    /// Answers `reply` with a storage read run in its own task, under the shard's timeout;
    /// with [`READS_BESIDE_MAX`] already running, at once with a retryable busy error.
    fn read_beside<T, Fut>(
        &self,
        reply: Reply<T>,
        read: impl FnOnce(Arc<S>, i64) -> Fut + Send + 'static,
    ) where
        T: Send + 'static,
        Fut: std::future::Future<Output = StoreResult<T>> + Send + 'static,
    {
        let Ok(permit) = self.reads.clone().try_acquire_owned() else {
            let _ = reply.send(Err(ShardError::Busy {
                shard: self.id,
                why: format!("{READS_BESIDE_MAX} reads are running"),
            }));
            return;
        };
        let store = self.store.clone();
        let (id, now, timeout) = (self.id, self.clock.now_ms(), self.timeout());
        tokio::spawn(async move {
            let (r, _) = timed(timeout, read(store, now)).await;
            drop(permit);
            let _ = reply.send(r.map_err(|e| storage_error(id, &e)));
        });
    }
}
