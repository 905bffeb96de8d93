//! The host's peers: how they are reached ([`Peers`], which the RPC layer implements with
//! pooled Thrift clients) and what this host last learned of each (reachable, spare
//! capacity, which topics have ready items there).
//!
//! What the host does with it lives beside: `cluster.rs` (views, the peer poll,
//! announcements, `getHostInfo`), `routing.rs` (routing decisions) and `routed_dequeue.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use futures::future::BoxFuture;

use super::api::{
    AckRequestItem, ActiveTopicsPage, EnqueueOutcome, EnqueueRequestItem, NackRequestItem,
    OutcomeAsk, ShardOutcome, TouchRequestItem,
};
use crate::error::Result;
use crate::model::{
    ClusterView, Head, Item, Progress, ReadyTopic, ShardId, ShardStatus, TopicName, TopicSnapshot,
};
use crate::quota::{QuotaBudget, Quotas};

/// Most topics a host lists in its ready summary (the fullest first).
pub const READY_TOPICS_MAX: usize = 10_000;
/// A peer's topics with ready items.
pub(super) type ReadyTopics = HashMap<TopicName, PeerTopic>;

/// What this host knows of a topic's ready items on a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PeerTopic {
    /// How many (as last said: dequeues since are not subtracted).
    pub ready: i64,
    /// No ready item there was more urgent than this when the peer last said so (a poll,
    /// an announcement) or an answer showed it; `None`: they may be anything. A peer
    /// announces a topic once per poll interval, so a more urgent item that came since is
    /// known at its next poll.
    pub head: Option<Head>,
    /// The keys of its most urgent ready items there, as last said (see
    /// `model::ReadyTopic::heads`), less those a routed dequeue took since.
    pub heads: Vec<Head>,
    /// Which poll or announcement said so (one counter for both, `announcements`).
    pub seq: u64,
}

impl PeerTopic {
    /// Takes in an announcement (or one newer than a poll): items became ready there,
    /// so its head can only have moved forward (or be unknown, if the announcement did
    /// not know it).
    pub(super) fn merge_announced(&mut self, said: &PeerTopic) {
        self.ready = self.ready.max(said.ready);
        self.head = match (self.head, said.head) {
            (Some(a), Some(b)) => Some(a.min(b)),
            _ => None,
        };
        // The announced keys are the peer's whole list as it stood then: newer than any.
        self.heads = if self.head.is_some() {
            said.heads.clone()
        } else {
            Vec::new()
        };
        self.seq = self.seq.max(said.seq);
    }
}

/// Who a forwarded per-item call comes from: this host (`forwarded_by`) and the identity
/// of the client it acts for (`forwarded_for`), which the owner of the items checks
/// against their namespaces.
#[derive(Debug, Clone, Copy)]
pub struct Forwarded<'a> {
    pub by: &'a str,
    pub for_identity: Option<&'a str>,
}

/// What a peer says of itself when polled.
#[derive(Debug, Clone, Default)]
pub struct PeerSummary {
    pub spare: i64,
    /// Its shards mark forwarded requests' items (`HostInfo.forward_marks`).
    pub forward_marks: bool,
    /// Topics with ready items on its shards, how many, and their heads there.
    pub ready: Vec<ReadyTopic>,
    /// Its shards and what each is doing (for operators: the console).
    pub shards: Vec<ShardStatus>,
    /// Its wall clock when it answered (absent from older builds).
    pub now_ms: Option<i64>,
}

/// A dead item and when it died.
pub type DeadItem = (Item, i64);

