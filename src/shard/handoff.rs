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

use super::inserts::InsertGroup;
use super::worker::ShardWorker;
use super::Command;
use crate::model::{Item, ItemId, NewItem, Policy, ReadyKey, TopicName};
use crate::store::{Handoff, ShardStore};

/// A row that may be handed: its place in the ready order, its INSERT group, its policy.
type Candidate = (ReadyKey, usize, Policy);

/// Failed INSERTs with hand-offs whose outcome a worker waits to settle, at most.
const HANDOFF_DOUBTS_MAX: usize = 1024;

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
        for g in groups.iter_mut() {
            g.written_at_ms = now_ms;
        }
        let demand = self.waiters.demand();
        // Most inserts find nobody waiting: they cost one look, nothing per row.
        if !demand.anyone_waiting() {
            return;
        }
        // Rows by topic, borrowed: a topic's name is copied once, not per row.
        let mut by_topic: HashMap<(&str, &str), Vec<Candidate>> = HashMap::new();
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
                    .entry((it.ns.as_str(), it.topic.as_str()))
                    .or_default()
                    .push((k, at, it.policy));
            }
        }
        // Owned names from here: the loop below writes to `groups`, which the map borrows.
        let by_topic: Vec<(TopicName, Vec<Candidate>)> = by_topic
            .into_iter()
            .map(|((ns, topic), rows)| {
                let name = TopicName {
                    ns: ns.to_string(),
                    topic: topic.to_string(),
                };
                (name, rows)
            })
            .collect();
        let mut token = None;
        for (topic, mut rows) in by_topic {
            let grant = demand.grant(&topic, now_ms);
            if grant.items == 0 {
                continue;
            }
            let Ok(first_ready) = self.first_ready(&topic, now_ms) else {
                continue;
            };
            // Only a prefix of the turn's rows in order: a row that cannot be handed goes
            // in ready, and nothing behind it may be handed ahead of it.
            rows.sort_unstable_by_key(|(k, _, _)| *k);
            let handable = rows
                .iter()
                .take_while(|(k, _, policy)| {
                    (grant.at_most_once || *policy != Policy::AtMostOnce)
                        && first_ready.is_none_or(|f| *k < f)
                })
                .count();
            rows.truncate(handable.min(grant.items));
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
        }
    }

    /// An INSERT that carried hand-offs failed: its rows may or may not exist (an unknown
    /// outcome). Their keys stay staged (a row that does exist is leased by nobody, and
    /// its lease must come back uncounted); once the outcome has settled, the keys of rows
    /// that do not exist are taken out (see [`Self::settle_handoffs`]), so the staged set
    /// does not keep them for ever.
    pub(super) fn handoff_failed(&mut self, handoff: Handoff) {
        if handoff.keys.is_empty() {
            return;
        }
        let at = std::time::Instant::now() + super::worker::settle_window(&self.cfg);
        if self.handoff_doubts.len() >= HANDOFF_DOUBTS_MAX {
            // A long outage: the oldest keys are left staged (memory, nothing else).
            self.handoff_doubts.pop_front();
        }
        self.handoff_doubts.push_back((at, handoff));
    }

    /// Takes out of the staged set the handed keys of failed INSERTs whose outcome has
    /// settled and whose rows do not exist. A lookup that fails is tried again later.
    pub(super) async fn settle_handoffs(&mut self) {
        let now = std::time::Instant::now();
        while self
            .handoff_doubts
            .front()
            .is_some_and(|(at, _)| *at <= now)
        {
            let Some((at, handoff)) = self.handoff_doubts.pop_front() else {
                return;
            };
            let (r, took) =
                super::worker::timed(self.timeout(), self.store.lookup(&handoff.keys)).await;
            self.record(&r, took);
            let Ok(found) = r else {
                // Tried again at the next pass.
                self.handoff_doubts.push_front((at, handoff));
                return;
            };
            let exists: std::collections::HashSet<u64> = found.iter().map(|m| m.key).collect();
            for k in handoff.keys.iter().filter(|k| !exists.contains(k)) {
                self.shared.staged.take(*k, handoff.token);
            }
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
                lease_ms: it.lease_ms,
                policy: it.policy,
                expires_at_ms: it.expires_at_ms,
                lease_token: handoff.token,
            });
        }
        for (topic, items) in by_topic {
            let n = items.len();
            let refused = self.waiters.demand().hand(&topic, items);
            let taken = n - refused.len();
            if !refused.is_empty() {
                let (reply, _) = oneshot::channel();
                self.deferred.push(Command::Release {
                    items: refused,
                    reply,
                });
            }
            if taken > 0 {
                self.probes.metrics.handoffs.inc_by(taken as u64);
                self.waiters.wake_handed(topic);
            }
        }
    }
}
