//! The `[[access]]` entries as the operator writes them: who may do which kinds of calls
//! in which namespaces (enforced by `core::access`).

use serde::Deserialize;

/// A kind of call, as named in `allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Produce,
    Consume,
    Admin,
    Peer,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Produce => "produce",
            Kind::Consume => "consume",
            Kind::Admin => "admin",
            Kind::Peer => "peer",
        }
    }
}

/// One `[[access]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessRule {
    /// A client identity, or `*` for any client (anonymous included).
    pub identity: String,
    /// Namespaces, or `["*"]` for all.
    pub namespaces: Vec<String>,
    pub allow: Vec<Kind>,
}
