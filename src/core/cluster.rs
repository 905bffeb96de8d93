//! What a host does with its cluster: it adopts the shard manager's views, keeps its
//! peers' loads and ready topics fresh, and reports itself (`getHostInfo`). The data it
//! keeps is `peers::ClusterState`; talking to a peer is the `peers::Peers` seam.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::join_all;

use super::access::{Caller, Kind};
use super::host::Host;
use super::peers::*;
use crate::error::{Error, ErrorCode, Result};
use crate::model::HEADS_MAX;
use crate::model::{ClusterView, Head, ReadyTopic, ShardStatus, TopicName};

/// Most topics in one announcement.
const ANNOUNCE_BATCH_MAX: usize = 1000;

impl Host {
    /// Adopts the shard manager's latest view (owners and peers).
    /// A replicated shard is paused for a switch, or not served yet after one (it has no
    /// owner, or this host owns it and has not reopened it): enqueues wait a little.
    pub(super) fn switching_here(&self) -> bool {
        let view = self.cluster.view();
        if view.primaries.is_empty() {
            return false;
        }
        let served = self.shards();
        view.primaries.iter().any(|(s, p)| {
            p.state != crate::model::PrimaryState::Serving
                || match view.owners.get(s) {
                    None => true,
                    Some(h) => h == self.host_id() && !served.contains_key(s),
                }
        })
    }

    pub fn set_view(&self, view: Arc<ClusterView>) {
        let live: Vec<String> = view.hosts.keys().cloned().collect();
        *self.cluster.view.write().expect("not poisoned") = view;
        self.cluster
            .loads
            .lock()
            .expect("not poisoned")
            .retain(|id, _| live.contains(id));
        self.cluster
            .ready
            .lock()
            .expect("not poisoned")
            .retain(|id, _| live.contains(id));
    }

    /// How much more this host can buffer: free slots in its healthy shards' queues.
    pub fn spare_capacity(&self) -> i64 {
        self.shards()
            .values()
            .filter(|s| s.is_healthy())
            .map(|s| s.spare() as i64)
            .sum()
    }

    /// Topics with ready items on this host's shards, the fullest first, at most
    /// `READY_TOPICS_MAX`, each with its head here; from the shards' in-memory counts and
    /// indexes, plus the items the prefetch stage holds (leased in storage, ready for
    /// clients: without them a busy topic whose ready items are all staged would vanish
    /// from the summary, and routed dequeues would stall until the stage releases them).
    /// A topic's head is unknown (`None`) when one of its shards does not know its own.
    pub fn ready_topics(&self) -> Vec<ReadyTopic> {
        let now = self.clock.now_ms();
        let mut parts: HashMap<TopicName, Vec<ReadyTopic>> = HashMap::new();
        let sources = self
            .shards()
            .values()
            .flat_map(|s| s.ready_topics(now))
            .chain(self.prefetch.staged_topics(self.staged_live()))
            .collect::<Vec<_>>();
        for r in sources {
            parts.entry(r.topic.clone()).or_default().push(r);
        }
        let mut out: Vec<ReadyTopic> = parts
            .into_iter()
            .map(|(topic, parts)| merged(topic, parts))
            .collect();
        out.sort_by(|a, b| b.ready.cmp(&a.ready).then_with(|| a.topic.cmp(&b.topic)));
        out.truncate(READY_TOPICS_MAX);
        // The heads' budget: the fullest topics keep theirs, the rest their first.
        let mut budget = SUMMARY_HEADS_MAX;
        for r in &mut out {
            r.heads.truncate(budget.max(1));
            budget = budget.saturating_sub(r.heads.len());
        }
        out
    }

    /// This host's summary of one topic (see [`Self::ready_topics`]), for an
    /// announcement: head and heads unknown or empty when nothing is known or ready.
    fn topic_summary(&self, topic: &TopicName) -> ReadyTopic {
        let now = self.clock.now_ms();
        let mut parts: Vec<ReadyTopic> = self
            .shards()
            .values()
            .filter_map(|s| s.ready_topic(topic, now))
            .collect();
        parts.extend(
            self.prefetch
                .staged_topics(self.staged_live())
                .into_iter()
                .filter(|r| &r.topic == topic),
        );
        merged(topic.clone(), parts)
    }