/// Calls to another host. Calls that change state carry this host's id as `forwarded_by`,
/// so the peer serves them or fails them, and never forwards them again; calls routed for
/// a whole tier ask the peer for its own shards only (`local_only`).
pub trait Peers: Send + Sync {
    /// `token`: drawn by this host for the request (see `enqueue_doubt`).
    fn enqueue<'a>(
        &'a self,
        addr: &'a str,
        items: Vec<EnqueueRequestItem>,
        from: &'a str,
        token: i64,
        acting: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<EnqueueOutcome>>>;
    fn ack<'a>(
        &'a self,
        addr: &'a str,
        items: Vec<AckRequestItem>,
        from: Forwarded<'a>,
    ) -> BoxFuture<'a, Result<Vec<Result<()>>>>;
    /// `token`: the nack's (see `Host::nack`).
    fn nack<'a>(
        &'a self,
        addr: &'a str,
        items: Vec<NackRequestItem>,
        from: Forwarded<'a>,
        token: i64,
    ) -> BoxFuture<'a, Result<Vec<Result<()>>>>;
    fn touch<'a>(
        &'a self,
        addr: &'a str,
        items: Vec<TouchRequestItem>,
        from: Forwarded<'a>,
    ) -> BoxFuture<'a, Result<Vec<Result<()>>>>;
    /// `token`: the requeue's (see `Host::dlq_requeue`).
    fn dlq_requeue<'a>(
        &'a self,
        addr: &'a str,
        ids: Vec<String>,
        from: Forwarded<'a>,
        token: i64,
    ) -> BoxFuture<'a, Result<Vec<Result<()>>>>;
    /// Up to `count` ready items of `topic` from the peer's own shards; with `before`, only
    /// items more urgent than it.
    fn dequeue<'a>(
        &'a self,
        addr: &'a str,
        topic: &'a TopicName,
        count: usize,
        before: Option<Head>,
        from: &'a str,
        acting: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Item>>>;
    fn peek<'a>(
        &'a self,
        addr: &'a str,
        topic: &'a TopicName,
        count: i32,
        acting: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Item>>>;
    /// The peer's counts and totals of a topic, and its oldest ready item's age.
    fn topic_stats<'a>(
        &'a self,
        addr: &'a str,
        topic: &'a TopicName,
        acting: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(TopicSnapshot, i64)>>;
    fn dlq_list<'a>(
        &'a self,
        addr: &'a str,
        topic: &'a TopicName,
        limit: i32,
        after: Option<String>,
        acting: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(Vec<DeadItem>, Option<String>)>>;
    fn dlq_requeue_all<'a>(
        &'a self,
        addr: &'a str,
        topic: &'a TopicName,
        max: Option<i64>,
        acting: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Progress>>;
    fn dlq_purge<'a>(
        &'a self,
        addr: &'a str,
        topic: &'a TopicName,
        acting: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Progress>>;
    /// The peer's own topics only (`local_only`).
    fn active_topics<'a>(
        &'a self,
        addr: &'a str,
        ns: &'a str,
        limit: i32,
        after: Option<String>,
        acting: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ActiveTopicsPage>>;
    /// Its spare capacity and ready topics (`getHostInfo`).
    fn poll<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<PeerSummary>>;
    /// Tells the peer that this host (`from`) now has ready items of `topics`.
    fn notify_ready<'a>(
        &'a self,
        addr: &'a str,
        from: &'a str,
        topics: Vec<ReadyTopic>,
    ) -> BoxFuture<'a, Result<()>>;
    /// What became of an enqueue whose answer was lost, asked of the peer's `shards`
    /// (see `enqueue_doubt`).
    fn enqueue_outcome<'a>(
        &'a self,
        addr: &'a str,
        shards: Vec<ShardId>,
        ask: OutcomeAsk,
    ) -> BoxFuture<'a, Result<Vec<ShardOutcome>>>;
}

/// The peers of a host that has none (a test's or a fuzzer's host, see
/// `Host::detached`): every call fails, retryably, as to a peer that cannot be reached.
pub struct NoPeers;

fn no_peer<'a, T: Send + 'a>(addr: &str) -> BoxFuture<'a, Result<T>> {
    let e = crate::error::Error::unavailable(format!("no peer {addr}: this host has none"));
    Box::pin(async move { Err(e) })
}

