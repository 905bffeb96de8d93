//! [`Doubts`]: the topics of a shard whose last write failed with an outcome the worker
//! cannot know, until that outcome has surely settled.
//!
//! A write that timed out may still commit: MySQL goes on running a statement after its
//! client gave up (up to `max_statement_time`, which the MySQL store sets to the shard's
//! store timeout on every connection), and SQLite's thread finishes a job whose caller no
//! longer waits. The worker forgets such a topic's index at once, but a refill that runs
//! before the late commit reads the old rows, may find the topic empty and index it as
//! fully known; whatever the late commit made ready would then never be indexed. So the
//! topic stays in doubt for one more `window` (the longest a late commit can take), and
//! when that has passed the worker forgets its index again and re-counts it from storage:
//! the next refill, and the counts behind topicStats, getActiveTopics and the metrics, see
//! the write's real outcome.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::model::TopicName;

/// What has settled and must be re-read from storage.
#[derive(Debug, PartialEq, Eq)]
pub enum Settled {
    /// Every topic (a write whose rows are unknown).
    All,
    Topics(Vec<TopicName>),
}

#[derive(Debug)]
pub struct Doubts {
    window: Duration,
    topics: HashMap<TopicName, Instant>,
    /// Every topic is in doubt until then.
    all: Option<Instant>,
    /// The clock time (ms) of the earliest failure still in doubt.
    earliest_ms: Option<i64>,
    /// Failures with an unknown outcome ever noted (see `forget.rs`: one since the last
    /// sweep restarts every idle topic's wait).
    noted: u64,
}

impl Doubts {
    pub fn new(window: Duration) -> Doubts {
        Doubts {
            window,
            topics: HashMap::new(),
            all: None,
            earliest_ms: None,
            noted: 0,
        }
    }

    /// A write to `topic` failed with an unknown outcome at `now` (`now_ms` by the clock).
    pub fn topic(&mut self, topic: TopicName, now: Instant, now_ms: i64) {
        self.topics.insert(topic, now + self.window);
        self.note(now_ms);
    }

    /// A write whose rows are unknown failed at `now`: every topic is in doubt.
    pub fn everything(&mut self, now: Instant, now_ms: i64) {
        self.all = Some(now + self.window);
        self.topics.clear();
        self.note(now_ms);
    }

    fn note(&mut self, now_ms: i64) {
        self.earliest_ms = Some(self.earliest_ms.map_or(now_ms, |e| e.min(now_ms)));
        self.noted += 1;
    }

    /// How many failures with an unknown outcome were noted, ever.
    pub fn noted(&self) -> u64 {
        self.noted
    }

    /// The clock time of the earliest failure in doubt, up to the last settling: a late
    /// commit may have set timers from then on, which the background scan must read again.
    pub fn earliest_ms(&self) -> Option<i64> {
        self.earliest_ms
    }

    fn forget_earliest_when_clear(&mut self) {
        if self.topics.is_empty() && self.all.is_none() {
            self.earliest_ms = None;
        }
    }

    /// Takes out what has settled by `now`.
    pub fn settled(&mut self, now: Instant) -> Option<Settled> {
        if let Some(at) = self.all {
            if at <= now {
                self.all = None;
                self.forget_earliest_when_clear();
                return Some(Settled::All);
            }
            return None;
        }
        let due: Vec<TopicName> = self
            .topics
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(t, _)| t.clone())
            .collect();
        if due.is_empty() {
            return None;
        }
        for t in &due {
            self.topics.remove(t);
        }
        self.forget_earliest_when_clear();
        Some(Settled::Topics(due))
    }

    /// Re-reading `s` failed: try again at the next chance, from `earliest_ms` again.
    pub fn retry(&mut self, s: Settled, now: Instant, earliest_ms: Option<i64>) {
        if let Some(ms) = earliest_ms {
            self.note(ms);
        }
        match s {
            Settled::All => self.all = Some(self.all.map_or(now, |a| a.min(now))),
            Settled::Topics(ts) => {
                for t in ts {
                    self.topics.entry(t).or_insert(now);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> TopicName {
        TopicName {
            ns: "n".into(),
            topic: name.into(),
        }
    }

    #[test]
    fn a_topic_settles_one_window_after_its_last_unknown_outcome() {
        let w = Duration::from_secs(5);
        let mut d = Doubts::new(w);
        let t0 = Instant::now();
        d.topic(t("a"), t0, 100);
        d.topic(t("b"), t0 + Duration::from_secs(1), 200);
        assert_eq!(d.earliest_ms(), Some(100));
        assert_eq!(d.settled(t0 + Duration::from_secs(4)), None);
        assert_eq!(d.settled(t0 + w), Some(Settled::Topics(vec![t("a")])));
        // Another failure of b moves its settling later.
        d.topic(t("b"), t0 + Duration::from_secs(3), 300);
        assert_eq!(d.settled(t0 + Duration::from_secs(7)), None);
        assert_eq!(
            d.settled(t0 + Duration::from_secs(8)),
            Some(Settled::Topics(vec![t("b")]))
        );
        assert_eq!(d.settled(t0 + Duration::from_secs(3600)), None);
        // A failed re-read comes back at the next chance.
        d.retry(
            Settled::Topics(vec![t("b")]),
            t0 + Duration::from_secs(9),
            Some(300),
        );
        assert_eq!(d.earliest_ms(), Some(300));
        assert_eq!(
            d.settled(t0 + Duration::from_secs(9)),
            Some(Settled::Topics(vec![t("b")]))
        );
    }

    #[test]
    fn doubt_about_everything_covers_every_topic() {
        let w = Duration::from_secs(5);
        let mut d = Doubts::new(w);
        let t0 = Instant::now();
        d.topic(t("a"), t0, 100);
        d.everything(t0 + Duration::from_secs(1), 50);
        assert_eq!(d.earliest_ms(), Some(50));
        assert_eq!(d.settled(t0 + w), None, "everything settles later");
        assert_eq!(d.settled(t0 + Duration::from_secs(6)), Some(Settled::All));
        assert_eq!(d.settled(t0 + Duration::from_secs(3600)), None);
    }
}
