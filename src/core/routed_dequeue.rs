//! A dequeue routed across the tier: the tier's most urgent items first, as far as this
//! host knows the peers' heads (the keys of each topic's most urgent ready items there,
//! from the peer's last poll or announcement, less what routed dequeues took since). It
//! merges what it knows (its own heads and the peers') into how many items to take from
//! each host, and asks each for exactly that many, none past the merge's last key: so a
//! reply holds the tier's most urgent items as of those heads, across any number of
//! hosts, and no item is leased that the reply does not return. A peer that cannot be
//! reached is skipped (its items wait); the call fails only when nothing was found and
//! some host with items could not be reached.

use super::host::Host;
use super::peers::ClusterState;
use crate::error::Result;
use crate::model::{Head, Item, TopicName};

/// How many times a routed dequeue plans and asks again when a peer answered with fewer
/// than planned.
const MERGE_ROUNDS_MAX: usize = 3;

/// A peer a routed dequeue may ask, with what this host knows of its head.
pub(super) struct RoutePeer {
    pub id: String,
    pub addr: String,
    pub head: Option<Head>,
    /// Its most urgent ready keys as known (at least `head` when that is known).
    pub heads: Vec<Head>,
    /// Whether it said it holds more ready items than `heads` lists (those are no more
    /// urgent than the last listed).
    pub more: bool,
    /// The poll or announcement the head came with (see `PeerTopic::seq`).
    pub seq: u64,
}

