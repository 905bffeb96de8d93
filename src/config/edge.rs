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
    ] {
        if v == 0 {
            problems.push(format!("{name} must be > 0"));
        }
    }
    if let Some(tls) = &s.tls {
        for (name, path) in [
            ("server.tls.cert_file", Some(&tls.cert_file)),
            ("server.tls.key_file", Some(&tls.key_file)),
            ("server.tls.client_ca_file", tls.client_ca_file.as_ref()),
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
    for (i, rule) in cfg.access.iter().enumerate() {
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
}
