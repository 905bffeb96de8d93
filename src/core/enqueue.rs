//! Enqueue: validation, quota, and where each item goes: a local shard, the shard that
//! owns its dedup key, or a peer (another tier's host, a dedup key's owner, or any host
//! of this tier with spare capacity when this one has none).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;

use futures::future::join_all;

use super::access::{Caller, Kind};
use super::api::{EnqueueOutcome, EnqueueRequestItem};
use super::host::Host;
use super::validate::{as_request, validate_item};
use crate::error::{Error, ErrorCode, Result};
use crate::model::{ItemId, NewItem, ShardId};
use crate::quota::Rate;
use crate::shard::{Enqueued, Forward, PendingEnqueue};

/// How often an enqueue held during a switch looks for a shard again.
const HOLD_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// Where a group of a request's items goes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Dest {
    /// Any healthy local shard (one INSERT for the group).
    AnyLocal,
    /// The local shard that owns the items' dedup keys.
    Shard(ShardId),
    /// A peer, at this address.
    Peer(String),
}

/// What [`Host::topic_room`] answered for each (namespace, topic) of one request.
type TopicRoom = HashMap<String, HashMap<String, Result<()>>>;

impl Host {
    /// Enqueues a batch; each item succeeds or fails alone. Replies only after commit.
    /// `forwarded_by` is set when a peer forwarded the request: it is then served here or
    /// failed, never forwarded again, and its quota was charged by that peer;
    /// `forward_token` is that peer's token for it, under which the items are marked as
    /// they are stored (see `enqueue_doubt`); `forwarded_for` the client it acts for,
    /// whose rights are checked here again (this host's rules may differ).
    pub async fn enqueue(
        &self,
        caller: &Caller,
        items: Vec<EnqueueRequestItem>,
        (forwarded_by, forwarded_for): (Option<&str>, Option<&str>),
        forward_token: Option<i64>,
    ) -> Result<Vec<EnqueueOutcome>> {
        super::host::check_batch(items.len(), "items")?;
        let caller = self
            .access
            .acting_for(caller, forwarded_by, forwarded_for)?;
        // Whom a peer this enqueue goes on to checks (see `acting_identity`).
        let acting = self.acting_identity(&caller);
        let forwarded = forwarded_by.is_some();
        let now = self.clock.now_ms();
        let mut results: Vec<Option<EnqueueOutcome>> = vec![None; items.len()];
        let mut valid = Vec::with_capacity(items.len());
        for (i, it) in items.into_iter().enumerate() {
            if let Err(e) = self.allow(&caller, &it.ns, Kind::Produce) {
                results[i] = Some(Err(e));
                continue;
            }
            let policy = self.namespaces.get(&it.ns);
            match validate_item(it, policy, now) {
                Ok(n) => valid.push((i, n)),
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        if !forwarded {
            valid = self.charge_quota(valid, &mut results).await;
        }
        // Items for this host's shards go in groups of one namespace each: a group takes its
        // namespace's turn at the shards and passes the shedder as that namespace (see
        // `tenants`). Items for a peer go in one call, whatever their namespaces.
        // (A namespace goes by its place among the request's namespaces, usually one: no
        // copy of its name per item.)
        let mut names: Vec<String> = Vec::new();
        let mut groups: BTreeMap<(Dest, usize), Vec<(usize, NewItem)>> = BTreeMap::new();
        let mut room = TopicRoom::default();
        for (i, n) in valid {
            match self.destination(&n, forwarded).and_then(|d| match d {
                Dest::Peer(_) => Ok(d),
                _ => self.topic_room(&mut room, &n.ns, &n.topic).map(|()| d),
            }) {
                Ok(d) => {
                    let ns = match d {
                        Dest::Peer(_) => 0,
                        _ => match names.iter().position(|x| *x == n.ns) {
                            Some(at) => at + 1,
                            None => {
                                names.push(n.ns.clone());
                                names.len()
                            }
                        },
                    };
                    groups.entry((d, ns)).or_default().push((i, n))
                }
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        let forward_token = forward_token.filter(|_| forwarded);
        if forward_token
            .is_some_and(|t| crate::store::token_from_the_future(t, self.clock.now_ms()))
        {
            return Err(Error::invalid(
                "forward_token was drawn more than a minute ahead of this host's clock",
            ));
        }
        // A forwarded request held before anything is stored, or after (tests arm them to
        // kill this host mid-call; nothing without the `failpoints` feature).
        if forwarded {
            crate::failpoint::pause("forwarded-enqueue-received").await;
        }
        let outcomes = join_all(groups.into_iter().map(|((dest, _), items)| async move {
            let (positions, items): (Vec<usize>, Vec<NewItem>) = items.into_iter().unzip();
            let forward = forward_token.map(|token| Forward {
                token,
                positions: positions.iter().map(|&p| p as u32).collect(),
            });
            (
                positions,
                self.enqueue_to(dest, items, forwarded, forward, now, acting)
                    .await,
            )
        }))
        .await;
        for (positions, outcome) in outcomes {
            for (pos, r) in positions.into_iter().zip(outcome) {
                results[pos] = Some(r);
            }
        }
        if forwarded {
            crate::failpoint::pause("forwarded-enqueue-answered").await;
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every position is filled"))
            .collect())
    }

    /// Admits what the namespaces' quotas allow (the first items of each namespace);
    /// the rest fail with `RATE_LIMITED`, retryable.
    async fn charge_quota(
        &self,
        valid: Vec<(usize, NewItem)>,
        results: &mut [Option<EnqueueOutcome>],
    ) -> Vec<(usize, NewItem)> {
        let mut wanted: BTreeMap<&str, (Rate, u64)> = BTreeMap::new();
        for (_, n) in &valid {
            if let Some(q) = self.namespaces.get(&n.ns).and_then(|p| p.quota()) {
                wanted.entry(&n.ns).or_insert((q, 0)).1 += 1;
            }
        }
        if wanted.is_empty() {
            return valid;
        }
        let mut allowed: BTreeMap<String, u64> = BTreeMap::new();
        for (ns, (rate, n)) in wanted {
            let ok = self.cluster.quotas.admit(ns, rate, n).await;
            allowed.insert(ns.to_string(), ok);
        }
        let mut kept = Vec::with_capacity(valid.len());
        for (i, n) in valid {
            match allowed.get_mut(&n.ns) {
                None => kept.push((i, n)),
                Some(0) => {
                    self.metrics.ns_refused(&n.ns, "quota");
                    let per_minute = self
                        .namespaces
                        .get(&n.ns)
                        .and_then(|p| p.enqueues_per_minute)
                        .unwrap_or(60_000)
                        .max(1);
                    // About when the next token comes (at least 1 ms).
                    results[i] = Some(Err(Error::rate_limited(
                        format!("namespace {:?} is over its enqueue quota", n.ns),
                        (60_000 / per_minute).max(1),
                    )))
                }
                Some(left) => {
                    *left -= 1;
                    kept.push((i, n));
                }
            }
        }
        kept
    }

    /// Where an item goes: its namespace's tier, then its dedup key's shard.
    fn destination(&self, n: &NewItem, forwarded: bool) -> Result<Dest> {
        let tier = self.namespaces.tier(&n.ns);
        if !self.cluster.serves_tier(tier) {
            return self
                .cluster
                .peer_for_tier(tier, forwarded, &n.ns)
                .map(Dest::Peer);
        }
        let Some(key) = &n.dedup_key else {
            return Ok(Dest::AnyLocal);
        };
        let shard = self.dedup_shard(tier, &n.ns, &n.topic, key)?;
        if self.shards().contains_key(&shard) {
            return Ok(Dest::Shard(shard));
        }
        self.cluster
            .owner_for(
                shard,
                self.cluster.may_forward(forwarded),
                "the shard that owns this dedup key",
            )
            .map(Dest::Peer)
    }

    /// The shard that owns a dedup key: a stable hash (FNV-1a) over every shard of the
    /// tier, healthy or not and wherever it is served, so the same key always meets
    /// itself. Changing a tier's shard list changes where keys go; dedup across such a
    /// change is not guaranteed.
    fn dedup_shard(&self, tier: &str, ns: &str, topic: &str, key: &str) -> Result<ShardId> {
        let h = crate::hash::fnv1a([ns.as_bytes(), &[0], topic.as_bytes(), &[0], key.as_bytes()]);
        let ids = self.cluster.tier_shards(tier);
        if ids.is_empty() {
            return Err(Error::unavailable(format!("tier {tier:?} has no shards")));
        }
        Ok(ids[(h % ids.len() as u64) as usize])
    }

    async fn enqueue_to(
        &self,
        dest: Dest,
        items: Vec<NewItem>,
        forwarded: bool,
        forward: Option<Forward>,
        now: i64,
        acting: Option<&str>,
    ) -> Vec<EnqueueOutcome> {
        let n = items.len();
        // This namespace's turn at the shards (see `tenants`), held until the shard's
        // answer (not while a switch holds the batch, nor while an answer in doubt is
        // resolved); a peer takes its own.
        let mut turn = match &dest {
            Dest::Peer(_) => None,
            _ => {
                // At least a byte an item: an enqueue always carries some (see `fair`).
                let bytes = items
                    .iter()
                    .map(|i| 1 + i.payload.len() + i.metadata.len())
                    .sum();
                if let Err(e) = self.shed(&items[0].ns, n).await {
                    return vec![Err(e); n];
                }
                match self.fair_turn(&items[0].ns, "enqueue", n, bytes).await {
                    Ok(p) => Some(p),
                    Err(e) => return vec![Err(e); n],
                }
            }
        };
        let spread = |shard: ShardId, r: Result<Vec<Enqueued>>| -> Vec<EnqueueOutcome> {
            match r {
                Ok(keys) => keys
                    .into_iter()
                    .map(|(key, dup)| Ok((ItemId { shard, key }, dup)))
                    .collect(),
                Err(e) => vec![Err(e); n],
            }
        };
        match dest {
            Dest::Shard(id) => match self.submit_to_shard(id, items, forward) {
                Ok(pending) => {
                    let answer = pending.wait().await;
                    drop(turn);
                    spread(id, self.resolve_enqueue(answer).await)
                }
                Err(e) => vec![Err(e); n],
            },
            Dest::Peer(addr) => self.forward_enqueue(&addr, items, now, acting).await,
            Dest::AnyLocal => {
                // While a switch pauses this host's replicated shards, the batch waits
                // for them (up to the hold), then goes to another host, then fails.
                let hold_until = std::time::Instant::now() + self.enqueue_hold;
                let mut items = items;
                let (items, e) = loop {
                    match self.submit_to_some_shard(items, forward.clone()) {
                        Ok((id, pending)) => {
                            let answer = pending.wait().await;
                            drop(turn);
                            return spread(id, self.resolve_enqueue(answer).await);
                        }
                        Err((back, e)) => {
                            if !self.switching_here() || std::time::Instant::now() >= hold_until {
                                break (back, e);
                            }
                            items = back;
                            // Held without a turn, taken again after.
                            drop(turn.take());
                            tokio::time::sleep(HOLD_POLL).await;
                            match self.fair_turn(&items[0].ns, "enqueue", n, 0).await {
                                Ok(p) => turn = Some(p),
                                Err(e) => return vec![Err(e); n],
                            }
                        }
                    }
                };
                // Nothing was written: another host of the tier may take the batch.
                drop(turn);
                match self.cluster.spare_peer(forwarded) {
                    Some(addr) => {
                        tracing::debug!(peer = addr, error = %e, "forwarding an enqueue");
                        self.forward_enqueue(&addr, items, now, acting).await
                    }
                    None => vec![Err(e); n],
                }
            }
        }
    }

    /// [`Self::within_topics_max`], asked once a topic of a request (it looks at every
    /// shard's counts), not once an item; a topic seen already costs no allocation.
    fn topic_room(&self, room: &mut TopicRoom, ns: &str, topic: &str) -> Result<()> {
        if let Some(r) = room.get(ns).and_then(|t| t.get(topic)) {
            return r.clone();
        }
        let r = self.within_topics_max(ns, topic);
        room.entry(ns.to_string())
            .or_default()
            .insert(topic.to_string(), r.clone());
        r
    }

    /// Refused when an item of `topic` would start a topic past its namespace's
    /// `topics_max`: the topic has no items on this host's shards and some shard holds
    /// `topics_max` topics of the namespace already (so no shard passes it, but for
    /// enqueues running at once).
    fn within_topics_max(&self, ns: &str, topic: &str) -> Result<()> {
        let Some(max) = self.namespaces.get(ns).map(|p| p.topics_max) else {
            return Ok(());
        };
        let mut most = 0;
        for shard in self.shards().values() {
            let (has, topics) = shard.topics_of(ns, topic);
            if has {
                return Ok(());
            }
            most = most.max(topics);
        }
        if (most as u64) < max {
            return Ok(());
        }
        Err(Error::new(
            ErrorCode::InvalidArgument,
            format!(
                "namespace {:?} has {most} topics with items on a shard of this host (topics_max = \
                 {max}): enqueue to one of them, or raise its topics_max",
                ns
            ),
        ))
    }

    /// Sends items to a peer as one request; each item gets the peer's answer for it. An
    /// answer in doubt (the peer died or went silent mid-call) is resolved under the
    /// request's token before the reply (see `enqueue_doubt`).
    async fn forward_enqueue(
        &self,
        addr: &str,
        items: Vec<NewItem>,
        now: i64,
        acting: Option<&str>,
    ) -> Vec<EnqueueOutcome> {
        let n = items.len();
        let token = crate::store::new_batch_token(self.clock.now_ms());
        let tiers: BTreeSet<&str> = items.iter().map(|i| self.namespaces.tier(&i.ns)).collect();
        let request = items.into_iter().map(|i| as_request(i, now)).collect();
        let mut results = match self
            .cluster
            .peers
            .enqueue(addr, request, self.host_id(), token, acting)
            .await
        {
            Ok(r) if r.len() == n => r,
            Ok(r) => vec![
                Err(Error::new(
                    ErrorCode::Internal,
                    format!("peer {addr} answered {} results for {n} items", r.len()),
                ));
                n
            ],
            Err(e) => vec![Err(e); n],
        };
        self.resolve_forward(addr, token, &tiers, &mut results)
            .await;
        results
    }

    /// Items with dedup keys go to the shard that owns their keys; if that shard is sick
    /// or busy they fail (retryably): writing them elsewhere would break uniqueness.
    fn submit_to_shard(
        &self,
        id: ShardId,
        items: Vec<NewItem>,
        forward: Option<Forward>,
    ) -> Result<PendingEnqueue> {
        let shards = self.shards();
        let Some(shard) = shards.get(&id) else {
            return Err(Error::unavailable(format!(
                "shard {id} is not served here now"
            )));
        };
        if !shard.is_healthy() {
            return Err(Error::unavailable(format!(
                "shard {id}, which owns these dedup keys, is unhealthy"
            )));
        }
        shard
            .submit_enqueue(items, forward)
            .map_err(|(_, e)| Error::from(e))
    }

    /// Hands the whole batch to one healthy shard, round-robin, so it is one INSERT.
    /// On refusal nothing was written and the items come back.
    #[allow(clippy::result_large_err)]
    fn submit_to_some_shard(
        &self,
        mut items: Vec<NewItem>,
        forward: Option<Forward>,
    ) -> std::result::Result<(ShardId, PendingEnqueue), (Vec<NewItem>, Error)> {
        let shards = self.shards();
        let healthy: Vec<_> = shards.values().filter(|s| s.is_healthy()).collect();
        if healthy.is_empty() {
            let why = if shards.is_empty() {
                "this host serves no shard now"
            } else {
                "no healthy shard: every shard's circuit breaker is open"
            };
            return Err((items, Error::unavailable(why)));
        }
        // The least busy first (fewest commands queued), round-robin among equals: an
        // enqueue does not queue behind another's batch on one shard while another idles.
        let start = self.next_shard.fetch_add(1, Ordering::Relaxed);
        let mut order: Vec<_> = (0..healthy.len())
            .map(|i| healthy[(start + i) % healthy.len()])
            .collect();
        order.sort_by_key(|s| s.queue_depth());
        // While a namespace with a guarantee is active, the last healthy shard is its
        // own: tried first for it, last for the others (see `tenants`).
        if let Some(at) = self.reserved_position(&order, &items[0].ns) {
            let reserved = order.remove(at.0);
            if at.1 {
                order.insert(0, reserved);
            } else {
                order.push(reserved);
            }
        }
        let mut last_err = None;
        // A refused submit wrote nothing, so trying the next shard cannot duplicate an
        // item. Once accepted, the outcome is final: a storage error may have committed.
        for shard in order {
            match shard.submit_enqueue(items, forward.clone()) {
                Ok(pending) => return Ok((shard.id(), pending)),
                Err((back, e)) => {
                    items = back;
                    last_err = Some(Error::from(e));
                }
            }
        }
        Err((
            items,
            last_err.unwrap_or_else(|| Error::unavailable("no shard could take the batch")),
        ))
    }
}
