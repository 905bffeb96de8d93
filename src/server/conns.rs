//! [`ConnTable`]: the open connections and what each is doing, so that at the connection
//! cap the one that has waited longest without a request in progress (idle, or stuck in a
//! partial frame or handshake) gives way to a new one. A connection busy with a request
//! (a long poll included) is never chosen.
//!
//! Lock order: the table's lock is taken alone and never held across an `.await`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

/// What a connection is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// Waiting for a request (or for its TLS handshake to finish).
    Idle,
    /// A frame has started and is not complete yet.
    Reading,
    /// A request is being served (or its reply written).
    Busy,
}

struct Entry {
    state: ConnState,
    since: Instant,
    kick: Arc<Notify>,
    /// Chosen to give way already: not chosen again.
    evicting: bool,
}

#[derive(Default)]
pub struct ConnTable {
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Entry>>,
}

/// A connection's place in the table; dropping it removes the connection.
pub struct ConnSlot {
    table: Arc<ConnTable>,
    id: u64,
    /// Notified when the connection must give way.
    pub kick: Arc<Notify>,
}

impl ConnTable {
    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.conns.lock().expect("not poisoned")
    }

    /// A new connection, idle from now.
    pub fn register(self: &Arc<Self>) -> ConnSlot {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let kick = Arc::new(Notify::new());
        self.conns().insert(
            id,
            Entry {
                state: ConnState::Idle,
                since: Instant::now(),
                kick: kick.clone(),
                evicting: false,
            },
        );
        ConnSlot {
            table: self.clone(),
            id,
            kick,
        }
    }

    pub fn len(&self) -> usize {
        self.conns().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tells the connection that has been idle or reading longest to close; false when
    /// every connection is busy with a request.
    pub fn evict_longest_waiting(&self) -> bool {
        let mut conns = self.conns();
        let victim = conns
            .values_mut()
            .filter(|e| e.state != ConnState::Busy && !e.evicting)
            .min_by_key(|e| e.since);
        match victim {
            Some(e) => {
                e.evicting = true;
                e.kick.notify_one();
                true
            }
            None => false,
        }
    }
}

impl ConnSlot {
    pub fn set(&self, state: ConnState) {
        if let Some(e) = self.table.conns().get_mut(&self.id) {
            e.state = state;
            e.since = Instant::now();
        }
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.table.conns().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_waiting_connection_gives_way_and_busy_ones_never_do() {
        let t = Arc::new(ConnTable::default());
        let a = t.register();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = t.register();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let c = t.register();
        a.set(ConnState::Busy);
        c.set(ConnState::Reading);
        // b waited longest among those not busy.
        assert!(t.evict_longest_waiting());
        assert!(futures::FutureExt::now_or_never(b.kick.notified()).is_some());
        // b is already giving way; c is next.
        assert!(t.evict_longest_waiting());
        assert!(futures::FutureExt::now_or_never(c.kick.notified()).is_some());
        // Only a busy connection is left.
        assert!(!t.evict_longest_waiting());
        drop((b, c));
        assert_eq!(t.len(), 1);
        drop(a);
        assert!(t.is_empty());
    }
}
