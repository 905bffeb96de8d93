//! Routing: which host serves what. Enqueues go to a local shard or a peer with capacity
//! (or of the namespace's tier); ids go to the host owning their shard; and the calls that
//! read or drain a topic (dequeue, long poll, peek, topicStats, the dead-letter calls,
//! getActiveTopics) cover the namespace's whole tier, asking each peer for its own shards
//! only (`local_only`): one hop at most.
//!
//! How a routed dequeue picks the tier's most urgent items is `routed_dequeue.rs`. Calls
//! whose answers must be complete (topicStats, the dead-letter counts and pages) fail with
//! a retryable `UNAVAILABLE` when a peer cannot be reached.

use std::collections::BTreeMap;
use std::time::Instant;

use futures::future::join_all;

use super::access::{Caller, Kind};
use super::host::Host;
use super::peers::{ClusterState, DeadItem, PeerLoad};
use super::ActiveTopicsPage;
use crate::error::{Error, Result};
use crate::model::{Item, Progress, ShardId, TopicSnapshot};

impl ClusterState {
    /// May a request (forwarded already or not) be forwarded from here?
    pub(super) fn may_forward(&self, forwarded: bool) -> bool {
        !forwarded && self.settings.forwarding
    }

    /// The reachable peers of `tier` that this host polls (see `cluster::fanout`) with
    /// their loads and addresses, the most spare capacity first.
    fn ranked(&self, tier: &str) -> Vec<(PeerLoad, String)> {
        let view = self.view();
        let (polled, _) = self.fanout();
        let loads = self.loads.lock().expect("not poisoned");
        let mut peers: Vec<(PeerLoad, String, String)> = view
            .hosts
            .iter()
            .filter(|(id, h)| polled.contains(*id) && h.tier == tier)
            // A peer not asked yet counts as reachable with no spare capacity.
            .map(|(id, h)| {
                let load = loads.get(id).copied().unwrap_or(PeerLoad {
                    reachable: true,
                    spare: 0,
                });
                (load, id.clone(), h.addr.clone())
            })
            .collect();
        peers.sort_by(|a, b| {
            (b.0.reachable, b.0.spare)
                .cmp(&(a.0.reachable, a.0.spare))
                .then(a.1.cmp(&b.1))
        });
        peers
            .into_iter()
            .filter(|(l, _, _)| l.reachable)
            .map(|(load, _, addr)| (load, addr))
            .collect()
    }

    /// The address of a host of `tier` to forward `ns`'s enqueues to; when forwarding is
    /// not allowed, `WRONG_HOST` naming one.
    pub(super) fn peer_for_tier(&self, tier: &str, forwarded: bool, ns: &str) -> Result<String> {
        let Some((_, addr)) = self.ranked(tier).into_iter().next() else {
            return Err(Error::unavailable(format!(
                "namespace {ns:?} belongs to tier {tier:?}, which has no reachable host"
            )));
        };
        if !self.may_forward(forwarded) {
            return Err(Error::wrong_host(
                format!("namespace {ns:?} is served by tier {tier:?}, not by this host"),
                &addr,
            ));
        }
        Ok(addr)
    }

    /// A peer of this host's tier with spare capacity, for an enqueue this host cannot
    /// take; `None` when forwarding is not allowed or no peer has room.
    pub(super) fn spare_peer(&self, forwarded: bool) -> Option<String> {
        if !self.may_forward(forwarded) {
            return None;
        }
        self.ranked(&self.settings.tier)
            .into_iter()
            .find(|(load, _)| load.spare > 0)
            .map(|(_, addr)| addr)
    }