/// How many items a routed dequeue of `count` takes from this host (`mine`, its own
/// heads) and from each peer (their known heads): the `count` most urgent keys of them
/// all, ties to this host, then to the earlier peer; and the least urgent key taken when
/// `count` were found (no host is asked for items past it).
pub(super) fn plan(
    mine: &[Head],
    peers: &[&[Head]],
    count: usize,
) -> (usize, Vec<usize>, Option<Head>) {
    let mut keys: Vec<(Head, usize)> = mine.iter().map(|h| (*h, 0)).collect();
    for (i, heads) in peers.iter().enumerate() {
        keys.extend(heads.iter().map(|h| (*h, i + 1)));
    }
    keys.sort_unstable();
    keys.truncate(count);
    let mut take = vec![0usize; peers.len() + 1];
    for (_, source) in &keys {
        take[*source] += 1;
    }
    let last = (keys.len() == count)
        .then(|| keys.last().map(|k| k.0))
        .flatten();
    let mine = take.remove(0);
    (mine, take, last)
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
                let known = ready.get(&id)?.get(topic)?;
                let heads = match (&known.heads[..], known.head) {
                    ([], Some(h)) => vec![h],
                    (heads, _) => heads.to_vec(),
                };
                (known.ready > 0).then_some((
                    known.ready,
                    RoutePeer {
                        id,
                        addr,
                        head: known.head,
                        more: known.ready > heads.len() as i64,
                        heads,
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

    /// A peer answered with `n` items: the first `n` of its known keys are taken (unless
    /// an announcement came since `seq` was read: its keys are newer).
    fn took(&self, p: &RoutePeer, topic: &TopicName, n: usize) {
        let mut ready = self.ready.lock().expect("not poisoned");
        if let Some(k) = ready.get_mut(&p.id).and_then(|t| t.get_mut(topic)) {
            if k.seq == p.seq {
                let n = n.min(k.heads.len());
                k.heads.drain(..n);
                k.ready = (k.ready - n as i64).max(0);
                if let Some(first) = k.heads.first() {
                    k.head = Some(k.head.map_or(*first, |h| h.max(*first)));
                }
            }
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
                // The keys it had before that are taken.
                k.heads.retain(|h| *h >= head);
            }
        }
    }
}

impl Host {
    /// Up to `count` items of `topic` for one dequeue, the tier's most urgent as far as
    /// this host knows. It merges its own heads (its `count` most urgent ready keys, from
    /// memory) with the peers' known heads ([`plan`]), asks each peer at once for its share
    /// (items up to the merge's last key), takes the rest from its own shards, and asks
    /// the peers that have the topic (those whose heads are unknown among them) for
    /// whatever is still missing (a peer whose heads were stale answered with fewer).
    ///
    /// With `local_only` (a dequeue a peer routed here), this host's items only, and with
    /// `before` only those more urgent than it.
    pub(super) async fn dequeue_across(
        &self,
        topic: &TopicName,
        count: usize,
        local_only: bool,
        before: Option<Head>,
        acting: Option<&str>,
    ) -> Result<Vec<Item>> {
        if local_only {
            return self.dequeue_topic(topic, count, before).await;
        }
        let since = self.waiters.demand().epoch(topic);
        let tier = self.namespaces.tier(&topic.ns);
        let mut failure = None;
        let mut remote: Vec<Item> = Vec::new();
        let peers = self.cluster.peers_with_ready(tier, topic);
        let unknown: Vec<&RoutePeer> = peers.iter().filter(|p| p.head.is_none()).collect();
        if !peers.is_empty() {
            let mine = self.local_heads(topic, count).await;
            // Peers whose heads are unknown (their shards have not read the topic since
            // they opened) may hold anything: asked first, for items more urgent than the
            // least urgent this host would give.
            for p in unknown {
                let mine_in = mine.len().min(count - remote.len());
                let Some(worst) = mine_in.checked_sub(1).map(|i| mine[i]) else {
                    break;
                };
                match self
                    .ask(p, topic, count - remote.len(), Some(worst), acting)
                    .await
                {
                    Ok(items) => remote.extend(items),
                    Err(e) => failure = Some(e),
                }
            }
            // Rounds: a peer whose heads were stale answers with fewer than planned; the
            // next round plans again with what the answers showed.
            for _ in 0..MERGE_ROUNDS_MAX {
                let want = count - remote.len();
                let peers = self.cluster.peers_with_ready(tier, topic);
                let known: Vec<&RoutePeer> = peers.iter().filter(|p| p.head.is_some()).collect();
                if want == 0 || known.is_empty() {
                    break;
                }
                // A peer with more than it lists may hold any number more at or after its
                // last listed key: planned as if they were at it (so it is asked for
                // them), while the bound comes from the listed keys alone (the least
                // urgent of the `want` most urgent known: nothing past it belongs in the
                // reply).
                let padded: Vec<Vec<Head>> = known
                    .iter()
                    .map(|p| {
                        let mut v = p.heads.clone();
                        if let (true, Some(last)) = (p.more, v.last().copied()) {
                            v.resize(v.len().max(want), last);
                        }
                        v
                    })
                    .collect();
                let heads: Vec<&[Head]> = padded.iter().map(|v| &v[..]).collect();
                let (_, takes, _) = plan(&mine, &heads, want);
                let listed: Vec<&[Head]> = known.iter().map(|p| &p.heads[..]).collect();
                let (_, _, last) = plan(&mine, &listed, want);
                // None past the merge's last key (`before` is exclusive: the key after it).
                let bound = last.map(|h| Head {
                    deliver_after_ms: h.deliver_after_ms.saturating_add(1),
                    ..h
                });
                let asks: Vec<_> = known
                    .iter()
                    .zip(takes)
                    .filter(|(_, n)| *n > 0)
                    .map(|(p, n)| async move { (n, self.ask(p, topic, n, bound, acting).await) })
                    .collect();
                if asks.is_empty() {
                    break;
                }
                let mut short = false;
                for (n, r) in futures::future::join_all(asks).await {
                    match r {
                        Ok(items) => {
                            short |= items.len() < n;
                            remote.extend(items);
                        }
                        Err(e) => failure = Some(e),
                    }
                }
                if !short {
                    break;
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
                match self.ask(&p, topic, want, None, acting).await {
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
        acting: Option<&str>,
    ) -> Result<Vec<Item>> {
        let r = self
            .cluster
            .peers
            .dequeue(&p.addr, topic, want, before, self.host_id(), acting)
            .await;
        match &r {
            Ok(items) => match (before, items.last()) {
                (None, None) => self.cluster.drained(&p.id, topic),
                (Some(b), _) if items.len() < want => self.cluster.head_at_least(p, topic, b),
                (_, Some(_)) => self.cluster.took(p, topic, items.len()),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn h(priority: i32) -> Head {
        Head {
            priority,
            deliver_after_ms: 0,
        }
    }

    #[test]
    fn the_plan_takes_the_most_urgent_known_keys_from_each_host() {
        // Three hosts, interleaved: this one 0, 3, 6, ...; the peers 1, 4, ... and 2, 5, ...
        let mine: Vec<Head> = (0..10).map(|i| h(3 * i)).collect();
        let a: Vec<Head> = (0..10).map(|i| h(3 * i + 1)).collect();
        let b: Vec<Head> = (0..10).map(|i| h(3 * i + 2)).collect();
        let (m, takes, last) = plan(&mine, &[&a, &b], 10);
        assert_eq!((m, takes, last), (4, vec![3, 3], Some(h(9))));
        // Fewer keys known than asked: all of them, and no bound.
        let (m, takes, last) = plan(&mine[..2], &[&a[..1]], 10);
        assert_eq!((m, takes, last), (2, vec![1], None));
        // Ties go to this host, then to the earlier peer.
        let (m, takes, _) = plan(&[h(1)], &[&[h(1)], &[h(1)]], 2);
        assert_eq!((m, takes), (1, vec![1, 0]));
        // A peer with nothing known is asked for nothing.
        let (m, takes, _) = plan(&[h(5)], &[&[]], 3);
        assert_eq!((m, takes), (1, vec![0]));
    }
}
