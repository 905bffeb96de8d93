//! The prefetch buffer: per (namespace, topic), items already claimed (leased in storage)
//! and staged in memory, so that a dequeue on a busy topic is served from memory and the
//! claims happen in large batches, off the consumer's path.
//!
//! How much is staged follows each topic's recent dequeue rate: about
//! `prefetch_window_ms` worth of it, at most `prefetch_items_max`. An idle topic stages
//! nothing, so a dequeue there merges and claims on demand, exactly what was asked.
//!
//! A staged item's lease runs from its claim, so it is handed out only while at least half
//! of that lease is left, its TTL has not passed and it has been staged no longer than
//! `prefetch_stage_max_ms`; otherwise it is released: made ready again in storage with the
//! unseen delivery uncounted. On shutdown every staged item is released. After a crash,
//! staged items are leased rows and come back when their leases expire (with that one
//! unseen delivery counted).
//!
//! The stage holds copies; the shard's claimed-not-delivered set ([`crate::shard::Staged`])
//! says which copies may still be handed out. An ack, nack or expiry that settles a staged
//! item takes it out of that set, and from then on the copy here is dead: it is never
//! handed out (the host hands items out through the shard), never shown by peek or
//! counted, and dropped at the next take or sweep. Lock order: `topics`, then a shard's
//! staged set (through the `live` callbacks); never the other way.
//!
//! Items an enqueue handed to waiting consumers (see [`crate::demand`]) are staged here
//! too, at-most-once ones included, for a shorter time.
//!
//! At-most-once items are never staged ahead of demand: after a crash a staged item's
//! lease would expire as a delivery, and for at-most-once that deletes an item nobody
//! could have received. A topic that turns out to hold them stages nothing ahead for
//! `AT_MOST_ONCE_PAUSE_MS`, so that claiming ahead and releasing does not repeat.
//!
//! The price of staging: an item enqueued after a batch was staged, even a more urgent
//! one, waits until the staged items ahead of it are handed out (at most one window).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::demand::AT_MOST_ONCE_HOLD_MS;
use crate::model::{GlobalKey, Head, Item, Policy, ReadyTopic, ShardId, TopicName, HEADS_MAX};

/// Half-life of the dequeue-rate estimate.
const RATE_HALF_LIFE_MS: f64 = 1000.0;
/// How long a topic found to hold at-most-once items stages nothing ahead.
const AT_MOST_ONCE_PAUSE_MS: i64 = 10_000;

#[derive(Debug, Clone, Copy)]
pub struct PrefetchConfig {
    pub window_ms: u64,
    pub items_max: usize,
    pub stage_max_ms: i64,
}

struct StagedItem {
    item: Item,
    staged_at_ms: i64,
    /// How long it may stay staged: `stage_max_ms`, shorter for an at-most-once item
    /// handed to a long poll.
    hold_ms: i64,
}

#[derive(Default)]
struct Stage {
    items: BTreeMap<GlobalKey, StagedItem>,
    /// Held while claiming for this topic: a dequeue that finds the stage short waits for
    /// a claim in flight and then looks again, so items in transit between the index and
    /// the stage are never missed (a dequeue returns min(count, ready)).
    claim_lock: Arc<tokio::sync::Mutex<()>>,
    /// Items dequeued, decayed with RATE_HALF_LIFE_MS: c = r * H / ln 2 at a steady rate r.
    recent: f64,
    recent_at_ms: i64,
    /// No staging ahead before this time (see `AT_MOST_ONCE_PAUSE_MS`).
    paused_until_ms: i64,
}

impl Stage {
    fn decay(&mut self, now_ms: i64) {
        let dt = (now_ms - self.recent_at_ms).max(0) as f64;
        self.recent *= 0.5f64.powf(dt / RATE_HALF_LIFE_MS);
        self.recent_at_ms = now_ms;
    }

    fn put(&mut self, item: Item, now_ms: i64, hold_ms: i64) {
        let s = StagedItem {
            item,
            staged_at_ms: now_ms,
            hold_ms,
        };
        self.items.insert(s.item.global_key(), s);
    }

    /// Past `max` items, the least urgent go to `out` (for the caller to release): the
    /// stage never holds more than its bound, whoever staged last.
    fn trim(&mut self, max: usize, out: &mut Vec<Item>) {
        while self.items.len() > max {
            let Some((_, s)) = self.items.pop_last() else {
                break;
            };
            out.push(s.item);
        }
    }

