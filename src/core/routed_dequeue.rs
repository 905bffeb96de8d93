//! A dequeue routed across the tier: the tier's most urgent items first, as far as this
//! host knows the peers' heads (each topic's most urgent ready item there, from the peer's
//! last poll or announcement, or its last answer to a routed dequeue). A peer that cannot
//! be reached is skipped (its items wait); the call fails only when nothing was found and
//! some host with items could not be reached.

use super::host::Host;
use super::peers::ClusterState;
use crate::error::Result;
use crate::model::{Head, Item, TopicName};

/// A peer a routed dequeue may ask, with what this host knows of its head.
pub(super) struct RoutePeer {
    pub id: String,
    pub addr: String,
    pub head: Option<Head>,
    /// The poll or announcement the head came with (see `PeerTopic::seq`).
    pub seq: u64,
}

impl ClusterState {
    /// The reachable peers of `tier` whose summaries list ready items of `topic`, those
    /// whose head may be the most urgent first (unknown heads first of all), then the
    /// fullest.
    pub(super) fn peers_with_ready(&self, tier: &str, topic: &TopicName) -> Vec<RoutePeer> {
        let peers = self.tier_peers(tier);
        let loads = self.loads.lock().expect("not poisoned").clone();
        let ready = self.ready.lock().expect("not poisoned");
        let mut out: Vec<(i64, RoutePeer)> = peers
            .into_iter()
            .filter(|(id, _)| loads.get(id).is_none_or(|l| l.reachable))
            .filter_map(|(id, addr)| {
                let known = *ready.get(&id)?.get(topic)?;
                (known.ready > 0).then_some((
                    known.ready,
                    RoutePeer {
                        id,
                        addr,
                        head: known.head,
                        seq: known.seq,
                    },
                ))
            })
            .collect();
        out.sort_by(|a, b| {
            a.1.head
                .cmp(&b.1.head)
                .then_with(|| b.0.cmp(&a.0))
                .then_with(|| a.1.id.cmp(&b.1.id))
        });
        out.into_iter().map(|(_, p)| p).collect()
    }

    /// A peer answered a routed dequeue of `topic` with nothing: forget the topic there
    /// until its next poll or announcement.
    fn drained(&self, host_id: &str, topic: &TopicName) {
        if let Some(t) = self.ready.lock().expect("not poisoned").get_mut(host_id) {
            t.remove(topic);
        }
    }

    /// A peer's answer showed that none of its ready items of `topic` is more urgent than
    /// `head`: raise what is known of its head, unless an announcement came since `seq`
    /// was read (it may have brought a more urgent item).
    fn head_at_least(&self, p: &RoutePeer, topic: &TopicName, head: Head) {
        let mut ready = self.ready.lock().expect("not poisoned");
        if let Some(k) = ready.get_mut(&p.id).and_then(|t| t.get_mut(topic)) {
            if k.seq == p.seq {
                k.head = Some(k.head.map_or(head, |h| h.max(head)));
            }
        }
    }
}

impl Host {
    /// Up to `count` items of `topic` for one dequeue, the tier's most urgent as far as
    /// this host knows. It looks at what it would give itself (the heads of its `count`
    /// most urgent ready items, from memory) and asks the peers whose head beats the least
    /// urgent of those, the most urgent head first, for items before it (`before`); then it
    /// takes from its own shards what is left to take, and asks the peers that have the
    /// topic for whatever is still missing. A peer's head comes from its last poll or
    /// announcement, or from its last answer. Two peers' items are not traded against each
    /// other: one peer's less urgent items may come while another holds more urgent ones,
    /// until the next reply.
    ///
    /// With `local_only` (a dequeue a peer routed here), this host's items only, and with
    /// `before` only those more urgent than it.
    pub(super) async fn dequeue_across(
        &self,
        topic: &TopicName,
        count: usize,
        local_only: bool,
        before: Option<Head>,
    ) -> Result<Vec<Item>> {
        if local_only {
            return self.dequeue_topic(topic, count, before).await;
        }
        let since = self.waiters.demand().epoch(topic);
        let tier = self.namespaces.tier(&topic.ns);
        let mut failure = None;
        let mut remote: Vec<Item> = Vec::new();
        let peers = self.cluster.peers_with_ready(tier, topic);
        if !peers.is_empty() {
            let mine = self.local_heads(topic, count).await;
            for p in &peers {
                // This host's items that would still be in the reply.
                let mine_in = mine.len().min(count - remote.len());
                let Some(worst) = mine_in.checked_sub(1).map(|i| mine[i]) else {
                    break;
                };
                if p.head.is_some_and(|h| h >= worst) {
                    continue;
                }
                let want = count - remote.len();
                match self.ask(p, topic, want, Some(worst)).await {
                    Ok(items) => remote.extend(items),
                    Err(e) => failure = Some(e),
                }
            }
        }
        let mut got = match self.dequeue_topic(topic, count - remote.len(), None).await {
            Ok(items) => items,
            Err(e) => {
                failure = Some(e);
                Vec::new()
            }
        };
        got.extend(remote);
        if got.len() < count {
            // What this host lacks, from the peers that have the topic (those that just
            // answered with all they had before the bound are asked again: what they have
            // after it may fill the reply).
            for p in self.cluster.peers_with_ready(tier, topic) {
                let want = count - got.len();
                match self.ask(&p, topic, want, None).await {
                    Ok(items) => got.extend(items),
                    Err(e) => failure = Some(e),
                }
                if got.len() >= count {
                    break;
                }
            }
        }
        if got.is_empty() {
            if let Some(e) = failure {
                return Err(e);
            }
            // A consumer of this host that finds the topic empty here and on its peers:
            // an item enqueued here now may be handed to it directly (see
            // `crate::demand`). Not for a dequeue a peer routed here: its consumer waits
            // at that peer.
            self.waiters
                .demand()
                .found_nothing(topic, count, self.clock.now_ms(), since);
        }
        got.sort_by_key(Item::global_key);
        Ok(got)
    }

    /// One routed dequeue to a peer; what it answers also tells what its head is now.
    async fn ask(
        &self,
        p: &RoutePeer,
        topic: &TopicName,
        want: usize,
        before: Option<Head>,
    ) -> Result<Vec<Item>> {
        let r = self
            .cluster
            .peers
            .dequeue(&p.addr, topic, want, before, self.host_id())
            .await;
        match &r {
            Ok(items) => match (before, items.last()) {
                (None, None) => self.cluster.drained(&p.id, topic),
                (Some(b), _) if items.len() < want => self.cluster.head_at_least(p, topic, b),
                (_, Some(last)) => self.cluster.head_at_least(p, topic, Head::of(last)),
                (Some(_), None) => {}
            },
            Err(e) => {
                tracing::debug!(peer = %p.id, error = %e, "routed dequeue failed");
                // Only a peer that could not be reached is skipped until its next poll; a
                // refusal (another config) is the peer's answer.
                if e.code == crate::error::ErrorCode::Unavailable {
                    self.cluster.unreachable(&p.id);
                }
            }
        }
        r
    }
}
