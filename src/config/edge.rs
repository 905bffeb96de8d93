//! The edge's configuration: connection limits, TLS (`[server.tls]`, `cluster.tls_*`),
//! access rules (`[[access]]`), metrics and logs; checked with the rest of the config.

use serde::Deserialize;

use super::Config;
use crate::cluster::ManagerKind;

/// `[metrics]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// HOST:PORT of the HTTP listener serving `/metrics`, `/healthz` and `/readyz`;
    /// absent: no such listener.
    pub listen: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (colours only on a terminal).
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// `[log]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
}

pub(super) fn check(cfg: &Config, problems: &mut Vec<String>) {
    let s = &cfg.server;
    for (name, v) in [
        ("server.frame_read_timeout_ms", s.frame_read_timeout_ms),
        ("server.idle_timeout_ms", s.idle_timeout_ms),
        ("server.handshake_timeout_ms", s.handshake_timeout_ms),
        ("server.http_header_timeout_ms", s.http_header_timeout_ms),
        ("server.http_idle_timeout_ms", s.http_idle_timeout_ms),
        ("server.http_connections_max", s.http_connections_max as u64),
        ("server.reply_items_max", s.reply_items_max as u64),
        (
            "server.listing_calls_per_caller_max",
            s.listing_calls_per_caller_max as u64,
        ),
        (
            "server.connections_per_address_max",
            s.connections_per_address_max as u64,
        ),
        (
            "server.connections_per_identity_max",
            s.connections_per_identity_max as u64,
        ),
    ] {
        if v == 0 {
            problems.push(format!("{name} must be > 0"));
        }
    }
    // One item of the largest size must fit, and the reply must fit a frame.
    if s.reply_bytes_max < crate::core::ITEM_WIRE_BYTES_MAX {
        problems.push(format!(
            "server.reply_bytes_max must be at least {} (one item of the largest size)",
            crate::core::ITEM_WIRE_BYTES_MAX
        ));
    }
    if let Some(tls) = s.tls.as_ref().filter(|t| t.crl_file.is_some()) {
        if tls.client_ca_file.is_none() {
            problems.push(
                "server.tls.crl_file revokes client certificates: it needs server.tls.client_ca_file"
                    .into(),
            );
        }
    }
    if let Some(tls) = &s.tls {
        for (name, path) in [
            ("server.tls.cert_file", Some(&tls.cert_file)),
            ("server.tls.key_file", Some(&tls.key_file)),
            ("server.tls.client_ca_file", tls.client_ca_file.as_ref()),
            ("server.tls.crl_file", tls.crl_file.as_ref()),
        ] {
            if let Some(p) = path {
                if !p.is_file() {
                    problems.push(format!("{name}: {} is not a readable file", p.display()));
                }
            }
        }
    }
    let c = &cfg.cluster;
    match (&c.tls_cert_file, &c.tls_key_file) {
        (Some(_), None) | (None, Some(_)) => {
            problems.push("cluster.tls_cert_file and cluster.tls_key_file go together".into())
        }
        _ => {}
    }
    if c.tls_cert_file.is_some() && c.tls_ca_file.is_none() {
        problems.push(
            "cluster.tls_cert_file needs cluster.tls_ca_file (the CA of the peers' certificates)"
                .into(),
        );
    }
    if c.manager != ManagerKind::Single && s.tls.is_some() && c.tls_ca_file.is_none() {
        problems.push(
            "server.tls is set in a cluster: peers speak TLS to each other, so cluster.tls_ca_file is needed"
                .into(),
        );
    }
    if !cfg.access.is_empty() && c.manager != ManagerKind::Single && c.tls_cert_file.is_none() {
        problems.push(
            "[[access]] rules in a cluster need cluster.tls_cert_file/tls_key_file (and server.tls with \
             client_ca_file): hosts prove they are peers with their certificates"
                .into(),
        );
    }
    match c.peer_secret() {
        Err(e) => problems.push(e),
        Ok(Some(_)) if c.manager == ManagerKind::Single => problems.push(
            "cluster.peer_secret is set but cluster.manager is \"single\": a single host has no peers"
                .into(),
        ),
        Ok(None)
            if c.manager != ManagerKind::Single
                && c.peer_ca_file.is_none()
                && !cfg
                    .access
                    .iter()
                    .any(|r| r.allow.contains(&super::Kind::Peer)) =>
        {
            problems.push(format!(
                "cluster.manager = \"{}\" needs cluster.peer_secret (or cluster.peer_secret_file), the \
                 same on every host, or peer certificates ([[access]] allow = [\"peer\"] with TLS): \
                 hosts prove to each other that they are peers, and clients cannot",
                c.manager.name()
            ))
        }
        Ok(None)
            if c.manager != ManagerKind::Single
                && s.tls.as_ref().is_none_or(|t| t.client_ca_file.is_none()) =>
        {
            // Peers by certificate only, but no client certificates asked for: every
            // caller is anonymous, so no peer would ever be recognised.
            problems.push(
                "peers proven by certificate ([[access]] allow = [\"peer\"], no cluster.peer_secret) \
                 need server.tls.client_ca_file: without client certificates no caller has an identity"
                    .into(),
            )
        }
        Ok(_) => {}
    }
    if let Some(p) = &c.peer_ca_file {
        if c.manager == ManagerKind::Single {
            problems.push("cluster.peer_ca_file is set but a single host has no peers".into());
        }
        if s.tls.as_ref().is_none_or(|t| t.client_ca_file.is_none()) {
            problems.push(
                "cluster.peer_ca_file needs server.tls.client_ca_file: peers are known by the \
                 certificates they present"
                    .into(),
            );
        }
        if !p.is_file() {
            problems.push(format!(
                "cluster.peer_ca_file: {} is not a readable file",
                p.display()
            ));
        }
    }
    for (i, rule) in cfg.access.iter().enumerate() {
        // A peer may do everything, for anyone: a rule that makes every client one (or
        // every client without a certificate) would open the whole cluster.
        if rule.allow.contains(&super::Kind::Peer)
            && (rule.identity == "*" || rule.identity == crate::tls::ANONYMOUS)
        {
            problems.push(format!(
                "access entry {} ({:?}): \"peer\" must name a host's certificate identity, not every client",
                i + 1,
                rule.identity
            ));
        }
        if rule.identity.is_empty() {
            problems.push(format!("access entry {}: identity is empty", i + 1));
        }
        if rule.allow.is_empty() {
            problems.push(format!(
                "access entry {} ({:?}): allow is empty",
                i + 1,
                rule.identity
            ));
        }
        let only_peer = rule.allow.iter().all(|k| *k == super::Kind::Peer);
        if rule.namespaces.is_empty() && !only_peer {
            problems.push(format!(
                "access entry {} ({:?}): namespaces is empty (use [\"*\"] for all)",
                i + 1,
                rule.identity
            ));
        }
    }
    if let Some(l) = &cfg.metrics.listen {
        if l.parse::<std::net::SocketAddr>().is_err() {
            problems.push(format!("metrics.listen {l:?} is not HOST:PORT"));
        }
    }
    open_by_accident(cfg, problems);
}