    /// Polls every peer every `every_ms` (spare capacity, ready topics) until `stop`
    /// turns true; topics may be announced again after each poll.
    pub async fn run_peer_poll(
        self: Arc<Self>,
        every_ms: u64,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(every_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => break,
            }
            self.waiters.reset_announced();
            let since = self
                .cluster
                .announcements
                .load(std::sync::atomic::Ordering::SeqCst);
            let view = self.cluster.view();
            // The peers within this host's fan-out, not the whole tier (see
            // `cluster::fanout`).
            let (within, _) = self.cluster.fanout();
            let asks = view
                .hosts
                .iter()
                .filter(|(id, _)| within.contains(*id))
                .map(|(id, h)| {
                    let peers = self.cluster.peers.clone();
                    let host = &self;
                    async move {
                        let sent = host.clock.now_ms();
                        let r = peers.poll(&h.addr).await;
                        if let Err(e) = &r {
                            tracing::debug!(peer = %id, error = %e, "peer unreachable");
                        }
                        host.compare_clocks(id, sent, r.as_ref().ok().and_then(|s| s.now_ms));
                        (id.clone(), r.ok())
                    }
                });
            let polled = join_all(asks).await;
            self.cluster
                .settings
                .clock_check
                .retain(|p| within.contains(p));
            self.judge_clock();
            let mut woken = Vec::new();
            {
                let mut loads = self.cluster.loads.lock().expect("not poisoned");
                let mut ready = self.cluster.ready.lock().expect("not poisoned");
                let mut states = self.cluster.shard_states.lock().expect("not poisoned");
                // What was learnt of a host no longer polled is dropped: it would only age.
                states.retain(|id, _| within.contains(id));
                loads.retain(|id, _| within.contains(id));
                ready.retain(|id, _| within.contains(id));
                for (id, summary) in polled {
                    let Some(s) = summary else {
                        loads.insert(id.clone(), PeerLoad::default());
                        ready.remove(&id);
                        states.remove(&id);
                        continue;
                    };
                    states.insert(id.clone(), s.shards);
                    {
                        let mut marks = self.cluster.marks_forwards.lock().expect("not poisoned");
                        if s.forward_marks {
                            marks.insert(id.clone());
                        } else {
                            marks.remove(&id);
                        }
                    }
                    loads.insert(
                        id.clone(),
                        PeerLoad {
                            reachable: true,
                            spare: s.spare,
                        },
                    );
                    let old = ready.remove(&id).unwrap_or_default();
                    // Its own number, so that a routed dequeue's answer that raced with it
                    // does not overwrite what it says (see `head_at_least`).
                    let seq = self
                        .cluster
                        .announcements
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                        + 1;
                    let mut new: ReadyTopics = s
                        .ready
                        .into_iter()
                        .map(|r| {
                            let known = PeerTopic {
                                ready: r.ready,
                                head: r.head,
                                heads: r.heads,
                                seq,
                            };
                            (r.topic, known)
                        })
                        .collect();
                    // Announcements that came after this poll was sent are newer than it.
                    for (t, known) in &old {
                        if known.seq > since {
                            new.entry(t.clone())
                                .and_modify(|n| n.merge_announced(known))
                                .or_insert(known.clone());
                        }
                    }
                    // A topic that appears here may have a long poll waiting for it (its
                    // announcement may have been spent or missed).
                    woken.extend(new.keys().filter(|t| !old.contains_key(*t)).cloned());
                    self.metrics.peer_polled(&id);
                    ready.insert(id, new);
                }
            }
            for t in &woken {
                self.waiters.wake_remote(t);
            }
        }
    }

    /// Sends the topics that got ready items here to the peers of this host's tier, in
    /// small batches, until `stop` turns true (see [`crate::waiters::Waiters::wake`]).
    pub async fn run_announcer(
        self: Arc<Self>,
        mut topics: tokio::sync::mpsc::UnboundedReceiver<TopicName>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        loop {
            let first = tokio::select! {
                t = topics.recv() => match t {
                    Some(t) => t,
                    None => break,
                },
                _ = stop.changed() => break,
            };
            let mut names = vec![first];
            let mut seen = std::collections::HashSet::new();
            seen.insert(names[0].clone());
            while names.len() < ANNOUNCE_BATCH_MAX {
                let Ok(t) = topics.try_recv() else { break };
                if seen.insert(t.clone()) {
                    names.push(t);
                }
            }
            let host: &Host = &self;
            // Each with its head here now, so that peers routing dequeues know whether
            // this host holds more urgent items than they do.
            let batch: Vec<ReadyTopic> = names
                .into_iter()
                .map(|topic| ReadyTopic {
                    ready: 1,
                    ..host.topic_summary(&topic)
                })
                .collect();
            // Every peer that polls this host, whatever its tier: a host routes a
            // namespace's calls to that namespace's tier, so any of them may hold a long
            // poll for these topics; those that do not poll it do not route dequeues here
            // (see `cluster::fanout`). A peer known to be unreachable is skipped, so it
            // cannot slow the others.
            let me = host.host_id();
            let loads = host.cluster.loads.lock().expect("not poisoned").clone();
            let (_, pollers) = host.cluster.fanout();
            let peers: Vec<(String, String)> = host
                .cluster
                .view()
                .hosts
                .iter()
                .filter(|(id, _)| pollers.contains(*id))
                .filter(|(id, _)| loads.get(*id).is_none_or(|l| l.reachable))
                .map(|(id, h)| (id.clone(), h.addr.clone()))
                .collect();
            join_all(peers.iter().map(|(id, addr)| {
                let batch = batch.clone();
                async move {
                    if let Err(e) = host.cluster.peers.notify_ready(addr, me, batch).await {
                        tracing::debug!(peer = %id, error = %e, "announcing ready topics failed");
                    }
                }
            }))
            .await;
        }
    }

    /// Whether `caller` is another host of this cluster (see `Access::is_peer`).
    pub fn is_peer(&self, caller: &Caller) -> bool {
        self.access.is_peer(caller)
    }

    /// Who a call that a peer routed here acts for: the client it names in
    /// `forwarded_for` (refused from a caller that is not a peer), else the caller.
    pub fn acting_as(&self, caller: &Caller, forwarded_for: Option<&str>) -> Result<Caller> {
        self.access.acting_for(caller, None, forwarded_for)
    }

    /// `peerLogin`: the caller's connection proves it is `host_id`'s with the cluster's
    /// secret. A refusal is counted with the requests (`peerLogin`, `PERMISSION_DENIED`),
    /// not logged: a client trying secrets must not fill the log.
    pub fn peer_login(&self, caller: &Caller, host_id: &str, secret: &[u8]) -> Result<()> {
        self.access.peer_login(caller, host_id, secret)?;
        tracing::debug!(peer = %host_id, "a peer logged in");
        Ok(())
    }

    /// A peer announced ready items of `topics`: route dequeues there, and wake the long
    /// polls waiting for them here.
    pub fn peer_ready(
        &self,
        caller: &Caller,
        host_id: &str,
        topics: Vec<ReadyTopic>,
    ) -> Result<()> {
        self.allow(caller, "", Kind::Peer)?;
        // A host announces its own ready items, not another's: on a logged-in connection
        // the host it logged in as.
        if let Some(logged_in) = caller.logged_in_peer().filter(|h| *h != host_id) {
            return Err(Error::new(
                ErrorCode::PermissionDenied,
                format!(
                    "notifyReady for host {host_id:?} on a connection host {logged_in:?} \
                     logged in on"
                ),
            ));
        }
        if !self.cluster.view().hosts.contains_key(host_id) || host_id == self.host_id() {
            // Not a member of the cluster as this host sees it: nothing to route to.
            return Ok(());
        }
        let seq = self
            .cluster
            .announcements
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        {
            let mut ready = self.cluster.ready.lock().expect("not poisoned");
            let known = ready.entry(host_id.to_string()).or_default();
            for r in &topics {
                let said = PeerTopic {
                    ready: r.ready,
                    head: r.head,
                    heads: r.heads.clone(),
                    seq,
                };
                known
                    .entry(r.topic.clone())
                    .and_modify(|k| k.merge_announced(&said))
                    .or_insert(said);
            }
        }
        for r in &topics {
            self.waiters.wake_remote(&r.topic);
        }
        Ok(())
    }

    /// Each reachable peer's shards and their states, as its last poll answered.
    pub fn peer_shard_states(&self) -> HashMap<String, Vec<ShardStatus>> {
        self.cluster
            .shard_states
            .lock()
            .expect("not poisoned")
            .clone()
    }

    /// The peers this host polls (`cluster.peer_fanout` of each tier, see
    /// `cluster::fanout`) as it sees them now: a bounded list, however large the tier.
    pub fn peer_statuses(&self) -> Vec<PeerStatus> {
        let view = self.cluster.view();
        let (polled, _) = self.cluster.fanout();
        let loads = self.cluster.loads.lock().expect("not poisoned").clone();
        view.hosts
            .iter()
            .filter(|(id, _)| polled.contains(*id))
            .map(|(id, h)| PeerStatus {
                host_id: id.clone(),
                addr: h.addr.clone(),
                tier: h.tier.clone(),
                shards: view.shards_of(id),
                load: loads.get(id).copied().unwrap_or_default(),
            })
            .collect()
    }

    /// One poll of `peer` sent at `sent_ms` (this host's clock) was answered now, with the
    /// peer's clock then (`None`: unanswered, or an older build that does not say).
    fn compare_clocks(&self, peer: &str, sent_ms: i64, theirs_ms: Option<i64>) {
        let check = &self.cluster.settings.clock_check;
        match theirs_ms {
            Some(theirs) => {
                let s = check.observe(peer, sent_ms, self.clock.now_ms(), theirs);
                self.metrics.peer_clock_offset(peer, s.offset_ms);
            }
            None => check.forget(peer),
        }
    }

    /// After a round of polls: whether this host's clock is out of bound now (see
    /// `cluster::clock`); a change is logged and shown in the metrics.
    fn judge_clock(&self) {
        let check = &self.cluster.settings.clock_check;
        match check.decide() {
            Some(true) => tracing::error!(
                bound_ms = check.bound_ms(),
                offsets = ?check.samples(),
                "this host's clock is beyond cluster.clock_skew_max_ms from the cluster's middle clock: \
                 it stops holding shards until its clock is back in bound"
            ),
            Some(false) => tracing::info!(
                offsets = ?check.samples(),
                "this host's clock is back within cluster.clock_skew_max_ms of its peers'"
            ),
            None => {}
        }
        self.metrics.clock_out_of_bound(check.out_of_bound());
    }

    /// Whether this host's clock is out of bound (see `cluster::clock`).
    pub fn clock_out_of_bound(&self) -> bool {
        self.cluster.settings.clock_check.out_of_bound()
    }

    /// This host, its shards and its peers as it sees them, for `getHostInfo`. The ready
    /// topics (names of every namespace's topics) only for callers allowed `peer` (or
    /// when there are no access rules).
    pub fn host_status(&self, caller: &Caller) -> HostStatus {
        let s = &self.cluster.settings;
        let peers = self.peer_statuses();
        HostStatus {
            host_id: s.host_id.clone(),
            addr: s.addr.clone(),
            tier: s.tier.clone(),
            manager: s.manager,
            shards: self.shard_status(),
            spare: self.spare_capacity(),
            peers,
            // Every namespace's topics: for peers, and for anyone where everything is
            // open anyway (no rules), as getActiveTopics is.
            ready_topics: if self.access.is_open() || self.access.is_peer(caller) {
                self.ready_topics()
            } else {
                Vec::new()
            },
            now_ms: self.clock.now_ms(),
        }
    }
}