    /// The address of the host that owns `shard`, to send `what` there; `WRONG_HOST`
    /// (with that address) when forwarding is not allowed, `UNAVAILABLE` while the shard
    /// has no owner (it is moving), `NOT_FOUND` for a shard no tier has.
    pub(super) fn owner_for(
        &self,
        shard: ShardId,
        may_forward: bool,
        what: &str,
    ) -> Result<String> {
        let view = self.view();
        match view.owner(shard) {
            Some((owner, _)) if owner == self.settings.host_id => Err(Error::unavailable(format!(
                "{what}: shard {shard} is being opened on this host; retry"
            ))),
            Some((_, addr)) if may_forward => Ok(addr.to_string()),
            Some((owner, addr)) => Err(Error::wrong_host(
                format!("{what}: shard {shard} is served by {owner} at {addr}"),
                addr,
            )),
            None if self
                .settings
                .tier_shards
                .values()
                .any(|s| s.contains(&shard)) =>
            {
                Err(Error::unavailable(format!(
                    "{what}: shard {shard} has no owner right now (it is moving); retry"
                )))
            }
            None => Err(Error::not_found(format!(
                "{what}: there is no shard {shard}"
            ))),
        }
    }

    /// Whether the peer at `addr` said, at its last poll, that its shards mark forwarded
    /// requests' items (an older build does not); a peer unreachable at its last poll
    /// keeps what it said before.
    pub(super) fn peer_marks_forwards(&self, addr: &str) -> bool {
        let view = self.view();
        let Some((id, _)) = view.hosts.iter().find(|(_, h)| h.addr == addr) else {
            return false;
        };
        let marks = self.marks_forwards.lock().expect("not poisoned");
        marks.contains(id.as_str())
    }

    /// A peer could not be reached: nothing is routed to it until its next poll.
    pub(super) fn unreachable(&self, host_id: &str) {
        self.loads
            .lock()
            .expect("not poisoned")
            .insert(host_id.to_string(), PeerLoad::default());
        self.ready.lock().expect("not poisoned").remove(host_id);
        self.shard_states
            .lock()
            .expect("not poisoned")
            .remove(host_id);
    }
}

impl Host {
    /// The peers a call about `ns` asks besides this host: none with `local_only`.
    fn tier_peers_of(&self, ns: &str, local_only: bool) -> Vec<(String, String)> {
        if local_only {
            return Vec::new();
        }
        self.cluster.tier_peers(self.namespaces.tier(ns))
    }

    /// For calls whose answer must be complete: every shard of `ns`'s tier has an owner
    /// that the call asks (this host or a peer of the tier); a shard that is moving would
    /// be missed, so the call fails retryably instead.
    fn every_shard_owned(&self, ns: &str, local_only: bool) -> Result<()> {
        if local_only {
            return Ok(());
        }
        let tier = self.namespaces.tier(ns);
        let view = self.cluster.view();
        let mine = self.shards();
        for s in self.cluster.tier_shards(tier) {
            let owned = mine.contains_key(s)
                || view
                    .owner(*s)
                    .is_some_and(|(o, _)| view.hosts.get(o).is_some_and(|h| h.tier == tier));
            if !owned {
                return Err(Error::unavailable(format!(
                    "shard {s} has no owner right now (it is moving); retry"
                )));
            }
        }
        Ok(())
    }

    /// The next `count` ready items of a topic in delivery order across the tier,
    /// without leasing them. A peer that cannot answer is left out (a snapshot).
    pub async fn peek(
        &self,
        caller: &Caller,
        ns: &str,
        topic: &str,
        count: i32,
        local_only: bool,
    ) -> Result<Vec<Item>> {
        self.allow(caller, ns, Kind::Consume)?;
        let acting = self.acting_identity(caller);
        let mut items = self.local_peek(ns, topic, count).await?;
        let name = self.topic_name(ns, topic)?;
        let peers = self.tier_peers_of(ns, local_only);
        let pages = join_all(
            peers
                .iter()
                .map(|(_, addr)| self.cluster.peers.peek(addr, &name, count, acting)),
        )
        .await;
        for p in pages.into_iter().flatten() {
            items.extend(p);
        }
        items.sort_by_key(Item::global_key);
        items.truncate(count.max(0) as usize);
        Ok(items)
    }

