//! [`Demand`]: consumers that found a topic empty and are waiting for it, so that an item
//! enqueued meanwhile can be handed to them directly (the direct hand-off): the shard
//! worker writes it already leased, in the same INSERT, and after the commit puts it where
//! the next dequeue of the topic takes it (the host's prefetch stage, through the sink the
//! host sets here). Such an item costs no claim: no UPDATE, no read back.
//!
//! Who counts as waiting: a long poll parked on the topic (for as long as it waits), and
//! a dequeue of this host's consumer that found nothing here nor on the peers (for
//! [`DEMAND_HOLD_MS`]: a consumer that polls in a loop is back within that; a dequeue a
//! peer routed here does not count, its consumer waits there). What they asked for
//! bounds what is handed (the asks of one hold window add up, to at most
//! [`DEMAND_ITEMS_MAX`]), and a consumer that finds nothing again asks anew.
//!
//! Order: an item is handed only while the topic has nothing more urgent ready on this
//! host. Finding nothing says so for every shard at that moment; any item that becomes
//! ready afterwards by the usual path (an enqueue not handed, a nack, an expiry, a
//! deferred item coming due) blocks further hand-offs until a dequeue finds nothing again;
//! each shard also checks its own ready items before handing (see the shard's
//! `plan_handoff`: only a prefix, in order, of a turn's rows). Two shards committing at the
//! same moment, or a nack in the same turn, may still let a less urgent handed item out
//! beside a more urgent one made ready meanwhile: the same slack as staging.
//!
//! If the consumer has gone by the time the commit lands, the item stays staged and goes
//! to the next dequeue, or is released (ready again, the delivery nobody saw uncounted)
//! like any staged item. At-most-once items are handed only to a parked long poll, and
//! are released after [`AT_MOST_ONCE_HOLD_MS`] unseen (see `core::prefetch`).
//!
//! Lock order: `topics` and `sink` are each taken alone; the sink runs without either.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::model::{Item, TopicName};

/// How long a dequeue that found nothing counts as a consumer waiting for the topic.
pub const DEMAND_HOLD_MS: i64 = 250;
/// Most items asked for by the dequeues of one hold window that found nothing (the most
/// one dequeue may ask for).
pub const DEMAND_ITEMS_MAX: usize = 1000;
/// How long an at-most-once item handed to a long poll may wait staged for it before it
/// is released (ready again): a crash while it is staged would end its lease as a
/// delivery, which for at-most-once deletes it, so it is not kept staged for long.
pub const AT_MOST_ONCE_HOLD_MS: i64 = 200;

/// Where handed items go once committed: returns those it could not take (to release).
pub type HandSink = Arc<dyn Fn(&TopicName, Vec<Item>) -> Vec<Item> + Send + Sync>;
/// How many more items the sink can take for a topic now (its stage's room).
pub type SinkRoom = Arc<dyn Fn(&TopicName) -> usize + Send + Sync>;

#[derive(Debug, Default)]
struct Want {
    /// Items asked for by the long polls parked now, and how many polls.
    parked: usize,
    polls: usize,
    /// Items asked for by the dequeues that found nothing, until `recent_until_ms`.
    recent: usize,
    recent_until_ms: i64,
    /// Handed since the topic was last found empty.
    handed: usize,
    /// An item became ready by the usual path since the topic was last found empty.
    blocked: bool,
}

/// What a shard may hand now for one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub items: usize,
    /// At-most-once items too (a long poll is parked).
    pub at_most_once: bool,
}

/// Buckets of [`Demand`]'s ready epochs: topics share a bucket by hash, which only makes
/// a look that raced with another topic's ready item count as raced too.
const EPOCH_BUCKETS: usize = 1024;

pub struct Demand {
    topics: Mutex<HashMap<TopicName, Want>>,
    sink: Mutex<Option<(HandSink, SinkRoom)>>,
    /// Bumped whenever an item of a topic (of the bucket) becomes ready the usual way,
    /// whether or not anyone waits on it: a consumer's look that found nothing holds only
    /// if no bump came between the look's start and its report (see [`Demand::epoch`]).
    epochs: Box<[std::sync::atomic::AtomicU64]>,
}

impl Default for Demand {
    fn default() -> Self {
        Demand {
            topics: Mutex::default(),
            sink: Mutex::default(),
            epochs: (0..EPOCH_BUCKETS)
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect(),
        }
    }
}

fn bucket(topic: &TopicName) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    topic.hash(&mut h);
    (h.finish() % EPOCH_BUCKETS as u64) as usize
}