/// At most this many head keys in one summary (see `model::HEADS_MAX`): a summary of
/// 10,000 topics stays small; past it, a topic's summary carries its first head only.
const SUMMARY_HEADS_MAX: usize = 4096;

/// One topic's summary on this host from its sources' (shards, the stage): the ready
/// counts added; the head the most urgent, unknown when one source's is; the heads merged
/// and cut where a source's unlisted items could come between (each source's unlisted
/// items are no more urgent than its last listed one, or its head when it lists none).
fn merged(topic: TopicName, parts: Vec<ReadyTopic>) -> ReadyTopic {
    let ready = parts.iter().map(|p| p.ready).sum();
    let unknown = parts.iter().any(|p| p.ready > 0 && p.head.is_none());
    let head = parts
        .iter()
        .filter_map(|p| p.head)
        .min()
        .filter(|_| !unknown);
    let cut = parts
        .iter()
        .filter(|p| p.ready > p.heads.len() as i64)
        .filter_map(|p| p.heads.last().copied().or(p.head))
        .min();
    let mut heads: Vec<Head> = if unknown {
        Vec::new()
    } else {
        parts.iter().flat_map(|p| p.heads.iter().copied()).collect()
    };
    heads.sort_unstable();
    if let Some(cut) = cut {
        heads.retain(|h| *h <= cut);
    }
    heads.truncate(HEADS_MAX);
    ReadyTopic {
        topic,
        ready,
        head,
        heads,
    }
}