impl Peers for NoPeers {
    fn enqueue<'a>(
        &'a self,
        addr: &'a str,
        _: Vec<EnqueueRequestItem>,
        _: &'a str,
        _: i64,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<EnqueueOutcome>>> {
        no_peer(addr)
    }
    fn ack<'a>(
        &'a self,
        addr: &'a str,
        _: Vec<AckRequestItem>,
        _: Forwarded<'a>,
    ) -> BoxFuture<'a, Result<Vec<Result<()>>>> {
        no_peer(addr)
    }
    fn nack<'a>(
        &'a self,
        addr: &'a str,
        _: Vec<NackRequestItem>,
        _: Forwarded<'a>,
        _: i64,
    ) -> BoxFuture<'a, Result<Vec<Result<()>>>> {
        no_peer(addr)
    }
    fn touch<'a>(
        &'a self,
        addr: &'a str,
        _: Vec<TouchRequestItem>,
        _: Forwarded<'a>,
    ) -> BoxFuture<'a, Result<Vec<Result<()>>>> {
        no_peer(addr)
    }
    fn dlq_requeue<'a>(
        &'a self,
        addr: &'a str,
        _: Vec<String>,
        _: Forwarded<'a>,
        _: i64,
    ) -> BoxFuture<'a, Result<Vec<Result<()>>>> {
        no_peer(addr)
    }
    fn dequeue<'a>(
        &'a self,
        addr: &'a str,
        _: &'a TopicName,
        _: usize,
        _: Option<Head>,
        _: &'a str,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Item>>> {
        no_peer(addr)
    }
    fn peek<'a>(
        &'a self,
        addr: &'a str,
        _: &'a TopicName,
        _: i32,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Item>>> {
        no_peer(addr)
    }
    fn topic_stats<'a>(
        &'a self,
        addr: &'a str,
        _: &'a TopicName,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(TopicSnapshot, i64)>> {
        no_peer(addr)
    }
    fn dlq_list<'a>(
        &'a self,
        addr: &'a str,
        _: &'a TopicName,
        _: i32,
        _: Option<String>,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(Vec<DeadItem>, Option<String>)>> {
        no_peer(addr)
    }
    fn dlq_requeue_all<'a>(
        &'a self,
        addr: &'a str,
        _: &'a TopicName,
        _: Option<i64>,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Progress>> {
        no_peer(addr)
    }
    fn dlq_purge<'a>(
        &'a self,
        addr: &'a str,
        _: &'a TopicName,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Progress>> {
        no_peer(addr)
    }
    fn active_topics<'a>(
        &'a self,
        addr: &'a str,
        _: &'a str,
        _: i32,
        _: Option<String>,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ActiveTopicsPage>> {
        no_peer(addr)
    }
    fn poll<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<PeerSummary>> {
        no_peer(addr)
    }
    fn notify_ready<'a>(
        &'a self,
        addr: &'a str,
        _: &'a str,
        _: Vec<ReadyTopic>,
    ) -> BoxFuture<'a, Result<()>> {
        no_peer(addr)
    }
    fn enqueue_outcome<'a>(
        &'a self,
        addr: &'a str,
        _: Vec<ShardId>,
        _: OutcomeAsk,
    ) -> BoxFuture<'a, Result<Vec<ShardOutcome>>> {
        no_peer(addr)
    }
}

/// What a host knows of itself in the cluster.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    pub host_id: String,
    /// "host:port" peers and redirected clients use.
    pub addr: String,
    pub tier: String,
    /// "single", "static" or "etcd".
    pub manager: &'static str,
    /// A single host serves every tier: there is nobody to forward to.
    pub serves_all_tiers: bool,
    pub forwarding: bool,
    /// How long a forwarded ack whose outcome is in doubt (the peer went away after it
    /// was sent) is tried again before the reply: long enough for the shard to get a new
    /// owner, and that one to open it (etcd: `lease_ttl_ms` + 5 s).
    pub in_doubt_max: std::time::Duration,
    /// Every tier's shards, wherever they are served.
    pub tier_shards: BTreeMap<String, Vec<ShardId>>,
    /// How many hosts of each tier this host polls and announces to (`cluster.peer_fanout`,
    /// see `cluster::fanout`).
    pub peer_fanout: usize,
    /// This host's clock against its peers', from the polls (see `cluster::clock`).
    pub clock_check: Arc<crate::cluster::ClockCheck>,
}

/// A peer's load as this host last saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerLoad {
    pub reachable: bool,
    pub spare: i64,
}

/// Another host, for `getHostInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerStatus {
    pub host_id: String,
    pub addr: String,
    pub tier: String,
    pub shards: Vec<ShardId>,
    pub load: PeerLoad,
}

/// This host, for `getHostInfo`.
#[derive(Debug, Clone)]
pub struct HostStatus {
    pub host_id: String,
    pub addr: String,
    pub tier: String,
    pub manager: &'static str,
    pub shards: Vec<ShardStatus>,
    pub spare: i64,
    pub peers: Vec<PeerStatus>,
    /// Topics with ready items on this host's shards (at most `READY_TOPICS_MAX`).
    pub ready_topics: Vec<ReadyTopic>,
    /// This host's wall clock when it answered.
    pub now_ms: i64,
}

