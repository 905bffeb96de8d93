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

use crate::error::{Error, ErrorCode, Result};

pub use crate::config::{AccessRule, Kind};

/// Who is calling, as far as access goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub identity: String,
    /// A peer host's forwarded request whose original caller was checked by that host.
    trusted: bool,
    /// Says when the caller's connection closed (see [`Hangup`]).
    hangup: HangupSignal,
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

/// A caller's [`Hangup`], when its requests come over a connection; not part of who it is
/// (equal whatever it holds).
#[derive(Debug, Clone, Default)]
struct HangupSignal(Option<std::sync::Arc<Hangup>>);

impl PartialEq for HangupSignal {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for HangupSignal {}

impl Caller {
    pub fn new(identity: impl Into<String>) -> Caller {
        Caller {
            identity: identity.into(),
            trusted: false,
            hangup: HangupSignal::default(),
        }
    }

    /// The same caller, whose connection's closing `hangup` tells.
    pub fn with_hangup(mut self, hangup: std::sync::Arc<Hangup>) -> Caller {
        self.hangup = HangupSignal(Some(hangup));
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
            hangup: HangupSignal::default(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Access {
    rules: Vec<AccessRule>,
}

fn matches(list: &[String], value: &str) -> bool {
    list.iter().any(|v| v == "*" || v == value)
}

impl Access {
    pub fn new(rules: Vec<AccessRule>) -> Access {
        Access { rules }
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
    /// (allowed `peer`) is a member of the cluster and may do everything.
    pub fn allows(&self, caller: &Caller, ns: &str, kind: Kind) -> bool {
        self.is_open()
            || caller.trusted
            || self.grants(caller, ns, kind)
            || self.grants(caller, ns, Kind::Peer)
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
    /// peer is refused: a host must not become a way around the rules.
    pub fn acting_for(
        &self,
        caller: &Caller,
        forwarded_by: Option<&str>,
        forwarded_for: Option<&str>,
    ) -> Result<Caller> {
        let Some(by) = forwarded_by else {
            return Ok(caller.clone());
        };
        if self.is_open() {
            return Ok(Caller::trusted());
        }
        if !caller.trusted && !self.grants(caller, "", Kind::Peer) {
            return Err(Error::new(
                ErrorCode::PermissionDenied,
                format!(
                    "{:?} may not forward requests (forwarded_by = {by:?}): it is not allowed \"peer\"",
                    caller.identity
                ),
            ));
        }
        Ok(match forwarded_for {
            Some(id) => Caller::new(id),
            None => Caller::trusted(),
        })
    }
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
        ]);
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
}
