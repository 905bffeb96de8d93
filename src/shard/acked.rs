//! [`AckMemory`]: the items a shard's worker deleted for an ack lately, and under which
//! lease, so that a retried ack answers what the first one did.
//!
//! An ack whose reply was lost (a timeout, a dropped connection, a peer that forwarded it
//! and did not hear back) is retried by its client; the row is gone by then, and without
//! this the retry would answer `NOT_FOUND`: the client could not tell "done" from "never
//! existed". As SQS's DeleteMessage is idempotent per receipt handle, a retry within
//! `engine.ack_memory_ms` answers OK when it names the same lease (or none), and keeps
//! today's `NOT_FOUND` when it names another lease.
//!
//! Keys are never reused, so a key remembered here can only be this item. Bounded twice:
//! by age (`ack_memory_ms`) and by count (`ack_memory_items_max`, the oldest forgotten
//! first); about 40 bytes an entry. It lives in the worker, so it is lost when the shard
//! moves to another host or the host restarts: a retry after a move answers `NOT_FOUND`.

use std::collections::{HashMap, VecDeque};

/// What a remembered ack settled: the lease it deleted the item under, or `None` when
/// that is unknown (a DELETE whose outcome was unknown, for an ack that named no lease:
/// any lease id then matches).
type Lease = Option<i64>;

#[derive(Debug)]
pub struct AckMemory {
    memory_ms: i64,
    items_max: usize,
    keys: HashMap<u64, Lease>,
    /// (when remembered, key), oldest first.
    order: VecDeque<(i64, u64)>,
}

/// What a remembered ack says of a retry that names `lease_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recall {
    /// Not remembered (never acked here, or forgotten): today's answer.
    Unknown,
    /// Acked under this lease (or one the retry does not name): the retry is done.
    Same,
    /// Acked under another lease than the one the retry names.
    Other,
}

impl AckMemory {
    pub fn new(memory_ms: u64, items_max: usize) -> Self {
        AckMemory {
            memory_ms: memory_ms.min(i64::MAX as u64) as i64,
            items_max,
            keys: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// `key` was deleted by an ack (or may have been: `lease` None and a DELETE whose
    /// outcome is unknown) at `now_ms`.
    pub fn remember(&mut self, key: u64, lease: Lease, now_ms: i64) {
        if self.items_max == 0 || self.memory_ms == 0 {
            return;
        }
        self.forget_old(now_ms);
        match self.keys.get_mut(&key) {
            // Remembered already (a retry of a doubtful ack): a known lease replaces an
            // unknown one; the entry keeps its age.
            Some(l) => {
                if lease.is_some() {
                    *l = lease;
                }
            }
            None => {
                if self.keys.len() >= self.items_max {
                    self.pop_oldest();
                }
                self.keys.insert(key, lease);
                self.order.push_back((now_ms, key));
            }
        }
    }

    /// What the memory says of an ack of `key` naming `lease_id` (None: no lease named).
    pub fn recall(&mut self, key: u64, lease_id: Option<i64>, now_ms: i64) -> Recall {
        self.forget_old(now_ms);
        match (self.keys.get(&key), lease_id) {
            (None, _) => Recall::Unknown,
            (Some(_), None) | (Some(None), Some(_)) => Recall::Same,
            (Some(Some(acked)), Some(asked)) if *acked == asked => Recall::Same,
            (Some(Some(_)), Some(_)) => Recall::Other,
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn pop_oldest(&mut self) {
        if let Some((_, key)) = self.order.pop_front() {
            self.keys.remove(&key);
        }
    }

    fn forget_old(&mut self, now_ms: i64) {
        while let Some((at, _)) = self.order.front() {
            if at.saturating_add(self.memory_ms) > now_ms {
                break;
            }
            self.pop_oldest();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_naming_the_same_lease_or_none_is_done_another_lease_is_not() {
        let mut m = AckMemory::new(1000, 10);
        m.remember(7, Some(42), 0);
        assert_eq!(m.recall(7, Some(42), 10), Recall::Same);
        assert_eq!(m.recall(7, None, 10), Recall::Same);
        assert_eq!(m.recall(7, Some(41), 10), Recall::Other);
        assert_eq!(m.recall(8, None, 10), Recall::Unknown);
        // A doubtful ack that named no lease matches any lease id.
        m.remember(9, None, 0);
        assert_eq!(m.recall(9, Some(5), 10), Recall::Same);
        // ... until the lease becomes known.
        m.remember(9, Some(6), 20);
        assert_eq!(m.recall(9, Some(5), 30), Recall::Other);
    }

    #[test]
    fn entries_are_forgotten_after_memory_ms_and_past_items_max() {
        let mut m = AckMemory::new(1000, 3);
        m.remember(1, Some(1), 0);
        m.remember(2, Some(1), 500);
        assert_eq!(m.recall(1, None, 999), Recall::Same);
        assert_eq!(m.recall(1, None, 1000), Recall::Unknown, "aged out");
        assert_eq!(m.recall(2, None, 1000), Recall::Same);
        m.remember(3, None, 1000);
        m.remember(4, None, 1000);
        m.remember(5, None, 1000);
        assert_eq!(m.len(), 3, "bounded by items_max");
        assert_eq!(
            m.recall(2, None, 1000),
            Recall::Unknown,
            "the oldest went first"
        );
        assert_eq!(m.recall(5, None, 1000), Recall::Same);
    }

    #[test]
    fn zero_keeps_nothing() {
        let mut m = AckMemory::new(0, 10);
        m.remember(1, Some(1), 0);
        assert!(m.is_empty());
        let mut m = AckMemory::new(1000, 0);
        m.remember(1, Some(1), 0);
        assert_eq!(m.recall(1, None, 0), Recall::Unknown);
    }
}