/// A long poll parked on a topic; leaving (dropping this) takes its demand away.
pub struct Parked<'a> {
    demand: &'a Demand,
    topic: TopicName,
    count: usize,
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        let mut topics = self.demand.topics();
        if let Some(w) = topics.get_mut(&self.topic) {
            w.parked = w.parked.saturating_sub(self.count);
            w.polls = w.polls.saturating_sub(1);
        }
    }
}

impl Demand {
    fn topics(&self) -> std::sync::MutexGuard<'_, HashMap<TopicName, Want>> {
        // Plain counters, consistent after any panic.
        self.topics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn sink(&self) -> Option<(HandSink, SinkRoom)> {
        self.sink
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Where committed hand-offs go, and how many it has room for; set by the host.
    /// Without one nothing is handed.
    pub fn set_sink(&self, sink: HandSink, room: SinkRoom) {
        *self
            .sink
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((sink, room));
    }

    /// Where `topic`'s ready events stand: read before a look for items, and passed back
    /// with what the look found (an item made ready meanwhile may be more urgent than
    /// anything enqueued next).
    pub fn epoch(&self, topic: &TopicName) -> u64 {
        self.epochs[bucket(topic)].load(std::sync::atomic::Ordering::SeqCst)
    }

    fn raced(&self, topic: &TopicName, since: u64) -> bool {
        self.epoch(topic) != since
    }

    /// A dequeue that looked from `since` (see [`Demand::epoch`]) found nothing ready in
    /// `topic` on this host's shards nor its peers. Several consumers may be waiting: the
    /// asks of the hold window add up (at most [`DEMAND_ITEMS_MAX`]). One consumer asking
    /// again counts again: what is handed for it beyond its ask is staged for its next
    /// dequeue, as claims ahead are. An item made ready since the look began keeps the
    /// topic blocked.
    pub fn found_nothing(&self, topic: &TopicName, count: usize, now_ms: i64, since: u64) {
        let mut topics = self.topics();
        let w = topics.entry(topic.clone()).or_default();
        w.recent = if now_ms < w.recent_until_ms {
            (w.recent + count).min(DEMAND_ITEMS_MAX)
        } else {
            count.min(DEMAND_ITEMS_MAX)
        };
        w.recent_until_ms = now_ms + DEMAND_HOLD_MS;
        w.handed = 0;
        w.blocked = self.raced(topic, since);
    }

    /// A long poll that looked from `since` and found nothing waits on `topic` for
    /// `count` items.
    pub fn park(&self, topic: &TopicName, count: usize, since: u64) -> Parked<'_> {
        let mut topics = self.topics();
        let w = topics.entry(topic.clone()).or_default();
        w.parked += count;
        w.polls += 1;
        w.handed = 0;
        w.blocked = self.raced(topic, since);
        Parked {
            demand: self,
            topic: topic.clone(),
            count,
        }
    }

    /// Whether any topic has consumers waiting (a cheap first look for every insert).
    pub fn anyone_waiting(&self) -> bool {
        !self.topics().is_empty()
    }

    /// How many items of `topic` a shard may hand now.
    pub fn grant(&self, topic: &TopicName, now_ms: i64) -> Grant {
        let none = Grant {
            items: 0,
            at_most_once: false,
        };
        let Some((_, room)) = self.sink() else {
            return none;
        };
        let grant = {
            let topics = self.topics();
            let Some(w) = topics.get(topic) else {
                return none;
            };
            if w.blocked {
                return none;
            }
            let recent = if now_ms < w.recent_until_ms {
                w.recent
            } else {
                0
            };
            Grant {
                // A long poll's own empty look also counts as `recent`: the larger ask,
                // not the sum, so that it is not counted twice. Many parked polls ask at
                // most DEMAND_ITEMS_MAX together, as a hold window's dequeues do.
                items: w
                    .parked
                    .min(DEMAND_ITEMS_MAX)
                    .max(recent)
                    .saturating_sub(w.handed),
                at_most_once: w.polls > 0,
            }
        };
        // No more than the sink can stage (asked without `topics` held: see the lock
        // order). Two shards granted at once may still hand more: the sink releases what
        // it has no room for.
        Grant {
            items: grant.items.min(room(topic)),
            ..grant
        }
    }

    /// A shard is handing `n` items of `topic` (after [`Demand::grant`]).
    pub fn took(&self, topic: &TopicName, n: usize) {
        if let Some(w) = self.topics().get_mut(topic) {
            w.handed += n;
        }
    }

    /// An item of `topic` became ready by the usual path: nothing more is handed until
    /// the topic is found empty again (it is no longer the most urgent thing there).
    pub fn block(&self, topic: &TopicName) {
        // The epoch first: a look that is about to report finding nothing sees it.
        self.epochs[bucket(topic)].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Some(w) = self.topics().get_mut(topic) {
            w.blocked = true;
        }
    }

