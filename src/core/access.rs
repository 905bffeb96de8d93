//! Namespace access control: who may do what in which namespace. A caller is known by its
//! identity (see [`crate::tls`]); `[[access]]` entries grant kinds of calls in namespaces.
//! With no entry every call is allowed; with at least one, a call is allowed only when an
//! entry matches its identity, its namespace and its kind, and is refused with
//! `PERMISSION_DENIED` before anything changes.
//!
//! Kinds: `produce` (enqueue); `consume` (dequeue, ack, nack, touch, peek, getActiveTopics,
//! topicStats); `admin` (the dead-letter calls); `peer` (another foqs host: a request it
//! forwards, marked with `forwarded_by`, was checked by that host, or names the identity
//! it acts for in `forwarded_for`, which is then checked here). getHostInfo is open.
//!
//! Being a peer is never granted by default, not even with no rules: a caller is a peer
//! only on a host with peers (not the `single` manager), and only when its connection
//! logged in with the cluster's secret (`peerLogin`, `cluster.peer_secret`) or its TLS
//! certificate's identity has an `[[access]]` entry allowing `peer`. Otherwise a client
//! could skip its namespace's quota with `forwarded_by`, or wake every long poll with
//! invented `notifyReady` heads.

use crate::error::{Error, ErrorCode, Result};

pub use crate::config::{AccessRule, Kind};

/// Who is calling, as far as access goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub identity: String,
    /// A peer host's forwarded request whose original caller was checked by that host.
    trusted: bool,
    /// Says when the caller's connection closed (see [`Hangup`]).
    hangup: ConnSignal<Hangup>,
    /// Set when the caller's connection logged in as a peer (see [`PeerMark`]).
    peer_mark: ConnSignal<PeerMark>,
    /// Its TLS certificate was issued by the peers' CA (`cluster.peer_ca_file`).
    peer_certificate: bool,
    /// The address it connected from, when it came over the network.
    origin: Option<std::net::IpAddr>,
}

/// Per connection: set once the connection proved, with the cluster's secret, that it is
/// another host's (`peerLogin`). Every later request on it is a peer's.
#[derive(Debug, Default)]
pub struct PeerMark {
    host_id: std::sync::OnceLock<String>,
}

impl PeerMark {
    /// The host the connection logged in as, once it has.
    pub fn host_id(&self) -> Option<&str> {
        self.host_id.get().map(String::as_str)
    }
}