    /// A topic's counts, totals and the age of its oldest ready item over the tier.
    pub async fn topic_stats(
        &self,
        caller: &Caller,
        ns: &str,
        topic: &str,
        local_only: bool,
    ) -> Result<(TopicSnapshot, i64)> {
        self.allow(caller, ns, Kind::Consume)?;
        let acting = self.acting_identity(caller);
        self.every_shard_owned(ns, local_only)?;
        let (mut all, mut age) = self.local_topic_stats(ns, topic).await?;
        let name = self.topic_name(ns, topic)?;
        let peers = self.tier_peers_of(ns, local_only);
        let answers = join_all(
            peers
                .iter()
                .map(|(_, addr)| self.cluster.peers.topic_stats(addr, &name, acting)),
        )
        .await;
        for ((id, _), r) in peers.iter().zip(answers) {
            let (s, a) = r.map_err(|e| incomplete(id, "count the topic", &e))?;
            all.ready += s.ready;
            all.deferred += s.deferred;
            all.leased += s.leased;
            all.dead += s.dead;
            all.totals.add(&s.totals);
            age = age.max(a);
        }
        Ok((all, age))
    }

    /// One page of a topic's dead items in delivery order over the tier: each host gives
    /// its first `limit` after the cursor, the merge keeps the first `limit`.
    pub async fn dlq_list(
        &self,
        caller: &Caller,
        ns: &str,
        topic: &str,
        limit: Option<i32>,
        after: Option<String>,
        local_only: bool,
    ) -> Result<(Vec<DeadItem>, Option<String>)> {
        self.allow(caller, ns, Kind::Admin)?;
        let acting = self.acting_identity(caller);
        self.every_shard_owned(ns, local_only)?;
        let (mut all, next) = self.local_dlq_list(ns, topic, limit, after.clone()).await?;
        let name = self.topic_name(ns, topic)?;
        let peers = self.tier_peers_of(ns, local_only);
        if peers.is_empty() {
            return Ok((all, next));
        }
        let limit = limit.unwrap_or(super::limits::DLQ_PAGE_DEFAULT);
        let pages = join_all(peers.iter().map(|(_, addr)| {
            self.cluster
                .peers
                .dlq_list(addr, &name, limit, after.clone(), acting)
        }))
        .await;
        let mut more = next.is_some();
        for ((id, _), r) in peers.iter().zip(pages) {
            let (items, next) = r.map_err(|e| incomplete(id, "list the dead letters", &e))?;
            more |= next.is_some();
            all.extend(items);
        }
        all.sort_by_key(|(i, _)| i.global_key());
        let limit = limit.max(1) as usize;
        more |= all.len() > limit;
        all.truncate(limit);
        let next = if more {
            all.last().map(|(i, _)| super::inspect::dlq_cursor(i))
        } else {
            None
        };
        Ok((all, next))
    }

    /// How long one dead-letter bulk call works here: a call a peer routed here
    /// (`local_only`) must answer within that peer's `cluster.peer_timeout_ms`, so it
    /// gets at most half of it.
    fn dlq_bound(&self, local_only: bool) -> std::time::Duration {
        if local_only {
            self.dlq_call_bound.min(self.dlq_routed_bound)
        } else {
            self.dlq_call_bound
        }
    }

    /// Makes up to `max` (default: all) of a topic's dead items ready again, over the
    /// tier, within the host's time bound for a call (each peer within its own); returns
    /// how many, and whether some are left (`more`: call again).
    pub async fn dlq_requeue_all(
        &self,
        caller: &Caller,
        ns: &str,
        topic: &str,
        max: Option<i64>,
        local_only: bool,
    ) -> Result<Progress> {
        self.allow(caller, ns, Kind::Admin)?;
        let acting = self.acting_identity(caller);
        self.every_shard_owned(ns, local_only)?;
        let until = Instant::now() + self.dlq_bound(local_only);
        let mut done = self.local_dlq_requeue_all(ns, topic, max, until).await?;
        let name = self.topic_name(ns, topic)?;
        for (id, addr) in self.tier_peers_of(ns, local_only) {
            let left = max.map(|m| m - done.count);
            if left.is_some_and(|l| l <= 0) {
                break;
            }
            if done.more || Instant::now() >= until {
                done.more = true;
                break;
            }
            done.add(
                self.cluster
                    .peers
                    .dlq_requeue_all(&addr, &name, left, acting)
                    .await
                    .map_err(|e| incomplete(&id, "requeue its dead letters", &e))?,
            );
        }
        Ok(done)
    }