pub struct ClusterState {
    pub(super) settings: ClusterSettings,
    pub(super) view: RwLock<Arc<ClusterView>>,
    pub(super) peers: Arc<dyn Peers>,
    pub(super) loads: Mutex<HashMap<String, PeerLoad>>,
    /// The peers (host ids) whose last answered poll said their shards mark forwarded
    /// requests' items (`HostInfo.forward_marks`); kept while a peer is unreachable, which
    /// is when it matters (see `enqueue_doubt`).
    pub(super) marks_forwards: Mutex<std::collections::HashSet<String>>,
    /// Each peer's shards as its last poll answered (none while unreachable).
    pub(super) shard_states: Mutex<HashMap<String, Vec<ShardStatus>>>,
    /// Per peer (host id): its topics with ready items and how many, from its last poll
    /// and its announcements since; each with the sequence number of the poll or
    /// announcement that set it, so a poll answered after an announcement keeps it.
    pub(super) ready: Mutex<HashMap<String, ReadyTopics>>,
    pub(super) announcements: std::sync::atomic::AtomicU64,
    pub(super) quotas: Quotas,
    /// The rings of the view they were drawn from, with the hosts that poll this one.
    fanout: Mutex<Option<Fanout>>,
}

/// Whom a host polls and announces to, for one view (see `cluster::fanout`).
struct Fanout {
    view: Arc<ClusterView>,
    polled: Arc<BTreeSet<String>>,
    pollers: Arc<BTreeSet<String>>,
}

impl ClusterState {
    pub(super) fn new(
        settings: ClusterSettings,
        peers: Arc<dyn Peers>,
        budget: Arc<dyn QuotaBudget>,
    ) -> ClusterState {
        ClusterState {
            settings,
            view: RwLock::new(Arc::new(ClusterView::default())),
            peers,
            loads: Mutex::new(HashMap::new()),
            marks_forwards: Mutex::new(Default::default()),
            shard_states: Mutex::new(HashMap::new()),
            ready: Mutex::new(HashMap::new()),
            announcements: std::sync::atomic::AtomicU64::new(0),
            quotas: Quotas::new(budget),
            fanout: Mutex::new(None),
        }
    }

    /// The peers this host polls (`polled`) and those that poll it (`pollers`, whom it
    /// announces its ready topics to), for the current view: drawn again when it changes.
    pub(super) fn fanout(&self) -> (Arc<BTreeSet<String>>, Arc<BTreeSet<String>>) {
        let view = self.view();
        let mut f = self.fanout.lock().expect("not poisoned");
        match &*f {
            Some(known) if Arc::ptr_eq(&known.view, &view) => {
                (known.polled.clone(), known.pollers.clone())
            }
            _ => {
                let rings = crate::cluster::Rings::new(&view.hosts);
                let (me, k) = (&self.settings.host_id, self.settings.peer_fanout);
                let polled = Arc::new(rings.polled(me, k));
                let pollers = Arc::new(rings.pollers(me, k));
                *f = Some(Fanout {
                    view,
                    polled: polled.clone(),
                    pollers: pollers.clone(),
                });
                (polled, pollers)
            }
        }
    }

    pub(super) fn view(&self) -> Arc<ClusterView> {
        self.view.read().expect("not poisoned").clone()
    }

    pub(super) fn serves_tier(&self, tier: &str) -> bool {
        self.settings.serves_all_tiers || tier == self.settings.tier
    }

    pub(super) fn tier_shards(&self, tier: &str) -> &[ShardId] {
        self.settings
            .tier_shards
            .get(tier)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The other hosts of `tier`: (host id, address).
    pub(super) fn tier_peers(&self, tier: &str) -> Vec<(String, String)> {
        let view = self.view();
        view.hosts
            .iter()
            .filter(|(id, h)| **id != self.settings.host_id && h.tier == tier)
            .map(|(id, h)| (id.clone(), h.addr.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(priority: i32) -> Option<Head> {
        Some(Head {
            priority,
            deliver_after_ms: 0,
        })
    }

    #[test]
    fn an_announcement_can_only_bring_the_head_forward_or_make_it_unknown() {
        let polled = PeerTopic {
            ready: 10,
            head: head(5),
            heads: head(5).into_iter().collect(),
            seq: 0,
        };
        let said = |h: Option<Head>, seq| PeerTopic {
            ready: 1,
            head: h,
            heads: h.into_iter().collect(),
            seq,
        };
        let mut k = polled;
        k.merge_announced(&said(head(7), 3));
        assert_eq!((k.ready, k.head, k.seq), (10, head(5), 3));
        k.merge_announced(&said(head(2), 4));
        assert_eq!(k.head, head(2));
        k.merge_announced(&said(None, 5));
        assert_eq!(k.head, None, "an item of unknown urgency came");
        k.merge_announced(&said(head(1), 6));
        assert_eq!(k.head, None, "still unknown until a poll or an answer says");
    }
}