/// Set by the server when a caller's connection closes while one of its requests is being
/// served: a long poll then stops waiting (what it would take would reach nobody), and
/// the demand it stood for goes with it.
#[derive(Debug, Default)]
pub struct Hangup {
    gone: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Hangup {
    pub fn hang_up(&self) {
        self.gone.store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub fn is_gone(&self) -> bool {
        self.gone.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// State a caller shares with its connection ([`Hangup`], [`PeerMark`]), when its requests
/// come over one; not part of who it is (equal whatever it holds).
#[derive(Debug)]
struct ConnSignal<T>(Option<std::sync::Arc<T>>);

impl<T> Clone for ConnSignal<T> {
    fn clone(&self) -> Self {
        ConnSignal(self.0.clone())
    }
}

impl<T> Default for ConnSignal<T> {
    fn default() -> Self {
        ConnSignal(None)
    }
}

impl<T> PartialEq for ConnSignal<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<T> Eq for ConnSignal<T> {}

impl Caller {
    pub fn new(identity: impl Into<String>) -> Caller {
        Caller {
            identity: identity.into(),
            trusted: false,
            hangup: ConnSignal::default(),
            peer_mark: ConnSignal::default(),
            peer_certificate: false,
            origin: None,
        }
    }

    /// The same caller, connected from `addr`.
    pub fn with_origin(mut self, addr: std::net::IpAddr) -> Caller {
        self.origin = Some(addr);
        self
    }

    /// Who the caller is for per-caller bounds: its TLS identity, or its address when it
    /// has none.
    pub fn bound_key(&self) -> String {
        match self.origin {
            Some(addr) if self.identity == crate::tls::ANONYMOUS => format!("address {addr}"),
            _ => format!("identity {}", self.identity),
        }
    }

    /// The same caller, whose certificate the peers' CA issued.
    pub fn with_peer_certificate(mut self) -> Caller {
        self.peer_certificate = true;
        self
    }

    /// The same caller, whose connection may log in as a peer through `mark`.
    pub fn with_peer_mark(mut self, mark: std::sync::Arc<PeerMark>) -> Caller {
        self.peer_mark = ConnSignal(Some(mark));
        self
    }

    /// The host this caller's connection logged in as (see [`Access::peer_login`]).
    pub fn logged_in_peer(&self) -> Option<&str> {
        self.peer_mark.0.as_ref().and_then(|m| m.host_id())
    }

    /// The same caller, whose connection's closing `hangup` tells.
    pub fn with_hangup(mut self, hangup: std::sync::Arc<Hangup>) -> Caller {
        self.hangup = ConnSignal(Some(hangup));
        self
    }

    /// Resolves when the caller's connection has closed (never, for a caller without one).
    pub async fn hung_up(&self) {
        let Some(h) = &self.hangup.0 else {
            return std::future::pending().await;
        };
        // Made before the check, so that a hang-up between the two still wakes it.
        let notified = h.notify.notified();
        if h.is_gone() {
            return;
        }
        notified.await
    }

    pub fn is_hung_up(&self) -> bool {
        self.hangup.0.as_ref().is_some_and(|h| h.is_gone())
    }

    /// The client `identity` a peer acts for (`forwarded_for`), on this caller's
    /// connection: its rules apply, not the peer's.
    pub fn acting_as(&self, identity: &str) -> Caller {
        Caller {
            identity: identity.to_string(),
            trusted: false,
            hangup: self.hangup.clone(),
            peer_mark: ConnSignal::default(),
            peer_certificate: false,
            // The client's address is the routing host's to know.
            origin: None,
        }
    }

    pub fn anonymous() -> Caller {
        Caller::new(crate::tls::ANONYMOUS)
    }

    pub fn is_trusted(&self) -> bool {
        self.trusted
    }

    /// Allowed everything: for a host's own calls and for requests a trusted peer checked.
    pub fn trusted() -> Caller {
        Caller {
            identity: "foqs-peer".to_string(),
            trusted: true,
            hangup: ConnSignal::default(),
            peer_mark: ConnSignal::default(),
            peer_certificate: false,
            origin: None,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Access {
    rules: Vec<AccessRule>,
    /// False on a single host (`single` manager): it has no peers, so nobody is one.
    has_peers: bool,
    /// `cluster.peer_secret`: what a connection presents to log in as a peer.
    secret: Option<std::sync::Arc<[u8]>>,
    /// `cluster.peer_ca_file` is set: a peer's certificate is known by its issuer, not by
    /// its name.
    peer_ca: bool,
}

fn matches(list: &[String], value: &str) -> bool {
    list.iter().any(|v| v == "*" || v == value)
}

impl Access {
    /// The rules of a host with no peers (a single host).
    pub fn new(rules: Vec<AccessRule>) -> Access {
        Access {
            rules,
            has_peers: false,
            secret: None,
            peer_ca: false,
        }
    }

    /// The same rules on a host of a cluster: its peers prove themselves with `secret`
    /// (`peerLogin`), or with a certificate: of the peers' own CA with `peer_ca`, else
    /// one whose identity is allowed `peer`.
    pub fn with_peers(mut self, secret: Option<Vec<u8>>, peer_ca: bool) -> Access {
        self.has_peers = true;
        self.secret = secret.map(Into::into);
        self.peer_ca = peer_ca;
        self
    }

    /// Whether `caller` is another host of this cluster (or this host itself).
    pub fn is_peer(&self, caller: &Caller) -> bool {
        let certified = if self.peer_ca {
            caller.peer_certificate
        } else {
            self.grants(caller, "", Kind::Peer)
        };
        caller.trusted || (self.has_peers && (caller.logged_in_peer().is_some() || certified))
    }

    /// `peerLogin`: marks the caller's connection as `host_id`'s when `secret` is the
    /// cluster's. Refused on a host with no peers or no secret, and for a caller whose
    /// connection cannot carry the mark.
    pub fn peer_login(&self, caller: &Caller, host_id: &str, secret: &[u8]) -> Result<()> {
        use subtle::ConstantTimeEq;
        let refused = |why: &str| {
            Error::new(
                ErrorCode::PermissionDenied,
                format!("peerLogin as {host_id:?} refused: {why}"),
            )
        };
        if !self.has_peers {
            return Err(refused(
                "this host has no peers (cluster.manager = \"single\")",
            ));
        }
        let Some(expected) = &self.secret else {
            return Err(refused(
                "this cluster has no cluster.peer_secret (its peers prove themselves with certificates)",
            ));
        };
        // Constant time: a caller must not learn the secret byte by byte from timings.
        if !bool::from(expected.as_ref().ct_eq(secret)) {
            return Err(refused("wrong secret"));
        }
        let Some(mark) = &caller.peer_mark.0 else {
            return Err(refused("not on a connection"));
        };
        if let Err(already) = mark.host_id.set(host_id.to_string()) {
            if mark.host_id() != Some(already.as_str()) {
                return Err(refused("the connection logged in as another host already"));
            }
        }
        Ok(())
    }

    /// True when there are no rules: everything is allowed.
    pub fn is_open(&self) -> bool {
        self.rules.is_empty()
    }

    fn grants(&self, caller: &Caller, ns: &str, kind: Kind) -> bool {
        self.rules.iter().any(|r| {
            r.allow.contains(&kind)
                && (r.identity == "*" || r.identity == caller.identity)
                && (kind == Kind::Peer || matches(&r.namespaces, ns))
        })
    }

    /// Whether `caller` may do `kind` in `ns` (`ns` is ignored for `peer`). A peer host
    /// is a member of the cluster and may do everything; only a peer may do `peer`, with
    /// or without rules.
    pub fn allows(&self, caller: &Caller, ns: &str, kind: Kind) -> bool {
        if kind == Kind::Peer {
            return self.is_peer(caller);
        }
        self.is_open() || self.is_peer(caller) || self.grants(caller, ns, kind)
    }

    pub fn check(&self, caller: &Caller, ns: &str, kind: Kind) -> Result<()> {
        if self.allows(caller, ns, kind) {
            return Ok(());
        }
        Err(denied(caller, ns, kind))
    }

    /// Who a request acts for: its caller; or, for a request a peer forwarded
    /// (`forwarded_by`), the identity it names in `forwarded_for`, or the peer's own
    /// check (trusted) when it names none. A `forwarded_by` from a caller that is not a
    /// peer is refused, with or without rules: a host must not become a way around the
    /// rules, nor a field a way around the quota.
    pub fn acting_for(
        &self,
        caller: &Caller,
        forwarded_by: Option<&str>,
        forwarded_for: Option<&str>,
    ) -> Result<Caller> {
        let forwarded_for = forwarded_for.filter(|s| !s.is_empty());
        if forwarded_by.is_none() && forwarded_for.is_none() {
            return Ok(caller.clone());
        }
        if !self.is_peer(caller) {
            let what = match (forwarded_by, forwarded_for) {
                (Some(by), _) => format!("forwarded_by = {by:?}"),
                _ => "forwarded_for".to_string(),
            };
            return Err(not_a_peer(caller, &what));
        }
        Ok(match forwarded_for {
            Some(id) => caller.acting_as(id),
            None => Caller::trusted(),
        })
    }
}

/// A field or call only hosts of the cluster may use, from a caller that is not one.
pub fn not_a_peer(caller: &Caller, what: &str) -> Error {
    Error::new(
        ErrorCode::PermissionDenied,
        format!(
            "{:?} may not send {what}: only the hosts of a cluster may (see peerLogin)",
            caller.identity
        ),
    )
}

pub fn denied(caller: &Caller, ns: &str, kind: Kind) -> Error {
    Error::new(
        ErrorCode::PermissionDenied,
        format!(
            "{:?} may not {} in namespace {ns:?}",
            caller.identity,
            kind.name()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(identity: &str, namespaces: &[&str], allow: &[Kind]) -> AccessRule {
        AccessRule {
            identity: identity.into(),
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            allow: allow.to_vec(),
        }
    }

    #[test]
    fn no_rules_allow_everything_and_rules_allow_only_what_they_list() {
        let a = Caller::new("billing-worker");
        assert!(Access::default().allows(&a, "any", Kind::Admin));
        let access = Access::new(vec![
            rule(
                "billing-worker",
                &["billing"],
                &[Kind::Produce, Kind::Consume],
            ),
            rule("*", &["public"], &[Kind::Consume]),
            rule("ops", &["*"], &[Kind::Admin]),
        ]);
        assert!(access.allows(&a, "billing", Kind::Consume));
        assert!(!access.allows(&a, "billing", Kind::Admin));
        assert!(!access.allows(&a, "shipping", Kind::Consume));
        assert!(access.allows(&Caller::anonymous(), "public", Kind::Consume));
        assert!(!access.allows(&Caller::anonymous(), "public", Kind::Produce));
        assert!(access.allows(&Caller::new("ops"), "shipping", Kind::Admin));
        let e = access.check(&a, "shipping", Kind::Consume).unwrap_err();
        assert_eq!(e.code, ErrorCode::PermissionDenied);
        assert!(!e.retryable);
    }

    #[test]
    fn only_peers_may_forward_and_forwarded_for_is_checked() {
        let access = Access::new(vec![
            rule("host-2", &[], &[Kind::Peer]),
            rule("a", &["a"], &[Kind::Consume]),
        ])
        .with_peers(None, false);
        let forged = access.acting_for(&Caller::new("a"), Some("h9"), None);
        assert_eq!(forged.unwrap_err().code, ErrorCode::PermissionDenied);
        let peer = Caller::new("host-2");
        let as_a = access.acting_for(&peer, Some("h2"), Some("a")).unwrap();
        assert!(access.allows(&as_a, "a", Kind::Consume));
        assert!(!access.allows(&as_a, "b", Kind::Consume));
        let checked = access.acting_for(&peer, Some("h2"), None).unwrap();
        assert!(access.allows(&checked, "b", Kind::Admin));
        // A peer host may make any call itself (getActiveTopics with local_only, ...).
        assert!(access.allows(&peer, "b", Kind::Consume));
        // Not forwarded: the caller itself.
        assert_eq!(access.acting_for(&peer, None, None).unwrap(), peer);
    }

    #[test]
    fn nobody_is_a_peer_by_default_not_even_without_rules() {
        let client = Caller::new("anonymous");
        for access in [
            Access::default(),
            Access::new(vec![]).with_peers(None, false),
        ] {
            assert!(access.allows(&client, "a", Kind::Admin), "open mode");
            assert!(!access.allows(&client, "", Kind::Peer));
            let e = access.acting_for(&client, Some("h2"), None).unwrap_err();
            assert_eq!(e.code, ErrorCode::PermissionDenied);
            // Nor may it name another client without forwarded_by.
            let e = access.acting_for(&client, None, Some("ops")).unwrap_err();
            assert_eq!(e.code, ErrorCode::PermissionDenied);
            assert_eq!(access.acting_for(&client, None, Some("")).unwrap(), client);
        }
        // A single host has no peers, whatever its rules say.
        let single = Access::new(vec![rule("host-2", &[], &[Kind::Peer])]);
        assert!(!single.is_peer(&Caller::new("host-2")));
        assert!(single.is_peer(&Caller::trusted()));
    }

    #[test]
    fn a_connection_logs_in_as_a_peer_with_the_clusters_secret_only() {
        let access = Access::new(vec![]).with_peers(Some(b"s3cret-s3cret-s3cret".to_vec()), false);
        let mark = std::sync::Arc::new(PeerMark::default());
        let conn = Caller::anonymous().with_peer_mark(mark.clone());
        let e = access.peer_login(&conn, "h2", b"guess").unwrap_err();
        assert_eq!(e.code, ErrorCode::PermissionDenied);
        assert!(!access.is_peer(&conn));
        access
            .peer_login(&conn, "h2", b"s3cret-s3cret-s3cret")
            .unwrap();
        // Every request on the connection (a clone of its caller) is a peer's now.
        let later = conn.clone();
        assert!(access.is_peer(&later));
        assert_eq!(later.logged_in_peer(), Some("h2"));
        assert!(access.acting_for(&later, Some("h2"), None).is_ok());
        // Not as another host on the same connection.
        assert!(access
            .peer_login(&conn, "h3", b"s3cret-s3cret-s3cret")
            .is_err());
        // Not without a connection, nor on hosts with no secret or no peers.
        let bare = Caller::anonymous();
        assert!(access
            .peer_login(&bare, "h2", b"s3cret-s3cret-s3cret")
            .is_err());
        let with_certs_only = Access::new(vec![]).with_peers(None, false);
        let conn2 = Caller::anonymous().with_peer_mark(std::sync::Arc::default());
        assert!(with_certs_only.peer_login(&conn2, "h2", b"").is_err());
        let single = Access::new(vec![]);
        assert!(single
            .peer_login(&conn2, "h2", b"s3cret-s3cret-s3cret")
            .is_err());
    }
}
