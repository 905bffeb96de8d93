//! [`NsCounts`]: a shard's items by topic and state, kept in memory by its worker so that
//! metrics (by namespace), the routing summaries peers exchange (ready items by topic),
//! topicStats and getActiveTopics need no query. Counted once from the store when the shard opens, then moved by the
//! worker at every committed change.
//!
//! Ready and deferred items are one state in the store (ready, with `deliver_after_ms`
//! perhaps in the future), so they are kept together, bucketed by the second of their
//! `deliver_after_ms`: at any `now`, the buckets whose earliest item is due are ready (the
//! oldest one gives the oldest ready item's age) and the later ones deferred, with no scan needed when a
//! deferred item comes due. Memory: one bucket per distinct second among a topic's
//! waiting items.
//!
//! After a storage error whose outcome is unknown the counts may drift by the items
//! involved, until the outcome has settled and the worker re-reads the topic's counts from
//! the store ([`NsCounts::recount`], see `doubt.rs`).
//!
//! Lock order: the shard's counts lock is taken alone, never across an `.await`.

use std::collections::{BTreeMap, HashMap};

use crate::model::{ItemState, TopicName};
use crate::store::StateCount;

#[derive(Debug, Default, Clone)]
struct Counts {
    leased: i64,
    dead: i64,
    /// Second of `deliver_after_ms` → items in state ready (ready or deferred).
    waiting: BTreeMap<i64, Bucket>,
}

/// The items of one second of `deliver_after_ms`, with bounds of their milliseconds: a
/// second is ready once its earliest item is due, so that an item nacked for 500 ms does
/// not count as ready in the same second. The bounds only widen while the second has
/// items (a removal cannot tell whether it took the earliest), so a second holding items
/// on both sides of now counts as ready a little early.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    n: i64,
    min_ms: i64,
}

impl Bucket {
    fn is_ready(&self, now_ms: i64) -> bool {
        self.min_ms <= now_ms
    }
}

/// One namespace's items on a shard at a moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NsSnapshot {
    pub ready: i64,
    pub deferred: i64,
    pub leased: i64,
    pub dead: i64,
    /// The earliest `deliver_after_ms` among ready items (a bound: see [`Bucket`]).
    pub oldest_ready_ms: Option<i64>,
}