    /// Committed hand-offs, to the sink; returns what it did not take (none set: all).
    pub fn hand(&self, topic: &TopicName, items: Vec<Item>) -> Vec<Item> {
        match self.sink() {
            Some((sink, _)) => sink(topic, items),
            None => items,
        }
    }

    /// Forgets topics nobody waits on any more.
    pub fn forget_idle(&self, now_ms: i64) {
        self.topics()
            .retain(|_, w| w.polls > 0 || now_ms < w.recent_until_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic() -> TopicName {
        TopicName {
            ns: "n".into(),
            topic: "t".into(),
        }
    }

    fn with_sink() -> Demand {
        let d = Demand::default();
        d.set_sink(
            Arc::new(|_: &TopicName, _: Vec<Item>| Vec::new()),
            Arc::new(|_: &TopicName| usize::MAX),
        );
        d
    }

    #[test]
    fn nothing_is_handed_without_a_sink_or_a_waiting_consumer() {
        let d = Demand::default();
        d.found_nothing(&topic(), 10, 0, 0);
        assert_eq!(d.grant(&topic(), 1).items, 0, "no sink");
        let d = with_sink();
        assert_eq!(d.grant(&topic(), 1).items, 0, "nobody found it empty");
    }

    #[test]
    fn a_dequeue_that_found_nothing_is_waited_for_a_while() {
        let d = with_sink();
        d.found_nothing(&topic(), 10, 1_000, 0);
        let g = d.grant(&topic(), 1_001);
        assert_eq!(
            g,
            Grant {
                items: 10,
                at_most_once: false
            }
        );
        d.took(&topic(), 4);
        assert_eq!(d.grant(&topic(), 1_002).items, 6);
        assert_eq!(d.grant(&topic(), 1_000 + DEMAND_HOLD_MS).items, 0);
        d.forget_idle(1_000 + DEMAND_HOLD_MS);
        assert!(d.topics().is_empty());
    }

    #[test]
    fn a_long_poll_is_waited_for_while_it_is_parked() {
        let d = with_sink();
        let p = d.park(&topic(), 3, 0);
        let g = d.grant(&topic(), 1_000_000);
        assert_eq!(
            g,
            Grant {
                items: 3,
                at_most_once: true
            }
        );
        d.forget_idle(1_000_000);
        assert_eq!(d.grant(&topic(), 1_000_000).items, 3, "still parked");
        drop(p);
        assert_eq!(d.grant(&topic(), 1_000_000).items, 0);
    }

    #[test]
    fn an_item_made_ready_the_usual_way_blocks_hand_offs_until_found_empty_again() {
        let d = with_sink();
        let _p = d.park(&topic(), 5, 0);
        d.block(&topic());
        assert_eq!(d.grant(&topic(), 0).items, 0);
        // A look that began before the block does not lift it.
        d.found_nothing(&topic(), 2, 0, 0);
        assert_eq!(d.grant(&topic(), 1).items, 0, "raced with a ready item");
        d.found_nothing(&topic(), 2, 0, d.epoch(&topic()));
        assert_eq!(d.grant(&topic(), 1).items, 5, "the larger ask");
        // More consumers finding it empty within the window: their asks add up.
        d.found_nothing(&topic(), 4, 2, d.epoch(&topic()));
        assert_eq!(d.grant(&topic(), 3).items, 2 + 2 + 4);
        d.found_nothing(&topic(), 999, 3, d.epoch(&topic()));
        assert_eq!(d.grant(&topic(), 4).items, DEMAND_ITEMS_MAX);
    }

    #[test]
    fn what_is_granted_fits_the_sinks_room_and_parked_polls_ask_at_most_the_max() {
        let d = Demand::default();
        let room = Arc::new(std::sync::atomic::AtomicUsize::new(5));
        let r = room.clone();
        d.set_sink(
            Arc::new(|_: &TopicName, _: Vec<Item>| Vec::new()),
            Arc::new(move |_: &TopicName| r.load(std::sync::atomic::Ordering::SeqCst)),
        );
        // Three long polls of 1,000 each: at most DEMAND_ITEMS_MAX together, and no more
        // than the sink can stage.
        let _polls: Vec<_> = (0..3).map(|_| d.park(&topic(), 1_000, 0)).collect();
        assert_eq!(d.grant(&topic(), 1).items, 5);
        room.store(usize::MAX, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(d.grant(&topic(), 1).items, DEMAND_ITEMS_MAX);
    }
}
