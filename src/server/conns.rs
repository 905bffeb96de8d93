//! [`ConnTable`]: the open connections and what each is doing, so that at the connection
//! cap one gives way to a new one: the one that has waited longest without a request in
//! progress (idle, or stuck in a partial frame or handshake); when there is none, the one
//! whose request has waited longest (a long poll: it is answered empty, then closed). A
//! connection writing its answer is never chosen, nor one a peer host logged in on. The
//! same choice, among one address's connections, keeps an address within its own cap.
//!
//! Lock order: the table's lock is taken alone and never held across an `.await`.

use std::collections::HashMap;
use std::net::IpAddr;
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
    /// A request that was not answered at once is being served: a long poll, a slow
    /// shard. Given way only when no connection is idle or reading.
    Waiting,
}

struct Entry {
    state: ConnState,
    since: Instant,
    addr: IpAddr,
    kick: Arc<Notify>,
    /// Chosen to give way already: not chosen again.
    evicting: bool,
    /// Another host's (logged in as a peer): never chosen, as cluster traffic is not a
    /// client's to push out.
    peer: bool,
    /// The client's TLS identity, once its handshake is done.
    identity: Option<Arc<str>>,
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

    /// A new connection from `addr`, idle from now.
    pub fn register(self: &Arc<Self>, addr: IpAddr) -> ConnSlot {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let kick = Arc::new(Notify::new());
        self.conns().insert(
            id,
            Entry {
                state: ConnState::Idle,
                since: Instant::now(),
                addr,
                kick: kick.clone(),
                evicting: false,
                peer: false,
                identity: None,
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

    /// Connections open from `addr` that are not giving way already.
    pub fn count_of(&self, addr: IpAddr) -> usize {
        self.count_where(|e| e.addr == addr)
    }

    /// Connections open with TLS identity `identity` that are not giving way already.
    pub fn count_of_identity(&self, identity: &str) -> usize {
        self.count_where(|e| e.identity.as_deref() == Some(identity))
    }

    fn count_where(&self, pick: impl Fn(&Entry) -> bool) -> usize {
        self.conns()
            .values()
            .filter(|e| !e.evicting && !e.peer && pick(e))
            .count()
    }

    /// Tells one connection to give way (see the module's notes), among those from `addr`
    /// when given; false when every one is writing an answer (or already giving way).
    pub fn evict_one(&self, addr: Option<IpAddr>) -> bool {
        self.evict_where(|e| addr.is_none_or(|a| e.addr == a))
    }

    /// The same among the connections of one TLS identity.
    pub fn evict_one_of_identity(&self, identity: &str) -> bool {
        self.evict_where(|e| e.identity.as_deref() == Some(identity))
    }

    fn evict_where(&self, pick: impl Fn(&Entry) -> bool) -> bool {
        let mut conns = self.conns();
        // Idle or reading before waiting, then the longest in that state.
        let victim = conns
            .values_mut()
            .filter(|e| !e.evicting && !e.peer && e.state != ConnState::Busy && pick(e))
            .min_by_key(|e| (e.state == ConnState::Waiting, e.since));
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
    /// The client's TLS identity, known once its handshake is done.
    pub fn set_identity(&self, identity: &str) {
        if let Some(e) = self.table.conns().get_mut(&self.id) {
            e.identity = Some(identity.into());
        }
    }

    /// The connection is another host's: it never gives way, nor counts for its address.
    pub fn mark_peer(&self) {
        if let Some(e) = self.table.conns().get_mut(&self.id) {
            e.peer = true;
        }
    }

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

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    fn kicked(s: &ConnSlot) -> bool {
        futures::FutureExt::now_or_never(s.kick.notified()).is_some()
    }

    #[test]
    fn idle_connections_give_way_first_then_the_longest_waiting_request_never_a_busy_one() {
        let t = Arc::new(ConnTable::default());
        let a = t.register(A);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let poll = t.register(A);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = t.register(A);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let c = t.register(A);
        a.set(ConnState::Busy);
        poll.set(ConnState::Waiting);
        c.set(ConnState::Reading);
        // b waited longest among those idle or reading; then c; then the long poll.
        assert!(t.evict_one(None));
        assert!(kicked(&b));
        assert!(t.evict_one(None));
        assert!(kicked(&c));
        assert!(t.evict_one(None));
        assert!(kicked(&poll));
        // Only a busy connection is left.
        assert!(!t.evict_one(None));
        // A peer's connection never gives way.
        let p = t.register(A);
        p.mark_peer();
        assert!(!t.evict_one(None));
        assert_eq!(t.count_of(A), 1, "the busy one; not the peer's");
        drop(p);
        drop((b, c, poll));
        assert_eq!(t.len(), 1);
        drop(a);
        assert!(t.is_empty());
    }

    #[test]
    fn an_address_gives_way_among_its_own_connections() {
        let t = Arc::new(ConnTable::default());
        let a1 = t.register(A);
        let b1 = t.register(B);
        let _a2 = t.register(A);
        assert_eq!((t.count_of(A), t.count_of(B)), (2, 1));
        assert!(t.evict_one(Some(B)));
        assert!(kicked(&b1) && !kicked(&a1));
        assert_eq!(t.count_of(B), 0, "giving way already");
        assert!(!t.evict_one(Some(B)));
        // The same by TLS identity.
        let (x1, x2) = (t.register(A), t.register(B));
        x1.set_identity("x");
        x2.set_identity("x");
        assert_eq!(t.count_of_identity("x"), 2);
        assert!(t.evict_one_of_identity("x"));
        assert!(kicked(&x1) && !kicked(&x2));
    }
}
