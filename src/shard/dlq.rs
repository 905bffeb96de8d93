//! Dead letters in a shard worker: requeueing dead items (by id, or a topic's in batches)
//! and purging them, and keeping each topic's within its bound
//! (`engine.dlq_max_items_per_topic`, or its namespace's): past it, the oldest dead items
//! of the topic on this shard are purged by the background ticks, at most
//! [`DLQ_TRIM_PER_TICK`] a topic a tick, and counted in `foqs_dlq_dropped_total{ns}`.
//! The bound is per shard: a topic spread over N shards keeps up to N times it. Each batch is one worker turn, so a million dead items are handled
//! in bounded memory without holding up the shard's other work.

use std::collections::HashMap;

use super::worker::{storage_error, timed, ShardWorker};
use super::Result;
use super::Settled;
use crate::model::{ItemState, ReadyKey, TopicName};
use crate::store::{Change, ShardStore};

/// Dead items purged per topic per background tick, at most.
pub(super) const DLQ_TRIM_PER_TICK: usize = 1_000;

impl<S: ShardStore> ShardWorker<S> {
    /// Purges the oldest dead items of the topics over their bound (see the module's
    /// notes); a topic stays listed until it is within it.
    pub(super) async fn trim_dead_letters(&mut self) {
        let topics: Vec<TopicName> = self
            .over_dlq
            .lock()
            .expect("not poisoned")
            .iter()
            .cloned()
            .collect();
        for t in topics {
            let bound = self.cfg.dlq_bounds.of(&t.ns).unwrap_or(u64::MAX) as i64;
            let over = self.counts().dead_of(&t.ns, &t.topic) - bound;
            if over > 0 {
                let n = (over as usize).min(DLQ_TRIM_PER_TICK);
                match self.purge_some(&t, n).await {
                    Ok(purged) => self.probes.metrics.dlq_dropped(&t.ns, purged),
                    Err(e) => {
                        tracing::warn!(shard = self.id, error = %e, "trimming dead letters failed");
                        continue;
                    }
                }
            }
            if self.counts().dead_of(&t.ns, &t.topic) <= bound {
                self.over_dlq.lock().expect("not poisoned").remove(&t);
            }
        }
    }

    /// Makes the dead items among `keys` ready again (delivery count reset), under the
    /// requeue's `token` when given; a key already revived under it (this requeue's first
    /// try applied, its answer lost) is `Done`; any other key is `NotFound`.
    pub(super) async fn revive(
        &mut self,
        keys: Vec<u64>,
        token: Option<i64>,
    ) -> Result<Vec<Settled>> {
        let (r, took) = timed(self.timeout(), self.store.lookup(&keys)).await;
        self.record(&r, took);
        let found = r.map_err(|e| storage_error(self.id, &e))?;
        let already: std::collections::HashSet<u64> = found
            .iter()
            .filter(|m| m.state != ItemState::Dead && token.is_some_and(|t| m.settled_token == t))
            .map(|m| m.key)
            .collect();
        let mut dead: HashMap<u64, (String, String, ReadyKey)> = found
            .into_iter()
            .filter(|m| m.state == ItemState::Dead)
            .map(|m| (m.key, (m.ns.clone(), m.topic.clone(), m.ready_key())))
            .collect();
        let changes: Vec<Change> = dead
            .keys()
            .map(|k| Change::Revive { key: *k, token })
            .collect();
        let (r, took) = timed(
            self.timeout(),
            self.store.apply(&changes, self.clock.now_ms()),
        )
        .await;
        self.record(&r, took);
        if let Err(e) = r {
            for (ns, topic, _) in dead.values() {
                self.outcome_unknown(ns, topic);
            }
            return Err(storage_error(self.id, &e));
        }
        Ok(keys
            .iter()
            .map(|k| match dead.remove(k) {
                Some((ns, topic, key)) => {
                    self.counts().moved(
                        &ns,
                        &topic,
                        (ItemState::Dead, 0),
                        (ItemState::Ready, key.deliver_after_ms),
                    );
                    self.ready(&ns, &topic, key);
                    Settled::Done
                }
                None if already.contains(k) => Settled::Done,
                None => Settled::NotFound,
            })
            .collect())
    }

    /// Makes up to `limit` of a topic's dead items ready again; returns how many.
    pub(super) async fn revive_some(&mut self, topic: &TopicName, limit: usize) -> Result<u64> {
        let (r, took) = timed(
            self.timeout(),
            self.store.dead_items(&topic.ns, &topic.topic, None, limit),
        )
        .await;
        self.record(&r, took);
        let items = r.map_err(|e| storage_error(self.id, &e))?;
        let changes: Vec<Change> = items
            .iter()
            .map(|(i, _)| Change::Revive {
                key: i.id.key,
                token: None,
            })
            .collect();
        let (r, took) = timed(
            self.timeout(),
            self.store.apply(&changes, self.clock.now_ms()),
        )
        .await;
        self.record(&r, took);
        if let Err(e) = r {
            self.outcome_unknown(&topic.ns, &topic.topic);
            return Err(storage_error(self.id, &e));
        }
        for (i, _) in &items {
            self.counts().moved(
                &i.ns,
                &i.topic,
                (ItemState::Dead, 0),
                (ItemState::Ready, i.deliver_after_ms),
            );
            let k = ReadyKey {
                priority: i.priority,
                deliver_after_ms: i.deliver_after_ms,
                key: i.id.key,
            };
            self.ready(&i.ns, &i.topic, k);
        }
        Ok(items.len() as u64)
    }

    /// Deletes up to `limit` of a topic's dead items; returns how many.
    pub(super) async fn purge_some(&mut self, topic: &TopicName, limit: usize) -> Result<u64> {
        let (r, took) = timed(
            self.timeout(),
            self.store.purge_dead(&topic.ns, &topic.topic, limit),
        )
        .await;
        self.record(&r, took);
        let n = r.map_err(|e| storage_error(self.id, &e))?;
        self.counts()
            .add(&topic.ns, &topic.topic, ItemState::Dead, 0, -(n as i64));
        self.shared
            .items
            .fetch_sub(n as i64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}