#[cfg(test)]
mod merged_tests {
    use super::*;

    fn h(priority: i32) -> Head {
        Head {
            priority,
            deliver_after_ms: 0,
        }
    }

    fn part(ready: i64, heads: &[i32]) -> ReadyTopic {
        let heads: Vec<Head> = heads.iter().map(|p| h(*p)).collect();
        ReadyTopic {
            topic: TopicName {
                ns: "n".into(),
                topic: "t".into(),
            },
            ready,
            head: heads.first().copied(),
            heads,
        }
    }

    #[test]
    fn a_hosts_heads_stop_where_a_sources_unlisted_items_could_come_between() {
        let t = |r: &ReadyTopic| r.heads.iter().map(|h| h.priority).collect::<Vec<_>>();
        // Both sources list everything: all of it, in order.
        let r = merged(part(0, &[]).topic, vec![part(2, &[1, 4]), part(2, &[2, 3])]);
        assert_eq!((r.ready, r.head, t(&r)), (4, Some(h(1)), vec![1, 2, 3, 4]));
        // The second lists 2 of its 5: its others are no more urgent than 3, so the
        // first's 4 cannot be told apart from them.
        let r = merged(part(0, &[]).topic, vec![part(2, &[1, 4]), part(5, &[2, 3])]);
        assert_eq!(t(&r), vec![1, 2, 3]);
        // A source whose head is unknown makes the host's unknown.
        let mut unknown = part(3, &[]);
        unknown.head = None;
        let r = merged(unknown.topic.clone(), vec![part(2, &[1, 4]), unknown]);
        assert_eq!((r.head, t(&r)), (None, vec![]));
    }
}
