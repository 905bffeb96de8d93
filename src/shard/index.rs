//! The per-shard ready index: for each topic, the keys of its most urgent ready items, in
//! memory and bounded, so `foqsd` memory does not grow with the backlog.
//!
//! Invariant (per topic): the index holds exactly the ready items whose key is at or below
//! the watermark. Items above it live only in MySQL and are read, in key order, by a refill
//! when the index runs low. Keeping the invariant is what lets the index be partial:
//! - a new ready item at or below the watermark is inserted; above it, MySQL has it;
//! - when an insert overflows the bound, the largest key is dropped and the watermark
//!   moves down to the new largest key;
//! - a refill reads keys strictly above the watermark and raises it to the last key read,
//!   or to "everything" when MySQL returned fewer than asked.
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
}

impl TopicIndex {
    fn new() -> Self {
        TopicIndex {
            keys: BTreeSet::new(),
            watermark: Watermark::Unloaded,
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

    /// True when MySQL may hold ready items that the index does not.
    pub fn is_partial(&self) -> bool {
        self.watermark != Watermark::All
    }

    /// Where a refill starts: strictly after this key (`None`: from the beginning).
    pub fn refill_after(&self) -> Option<ReadyKey> {
        match self.watermark {
            Watermark::Upto(w) => Some(w),
            _ => None,
        }
    }

    /// Records the result of a refill that asked MySQL for `asked` keys after
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

    /// The `n` most urgent keys.
    pub fn head(&self, n: usize) -> Vec<ReadyKey> {
        self.keys.iter().take(n).copied().collect()
    }
}

/// All topics of one shard.
#[derive(Debug)]
pub struct ReadyIndex {
    topics: HashMap<TopicName, TopicIndex>,
    cap: usize,
}

impl ReadyIndex {
    pub fn new(keys_per_topic_max: usize) -> Self {
        ReadyIndex {
            topics: HashMap::new(),
            cap: keys_per_topic_max,
        }
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    pub fn topic(&mut self, t: &TopicName) -> &mut TopicIndex {
        if !self.topics.contains_key(t) {
            self.topics.insert(t.clone(), TopicIndex::new());
        }
        self.topics.get_mut(t).expect("just inserted")
    }

    /// Offers a key to a topic that is loaded; an unloaded topic will read it from MySQL.
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

    /// Forgets what the index knows of a topic; the next use reloads it from MySQL. Used
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
        t.offer(k(7, 3), 10); // above the watermark: MySQL has it, a refill will read it
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
    fn refill_of_zero_when_asked_zero_keeps_watermark() {
        let mut t = TopicIndex::new();
        t.apply_refill(&[k(1, 1)], 1, 1);
        t.apply_refill(&[], 0, 1);
        assert_eq!(t.refill_after(), Some(k(1, 1)));
    }
}