impl NsSnapshot {
    pub fn add(&mut self, o: &NsSnapshot) {
        self.ready += o.ready;
        self.deferred += o.deferred;
        self.leased += o.leased;
        self.dead += o.dead;
        self.oldest_ready_ms = match (self.oldest_ready_ms, o.oldest_ready_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

impl Counts {
    fn total(&self) -> i64 {
        self.leased + self.dead + self.waiting.values().map(|b| b.n).sum::<i64>()
    }

    fn snapshot(&self, now_ms: i64) -> NsSnapshot {
        let mut s = NsSnapshot {
            leased: self.leased,
            dead: self.dead,
            ..Default::default()
        };
        for b in self.waiting.values() {
            if b.is_ready(now_ms) {
                s.ready += b.n;
                s.oldest_ready_ms.get_or_insert(b.min_ms);
            } else {
                s.deferred += b.n;
            }
        }
        s
    }

    fn has_ready(&self, now_ms: i64) -> bool {
        self.waiting
            .values()
            .next()
            .is_some_and(|b| b.is_ready(now_ms))
    }
}

#[derive(Debug, Default)]
pub struct NsCounts {
    /// Namespace → topic → counts; nested so that a change to a known topic allocates
    /// nothing (it runs for every item the worker writes). Topics in name order, so that a
    /// page of getActiveTopics is a range, not a sort of every topic under the lock the
    /// worker takes at every commit.
    by_ns: HashMap<String, BTreeMap<String, Counts>>,
    /// Topics that came to hold nothing since the worker last took them (see
    /// `forget.rs`): namespace → topics, each once however often it emptied.
    emptied: HashMap<String, std::collections::HashSet<String>>,
}

impl NsCounts {
    /// `delta` items of topic (`ns`, `topic`) enter (> 0) or leave (< 0) `state`;
    /// `deliver_after_ms` matters for the ready state only.
    pub fn add(
        &mut self,
        ns: &str,
        topic: &str,
        state: ItemState,
        deliver_after_ms: i64,
        delta: i64,
    ) {
        if delta == 0 {
            return;
        }
        if !self.by_ns.contains_key(ns) {
            self.by_ns.insert(ns.to_string(), BTreeMap::new());
        }
        let topics = self.by_ns.get_mut(ns).expect("just ensured");
        if !topics.contains_key(topic) {
            topics.insert(topic.to_string(), Counts::default());
        }
        let c = topics.get_mut(topic).expect("just ensured");
        match state {
            ItemState::Leased => c.leased += delta,
            ItemState::Dead => c.dead += delta,
            ItemState::Ready => {
                let sec = deliver_after_ms.div_euclid(1000);
                let b = c.waiting.entry(sec).or_insert(Bucket {
                    n: 0,
                    min_ms: deliver_after_ms,
                });
                b.n += delta;
                if delta > 0 {
                    b.min_ms = b.min_ms.min(deliver_after_ms);
                }
                if b.n == 0 {
                    c.waiting.remove(&sec);
                }
            }
        }
        if c.leased == 0 && c.dead == 0 && c.waiting.is_empty() {
            topics.remove(topic);
            if topics.is_empty() {
                self.by_ns.remove(ns);
            }
            self.note_emptied(ns, topic);
        }
    }

    fn note_emptied(&mut self, ns: &str, topic: &str) {
        // No allocation for a topic already noted: a busy topic of one item at a time
        // empties at every delivery.
        match self.emptied.get_mut(ns) {
            Some(topics) if topics.contains(topic) => {}
            Some(topics) => {
                topics.insert(topic.to_string());
            }
            None => {
                self.emptied
                    .insert(ns.to_string(), [topic.to_string()].into_iter().collect());
            }
        }
    }

    /// The topics that came to hold nothing since the last call (some may hold items
    /// again by now).
    pub fn take_emptied(&mut self) -> Vec<TopicName> {
        std::mem::take(&mut self.emptied)
            .into_iter()
            .flat_map(|(ns, topics)| {
                topics.into_iter().map(move |topic| TopicName {
                    ns: ns.clone(),
                    topic,
                })
            })
            .collect()
    }

    /// Replaces what is counted of `topic` (every topic: `None`) by `rows`, as read from
    /// the store (see `ShardStore::state_counts`); returns how many items that adds (< 0:
    /// removes) to the shard's total.
    pub fn recount(&mut self, topic: Option<&TopicName>, rows: Vec<StateCount>) -> i64 {
        let before = match topic {
            None => {
                let all = self.total();
                self.by_ns.clear();
                all
            }
            Some(t) => {
                let gone = self
                    .by_ns
                    .get_mut(&t.ns)
                    .and_then(|topics| topics.remove(&t.topic));
                if self.by_ns.get(&t.ns).is_some_and(|m| m.is_empty()) {
                    self.by_ns.remove(&t.ns);
                }
                if gone.is_some() {
                    self.note_emptied(&t.ns, &t.topic);
                }
                gone.map_or(0, |c| c.total())
            }
        };
        let mut after = 0;
        for (ns, name, state, sec, n) in rows {
            if topic.is_some_and(|t| t.ns != ns || t.topic != name) {
                continue;
            }
            self.add(&ns, &name, state, sec * 1000, n);
            after += n;
        }
        after - before
    }

    fn total(&self) -> i64 {
        self.by_ns
            .values()
            .flat_map(|topics| topics.values())
            .map(Counts::total)
            .sum()
    }

    /// Moves one item of a topic between states (added first, so that a topic of one
    /// item does not pass through empty).
    pub fn moved(&mut self, ns: &str, topic: &str, from: (ItemState, i64), to: (ItemState, i64)) {
        self.add(ns, topic, to.0, to.1, 1);
        self.add(ns, topic, from.0, from.1, -1);
    }

    /// One topic's counts at `now_ms` (its oldest ready item: see [`Bucket`]).
    pub fn topic(&self, ns: &str, topic: &str, now_ms: i64) -> NsSnapshot {
        self.by_ns
            .get(ns)
            .and_then(|topics| topics.get(topic))
            .map(|c| c.snapshot(now_ms))
            .unwrap_or_default()
    }

    /// The topics of `ns` after `after` (by name) with ready, deferred or leased items,
    /// at most `limit`, in name order: `getActiveTopics` from memory, no query.
    pub fn active(
        &self,
        ns: &str,
        after: Option<&str>,
        limit: usize,
        now_ms: i64,
    ) -> Vec<crate::model::TopicCounts> {
        use std::ops::Bound;
        let Some(topics) = self.by_ns.get(ns) else {
            return Vec::new();
        };
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        topics
            .range::<str, _>((from, Bound::Unbounded))
            .filter(|(_, c)| c.leased > 0 || !c.waiting.is_empty())
            .take(limit)
            .map(|(name, c)| {
                let s = c.snapshot(now_ms);
                crate::model::TopicCounts {
                    topic: name.clone(),
                    ready: s.ready,
                    deferred: s.deferred,
                    leased: s.leased,
                    hosts: Vec::new(),
                }
            })
            .collect()
    }

    /// Every namespace's counts at `now_ms`.
    pub fn snapshot(&self, now_ms: i64) -> Vec<(String, NsSnapshot)> {
        self.by_ns
            .iter()
            .map(|(ns, topics)| {
                let mut s = NsSnapshot::default();
                for c in topics.values() {
                    s.add(&c.snapshot(now_ms));
                }
                (ns.clone(), s)
            })
            .collect()
    }

    /// One namespace's topics and their counts at `now_ms` (for the console's topic
    /// list: memory only, no query, whatever the number of topics).
    pub fn topics(&self, ns: &str, now_ms: i64) -> Vec<(String, NsSnapshot)> {
        self.by_ns.get(ns).map_or_else(Vec::new, |topics| {
            topics
                .iter()
                .map(|(t, c)| (t.clone(), c.snapshot(now_ms)))
                .filter(|(_, s)| s.ready + s.deferred + s.leased + s.dead > 0)
                .collect()
        })
    }

    /// Whether a topic has ready items at `now_ms` (see [`Bucket`]).
    pub fn has_ready(&self, ns: &str, topic: &str, now_ms: i64) -> bool {
        self.by_ns
            .get(ns)
            .and_then(|topics| topics.get(topic))
            .is_some_and(|c| c.has_ready(now_ms))
    }

    /// Whether `topic` of `ns` has items here, and how many topics of `ns` do.
    pub fn topics_of(&self, ns: &str, topic: &str) -> (bool, usize) {
        self.by_ns
            .get(ns)
            .map_or((false, 0), |t| (t.contains_key(topic), t.len()))
    }

    /// How many items of one topic are dead.
    pub fn dead_of(&self, ns: &str, topic: &str) -> i64 {
        self.by_ns
            .get(ns)
            .and_then(|topics| topics.get(topic))
            .map_or(0, |c| c.dead)
    }

    /// How many items of one topic are ready at `now_ms`.
    pub fn ready_of(&self, ns: &str, topic: &str, now_ms: i64) -> i64 {
        self.by_ns
            .get(ns)
            .and_then(|topics| topics.get(topic))
            .map_or(0, |c| c.snapshot(now_ms).ready)
    }

    /// How many items of a topic are ready at `now_ms`, counted up to `limit`: for every
    /// dequeue (see `TopicIndex::misses_items`), so it stops at the limit and at the
    /// first second after now, whatever the backlog.
    pub fn ready_upto(&self, ns: &str, topic: &str, now_ms: i64, limit: i64) -> i64 {
        let Some(c) = self.by_ns.get(ns).and_then(|topics| topics.get(topic)) else {
            return 0;
        };
        let now_sec = now_ms.div_euclid(1000);
        let mut n = 0;
        for (sec, b) in &c.waiting {
            if *sec > now_sec || n >= limit {
                break;
            }
            if b.is_ready(now_ms) {
                n += b.n;
            }
        }
        n.min(limit)
    }

    /// Topics with ready items at `now_ms` and how many: (ns, topic, ready).
    pub fn ready_topics(&self, now_ms: i64) -> Vec<(String, String, i64)> {
        self.by_ns
            .iter()
            .flat_map(|(ns, topics)| topics.iter().map(move |(t, c)| (ns, t, c)))
            .filter(|(_, _, c)| c.has_ready(now_ms))
            .map(|(ns, t, c)| (ns.clone(), t.clone(), c.snapshot(now_ms).ready))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_items_are_ready_or_deferred_by_the_clock() {
        let mut c = NsCounts::default();
        c.add("a", "t", ItemState::Ready, 5_000, 2);
        c.add("a", "u", ItemState::Ready, 9_500, 1);
        c.add("a", "t", ItemState::Ready, 60_000, 1);
        c.moved("a", "t", (ItemState::Ready, 5_000), (ItemState::Leased, 0));
        c.add("b", "t", ItemState::Dead, 0, 1);
        let snap: HashMap<String, NsSnapshot> = c.snapshot(10_000).into_iter().collect();
        assert_eq!(
            snap["a"],
            NsSnapshot {
                ready: 2,
                deferred: 1,
                leased: 1,
                dead: 0,
                oldest_ready_ms: Some(5_000)
            }
        );
        assert_eq!(snap["b"].dead, 1);
        // Later, the deferred one is ready too, with no event at all.
        let later: HashMap<String, NsSnapshot> = c.snapshot(60_000).into_iter().collect();
        assert_eq!((later["a"].ready, later["a"].deferred), (3, 0));
        // A namespace with nothing left disappears.
        c.add("b", "t", ItemState::Dead, 0, -1);
        assert!(c.snapshot(0).iter().all(|(ns, _)| ns != "b"));
        // Topics with ready items, for the routing summaries.
        let mut ready = c.ready_topics(10_000);
        ready.sort();
        assert_eq!(
            ready,
            vec![("a".into(), "t".into(), 1), ("a".into(), "u".into(), 1)]
        );
    }

    #[test]
    fn ready_counts_stop_at_the_limit_and_at_now() {
        let mut c = NsCounts::default();
        for sec in 0..100 {
            c.add("a", "t", ItemState::Ready, sec * 1000, 3);
        }
        c.add("a", "t", ItemState::Ready, 500_000, 7);
        assert_eq!(c.ready_upto("a", "t", 99_999, 1_000), 300);
        assert_eq!(c.ready_upto("a", "t", 99_999, 10), 10);
        assert_eq!(c.ready_upto("a", "t", 1_000_000, 1_000), 307);
        assert_eq!(c.ready_upto("a", "nope", 1_000_000, 1_000), 0);
    }

    #[test]
    fn an_item_due_later_in_this_second_is_deferred_until_it_is_due() {
        let mut c = NsCounts::default();
        c.add("a", "t", ItemState::Ready, 10_500, 1);
        assert_eq!(c.topic("a", "t", 10_100).deferred, 1);
        assert!(!c.has_ready("a", "t", 10_100));
        assert_eq!(c.topic("a", "t", 10_500).ready, 1);
        // An earlier one in the same second makes the second ready.
        c.add("a", "t", ItemState::Ready, 10_050, 1);
        let s = c.topic("a", "t", 10_100);
        assert_eq!((s.ready, s.oldest_ready_ms), (2, Some(10_050)));
    }
}
