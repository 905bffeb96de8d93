//! The direct hand-off on the shard's side (see [`crate::demand`]): before a turn's
//! INSERTs run, the worker picks the rows it may write already leased to consumers
//! waiting on their topic; once the INSERT commits, it gives those items to the host
//! (its prefetch stage) and wakes the waiters, before the enqueue is answered.
//!
//! The lease is decided before the commit: the rows carry a claim token, and their keys
//! are in the shard's staged set under it from the start. So every way the hand-over can
//! fail ends as for any claimed item nobody received: a commit whose outcome is unknown,
//! a consumer gone, a worker that dies, leave a lease that comes back uncounted when it
//! ends (or is released sooner by the stage); a crash of the whole process leaves a
//! leased row that the scan gives back when its lease ends.

use std::collections::HashMap;

use tokio::sync::oneshot;

use super::ops::InsertGroup;
use super::worker::ShardWorker;
use super::Command;
use crate::model::{Item, ItemId, NewItem, Policy, ReadyKey, TopicName};
use crate::store::{Handoff, ShardStore};

fn topic_of(it: &NewItem) -> TopicName {
    TopicName {
        ns: it.ns.clone(),
        topic: it.topic.clone(),
    }
}

impl<S: ShardStore> ShardWorker<S> {
    /// Marks in `groups` the rows to write leased: for each topic with consumers waiting,
    /// as many as they asked for, most urgent first, and only those more urgent than any
    /// item this shard already has ready for the topic. Ready now and not expired only;
    /// at-most-once ones only for a parked long poll.
    pub(super) fn plan_handoff(&mut self, groups: &mut [InsertGroup], now_ms: i64) {
        let demand = self.waiters.demand();
        let mut by_topic: HashMap<TopicName, Vec<(ReadyKey, usize, Policy)>> = HashMap::new();
        for (at, g) in groups.iter().enumerate() {
            for (key, it) in &g.rows {
                if it.deliver_after_ms > now_ms || it.expires_at_ms.is_some_and(|t| t <= now_ms) {
                    continue;
                }
                let k = ReadyKey {
                    priority: it.priority,
                    deliver_after_ms: it.deliver_after_ms,
                    key: *key,
                };
                by_topic
                    .entry(topic_of(it))
                    .or_default()
                    .push((k, at, it.policy));
            }
        }
        let mut token = None;
        for (topic, mut rows) in by_topic {
            let grant = demand.grant(&topic, now_ms);
            if grant.items == 0 {
                continue;
            }
            let Ok(first_ready) = self.first_ready(&topic, now_ms) else {
                continue;
            };
            rows.retain(|(k, _, policy)| {
                (grant.at_most_once || *policy != Policy::AtMostOnce)
                    && first_ready.is_none_or(|f| *k < f)
            });
            rows.sort_unstable_by_key(|(k, _, _)| *k);
            rows.truncate(grant.items);
            if rows.is_empty() {
                continue;
            }
            demand.took(&topic, rows.len());
            let token = *token.get_or_insert_with(|| {
                self.lease_token += 1;
                self.lease_token
            });
            for (k, at, _) in rows {
                let h = &mut groups[at].handoff;
                h.token = token;
                h.keys.push(k.key);
                // Staged before the commit: whatever happens to the hand-over, the lease
                // this row may get is nobody's until a consumer takes the item.
                self.shared.staged.insert(k.key, token);
            }
        }
        for g in groups.iter_mut() {
            g.handoff.keys.sort_unstable();
            g.written_at_ms = now_ms;
        }
    }

    /// This shard's most urgent ready key of `topic` (`Ok(None)`: it has none ready);
    /// `Err` when it has some but its index does not say which.
    fn first_ready(&self, topic: &TopicName, now_ms: i64) -> Result<Option<ReadyKey>, ()> {
        if let Some(t) = self.index().get(topic) {
            if let Some(k) = t.head(1).first() {
                return Ok(Some(*k));
            }
            if !t.is_partial() {
                return Ok(None);
            }
        }
        if self.counts().has_ready(&topic.ns, &topic.topic, now_ms) {
            Err(())
        } else {
            Ok(None)
        }
    }

    /// The INSERT that wrote `rows` committed: the items `handoff` holds go to the host's
    /// stage for the consumers waiting on their topics, who are woken. Those the host does
    /// not take are released in the next turn.
    pub(super) fn hand_over(
        &mut self,
        handoff: &Handoff,
        rows: Vec<(u64, NewItem)>,
        written_at_ms: i64,
    ) {
        if handoff.keys.is_empty() {
            return;
        }
        fail::fail_point!(&format!("shard-{}-handoff-committed", self.id));
        let mut by_topic: HashMap<TopicName, Vec<Item>> = HashMap::new();
        for (key, it) in rows {
            if !handoff.holds(key) {
                continue;
            }
            let topic = topic_of(&it);
            by_topic.entry(topic).or_default().push(Item {
                id: ItemId {
                    shard: self.id,
                    key,
                },
                ns: it.ns,
                topic: it.topic,
                priority: it.priority,
                payload: it.payload,
                metadata: it.metadata,
                deliver_after_ms: it.deliver_after_ms,
                enqueued_at_ms: it.enqueued_at_ms,
                delivery_count: 1,
                lease_expires_ms: written_at_ms + it.lease_ms,
                policy: it.policy,
                expires_at_ms: it.expires_at_ms,
                lease_token: handoff.token,
            });
        }
        for (topic, items) in by_topic {
            self.probes.metrics.handoffs.inc_by(items.len() as u64);
            let refused = self.waiters.demand().hand(&topic, items);
            if !refused.is_empty() {
                let (reply, _) = oneshot::channel();
                self.deferred.push(Command::Release {
                    items: refused,
                    reply,
                });
            }
            self.waiters.wake_handed(topic);
        }
    }
}
