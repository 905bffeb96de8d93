//! The per-shard ready index: for each topic, the keys of its most urgent ready items, in
//! memory and bounded, so `foqsd` memory does not grow with the backlog.
//!
//! Invariant (per topic): the index holds exactly the ready items whose key is at or below
//! the watermark. Items above it live only in storage and are read, in key order, by a refill
//! when the index runs low. Keeping the invariant is what lets the index be partial:
//! - a new ready item at or below the watermark is inserted; above it, storage has it;
//! - when an insert overflows the bound, the largest key is dropped and the watermark
//!   moves down to the new largest key;
//! - a refill reads keys strictly above the watermark and raises it to the last key read,
//!   or to "everything" when storage returned fewer than asked.
//!
//! A topic never seen since start-up (or whose state is doubtful after a storage error) is
//! `Unloaded`: its watermark is below every key, so nothing is inserted until the first
//! refill reads from the start of the topic's range.

use std::collections::{BTreeSet, HashMap};

use crate::model::{ReadyKey, TopicName};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watermark {
    Unloaded,
    Upto(ReadyKey),
    All,
}

#[derive(Debug)]
pub struct TopicIndex {
    keys: BTreeSet<ReadyKey>,
    watermark: Watermark,
    /// When a dequeue last used this topic (a counter, not a time): for LRU eviction.
    last_used: u64,
    /// When it was last read again from the start because the counts said it missed
    /// ready items (see [`TopicIndex::misses_items`]).
    reloaded_ms: i64,
}

/// A topic is read again from the start at most this often on the counts' word: a second
/// of `deliver_after_ms` may count as ready a little early (see `counts::Bucket`).
const RELOAD_EVERY_MS: i64 = 1000;

impl TopicIndex {
    fn new() -> Self {
        TopicIndex {
            keys: BTreeSet::new(),
            watermark: Watermark::Unloaded,
            last_used: 0,
            reloaded_ms: i64::MIN,
        }
    }