    /// Deletes a topic's dead items over the tier; returns how many.
    pub async fn dlq_purge(
        &self,
        caller: &Caller,
        ns: &str,
        topic: &str,
        local_only: bool,
    ) -> Result<Progress> {
        self.allow(caller, ns, Kind::Admin)?;
        let acting = self.acting_identity(caller);
        self.every_shard_owned(ns, local_only)?;
        // The peers purge at the same time as this host, each within its own bound.
        let until = Instant::now() + self.dlq_bound(local_only);
        let name = self.topic_name(ns, topic)?;
        let peers = self.tier_peers_of(ns, local_only);
        let (local, answers) = futures::join!(
            self.local_dlq_purge(ns, topic, until),
            join_all(
                peers
                    .iter()
                    .map(|(_, addr)| self.cluster.peers.dlq_purge(addr, &name, acting)),
            )
        );
        let mut done = local?;
        for ((id, _), r) in peers.iter().zip(answers) {
            done.add(r.map_err(|e| incomplete(id, "purge its dead letters", &e))?);
        }
        Ok(done)
    }
    /// `getActiveTopics` for the namespace's whole tier: this host's topics merged with
    /// its peers' (each asked for its own only), each topic naming the hosts that hold it.
    /// With `local_only`, this host's topics only. A peer that cannot answer fails the
    /// call (retryably): a partial list would look complete.
    pub async fn active_topics(
        &self,
        caller: &Caller,
        ns: &str,
        limit: Option<i32>,
        after: Option<String>,
        local_only: bool,
    ) -> Result<ActiveTopicsPage> {
        self.allow(caller, ns, Kind::Consume)?;
        let acting = self.acting_identity(caller);
        let mut page = self.local_active_topics(ns, limit, after.clone()).await?;
        let me = self.host_id().to_string();
        for t in &mut page.topics {
            t.hosts = vec![me.clone()];
        }
        if local_only {
            return Ok(page);
        }
        let tier = self.namespaces.tier(ns);
        let view = self.cluster.view();
        let peers: Vec<(&String, &str)> = view
            .hosts
            .iter()
            .filter(|(id, h)| **id != me && h.tier == tier)
            .map(|(id, h)| (id, h.addr.as_str()))
            .collect();
        if peers.is_empty() {
            return Ok(page);
        }
        let limit = limit.unwrap_or(super::limits::ACTIVE_TOPICS_LIMIT_DEFAULT);
        let pages = join_all(peers.iter().map(|(id, addr)| {
            let after = after.clone();
            async move {
                let r = self
                    .cluster
                    .peers
                    .active_topics(addr, ns, limit, after, acting)
                    .await;
                (id.to_string(), r)
            }
        }))
        .await;
        // Each source returned its first `limit` topics after the cursor, so each topic of
        // the first `limit` overall is in every list that has it: its sums are complete.
        let mut more = page.next_after.is_some();
        let mut merged: BTreeMap<String, crate::model::TopicCounts> = page
            .topics
            .into_iter()
            .map(|t| (t.topic.clone(), t))
            .collect();
        for (id, r) in pages {
            let p = r.map_err(|e| {
                Error::unavailable(format!(
                    "peer {id} could not list its topics: {}",
                    e.message
                ))
            })?;
            more |= p.next_after.is_some();
            for t in p.topics {
                let m =
                    merged
                        .entry(t.topic.clone())
                        .or_insert_with(|| crate::model::TopicCounts {
                            topic: t.topic.clone(),
                            ..Default::default()
                        });
                m.ready += t.ready;
                m.deferred += t.deferred;
                m.leased += t.leased;
                m.hosts.push(id.clone());
            }
        }
        let limit = limit.max(1) as usize;
        let more = more || merged.len() > limit;
        let topics: Vec<_> = merged
            .into_values()
            .take(limit)
            .map(|mut t| {
                t.hosts.sort();
                t
            })
            .collect();
        let next_after = if more {
            topics.last().map(|t| t.topic.clone())
        } else {
            None
        };
        Ok(ActiveTopicsPage { topics, next_after })
    }
}

/// A peer's failure in a call whose answer must be complete: retryable, never partial.
fn incomplete(peer: &str, what: &str, e: &Error) -> Error {
    Error::unavailable(format!("peer {peer} could not {what}: {}", e.message))
}