    /// Dequeued items per second, recently.
    fn rate(&self) -> f64 {
        self.recent * std::f64::consts::LN_2 / (RATE_HALF_LIFE_MS / 1000.0)
    }
}

fn fit(s: &StagedItem, now_ms: i64) -> bool {
    let lease_total = s.item.lease_expires_ms - s.staged_at_ms;
    let held = now_ms - s.staged_at_ms;
    held <= s.hold_ms && held * 2 <= lease_total && s.item.expires_at_ms.is_none_or(|t| t > now_ms)
}

/// What a dequeue got from the stage.
pub struct Taken {
    pub items: Vec<Item>,
    /// Items that may no longer be handed out: the caller releases them.
    pub release: Vec<Item>,
    /// How many to claim beyond the shortfall, to restock the stage.
    pub ahead: usize,
}

pub struct Prefetch {
    cfg: PrefetchConfig,
    topics: Mutex<HashMap<TopicName, Stage>>,
    /// Shards whose stage was drained (being let go; `None`: every shard, at shutdown):
    /// what an enqueue hands over for them afterwards is refused, for the shard to
    /// release, instead of staying staged with nobody left to release it. Taken only
    /// under `topics`, so a drain and a hand-over are in one order or the other.
    closed: Mutex<Option<HashSet<ShardId>>>,
}

impl Prefetch {
    pub fn new(cfg: PrefetchConfig) -> Self {
        Prefetch {
            cfg,
            topics: Mutex::new(HashMap::new()),
            closed: Mutex::new(Some(HashSet::new())),
        }
    }

    fn target(&self, stage: &Stage, now_ms: i64) -> usize {
        if now_ms < stage.paused_until_ms {
            return 0;
        }
        let t = stage.rate() * self.cfg.window_ms as f64 / 1000.0;
        (t as usize).min(self.cfg.items_max)
    }

    /// Takes up to `count` staged items for a dequeue and records the demand.
    #[cfg(test)]
    pub fn take(&self, topic: &TopicName, count: usize, now_ms: i64) -> Taken {
        self.take_before(topic, count, None, now_ms, true)
    }

    /// The topic's claim lock (see `Stage::claim_lock`).
    pub fn claim_lock(&self, topic: &TopicName) -> Arc<tokio::sync::Mutex<()>> {
        let mut topics = self.topics.lock().expect("not poisoned");
        topics.entry(topic.clone()).or_default().claim_lock.clone()
    }

    /// Takes up to `count` staged items, and with `before` only those more urgent than it
    /// (the rest stay as they are); `demand`: count the dequeue's demand.
    pub fn take_before(
        &self,
        topic: &TopicName,
        count: usize,
        before: Option<Head>,
        now_ms: i64,
        demand: bool,
    ) -> Taken {
        let mut topics = self.topics.lock().expect("not poisoned");
        let stage = topics.entry(topic.clone()).or_default();
        stage.decay(now_ms);
        if demand {
            stage.recent += count as f64;
        }
        let mut items = Vec::new();
        let mut release = Vec::new();
        while items.len() < count {
            let Some(first) = stage.items.first_key_value().map(|(k, _)| Head::from(*k)) else {
                break;
            };
            if before.is_some_and(|b| first >= b) {
                break;
            }
            let Some((_, s)) = stage.items.pop_first() else {
                break;
            };
            if fit(&s, now_ms) {
                items.push(s.item);
            } else {
                release.push(s.item);
            }
        }
        let ahead = self.target(stage, now_ms).saturating_sub(stage.items.len());
        Taken {
            items,
            release,
            ahead,
        }
    }

    /// Stages claimed items that were not handed out, except at-most-once ones and those
    /// of shards whose stage was drained (see `closed`: a claim that came back after its
    /// shard was abandoned): those are returned, for the caller to release (see the module
    /// comment).
    #[must_use = "the items not staged must be released"]
    pub fn stage(&self, topic: &TopicName, items: Vec<Item>, now_ms: i64) -> Vec<Item> {
        if items.is_empty() {
            return items;
        }
        let mut topics = self.topics.lock().expect("not poisoned");
        let closed = self.closed.lock().expect("not poisoned");
        let (items, mut refused): (Vec<Item>, Vec<Item>) = items
            .into_iter()
            .partition(|i| closed.as_ref().is_some_and(|c| !c.contains(&i.id.shard)));
        drop(closed);
        let late = refused.len();
        let stage = topics.entry(topic.clone()).or_default();
        for item in items {
            if item.policy == Policy::AtMostOnce {
                refused.push(item);
                continue;
            }
            stage.put(item, now_ms, self.cfg.stage_max_ms);
        }
        if refused.len() > late {
            stage.paused_until_ms = now_ms + AT_MOST_ONCE_PAUSE_MS;
        }
        stage.trim(self.cfg.items_max, &mut refused);
        refused
    }