/// Whether `addr` (HOST:PORT) can be reached only from this machine. A name other than
/// `localhost` may resolve anywhere: not loopback.
pub fn loopback_only(addr: &str) -> bool {
    if let Ok(a) = addr.parse::<std::net::SocketAddr>() {
        return a.ip().is_loopback();
    }
    addr.rsplit_once(':')
        .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost"))
}

/// A host with no TLS and no `[[access]]` rules lets any client that reaches it do
/// everything, admin calls included: fine on loopback, refused beyond it unless
/// `server.allow_open` says so. A console beyond loopback needs its users (a login).
fn open_by_accident(cfg: &Config, problems: &mut Vec<String>) {
    let open = cfg.server.tls.is_none() && cfg.access.is_empty();
    if open && !cfg.server.allow_open {
        let listeners = [
            ("server.listen", Some(&cfg.server.listen)),
            ("metrics.listen", cfg.metrics.listen.as_ref()),
            ("console.listen", cfg.console.listen.as_ref()),
        ];
        for (key, addr) in listeners {
            if let Some(a) = addr.filter(|a| !loopback_only(a)) {
                problems.push(format!(
                    "{key} = {a:?} is reachable beyond this machine, and with no [server.tls] and no \
                     [[access]] rules any client that reaches it may do everything (admin calls \
                     included): add TLS and rules, listen on 127.0.0.1, or set server.allow_open = \
                     true to serve it open on purpose"
                ));
            }
        }
    }
    if let Some(a) = cfg.console.listen.as_ref().filter(|a| !loopback_only(a)) {
        if cfg.console.users.is_empty() {
            problems.push(format!(
                "console.listen = {a:?} is reachable beyond this machine: list [[console.users]] \
                 (hashes from `foqsctl hash-password`) so that it asks for a login"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;

    fn problems(toml: &str) -> String {
        match Config::from_toml(toml) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    const SHARD: &str = "[[shards]]\nid = 0\nurl = \"mysql://root@127.0.0.1:3306/s0\"\n";

    #[test]
    fn an_open_host_beyond_loopback_is_refused_unless_allow_open_says_so() {
        for listen in ["127.0.0.1:9090", "[::1]:9090"] {
            let toml = format!("[server]\nlisten = \"{listen}\"\n{SHARD}");
            assert_eq!(problems(&toml), "", "{listen}");
        }
        let wide = format!("[server]\nlisten = \"0.0.0.0:9090\"\n{SHARD}");
        assert!(problems(&wide).contains("server.allow_open"));
        let metrics = format!("[metrics]\nlisten = \"0.0.0.0:9100\"\n{SHARD}");
        assert!(problems(&metrics).contains("metrics.listen"));
        let meant = format!("[server]\nlisten = \"0.0.0.0:9090\"\nallow_open = true\n{SHARD}");
        assert_eq!(problems(&meant), "");
        let ruled = format!(
            "[server]\nlisten = \"0.0.0.0:9090\"\n{SHARD}\
             [[access]]\nidentity = \"*\"\nnamespaces = [\"public\"]\nallow = [\"consume\"]\n"
        );
        assert_eq!(problems(&ruled), "");
        // A console beyond loopback asks for a login, open on purpose or not.
        let console =
            format!("[server]\nallow_open = true\n[console]\nlisten = \"0.0.0.0:9190\"\n{SHARD}");
        assert!(problems(&console).contains("[[console.users]]"));
    }

    #[test]
    fn a_cluster_needs_a_way_for_its_hosts_to_prove_they_are_peers() {
        let cluster = |extra: &str| {
            format!(
                "[server]\nhost_id = \"h1\"\n{SHARD}[cluster]\nmanager = \"static\"\n{extra}\
                 [[cluster.hosts]]\nid = \"h1\"\naddr = \"127.0.0.1:9090\"\nshards = [0]\n"
            )
        };
        assert!(problems(&cluster("")).contains("needs cluster.peer_secret"));
        assert!(problems(&cluster("peer_secret = \"short\"\n")).contains("at least 16 bytes"));
        assert_eq!(
            problems(&cluster("peer_secret = \"0123456789abcdef\"\n")),
            ""
        );
        let single = format!("{SHARD}[cluster]\npeer_secret = \"0123456789abcdef\"\n");
        assert!(problems(&single).contains("a single host has no peers"));
        let file = std::env::temp_dir().join(format!("foqs-secret-{}", std::process::id()));
        std::fs::write(&file, "0123456789abcdef\n").unwrap();
        let from_file = format!("peer_secret_file = \"{}\"\n", file.display());
        assert_eq!(problems(&cluster(&from_file)), "");
        let both = format!("{from_file}peer_secret = \"0123456789abcdef\"\n");
        assert!(problems(&cluster(&both)).contains("give one"));
        std::fs::remove_file(&file).unwrap();
        // Peers by certificate: a rule naming a host, and client certificates asked for.
        let by_cert = cluster("").replace(
            "[cluster]",
            "[[access]]\nidentity = \"host-2\"\nnamespaces = []\nallow = [\"peer\"]\n[cluster]",
        );
        assert!(problems(&by_cert).contains("need server.tls.client_ca_file"));
        let everyone = by_cert.replace("identity = \"host-2\"", "identity = \"*\"");
        assert!(problems(&everyone).contains("must name a host's certificate identity"));
    }
}
