//! Forgetting topics that hold nothing: [`IdleTopics`] remembers since when each topic the
//! shard knows has held no item, and the worker has its store forget those idle for
//! `engine.topic_forget_after_ms` (rows, totals and ids: see `store::topics`;
//! `ShardWorker::forget_idle_topics` in `scans.rs`). Without it a
//! client making topics without end (one item each, acked) grew every shard's `topics`
//! table, its id map and the totals kept in memory for ever.

use std::collections::HashMap;

use super::NsCounts;
use crate::model::TopicName;

/// Topics forgotten per statement, at most: the rest wait for the next sweep.
const FORGET_PER_SWEEP_MAX: usize = 1000;
/// The longest pause between sweeps (shorter when the forget delay is short).
const SWEEP_EVERY_MS_MAX: i64 = 60_000;

#[derive(Debug, Default)]
pub(super) struct IdleTopics {
    /// Topic → when it was first seen holding nothing.
    since: HashMap<TopicName, i64>,
    last_sweep_ms: i64,
    /// `Doubts::noted` at the last sweep.
    doubts_noted: u64,
}

impl IdleTopics {
    /// Topics known at open (they have a row) that hold nothing then.
    pub(super) fn at_open<'a>(
        known: impl Iterator<Item = &'a TopicName>,
        counts: &NsCounts,
        now_ms: i64,
    ) -> IdleTopics {
        IdleTopics {
            since: known
                .filter(|t| !counts.topics_of(&t.ns, &t.topic).0)
                .map(|t| (t.clone(), now_ms))
                .collect(),
            last_sweep_ms: now_ms,
            doubts_noted: 0,
        }
    }

    /// Whether a sweep is due at `now_ms` (then it starts: the next one is a pause away).
    pub(super) fn sweep_due(&mut self, now_ms: i64, after_ms: i64) -> bool {
        if now_ms - self.last_sweep_ms < (after_ms / 4).clamp(1, SWEEP_EVERY_MS_MAX) {
            return false;
        }
        self.last_sweep_ms = now_ms;
        true
    }

    /// Topics that came to hold nothing (again): idle from `now_ms`. A topic that holds
    /// an item now and then, each consumed at once, is idle only since its last one.
    pub(super) fn emptied(&mut self, topics: Vec<TopicName>, now_ms: i64) {
        for t in topics {
            self.since.insert(t, now_ms);
        }
    }

    /// Whether a sweep may forget now, given the worker's doubts: not while a write's
    /// outcome is unknown, and after one (`noted` moved since the last sweep) every idle
    /// topic's wait starts again, so that a late commit of rows into a topic that looked
    /// idle cannot find its row forgotten.
    pub(super) fn may_forget(&mut self, in_doubt: bool, noted: u64, now_ms: i64) -> bool {
        if noted != self.doubts_noted {
            self.doubts_noted = noted;
            for since in self.since.values_mut() {
                *since = now_ms;
            }
            return false;
        }
        !in_doubt
    }

    /// The topics idle for `after_ms` at `now_ms`, at most [`FORGET_PER_SWEEP_MAX`], taken
    /// out (kept ones come back when they are emptied again). A topic `busy` says is not
    /// idle (it holds items again, or has totals to save) is dropped.
    pub(super) fn due(
        &mut self,
        now_ms: i64,
        after_ms: i64,
        busy: impl Fn(&TopicName) -> bool,
    ) -> Vec<TopicName> {
        self.since.retain(|t, _| !busy(t));
        let due: Vec<TopicName> = self
            .since
            .iter()
            .filter(|(_, since)| now_ms - **since >= after_ms)
            .map(|(t, _)| t.clone())
            .take(FORGET_PER_SWEEP_MAX)
            .collect();
        for t in &due {
            self.since.remove(t);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ItemState;

    fn name(topic: &str) -> TopicName {
        TopicName {
            ns: "a".into(),
            topic: topic.into(),
        }
    }

    #[test]
    fn a_topic_is_due_once_idle_long_enough_and_not_while_it_holds_items() {
        let mut counts = NsCounts::default();
        counts.add("a", "busy", ItemState::Ready, 0, 1);
        let known = [name("busy"), name("idle")];
        let mut idle = IdleTopics::at_open(known.iter(), &counts, 1_000);
        assert_eq!(idle.since.len(), 1);
        assert!(idle.due(1_500, 1_000, |_| false).is_empty());
        assert_eq!(idle.due(2_000, 1_000, |_| false), vec![name("idle")]);
        // Taken out: not due twice.
        assert!(idle.due(9_000, 1_000, |_| false).is_empty());
        // One that holds items again is dropped, not forgotten.
        idle.since.insert(name("back"), 0);
        assert!(idle.due(9_000, 1_000, |t| t.topic == "back").is_empty());
        assert!(idle.since.is_empty());
    }

    #[test]
    fn a_topic_used_now_and_then_is_idle_only_since_it_last_emptied() {
        let mut counts = NsCounts::default();
        // One item at a time, delivered and acked: it empties at the ack only.
        counts.add("a", "t", ItemState::Ready, 0, 1);
        counts.moved("a", "t", (ItemState::Ready, 0), (ItemState::Leased, 0));
        assert!(
            counts.take_emptied().is_empty(),
            "a delivery does not empty it"
        );
        counts.add("a", "t", ItemState::Leased, 0, -1);
        counts.add("a", "t", ItemState::Ready, 0, 1);
        counts.add("a", "t", ItemState::Ready, 0, -1);
        assert_eq!(counts.take_emptied(), vec![name("t")], "noted once");
        let mut idle = IdleTopics::default();
        idle.emptied(vec![name("t")], 1_000);
        idle.emptied(vec![name("t")], 5_000);
        assert!(idle.due(5_500, 1_000, |_| false).is_empty());
        assert_eq!(idle.due(6_000, 1_000, |_| false), vec![name("t")]);
    }

    #[test]
    fn a_write_in_doubt_restarts_every_idle_topics_wait() {
        let mut idle = IdleTopics::default();
        idle.emptied(vec![name("t")], 0);
        assert!(idle.may_forget(false, 0, 10_000));
        // A failure was noted since the last sweep (settled or not): no forgetting now,
        // and the wait starts again.
        assert!(!idle.may_forget(false, 1, 10_000));
        assert!(idle.due(10_500, 1_000, |_| false).is_empty());
        assert!(idle.may_forget(false, 1, 11_000));
        assert!(!idle.may_forget(true, 1, 11_000), "not while in doubt");
        assert_eq!(idle.due(11_000, 1_000, |_| false), vec![name("t")]);
    }
}
