//! What the web console shows of this host at a glance: items by namespace and by topic
//! on this host's shards, from the counts the shard workers keep in memory (no query, so
//! a page stays fast whatever the number of topics), corrected as `getActiveTopics` is for
//! the items the prefetch buffer holds (leased in storage, ready to clients).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::host::Host;
use crate::model::ClusterView;
use crate::shard::NsSnapshot;

/// One namespace on this host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NamespaceRow {
    pub ns: String,
    pub tier: String,
    pub ready: i64,
    pub deferred: i64,
    pub leased: i64,
    pub dead: i64,
    pub topics: usize,
    /// How long the oldest ready item has been ready (ms, to the second); 0 when none.
    pub oldest_ready_age_ms: i64,
}

/// One topic on this host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TopicRow {
    pub topic: String,
    pub ready: i64,
    pub deferred: i64,
    pub leased: i64,
    pub dead: i64,
    pub oldest_ready_age_ms: i64,
}

/// Moves staged items (leased in storage, handed to nobody) from leased to ready.
fn unstage(s: &mut NsSnapshot, staged: i64) {
    let n = staged.min(s.leased);
    s.leased -= n;
    s.ready += n;
}

impl Host {
    fn age(&self, s: &NsSnapshot) -> i64 {
        s.oldest_ready_ms
            .map_or(0, |t| (self.clock.now_ms() - t).max(0))
    }

    /// Every namespace with items on this host's shards, and every listed one, by name.
    pub fn namespace_rows(&self) -> Vec<NamespaceRow> {
        let now = self.clock.now_ms();
        let shards = self.shards();
        let mut by_ns: BTreeMap<String, NsSnapshot> = BTreeMap::new();
        for ns in self.namespaces.listed() {
            by_ns.entry(ns.to_string()).or_default();
        }
        let mut topics: HashMap<String, std::collections::HashSet<String>> = HashMap::new();
        for s in shards.values() {
            for (ns, snap) in s.ns_counts(now) {
                by_ns.entry(ns.clone()).or_default().add(&snap);
            }
        }
        for ns in by_ns.keys() {
            for s in shards.values() {
                for (t, _) in s.topic_table(ns, now) {
                    topics.entry(ns.clone()).or_default().insert(t);
                }
            }
        }
        let staged = self.prefetch.staged_topics(self.staged_live());
        let mut staged_by_ns: HashMap<String, i64> = HashMap::new();
        for r in staged {
            *staged_by_ns.entry(r.topic.ns).or_default() += r.ready;
        }
        by_ns
            .into_iter()
            .map(|(ns, mut s)| {
                unstage(&mut s, staged_by_ns.get(&ns).copied().unwrap_or(0));
                NamespaceRow {
                    tier: self.namespaces.tier(&ns).to_string(),
                    topics: topics.get(&ns).map_or(0, |t| t.len()),
                    ready: s.ready,
                    deferred: s.deferred,
                    leased: s.leased,
                    dead: s.dead,
                    oldest_ready_age_ms: self.age(&s),
                    ns,
                }
            })
            .collect()
    }

    /// A namespace's topics with items on this host's shards, by name.
    pub fn topic_rows(&self, ns: &str) -> Vec<TopicRow> {
        let now = self.clock.now_ms();
        let mut by_topic: BTreeMap<String, NsSnapshot> = BTreeMap::new();
        for s in self.shards().values() {
            for (t, snap) in s.topic_table(ns, now) {
                by_topic.entry(t).or_default().add(&snap);
            }
        }
        let staged = self.prefetch.staged_counts(ns, self.staged_live());
        by_topic
            .into_iter()
            .map(|(topic, mut s)| {
                unstage(&mut s, staged.get(&topic).copied().unwrap_or(0));
                TopicRow {
                    ready: s.ready,
                    deferred: s.deferred,
                    leased: s.leased,
                    dead: s.dead,
                    oldest_ready_age_ms: self.age(&s),
                    topic,
                }
            })
            .collect()
    }

    /// The cluster as this host sees it now (hosts, owners, primaries).
    pub fn cluster_view(&self) -> Arc<ClusterView> {
        self.cluster.view()
    }

    /// Whether `caller` may do `kind` calls in `ns` (the console shows only what its
    /// identity may read).
    pub fn allows(&self, caller: &super::Caller, ns: &str, kind: super::Kind) -> bool {
        self.allow(caller, ns, kind).is_ok()
    }

    /// `UNKNOWN_NAMESPACE` when namespaces are listed and `ns` is not one of them.
    pub fn check_namespace(&self, ns: &str) -> crate::error::Result<()> {
        self.namespace(ns).map(|_| ())
    }

    /// Every namespace's items on this host's shards (no topic list: the console's
    /// once-a-second sample).
    pub fn namespace_totals(&self) -> BTreeMap<String, NsSnapshot> {
        let now = self.clock.now_ms();
        let mut by_ns: BTreeMap<String, NsSnapshot> = BTreeMap::new();
        for s in self.shards().values() {
            for (ns, snap) in s.ns_counts(now) {
                by_ns.entry(ns).or_default().add(&snap);
            }
        }
        by_ns
    }

    /// The host's clock now (Unix ms).
    pub fn clock_ms(&self) -> i64 {
        self.clock.now_ms()
    }
}
