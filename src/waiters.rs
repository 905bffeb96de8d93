//! Who waits for which topic: long-polling dequeues park here, and whatever makes an item
//! ready (an enqueue committing, a nack, an expired lease, a deferred item coming due, a
//! staged item released) wakes the waiters of its topic. Waiting costs no MySQL query.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::model::TopicName;

#[derive(Default)]
pub struct Waiters {
    topics: Mutex<HashMap<TopicName, Arc<Notify>>>,
    /// Set at shutdown: waits end at once, so in-flight long polls do not hold it up.
    closing: AtomicBool,
    closed: Notify,
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

    /// Wakes everyone waiting on the topic, if anyone is.
    pub fn wake(&self, ns: &str, topic: &str) {
        let topics = self.topics.lock().expect("not poisoned");
        let key = TopicName {
            ns: ns.to_string(),
            topic: topic.to_string(),
        };
        if let Some(n) = topics.get(&key) {
            n.notify_waiters();
        }
    }

    /// Forgets topics nobody watches any more.
    pub fn forget_idle(&self) {
        let mut topics = self.topics.lock().expect("not poisoned");
        topics.retain(|_, n| Arc::strong_count(n) > 1);
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