    /// Stages items an enqueue handed to the topic's waiting consumers (see
    /// [`crate::demand`]), at-most-once ones included: a long poll is there to take them,
    /// and they are released after [`AT_MOST_ONCE_HOLD_MS`] if it has gone. Returns the
    /// items of shards whose stage was drained (see `closed`), for the shard to release.
    #[must_use = "the items not staged must be released"]
    pub fn stage_handed(&self, topic: &TopicName, items: Vec<Item>, now_ms: i64) -> Vec<Item> {
        let mut topics = self.topics.lock().expect("not poisoned");
        let closed = self.closed.lock().expect("not poisoned");
        let (mut items, mut refused): (Vec<Item>, Vec<Item>) = items
            .into_iter()
            .partition(|i| closed.as_ref().is_some_and(|c| !c.contains(&i.id.shard)));
        drop(closed);
        let stage = topics.entry(topic.clone()).or_default();
        // Only the handing shard's own items go back (it releases them itself): past the
        // stage's room, the least urgent of these, never what is staged already.
        let room = self.cfg.items_max.saturating_sub(stage.items.len());
        if items.len() > room {
            items.sort_by_key(Item::global_key);
            refused.extend(items.split_off(room));
        }
        for item in items {
            let hold_ms = match item.policy {
                Policy::AtMostOnce => AT_MOST_ONCE_HOLD_MS.min(self.cfg.stage_max_ms),
                Policy::AtLeastOnce => self.cfg.stage_max_ms,
            };
            stage.put(item, now_ms, hold_ms);
        }
        refused
    }

    /// How many more items `topic`'s stage can hold now.
    pub fn room(&self, topic: &TopicName) -> usize {
        let topics = self.topics.lock().expect("not poisoned");
        let staged = topics.get(topic).map_or(0, |s| s.items.len());
        self.cfg.items_max.saturating_sub(staged)
    }

    /// Items staged: over all topics, and in the fullest topic's stage.
    pub fn staged(&self) -> (usize, usize) {
        let topics = self.topics.lock().expect("not poisoned");
        let each = topics.values().map(|s| s.items.len());
        (each.clone().sum(), each.max().unwrap_or(0))
    }

    /// A shard is served (again): hand-overs for it are staged.
    pub fn open_shard(&self, shard: ShardId) {
        let _topics = self.topics.lock().expect("not poisoned");
        if let Some(c) = self.closed.lock().expect("not poisoned").as_mut() {
            c.remove(&shard);
        }
    }

    /// Topics whose stage is below half its target, with how many to claim; and the items
    /// that aged out (to release). Drops dead copies (not `live`); forgets topics that are
    /// idle and empty.
    pub fn sweep(
        &self,
        now_ms: i64,
        live: impl Fn(&Item) -> bool,
    ) -> (Vec<(TopicName, usize)>, Vec<Item>) {
        let mut topics = self.topics.lock().expect("not poisoned");
        let mut restock = Vec::new();
        let mut release = Vec::new();
        topics.retain(|name, stage| {
            stage.decay(now_ms);
            stage.items.retain(|_, s| live(&s.item));
            let stale: Vec<GlobalKey> = stage
                .items
                .iter()
                .filter(|(_, s)| !fit(s, now_ms))
                .map(|(k, _)| *k)
                .collect();
            for k in stale {
                release.extend(stage.items.remove(&k).map(|s| s.item));
            }
            let target = self.target(stage, now_ms);
            if target > 0 && stage.items.len() * 2 < target {
                restock.push((name.clone(), target - stage.items.len()));
            }
            // Forget idle topics, unless a claim holds their lock right now.
            !(stage.items.is_empty()
                && stage.recent < 0.01
                && Arc::strong_count(&stage.claim_lock) == 1)
        });
        (restock, release)
    }