    fn covers(&self, k: &ReadyKey) -> bool {
        match self.watermark {
            Watermark::Unloaded => false,
            Watermark::Upto(w) => *k <= w,
            Watermark::All => true,
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// True when storage may hold ready items that the index does not.
    pub fn is_partial(&self) -> bool {
        self.watermark != Watermark::All
    }

    /// Whether the topic, whole by its watermark, holds no key while the shard's counts
    /// have ready items (`counted_ready`): a ready row no event brought to the index. A
    /// host whose clock ran ahead writes an item as ready now, with no timer; once the
    /// shard moved to a host whose clock is behind, it comes due with nothing to say so.
    /// (Only when empty: while it holds keys, dequeues go on and drain it first; and a
    /// claim under way takes keys out before the counts move.)
    pub fn misses_items(&self, counted_ready: i64) -> bool {
        !self.is_partial() && self.keys.is_empty() && counted_ready > 0
    }

    /// Forgets what the topic holds, to be read again from the start, unless it was at
    /// most [`RELOAD_EVERY_MS`] ago; whether it did.
    pub fn reload(&mut self, now_ms: i64) -> bool {
        if now_ms.saturating_sub(self.reloaded_ms) < RELOAD_EVERY_MS {
            return false;
        }
        self.reloaded_ms = now_ms;
        self.keys.clear();
        self.watermark = Watermark::Unloaded;
        true
    }

    /// Where a refill starts: strictly after this key (`None`: from the beginning).
    pub fn refill_after(&self) -> Option<ReadyKey> {
        match self.watermark {
            Watermark::Upto(w) => Some(w),
            _ => None,
        }
    }

    /// Records the result of a refill that asked storage for `asked` keys after
    /// [`Self::refill_after`].
    pub fn apply_refill(&mut self, loaded: &[ReadyKey], asked: usize, cap: usize) {
        self.keys.extend(loaded.iter().copied());
        self.watermark = match loaded.last() {
            Some(last) if loaded.len() >= asked => Watermark::Upto(*last),
            _ if loaded.len() >= asked => self.watermark,
            _ => Watermark::All,
        };
        self.trim(cap);
    }

    /// A ready item came into being (enqueue, nack, lease expiry, deferred item due).
    pub fn offer(&mut self, k: ReadyKey, cap: usize) {
        if self.covers(&k) {
            self.keys.insert(k);
            self.trim(cap);
        }
    }

    fn trim(&mut self, cap: usize) {
        while self.keys.len() > cap {
            self.keys.pop_last();
            if let Some(last) = self.keys.last() {
                self.watermark = Watermark::Upto(*last);
            }
        }
    }

    pub fn remove(&mut self, k: &ReadyKey) -> bool {
        self.keys.remove(k)
    }

    /// No ready item of the topic is more urgent than this: its most urgent key, or when
    /// none is held but storage may have some, the watermark they all lie above. `None`
    /// while the topic is unloaded (it may hold anything) or has nothing ready.
    pub fn head_bound(&self) -> Option<ReadyKey> {
        match (self.keys.first(), self.watermark) {
            (Some(k), _) => Some(*k),
            (None, Watermark::Upto(w)) => Some(w),
            (None, _) => None,
        }
    }

    /// The `n` most urgent keys.
    pub fn head(&self, n: usize) -> Vec<ReadyKey> {
        self.keys.iter().take(n).copied().collect()
    }
}

/// All topics of one shard, at most `topics_max` of them: past that, the least recently
/// dequeued tenth is forgotten (unloaded), to be reloaded from storage when used again. So
/// memory is bounded by topics_max * keys_per_topic_max keys, however many topics exist.
#[derive(Debug)]
pub struct ReadyIndex {
    topics: HashMap<TopicName, TopicIndex>,
    cap: usize,
    topics_max: usize,
    uses: u64,
}

impl ReadyIndex {
    /// What it holds: (topics, keys over all topics).
    pub fn size(&self) -> (usize, usize) {
        (
            self.topics.len(),
            self.topics.values().map(TopicIndex::len).sum(),
        )
    }

    /// The keys of its fullest topic (0 when it holds none).
    pub fn largest_topic(&self) -> usize {
        self.topics.values().map(TopicIndex::len).max().unwrap_or(0)
    }

    pub fn new(keys_per_topic_max: usize, topics_max: usize) -> Self {
        ReadyIndex {
            topics: HashMap::new(),
            cap: keys_per_topic_max,
            topics_max: topics_max.max(1),
            uses: 0,
        }
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    pub fn topics(&self) -> usize {
        self.topics.len()
    }

    /// Whether another topic fits without evicting one.
    pub fn has_room(&self) -> bool {
        self.topics.len() < self.topics_max
    }

    /// Whether the topic's keys are known: it has been read since it was (re)loaded.
    pub fn is_loaded(&self, t: &TopicName) -> bool {
        self.topics
            .get(t)
            .is_some_and(|t| t.watermark != Watermark::Unloaded)
    }

    /// The topic's index if it has one, not marked as used: for readers beside the worker,
    /// which must not add topics (adding one may evict another, see `ShardHandle::peek`).
    pub fn get(&self, t: &TopicName) -> Option<&TopicIndex> {
        self.topics.get(t)
    }

    /// The topic's index, loaded or not, marked as just used. Only the shard's worker
    /// calls it: it may add the topic and evict others.
    pub fn topic(&mut self, t: &TopicName) -> &mut TopicIndex {
        if !self.topics.contains_key(t) {
            if self.topics.len() >= self.topics_max {
                self.evict();
            }
            self.topics.insert(t.clone(), TopicIndex::new());
        }
        self.uses += 1;
        let entry = self.topics.get_mut(t).expect("just inserted");
        entry.last_used = self.uses;
        entry
    }

    /// Forgets the least recently used tenth of the topics.
    fn evict(&mut self) {
        let n = (self.topics.len() / 10).max(1);
        let mut uses: Vec<u64> = self.topics.values().map(|t| t.last_used).collect();
        let (_, cutoff, _) = uses.select_nth_unstable(n - 1);
        let cutoff = *cutoff;
        let mut left = n;
        self.topics.retain(|_, t| {
            if left > 0 && t.last_used <= cutoff {
                left -= 1;
                false
            } else {
                true
            }
        });
    }

    /// Offers a key to a topic that is loaded; an unloaded topic will read it from storage.
    pub fn offer(&mut self, ns: &str, topic: &str, k: ReadyKey) {
        let cap = self.cap;
        if let Some(t) = self.get_mut(ns, topic) {
            t.offer(k, cap);
        }
    }

    pub fn remove(&mut self, ns: &str, topic: &str, k: &ReadyKey) {
        if let Some(t) = self.get_mut(ns, topic) {
            t.remove(k);
        }
    }

    /// Forgets what the index knows of a topic; the next use reloads it from storage. Used
    /// after a storage error, when the outcome of a write is unknown.
    pub fn invalidate(&mut self, ns: &str, topic: &str) {
        self.topics.remove(&TopicName {
            ns: ns.to_string(),
            topic: topic.to_string(),
        });
    }

    /// Forgets every topic (after a write whose outcome and rows are both unknown).
    pub fn clear(&mut self) {
        self.topics.clear();
    }

    fn get_mut(&mut self, ns: &str, topic: &str) -> Option<&mut TopicIndex> {
        // Topic names are short; building the key is cheaper than a second map layer.
        self.topics.get_mut(&TopicName {
            ns: ns.to_string(),
            topic: topic.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(priority: i32, key: u64) -> ReadyKey {
        ReadyKey {
            priority,
            deliver_after_ms: 0,
            key,
        }
    }

    #[test]
    fn the_head_bound_is_the_first_key_or_the_watermark_and_unknown_while_unloaded() {
        let mut t = TopicIndex::new();
        assert_eq!(t.head_bound(), None, "unloaded: anything may be ready");
        // A refill of 2 that filled what it asked for: more may be in storage above k(3).
        t.apply_refill(&[k(1, 1), k(3, 2)], 2, 10);
        assert_eq!(t.head_bound(), Some(k(1, 1)));
        assert!(t.remove(&k(1, 1)) && t.remove(&k(3, 2)));
        assert_eq!(
            t.head_bound(),
            Some(k(3, 2)),
            "none held: the watermark bounds them"
        );
        t.apply_refill(&[], 2, 10);
        assert_eq!(t.head_bound(), None, "all read and none left");
    }

    #[test]
    fn a_whole_topic_that_misses_ready_items_is_read_again_at_most_once_a_second() {
        let mut t = TopicIndex::new();
        // Unloaded: it may hold anything, so it misses nothing it knows of.
        assert!(!t.misses_items(5));
        t.apply_refill(&[k(1, 1)], 10, 10);
        assert!(!t.misses_items(1));
        assert!(
            !t.misses_items(2),
            "it holds keys: dequeues drain them first"
        );
        assert!(t.remove(&k(1, 1)));
        assert!(!t.misses_items(0));
        assert!(t.misses_items(1));
        assert!(t.reload(5_000));
        assert!(t.is_partial() && t.is_empty());
        t.apply_refill(&[k(1, 1)], 10, 10);
        assert!(!t.reload(5_999), "a second has not passed");
        assert!(t.reload(6_000));
    }

    #[test]
    fn unloaded_topic_ignores_offers_until_refilled() {
        let mut t = TopicIndex::new();
        t.offer(k(1, 1), 10);
        assert!(t.is_empty());
        assert!(t.is_partial());
        assert_eq!(t.refill_after(), None);
        t.apply_refill(&[k(1, 1), k(2, 2)], 10, 10);
        assert!(
            !t.is_partial(),
            "fewer than asked: the index holds everything"
        );
        t.offer(k(9, 3), 10);
        assert_eq!(t.head(5), vec![k(1, 1), k(2, 2), k(9, 3)]);
    }

    #[test]
    fn full_refill_sets_watermark_and_later_offers_above_it_stay_in_mysql() {
        let mut t = TopicIndex::new();
        t.apply_refill(&[k(1, 1), k(5, 2)], 2, 10);
        assert!(t.is_partial());
        assert_eq!(t.refill_after(), Some(k(5, 2)));
        t.offer(k(7, 3), 10); // above the watermark: storage has it, a refill will read it
        t.offer(k(3, 4), 10); // below: must be indexed, a refill would never read it
        assert_eq!(t.head(10), vec![k(1, 1), k(3, 4), k(5, 2)]);
    }

    #[test]
    fn overflow_drops_the_largest_and_lowers_the_watermark() {
        let mut t = TopicIndex::new();
        t.apply_refill(&[], 3, 3);
        for (p, key) in [(5, 1), (4, 2), (3, 3), (2, 4)] {
            t.offer(k(p, key), 3);
        }
        assert_eq!(t.head(10), vec![k(2, 4), k(3, 3), k(4, 2)]);
        assert_eq!(t.refill_after(), Some(k(4, 2)));
        // (5,1) was dropped: an offer equal to it must now be refused, a refill finds it.
        t.offer(k(5, 1), 3);
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn the_least_recently_used_topics_are_forgotten_past_the_bound() {
        let name = |i: usize| TopicName {
            ns: "n".into(),
            topic: format!("t{i}"),
        };
        let mut idx = ReadyIndex::new(10, 20);
        for i in 0..20 {
            idx.topic(&name(i)).apply_refill(&[k(1, i as u64)], 5, 10);
        }
        idx.topic(&name(0)); // t0 is used again: t1 is now the oldest
        idx.topic(&name(20));
        assert_eq!(idx.topics(), 19, "two forgotten (a tenth), one added");
        assert!(idx.topics.contains_key(&name(0)));
        assert!(!idx.topics.contains_key(&name(1)));
        assert!(!idx.topics.contains_key(&name(2)));
        // A forgotten topic comes back unloaded: offers are ignored until a refill.
        assert!(idx.topic(&name(1)).is_partial());
        assert_eq!(idx.topic(&name(1)).refill_after(), None);
    }

    #[test]
    fn refill_of_zero_when_asked_zero_keeps_watermark() {
        let mut t = TopicIndex::new();
        t.apply_refill(&[k(1, 1)], 1, 1);
        t.apply_refill(&[], 0, 1);
        assert_eq!(t.refill_after(), Some(k(1, 1)));
    }
}
