//! `[console]`: the web console foqsd serves to operators (see `crate::console`).

use serde::Deserialize;

use super::Config;

/// The console's refresh period when `refresh_ms` is not set.
pub const CONSOLE_REFRESH_MS_DEFAULT: u64 = 2_000;
/// Faster than this, open tabs would keep the host busy answering them.
pub const CONSOLE_REFRESH_MS_MIN: u64 = 250;

/// `[console]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleConfig {
    /// HOST:PORT of the console's HTTP listener; absent: no console.
    pub listen: Option<String>,
    /// Who may log in (HTTP basic auth); none: anyone who reaches the listener, as admin.
    pub users: Vec<ConsoleUser>,
    /// The identity the console's calls carry under `[[access]]` rules (required when
    /// there are rules); absent without rules: the console may do everything.
    pub identity: Option<String>,
    /// How often the pages refresh their figures (ms, at least [`CONSOLE_REFRESH_MS_MIN`]).
    pub refresh_ms: Option<u64>,
    /// Host names (`name` or `name:port`) the console may be reached by besides IP
    /// addresses and `localhost`: a request naming another `Host` is refused, so that a
    /// web page cannot reach the console through a DNS name it re-points (DNS rebinding).
    pub allowed_hosts: Vec<String>,
}

/// One `[[console.users]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleUser {
    pub name: String,
    /// An Argon2 hash in PHC format (`$argon2id$v=19$...`), as `foqsctl hash-password`
    /// prints it.
    pub password_hash: String,
    #[serde(default)]
    pub role: ConsoleRole,
}

/// What a console user may do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum ConsoleRole {
    /// Everything the console offers: requeue, purge, test enqueues.
    #[default]
    #[serde(rename = "admin")]
    Admin,
    /// Look only: every request that changes state is refused (403).
    #[serde(rename = "read-only")]
    ReadOnly,
}

impl ConsoleConfig {
    pub fn refresh_ms(&self) -> u64 {
        self.refresh_ms.unwrap_or(CONSOLE_REFRESH_MS_DEFAULT)
    }
}

pub(super) fn check(cfg: &Config, problems: &mut Vec<String>) {
    let c = &cfg.console;
    let Some(l) = &c.listen else {
        if !c.users.is_empty() || c.identity.is_some() {
            problems
                .push("console.users / console.identity are set but console.listen is not".into());
        }
        return;
    };
    if l.parse::<std::net::SocketAddr>().is_err() {
        problems.push(format!("console.listen {l:?} is not HOST:PORT"));
    }
    if c.refresh_ms.is_some_and(|r| r < CONSOLE_REFRESH_MS_MIN) {
        problems.push(format!(
            "console.refresh_ms must be >= {CONSOLE_REFRESH_MS_MIN}"
        ));
    }
    for h in &c.allowed_hosts {
        if h.is_empty() || h.contains(['/', ' ', '@']) {
            problems.push(format!(
                "console.allowed_hosts: {h:?} is not a host name (name or name:port)"
            ));
        }
    }
    if !cfg.access.is_empty() && c.identity.as_deref().is_none_or(str::is_empty) {
        problems.push(
            "console.identity is needed with [[access]] rules: the identity whose rules the console's calls follow"
                .into(),
        );
    }
    let mut seen = std::collections::HashSet::new();
    for (i, u) in c.users.iter().enumerate() {
        if u.name.is_empty() || u.name.contains(':') {
            problems.push(format!(
                "console.users entry {}: name must be non-empty and hold no ':'",
                i + 1
            ));
        }
        if !seen.insert(u.name.as_str()) {
            problems.push(format!("console.users: {:?} is listed twice", u.name));
        }
        if argon2::PasswordHash::new(&u.password_hash).is_err() {
            problems.push(format!(
                "console.users {:?}: password_hash is not a PHC string (make one with `foqsctl hash-password`)",
                u.name
            ));
        }
    }
}