    /// Copies of up to `count` staged items that could be handed out now, in order,
    /// shown as not leased (for peek): they are ready as far as clients can tell.
    pub fn peek(
        &self,
        topic: &TopicName,
        count: usize,
        now_ms: i64,
        live: impl Fn(&Item) -> bool,
    ) -> Vec<Item> {
        let topics = self.topics.lock().expect("not poisoned");
        let Some(stage) = topics.get(topic) else {
            return vec![];
        };
        stage
            .items
            .values()
            .filter(|s| fit(s, now_ms) && live(&s.item))
            .take(count)
            .map(|s| Item {
                lease_expires_ms: 0,
                lease_token: 0,
                delivery_count: s.item.delivery_count - 1,
                ..s.item.clone()
            })
            .collect()
    }

    /// How many items of a topic are staged, and the oldest `deliver_after_ms` among them.
    pub fn staged_summary(
        &self,
        topic: &TopicName,
        live: impl Fn(&Item) -> bool,
    ) -> (i64, Option<i64>) {
        let topics = self.topics.lock().expect("not poisoned");
        let Some(stage) = topics.get(topic) else {
            return (0, None);
        };
        let mut n = 0;
        let mut oldest = None;
        for s in stage.items.values().filter(|s| live(&s.item)) {
            n += 1;
            let t = s.item.deliver_after_ms;
            oldest = Some(oldest.map_or(t, |o: i64| o.min(t)));
        }
        (n, oldest)
    }

    /// Everything staged, for release at shutdown; later hand-overs are refused.
    pub fn drain(&self) -> Vec<Item> {
        let mut topics = self.topics.lock().expect("not poisoned");
        *self.closed.lock().expect("not poisoned") = None;
        topics
            .drain()
            .flat_map(|(_, s)| s.items.into_values().map(|s| s.item))
            .collect()
    }

    /// Takes every staged item of one shard (the host is letting the shard go); later
    /// hand-overs for it are refused until [`Prefetch::open_shard`].
    pub fn drain_shard(&self, shard: ShardId) -> Vec<Item> {
        let mut topics = self.topics.lock().expect("not poisoned");
        if let Some(c) = self.closed.lock().expect("not poisoned").as_mut() {
            c.insert(shard);
        }
        let mut out = Vec::new();
        for stage in topics.values_mut() {
            let keys: Vec<GlobalKey> = stage
                .items
                .keys()
                .filter(|k| k.shard == shard)
                .copied()
                .collect();
            for k in keys {
                if let Some(s) = stage.items.remove(&k) {
                    out.push(s.item);
                }
            }
        }
        out
    }

    /// Every topic's staged items that may still be handed out, and how many (for the
    /// ready summary peers route by: staged items are ready as far as clients go).
    /// Each has its most urgent staged item as its head.
    pub fn staged_topics(&self, live: impl Fn(&Item) -> bool) -> Vec<ReadyTopic> {
        let topics = self.topics.lock().expect("not poisoned");
        topics
            .iter()
            .filter_map(|(t, s)| {
                let mut heads = Vec::new();
                let mut ready = 0i64;
                for s in s.items.values().filter(|s| live(&s.item)) {
                    if heads.len() < HEADS_MAX {
                        heads.push(Head::of(&s.item));
                    }
                    ready += 1;
                }
                Some(ReadyTopic {
                    topic: t.clone(),
                    ready,
                    head: Some(*heads.first()?),
                    heads,
                })
            })
            .collect()
    }

    /// The heads of up to `max` staged items of a topic that could be handed out now, the
    /// most urgent first.
    pub fn staged_heads(
        &self,
        topic: &TopicName,
        max: usize,
        now_ms: i64,
        live: impl Fn(&Item) -> bool,
    ) -> Vec<Head> {
        let topics = self.topics.lock().expect("not poisoned");
        let Some(stage) = topics.get(topic) else {
            return Vec::new();
        };
        stage
            .items
            .values()
            .filter(|s| fit(s, now_ms) && live(&s.item))
            .take(max)
            .map(|s| Head::of(&s.item))
            .collect()
    }

    /// Staged items per topic of `ns`: leased in storage, but ready as far as clients go.
    pub fn staged_counts(&self, ns: &str, live: impl Fn(&Item) -> bool) -> HashMap<String, i64> {
        self.staged_topics(live)
            .into_iter()
            .filter(|r| r.topic.ns == ns)
            .map(|r| (r.topic.topic, r.ready))
            .collect()
    }
}

#[cfg(test)]
mod tests;
