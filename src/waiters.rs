//! Who waits for which topic: long-polling dequeues park here, and whatever makes an item
//! ready (an enqueue committing, a nack, an expired lease, a deferred item coming due, a
//! staged item released) wakes the waiters of its topic. Waiting costs no storage query.
//!
//! In a cluster, a topic that gets a ready item here is also announced to the peers (at
//! most once per peer poll, see [`Waiters::announce_to`]), so that long polls routed
//! through other hosts wake at once; their announcements wake waiters here through
//! [`Waiters::wake_remote`], which announces nothing.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::demand::Demand;
use crate::model::TopicName;

#[derive(Default)]
pub struct Waiters {
    topics: Mutex<HashMap<TopicName, Arc<Notify>>>,
    /// Set at shutdown: waits end at once, so in-flight long polls do not hold it up.
    closing: AtomicBool,
    closed: Notify,
    /// Where topics that got ready items go to be announced to peers (none: one host).
    announce: Mutex<Option<tokio::sync::mpsc::UnboundedSender<TopicName>>>,
    /// Topics announced since the last peer poll.
    announced: Mutex<HashSet<TopicName>>,
    /// Consumers that found their topic empty: what enqueues may hand them directly.
    demand: Demand,
}

impl Waiters {
    pub fn new() -> Arc<Waiters> {
        Arc::new(Waiters::default())
    }

    /// The notifier of a topic; keep it while waiting.
    pub fn watch(&self, topic: &TopicName) -> Arc<Notify> {
        let mut topics = self.topics.lock().expect("not poisoned");
        topics.entry(topic.clone()).or_default().clone()
    }

    pub fn demand(&self) -> &Demand {
        &self.demand
    }

    /// A topic of this host got a ready item: wakes everyone waiting on it here, and
    /// announces it to the peers when it was not announced since the last poll. Items of
    /// the topic are no longer handed to waiting consumers directly (see [`Demand`]).
    pub fn wake(&self, ns: &str, topic: &str) {
        let key = TopicName {
            ns: ns.to_string(),
            topic: topic.to_string(),
        };
        self.demand.block(&key);
        self.wake_handed(key);
    }

    /// Items of a topic were handed to its waiting consumers (staged for them): wakes
    /// them, and announces the topic as [`Waiters::wake`] does.
    pub fn wake_handed(&self, key: TopicName) {
        self.notify(&key);
        let announce = self.announce.lock().expect("not poisoned");
        if let Some(tx) = announce.as_ref() {
            if self
                .announced
                .lock()
                .expect("not poisoned")
                .insert(key.clone())
            {
                let _ = tx.send(key);
            }
        }
    }

    /// A peer announced ready items of a topic: wakes everyone waiting on it here.
    pub fn wake_remote(&self, key: &TopicName) {
        self.notify(key);
    }

    fn notify(&self, key: &TopicName) {
        let topics = self.topics.lock().expect("not poisoned");
        if let Some(n) = topics.get(key) {
            n.notify_waiters();
        }
    }

    /// From now on, topics that get ready items are sent to `tx` to be announced.
    pub fn announce_to(&self, tx: tokio::sync::mpsc::UnboundedSender<TopicName>) {
        *self.announce.lock().expect("not poisoned") = Some(tx);
    }

    /// Peers have just polled (or been polled): topics may be announced again.
    pub fn reset_announced(&self) {
        self.announced.lock().expect("not poisoned").clear();
    }

    /// Forgets topics nobody watches or waits on any more.
    pub fn forget_idle(&self, now_ms: i64) {
        let mut topics = self.topics.lock().expect("not poisoned");
        topics.retain(|_, n| Arc::strong_count(n) > 1);
        drop(topics);
        self.demand.forget_idle(now_ms);
    }

    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// Ends every wait, now and later.
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.closed.notify_waiters();
    }

    /// Resolves when `close` is called.
    pub async fn closed(&self) {
        let notified = self.closed.notified();
        if self.is_closing() {
            return;
        }
        notified.await;
    }
}
