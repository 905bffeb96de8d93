//! Dead letters in a shard worker: requeueing dead items (by id, or a topic's in batches)
//! and purging them. Each batch is one worker turn, so a million dead items are handled
//! in bounded memory without holding up the shard's other work.

use std::collections::HashMap;

use super::worker::{storage_error, timed, ShardWorker};
use super::Result;
use super::Settled;
use crate::model::{ItemState, ReadyKey, TopicName};
use crate::store::{Change, ShardStore};

impl<S: ShardStore> ShardWorker<S> {
    /// Makes the dead items among `keys` ready again (delivery count reset); any other key
    /// is `NotFound`.
    pub(super) async fn revive(&mut self, keys: Vec<u64>) -> Result<Vec<Settled>> {
        let (r, took) = timed(self.timeout(), self.store.lookup(&keys)).await;
        self.record(&r, took);
        let mut dead: HashMap<u64, (String, String, ReadyKey)> = r
            .map_err(|e| storage_error(self.id, &e))?
            .into_iter()
            .filter(|m| m.state == ItemState::Dead)
            .map(|m| (m.key, (m.ns.clone(), m.topic.clone(), m.ready_key())))
            .collect();
        let changes: Vec<Change> = dead.keys().map(|k| Change::Revive { key: *k }).collect();
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
            .map(|(i, _)| Change::Revive { key: i.id.key })
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
